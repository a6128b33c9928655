"""The Fashion-MNIST task: 28x28 clothing images, 10 classes, 92% test accuracy to reach; the in-memory
loader for most recipes and the hand-written torchvision pipeline for the ``loader: torch`` baseline."""
from __future__ import annotations

import torch

from speedkit.data import BatchLoader, FashionMNIST, fashion_mnist_loaders, load_fashion_mnist, stratified_indices
from speedkit.data.per_image import alternate_flips, as_augment, per_image_transforms
from speedkit.tasks.builtin._shared import LIBRARY_MODELS, classification_metrics, recipe_augment, vision_model_factory
from speedkit.tasks.recipes import load_presets
from speedkit.tasks.task import DataRequest, Task


def fashion_mnist_torch_loader(batch_size: int, augment: dict | None, data_fraction: float, seed: int,
                               num_workers: int = 0, download: bool = False):
    """The hand-written baseline's input pipeline: a torchvision transform per image and a DataLoader.

    Under torchrun each rank reads batch_size / world_size samples per step through a
    ``DistributedSampler`` (the Trainer calls its ``set_epoch``), so the global batch stays ``batch_size``.
    """
    import torchvision.transforms as T

    from speedkit.core import distributed

    augment, arrays = as_augment(augment), load_fashion_mnist(download=download)
    # The same augmentation as the in-memory loader's (an alternating flip included), so the two pipelines differ
    # only as pipelines.
    steps = per_image_transforms(augment, 28) + [T.ToTensor(), T.Normalize((arrays.mean,), (arrays.std,))]
    dataset = FashionMNIST(train=True, transform=T.Compose(steps), download=download)
    if data_fraction < 1.0:
        dataset = torch.utils.data.Subset(dataset, stratified_indices(arrays.train_y, data_fraction, seed).tolist())
    world = distributed.world_size()
    if batch_size % world:
        raise ValueError(f"batch_size={batch_size} is the global batch size and must split evenly over "
                         f"world_size={world} ranks; use a multiple of {world}")
    sampler = (torch.utils.data.RandomSampler(dataset) if world == 1 else
               torch.utils.data.DistributedSampler(dataset, num_replicas=world, rank=distributed.rank(),
                                                   shuffle=True, seed=seed))
    if augment is not None and augment.flip == "alternating":
        dataset, sampler = alternate_flips(dataset, sampler, seed)
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size // world, sampler=sampler,
                                       num_workers=num_workers, persistent_workers=num_workers > 0)


def _fashion_mnist_loaders(request: DataRequest):
    return fashion_mnist_loaders(batch_size=request.batch_size, device=request.device,
                                 augment=recipe_augment(request.recipe), data_fraction=request.data_fraction,
                                 seed=request.seed, eval_fraction=request.eval_fraction, download=request.download)


def fashion_mnist_train(request: DataRequest):
    recipe = request.recipe
    if recipe is not None and recipe.loader == "torch":
        return fashion_mnist_torch_loader(request.batch_size, recipe.augment, request.data_fraction, request.seed,
                                          num_workers=request.num_workers, download=request.download)
    return _fashion_mnist_loaders(request)[0]


def fashion_mnist_eval(request: DataRequest):
    """The test set (a class-balanced ``eval_fraction`` of it), the same for every recipe: what
    ``fashion_mnist_loaders`` evaluates on, without building its training loader again."""
    arrays = load_fashion_mnist(download=request.download)
    x, y = arrays.test_x, arrays.test_y
    if request.eval_fraction:
        keep = stratified_indices(y, request.eval_fraction, request.seed)
        x, y = x.index_select(0, keep), y.index_select(0, keep)
    return BatchLoader(x, y, 1024, shuffle=False, device=request.device, mean=arrays.mean, std=arrays.std,
                       seed=request.seed)


FASHION_MNIST = Task(
    name="fashion-mnist", domain="vision", summary="Fashion-MNIST 28x28 clothing images, 10 classes",
    model=vision_model_factory(in_channels=1, num_classes=10), train_data=fashion_mnist_train,
    eval_data=fashion_mnist_eval, metrics=classification_metrics, target_metric="eval/accuracy", target_value=0.92,
    recipes=load_presets("fashion-mnist"), baselines=("baseline", "plain", "plain-bf16"),
    models=("resnet8", "resnet9", *LIBRARY_MODELS))
