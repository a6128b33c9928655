"""The built-in tasks, defined with the public ``Task`` like a user's: Fashion-MNIST, the Python docs
language model, and two tasks over the user's own files (``image-folder``, ``text-folder``).

The folder tasks are functions of the folder (``image_folder_task(DIR)``): ``--task image-folder
--data DIR`` calls them through ``speedkit.tasks.resolve_task``.
"""
from __future__ import annotations

import dataclasses
import functools
import warnings
from pathlib import Path

import torch

from speedkit.data import (Augment, BatchLoader, FashionMNIST, TokenBatchLoader, fashion_mnist_loaders,
                           load_fashion_mnist, load_text_corpus, stratified_indices)
from speedkit.data.images import check_image_size, decode_images
from speedkit.data.per_image import alternate_flips, as_augment, per_image_transforms
from speedkit.data.vision import image_folder
from speedkit.models import get_model
from speedkit.record.metrics import Accuracy, BitsPerByte, CrossEntropy
from speedkit.tasks.recipes import RECIPES, Recipe
from speedkit.tasks.task import DataRequest, Task

LIBRARY_MODELS = ("torchvision:*", "timm:*")  # any classifier of these, adapted to channels and classes
GPT_MODELS = ("gpt-nano", "gpt-micro", "gpt-mini", "gpt-small",
              "hf:gpt2-nano", "hf:gpt2-micro", "hf:gpt2-mini", "hf:gpt2-small")  # hf: transformers, from a config


def classification_metrics() -> dict:
    return {"accuracy": Accuracy(), "loss": CrossEntropy()}


def language_metrics() -> dict:
    return {"bpb": BitsPerByte(), "loss": CrossEntropy()}


def vision_model_factory(in_channels: int, num_classes: int):
    """``model(name)`` for a vision task: speedkit's models and ``torchvision:``/``timm:`` ones, all
    built for ``in_channels`` and ``num_classes``."""
    def model(name: str) -> torch.nn.Module:
        return get_model(name, num_classes=num_classes, in_channels=in_channels)
    return model


def language_model(name: str) -> torch.nn.Module:
    return get_model(name)


def _augment(recipe: Recipe | None) -> Augment | None:
    return Augment(**recipe.augment) if recipe is not None and recipe.augment else None


# -- Fashion-MNIST ---------------------------------------------------------------------------
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
                                 augment=_augment(request.recipe), data_fraction=request.data_fraction,
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
    recipes=RECIPES["fashion-mnist"], baselines=("baseline", "plain", "plain-bf16"),
    models=("resnet8", "resnet9", *LIBRARY_MODELS))


# -- language modelling on a folder of text --------------------------------------------------
@functools.lru_cache(maxsize=4)
def _corpus(root: str | None, seed: int, skip_unreadable: bool = False):
    return load_text_corpus(root, seed=seed, skip_unreadable=skip_unreadable)


def _context_length(request: DataRequest) -> int:
    config = getattr(request.model, "config", None)
    for field in ("block_size", "n_positions", "max_position_embeddings"):  # speedkit's GPT, Hugging Face's
        if getattr(config, field, None):
            return min(int(getattr(config, field)), 256)
    return 256


class DictBatches:
    """A token loader whose ``(inputs, targets)`` batches come out as ``{"input_ids", "labels"}`` dicts, for
    models called Hugging Face style; length, epochs and resuming part-way are the wrapped loader's."""

    def __init__(self, loader):
        self.loader = loader

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        return self._as_dicts(iter(self.loader))

    def iter_from(self, batch_index: int):
        return self._as_dicts(self.loader.iter_from(batch_index))

    def __getattr__(self, name):  # batch_size, tokens_per_batch, set_epoch, ...
        return getattr(self.__dict__["loader"], name)

    @staticmethod
    def _as_dicts(batches):
        for inputs, targets in batches:
            yield {"input_ids": inputs, "labels": targets}


def _for_model(loader, request: DataRequest):
    return DictBatches(loader) if getattr(request.model, "takes_dict_batches", False) else loader


def text_data(root: str | None, skip_unreadable: bool = False):
    """(train_data, eval_data) over the text files under ``root`` (None: the Python docs), split by file."""
    def train(request: DataRequest):
        corpus, seq_len = _corpus(root, request.seed, skip_unreadable), _context_length(request)
        tokens = corpus.train[: max(seq_len + 1, int(len(corpus.train) * request.data_fraction))]
        loader = TokenBatchLoader(tokens, seq_len, request.batch_size, seed=request.seed, device=request.device)
        return _for_model(loader, request)

    def evaluate(request: DataRequest):
        corpus, seq_len = _corpus(root, request.seed, skip_unreadable), _context_length(request)
        batches = max(1, int(64 * (request.eval_fraction or 1.0)))
        loader = TokenBatchLoader(corpus.val, seq_len, 32, steps_per_epoch=batches, shuffle=False,
                                  device=request.device)
        return _for_model(loader, request)

    return train, evaluate


_pydocs_train, _pydocs_eval = text_data(None)
PYDOCS = Task(
    name="pydocs", domain="language", summary="byte-level language model on the Python documentation sources",
    model=language_model, train_data=_pydocs_train, eval_data=_pydocs_eval, metrics=language_metrics,
    target_metric="eval/bpb", target_value=2.0, recipes=RECIPES["pydocs"], baselines=("baseline", "tuned"),
    models=GPT_MODELS)


def _adopted(recipes: dict, task: str, names: tuple[str, ...]) -> dict:
    """Recipes of a built-in task for a folder task: the same methods and settings, nothing they reached,
    and the folder task's own target (what a recipe reached on one data set says nothing of another)."""
    return {name: dataclasses.replace(recipes[name], task=task, target=None, reached=None) for name in names}


def text_folder_task(data, target: float = 2.5, skip_unreadable: bool = False) -> Task:
    """A byte-level GPT on the text files (.txt, .rst, .md) under DIR, split train/validation by file.

    ``target`` is the validation bits per byte to reach. A file that is not text is refused naming it, or
    left out and counted with ``skip_unreadable=True``."""
    root = Path(data).expanduser()
    try:
        corpus = _corpus(str(root), 0, skip_unreadable)  # fails now, before a model is built, if the folder
    except (FileNotFoundError, ValueError) as e:       # holds too little text, or files that are not text
        raise type(e)(f"text-folder {root}: {e}") from None
    if corpus.skipped:
        warnings.warn(f"text-folder {root}: left out {len(corpus.skipped)} file(s) that are not text: "
                      + ", ".join(str(f) for f in corpus.skipped[:5]) + (" ..." if len(corpus.skipped) > 5 else ""),
                      stacklevel=2)
    train, evaluate = text_data(str(root), skip_unreadable)
    return Task(name="text-folder", domain="language", summary=f"byte-level language model on the text in {root}",
                model=language_model, train_data=train, eval_data=evaluate, metrics=language_metrics,
                target_metric="eval/bpb", target_value=target, models=GPT_MODELS,
                recipes=_adopted(RECIPES["pydocs"], "text-folder", ("baseline", "mild", "hot")))


# -- classification on a folder of images ----------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ImageArrays:
    """A folder's images decoded once, resized, as uint8 tensors; per-channel mean/std of the training part."""
    train_x: torch.Tensor
    train_y: torch.Tensor
    val_x: torch.Tensor
    val_y: torch.Tensor
    classes: tuple[str, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    skipped: tuple[tuple[str, str], ...] = ()  # (path, why) of images that could not be decoded, left out


@functools.lru_cache(maxsize=2)
def load_image_folder(data: str, image_size: int, val_fraction: float, seed: int,
                      skip_unreadable: bool = False) -> ImageArrays:
    """``data/train`` and ``data/val`` (or ``valid``/``test``) class folders, or one set of class folders
    split ``val_fraction`` per class with ``seed`` (see ``speedkit.data.images.decode_images``)."""
    root = Path(data).expanduser()
    decode = functools.partial(_decode, image_size=image_size, where=f"image-folder {root}",
                               skip_unreadable=skip_unreadable)
    val_dir = next((root / name for name in ("val", "valid", "validation", "test") if (root / name).is_dir()), None)
    if (root / "train").is_dir() and val_dir is not None:
        train, val = image_folder(root / "train"), image_folder(val_dir)
        if train.classes != val.classes:
            raise ValueError(f"{root}: train/ has classes {train.classes} but {val_dir.name}/ has {val.classes}; "
                             f"both need the same class folders")
        (train_x, train_y, skipped), (val_x, val_y, skipped_val) = decode(train), decode(val)
        skipped += skipped_val
    else:
        if (root / "train").is_dir():
            raise FileNotFoundError(f"{root} has train/ but no val/ beside it; add val/<class>/ images, or put the "
                                    f"class folders directly in {root} to split them")
        everything = image_folder(root)
        train = everything
        x, y, skipped = decode(everything)
        val_index = stratified_indices(y, val_fraction, seed)
        is_val = torch.zeros(len(y), dtype=torch.bool)
        is_val[val_index] = True
        train_x, train_y, val_x, val_y = x[~is_val], y[~is_val], x[is_val], y[is_val]
    scaled = train_x.float() / 255
    return ImageArrays(train_x, train_y, val_x, val_y, tuple(train.classes),
                       tuple(scaled.mean(dim=(0, 2, 3)).tolist()), tuple(scaled.std(dim=(0, 2, 3)).clamp_min(1e-3).tolist()),
                       skipped=tuple(skipped))


def _decode(dataset, **options) -> tuple[torch.Tensor, torch.Tensor, tuple]:
    """Every image of an ImageFolder as uint8 [N, C, size, size], labels, and the images left out."""
    decoded = decode_images(dataset.samples, **options)
    return decoded.x, decoded.y, decoded.skipped


def _image_folder_recipes(task: str) -> dict:
    common = dict(task=task, domain="vision", model="resnet9", batch_size=64, loader="memory",
                  optimizer={"name": "sgd", "lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 5e-4},
                  schedule={"name": "cosine", "warmup": "0.1dur"}, augment={"crop_pad": 2, "flip": "random"})
    return {
        "baseline": Recipe(name="baseline", duration="10ep", precision="fp32",
                           summary="SGD+Nesterov, cosine with warmup, fp32, crop+flip, images in memory", **common),
        "mild": Recipe(name="mild", duration="6ep", precision="auto",
                       methods={"channels_last": {}, "label_smoothing": {"smoothing": 0.1}},
                       summary="the baseline with bf16 autocast where fast, channels_last and label smoothing, "
                               "in fewer epochs", **common),
    }


def image_folder_task(data, image_size: int = 32, val_fraction: float = 0.1, seed: int = 0,
                      target: float = 0.9, skip_unreadable: bool = False) -> Task:
    """Classify the images in class folders under DIR (train/ and val/, or split per class), resized square.

    ``data/train/<class>/`` and ``data/val/<class>/``, or ``data/<class>/`` split ``val_fraction`` per class
    with ``seed``; images resized to ``image_size`` square (4 to 1024); ``target`` is the accuracy to reach.
    An image that cannot be decoded is refused naming its path, or left out and counted with
    ``skip_unreadable=True``."""
    check_image_size(image_size)
    arrays = load_image_folder(str(Path(data).expanduser().resolve()), image_size, val_fraction, seed,
                               skip_unreadable)
    if arrays.skipped:
        warnings.warn(f"image-folder {data}: left out {len(arrays.skipped)} image(s) that cannot be decoded: "
                      + ", ".join(path for path, _ in arrays.skipped[:5]) + (" ..." if len(arrays.skipped) > 5 else ""),
                      stacklevel=2)
    if len(arrays.classes) < 2:
        raise ValueError(f"{data} holds one class folder ({arrays.classes[0]!r}); a classifier needs at least two")
    if len(arrays.val_y) == 0:
        raise ValueError(f"{data}: no images left for validation; add images or raise val_fraction")
    channels = arrays.train_x.shape[1]

    def loader(x, y, request: DataRequest, train: bool) -> BatchLoader:
        if train and request.data_fraction < 1.0:
            keep = stratified_indices(y, request.data_fraction, request.seed)
            x, y = x[keep], y[keep]
        if not train and request.eval_fraction:
            keep = stratified_indices(y, request.eval_fraction, request.seed)
            x, y = x[keep], y[keep]
        return BatchLoader(x, y, request.batch_size, shuffle=train, device=request.device, seed=request.seed,
                           augment=_augment(request.recipe) if train else None, mean=arrays.mean, std=arrays.std)

    return Task(name="image-folder", domain="vision",
                summary=f"{len(arrays.classes)}-class images from {data}, {image_size}x{image_size}, {channels} channel(s)"
                        + (f", {len(arrays.skipped)} unreadable image(s) left out" if arrays.skipped else ""),
                model=vision_model_factory(channels, len(arrays.classes)),
                train_data=lambda request: loader(arrays.train_x, arrays.train_y, request, train=True),
                eval_data=lambda request: loader(arrays.val_x, arrays.val_y, request, train=False),
                metrics=classification_metrics, target_metric="eval/accuracy", target_value=target,
                recipes=_image_folder_recipes("image-folder"), models=("resnet9", "resnet8", *LIBRARY_MODELS))


BUILT_IN_TASKS = (FASHION_MNIST, PYDOCS)
FOLDER_TASKS = {"image-folder": image_folder_task, "text-folder": text_folder_task}
__all__ = ["BUILT_IN_TASKS", "FASHION_MNIST", "FOLDER_TASKS", "PYDOCS", "fashion_mnist_torch_loader",
           "image_folder_task", "load_image_folder", "text_folder_task", "vision_model_factory"]
