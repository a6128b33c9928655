"""Tasks: a dataset, its metrics and its target, and where recipes become Trainer arguments.

The CLI, the demo, the notebooks and the benchmark all build their runs through ``make_trainer``,
so a configuration means the same thing everywhere. A hand-built Trainer takes a recipe's parts from
``recipe_parts``: the Trainer itself takes parts, never recipes, so a recipe is resolved here only.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch

from speedkit.algorithms import build_algorithms
from speedkit.data import Augment, FashionMNIST, TokenBatchLoader, fashion_mnist_loaders, load_text_corpus
from speedkit.data import load_fashion_mnist, stratified_indices
from speedkit.devices import resolve_device
from speedkit.metrics import Accuracy, BitsPerByte, CrossEntropy, Evaluator
from speedkit.models import get_model
from speedkit.optim.factory import make_optimizer_factory
from speedkit.recipes import Recipe, get_recipe, resolve_recipe
from speedkit.trainer import Trainer


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    name: str
    domain: str
    summary: str
    target_metric: str
    target_value: float
    models: tuple[str, ...]  # the models that fit its data (input channels, classes or vocabulary)


TASKS = {
    "fashion-mnist": TaskSpec("fashion-mnist", "vision", "Fashion-MNIST 28x28 clothing images, 10 classes",
                              "eval/accuracy", 0.92, ("resnet8", "resnet9")),
    "pydocs": TaskSpec("pydocs", "language", "byte-level language model on the Python documentation sources",
                       "eval/bpb", 2.0, ("gpt-nano", "gpt-micro", "gpt-mini", "gpt-small")),
}


def get_task(name: str) -> TaskSpec:
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known tasks: {sorted(TASKS)}")
    return TASKS[name]


def model_fit_problem(spec: TaskSpec, model: str) -> str | None:
    """Why ``model`` does not fit the task's data (channels, classes, vocabulary), or None when it does."""
    if model not in spec.models:
        return f"model {model!r} does not fit task {spec.name!r}; use one of {list(spec.models)}"
    return None


# -- data ----------------------------------------------------------------------------------
def fashion_mnist_torch_loader(batch_size: int, augment: dict | None, data_fraction: float, seed: int,
                               num_workers: int = 0, download: bool = False):
    """The hand-written baseline's input pipeline: a torchvision transform per image and a DataLoader.

    Under torchrun each rank reads batch_size / world_size samples per step through a
    ``DistributedSampler`` (the Trainer calls its ``set_epoch``), so the global batch stays ``batch_size``.
    """
    import torchvision.transforms as T

    from speedkit import distributed

    arrays = load_fashion_mnist(download=download)
    steps = []
    if augment and augment.get("crop_pad"):
        steps.append(T.RandomCrop(28, padding=augment["crop_pad"], padding_mode="reflect"))
    if augment and augment.get("flip"):
        steps.append(T.RandomHorizontalFlip())
    steps += [T.ToTensor(), T.Normalize((arrays.mean,), (arrays.std,))]
    dataset = FashionMNIST(train=True, transform=T.Compose(steps), download=download)
    if data_fraction < 1.0:
        dataset = torch.utils.data.Subset(dataset, stratified_indices(arrays.train_y, data_fraction, seed).tolist())
    world = distributed.world_size()
    if world == 1:
        return torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=num_workers,
                                           persistent_workers=num_workers > 0)
    if batch_size % world:
        raise ValueError(f"batch_size={batch_size} is the global batch size and must split evenly over "
                         f"world_size={world} ranks; use a multiple of {world}")
    sampler = torch.utils.data.DistributedSampler(dataset, num_replicas=world, rank=distributed.rank(),
                                                  shuffle=True, seed=seed)
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size // world, sampler=sampler,
                                       num_workers=num_workers, persistent_workers=num_workers > 0)


def make_loaders(task: str, recipe: Recipe, device: torch.device, data_fraction: float = 1.0, seed: int = 0,
                 eval_fraction: float | None = None, download: bool = False, num_workers: int = 0,
                 seq_len: int | None = None):
    """(train loader, evaluators) for a task and recipe. Evaluation data is the same for every recipe."""
    if not 0 < data_fraction <= 1:
        raise ValueError(f"data_fraction must be in (0, 1], got {data_fraction}")
    if task == "fashion-mnist":
        augment = Augment(**recipe.augment) if recipe.augment else None
        train, test = fashion_mnist_loaders(batch_size=recipe.batch_size, device=device, augment=augment,
                                            data_fraction=data_fraction, seed=seed, eval_fraction=eval_fraction,
                                            download=download)
        if recipe.loader == "torch":
            train = fashion_mnist_torch_loader(recipe.batch_size, recipe.augment, data_fraction, seed,
                                               num_workers=num_workers, download=download)
        return train, [Evaluator(test, {"accuracy": Accuracy(), "loss": CrossEntropy()})]
    if task == "pydocs":
        corpus = load_text_corpus(seed=seed)
        seq_len = seq_len or 256
        train_tokens = corpus.train[: max(seq_len + 1, int(len(corpus.train) * data_fraction))]
        train = TokenBatchLoader(train_tokens, seq_len, recipe.batch_size, seed=seed, device=device)
        eval_batches = max(1, int(64 * (eval_fraction or 1.0)))
        val = TokenBatchLoader(corpus.val, seq_len, 32, steps_per_epoch=eval_batches, shuffle=False, device=device)
        return train, [Evaluator(val, {"bpb": BitsPerByte(), "loss": CrossEntropy()})]
    raise ValueError(f"unknown task {task!r}; known tasks: {sorted(TASKS)}")


# -- recipes into Trainer arguments -------------------------------------------------------------
def recipe_parts(recipe: str | Recipe, model: torch.nn.Module | None = None, *,
                 max_duration: str | None = None, optimizers=None, schedulers=None, algorithms=None,
                 precision: str | None = None, config: dict | None = None) -> dict:
    """The Trainer arguments a recipe supplies, with the ones given here winning over the recipe's.

    ``recipe`` is a Recipe, ``"task:name"`` or a bare name picked by ``model``'s domain (vision or
    language): ``Trainer(model, data, **recipe_parts("mild", model, max_duration="2ep"))``.
    """
    recipe = resolve_recipe(recipe, model)
    return {"max_duration": max_duration or recipe.duration,
            "optimizers": optimizers or make_optimizer_factory(recipe.optimizer),
            "schedulers": recipe.schedule if schedulers is None else schedulers,
            "algorithms": build_algorithms(recipe.methods) if algorithms is None else algorithms,
            "precision": precision or recipe.precision,
            "config": {"recipe": recipe.name, "recipe_spec": recipe.to_dict(), **(config or {})}}


# -- the one way to build a run -----------------------------------------------------------------
def make_trainer(task: str = "fashion-mnist", recipe: str | Recipe = "baseline", *, model: str | None = None,
                 duration: str | None = None, methods: Any = None, precision: str | None = None,
                 batch_size: int | None = None, eval_interval: str | None = None, device: str = "auto", seed: int = 0,
                 data_fraction: float = 1.0,
                 eval_fraction: float | None = None, target: float | None = None, stop_at_target: bool = False,
                 download: bool = False, num_workers: int = 0, extra_config: dict | None = None,
                 **trainer_kwargs) -> Trainer:
    """A Trainer for ``task`` configured by ``recipe``; keyword arguments override the recipe's fields.

    ``extra_config`` is stored in the RunRecord's config beside the task and recipe (the benchmark
    marks seeds and leave-one-out runs this way).
    """
    spec = get_task(task)
    recipe = get_recipe(task, recipe).with_changes(model=model, duration=duration, precision=precision,
                                                   batch_size=batch_size, eval_interval=eval_interval)
    if methods is not None:
        recipe = recipe.with_changes(methods=_methods_dict(methods))
    problem = model_fit_problem(spec, recipe.model)
    if problem:
        raise ValueError(problem)
    device = resolve_device(device)
    torch.manual_seed(seed)  # the same initial weights for every recipe with the same seed
    net = get_model(recipe.model, **({"num_classes": 10} if spec.domain == "vision" else {}))
    seq_len = net.config.block_size if spec.domain == "language" else None
    train, evaluators = make_loaders(task, recipe, device, data_fraction, seed, eval_fraction, download,
                                     num_workers, seq_len)
    target_value = target if target is not None else recipe_target(spec, recipe)
    config = {"task": task, "data_fraction": data_fraction,
              "target": {"metric": spec.target_metric, "value": target_value}, **(extra_config or {})}
    trainer = Trainer(
        net, train, evaluators=evaluators, **recipe_parts(recipe, net, config=config), device=device, seed=seed,
        eval_interval=recipe.eval_interval, stop_at=(spec.target_metric, target_value) if stop_at_target else None,
        **trainer_kwargs)
    trainer.record.target = {"metric": spec.target_metric, "value": target_value}
    return trainer


def recipe_target(spec: TaskSpec, recipe: Recipe) -> float:
    """The target a run of ``recipe`` is measured against: the one it was tuned for, else the task's."""
    if recipe.target is None:
        return spec.target_value
    if recipe.target["metric"] != spec.target_metric:
        raise ValueError(f"recipe {recipe.name!r} targets {recipe.target['metric']}, but task {spec.name!r} "
                         f"measures {spec.target_metric}; set the recipe's target metric to {spec.target_metric!r}")
    return recipe.target["value"]


def _methods_dict(methods) -> dict:
    if isinstance(methods, dict):
        return methods
    if isinstance(methods, str):
        methods = [m.strip() for m in methods.split(",") if m.strip()]
    return {name: {} for name in methods}
