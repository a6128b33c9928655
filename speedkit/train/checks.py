"""Checks of what a user hands the Trainer: its arguments when it is built, and the first batch against the model.

Every refusal is a ValueError (a value out of bounds) or a TypeError (the wrong kind of thing) whose
message starts with the argument's name and says what was expected. ``check_trainer_arguments`` (the
Trainer's arguments by name, each checked explicitly) runs once in ``Trainer.__init__``; the first-batch
checks run on the first training step of a fit only, so every later step pays nothing for them.
"""
from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from speedkit.core.batch import batch_inputs, batch_targets, is_dict_batch, output_logits, output_loss
from speedkit.core.method import show  # repr cut short, never failing
from speedkit.core.time import Time, TimeUnit
from speedkit.record.run_folder import run_folder_path

_DEVICE = re.compile(r"^(auto|cpu|mps|cuda(:(0|[1-9][0-9]{0,3}))?)$")
_DEVICE_TYPES = ("cpu", "cuda", "mps")
_INDEX_DTYPES = (torch.int64, torch.uint8)  # the class-index dtypes F.cross_entropy takes
IGNORE_INDEX = -100  # F.cross_entropy's default: labels equal to it are left out of the loss




def _kind(value: Any) -> str:
    return f"{type(value).__name__} {show(value)}"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# -- single arguments ---------------------------------------------------------------------------
def check_duration(name: str, value: Any, *, optional: bool, fraction_ok: bool) -> Time | None:
    """A positive duration (``"3ep"``, ``"500ba"``, ``"0.25dur"`` if ``fraction_ok``, ``"90s"``) or a Time."""
    if value is None:
        if optional:
            return None
        raise TypeError(f"{name} must be a duration such as '1ep', '500ba' or '0.25dur', got None")
    if isinstance(value, bool) or not isinstance(value, (str, Time)):
        hint = (f"; a bare number has no unit: write e.g. '{show(value)}ep' or '{show(value)}ba'"
                if _is_number(value) else "")
        raise TypeError(f"{name} must be a duration string such as '3ep', '500ba' or '90s' (or a Time), "
                        f"got {_kind(value)}{hint}")
    try:
        time = Time.from_input(value)
    except (ValueError, TypeError) as e:
        raise type(e)(f"{name}: {e}") from None
    if time.unit is TimeUnit.DURATION and not fraction_ok:
        raise ValueError(f"{name}={time} is a fraction of the run itself; give it in ep, ba, sp, tok or s")
    if time.value <= 0:
        raise ValueError(f"{name} must be longer than zero, got {show(value)}")
    return time


def check_whole(name: str, value: Any, low: int = 1, high: int | None = None) -> int:
    """A whole number (not a bool) in ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a whole number >= {low}, got {_kind(value)}")
    if value < low or (high is not None and value > high):
        bounds = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be a whole number {bounds}, got {show(value)}")
    return int(value)


def check_loader(name: str, loader: Any, *, optional: bool = True) -> None:
    """An iterable of batches (a DataLoader or speedkit loader) that is not known to be empty."""
    if loader is None:
        if optional:
            return
        raise TypeError(f"{name} must be an iterable of batches such as a DataLoader, got None")
    if isinstance(loader, torch.utils.data.Dataset) and not isinstance(loader, torch.utils.data.IterableDataset):
        raise TypeError(f"{name} got a {type(loader).__name__} (a dataset, which yields single samples); "
                        f"wrap it in a DataLoader: torch.utils.data.DataLoader(dataset, batch_size=...)")
    if isinstance(loader, (str, bytes, Mapping, torch.Tensor)) or not isinstance(loader, Iterable):
        raise TypeError(f"{name} must be an iterable of batches such as a DataLoader, got {_kind(loader)}")
    try:
        size = len(loader)
    except (TypeError, NotImplementedError):  # no length (a generator, an iterable dataset's loader)
        return
    if size == 0:
        raise ValueError(f"{name} is empty: it yields no batches (is the dataset empty, or smaller than the "
                         f"batch size with drop_last=True?)")


def check_device(device: Any) -> None:
    """``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:N"`` (one this machine has), ``"mps"`` or a torch.device."""
    if isinstance(device, torch.device):
        if device.type not in _DEVICE_TYPES:
            raise ValueError(f"device must be one of 'auto', 'cpu', 'cuda[:N]', 'mps', got torch.device({device})")
        return
    if not isinstance(device, str):
        raise TypeError(f"device must be 'auto', 'cpu', 'cuda', 'cuda:N', 'mps' or a torch.device, got {_kind(device)}")
    if not _DEVICE.match(device):
        raise ValueError(f"device must be one of ('auto', 'cpu', 'cuda', 'mps') (optionally 'cuda:N'), "
                         f"got {show(device)}")
    index = int(device.partition(":")[2] or 0)
    if device.startswith("cuda") and torch.cuda.is_available() and index >= torch.cuda.device_count():
        raise ValueError(f"device={device!r}: this machine has {torch.cuda.device_count()} CUDA device(s), "
                         f"cuda:0 to cuda:{torch.cuda.device_count() - 1}")


def _check_stop_at(stop_at: Any, has_evaluation: bool) -> None:
    if stop_at is None:
        return
    example = "('eval/accuracy', 0.92) or {'metric': 'eval/accuracy', 'value': 0.92}"
    if isinstance(stop_at, Mapping):
        keys = set(stop_at)
        if keys != {"metric", "value"}:
            raise ValueError(f"stop_at as a dict needs exactly the keys 'metric' and 'value' ({example}), "
                             f"got keys {sorted(map(show, keys))}")
        metric, value = stop_at["metric"], stop_at["value"]
    elif isinstance(stop_at, (tuple, list)):
        if len(stop_at) != 2:
            raise ValueError(f"stop_at must be a pair (metric, value) such as {example}, got {show(stop_at)}")
        metric, value = stop_at
    else:
        raise TypeError(f"stop_at must be a pair (metric, value) such as {example}, got {_kind(stop_at)}")
    if not isinstance(metric, str) or "/" not in metric:
        raise ValueError(f"stop_at's metric must be a logged name such as 'eval/accuracy', got {_kind(metric)}")
    if not _is_number(value) or not math.isfinite(value):
        raise TypeError(f"stop_at's value must be a finite number (the target for {metric}), got {_kind(value)}")
    if not has_evaluation:
        raise ValueError(f"stop_at={show(stop_at)} needs evaluation to see {metric}: pass eval_dataloader "
                         f"or evaluators")


def _check_sequence(name: str, items: Any, ok, expected: str) -> None:
    if isinstance(items, (str, bytes, Mapping)) or not isinstance(items, Iterable):
        raise TypeError(f"{name} must be a list of {expected}, got {_kind(items)}")
    if not isinstance(items, (list, tuple)):
        return  # a one-shot iterable: looking would use it up
    for i, item in enumerate(items):
        if not ok(item):
            raise TypeError(f"{name}[{i}] must be {expected}, got {_kind(item)}")


def _is_path(value: Any) -> bool:
    return isinstance(value, (str, os.PathLike))


# -- the Trainer's arguments --------------------------------------------------------------------
def check_trainer_arguments(arguments: Mapping[str, Any]) -> None:
    """Check the arguments of ``Trainer.__init__``, by name as it received them (its ``locals()`` on entry,
    so its signature and defaults are stated once, there); raise on the first bad one."""
    from speedkit.record.metrics import Evaluator

    a = arguments
    model, train_dataloader, eval_dataloader, evaluators = (a["model"], a["train_dataloader"], a["eval_dataloader"],
                                                            a["evaluators"])
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    check_loader("train_dataloader", train_dataloader)
    check_loader("eval_dataloader", eval_dataloader)
    _check_sequence("evaluators", evaluators, lambda e: isinstance(e, Evaluator), "speedkit.record.metrics.Evaluator objects")
    for i, evaluator in enumerate(evaluators if isinstance(evaluators, (list, tuple)) else ()):
        check_loader(f"evaluators[{i}].dataloader", evaluator.dataloader, optional=False)
    max_duration = check_duration("max_duration", a["max_duration"], optional=True, fraction_ok=False)
    check_duration("eval_interval", a["eval_interval"], optional=False, fraction_ok=True)
    check_duration("save_interval", a["save_interval"], optional=True, fraction_ok=True)
    _check_schedule_scale(a["schedule_scale"], max_duration)
    _check_counts(a["grad_accum"], a["log_interval"], a["keep_checkpoints"], a["microbatch_size"], a["seed"])
    check_precision("precision", a["precision"], optional=True)
    check_device(a["device"])
    _check_nan_policy(a["nan_policy"])
    has_evaluation = eval_dataloader is not None or not isinstance(evaluators, (list, tuple)) or bool(evaluators)
    _check_stop_at(a["stop_at"], has_evaluation)
    _check_parts(a["methods"], a["callbacks"], a["loggers"], a["loss_fn"])
    if a["progress_bar"] != "auto" and not isinstance(a["progress_bar"], bool):
        raise TypeError(f"progress_bar must be True, False or 'auto' (a bar when a terminal or notebook shows the "
                        f"run), got {_kind(a['progress_bar'])}")
    for name in ("deterministic", "save_checkpoints", "autoresume", "overwrite", "extend_duration", "console"):
        if not isinstance(a[name], bool):
            raise TypeError(f"{name} must be True or False, got {_kind(a[name])}")
    _check_run_folder_choice(a["autoresume"], a["overwrite"], a["extend_duration"], max_duration)
    _check_paths(a["run_name"], a["run_dir"], a["save_folder"], a["load_path"])
    if a["config"] is not None and not isinstance(a["config"], Mapping):
        raise TypeError(f"config must be a dict or None, got {_kind(a['config'])}")


def check_precision(name: str, precision: Any, *, optional: bool) -> str | None:
    """One of ``speedkit.core.devices.PRECISIONS`` (or None where ``optional``)."""
    from speedkit.core.devices import PRECISIONS

    if precision is None and optional:
        return None
    if not isinstance(precision, str):
        raise TypeError(f"{name} must be one of {PRECISIONS}{' or None' if optional else ''}, got {_kind(precision)}")
    if precision not in PRECISIONS:
        raise ValueError(f"{name} must be one of {PRECISIONS}, got {show(precision)}")
    return precision


def _check_counts(grad_accum, log_interval, keep_checkpoints, microbatch_size, seed) -> None:
    check_whole("grad_accum", grad_accum)
    check_whole("log_interval", log_interval)
    check_whole("keep_checkpoints", keep_checkpoints)
    if microbatch_size is not None and not (isinstance(microbatch_size, str) and microbatch_size == "auto"):
        if isinstance(microbatch_size, str):
            raise ValueError(f"microbatch_size must be a whole number >= 1, 'auto' or None, "
                             f"got {show(microbatch_size)}")
        check_whole("microbatch_size", microbatch_size)
    check_whole("seed", seed, low=0, high=2**32 - 1)


def _check_schedule_scale(scale: Any, max_duration: Time | None) -> None:
    if not _is_number(scale):
        raise TypeError(f"schedule_scale must be a positive number, got {_kind(scale)}")
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"schedule_scale must be a positive finite number, got {show(scale)}")
    if max_duration is None:
        return
    try:
        scaled = max_duration * float(scale)
    except (ValueError, OverflowError) as e:
        raise ValueError(f"schedule_scale={show(scale)} stretches max_duration={max_duration} too far: "
                         f"{e}") from None
    if scaled.value <= 0:
        raise ValueError(f"schedule_scale={show(scale)} shrinks max_duration={max_duration} to nothing; "
                         f"use a larger scale or a longer max_duration")


def _check_nan_policy(nan_policy: Any) -> None:
    from speedkit.callbacks import NaNGuard

    if nan_policy is not None and (not isinstance(nan_policy, str) or nan_policy not in NaNGuard.POLICIES):
        raise ValueError(f"nan_policy must be one of {NaNGuard.POLICIES} or None, got {_kind(nan_policy)}")


def check_schedulers(schedulers: list, optimizers: list[torch.optim.Optimizer]) -> None:
    """The Trainer's schedules once made (``speedkit.train.parts.make_schedules``): speedkit schedules or the
    user's torch LR schedulers, not both (each would set every group's lr at every step), and a torch scheduler
    drives one of the Trainer's ``optimizers`` (else it would step an optimizer nothing trains)."""
    from speedkit.optim import Schedule
    from speedkit.optim.follow import TORCH_SCHEDULERS

    torch_schedulers = [s for s in schedulers if isinstance(s, TORCH_SCHEDULERS)]
    ours = [s.name for s in schedulers if isinstance(s, Schedule)]
    if torch_schedulers and ours:
        raise ValueError(f"schedulers holds speedkit schedules ({', '.join(ours)}) and torch LR schedulers "
                         f"({', '.join(type(s).__name__ for s in torch_schedulers)}): both would set the learning "
                         f"rate at every step; keep one kind")
    for scheduler in torch_schedulers:
        if all(scheduler.optimizer is not optimizer for optimizer in optimizers):
            raise ValueError(f"schedulers: your {type(scheduler).__name__} drives an optimizer this Trainer was not "
                             f"given; build it on the optimizer you pass as optimizers= (an optimizer object, not a "
                             f"factory)")


def _check_parts(methods, callbacks, loggers, loss_fn) -> None:
    from speedkit.core.method import Method

    if methods is not None:
        _check_sequence("methods", methods, lambda a: isinstance(a, Method),
                        "Method objects (speedkit.methods.get_method('name', ...) builds one by name)")
    _check_sequence("callbacks", callbacks, lambda c: callable(getattr(c, "run_event", None)),
                    "speedkit.callbacks.Callback objects")
    check_loggers(loggers)
    if loss_fn is not None and not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable as loss_fn(outputs, targets), got {_kind(loss_fn)}")


def check_loggers(loggers) -> None:
    """A list of logger destinations or the names of the built-in ones."""
    from speedkit.record.loggers import NAMED_LOGGERS, check_logger_name

    _check_sequence("loggers", loggers,
                    lambda d: isinstance(d, str) or all(callable(getattr(d, m, None))
                                                        for m in ("log_metrics", "log_text", "close")),
                    f"speedkit.record.loggers.LoggerDestination objects or names ({', '.join(NAMED_LOGGERS)})")
    names = [d for d in loggers if isinstance(d, str)] if isinstance(loggers, (list, tuple)) else []
    for name in names:  # refused up front, with the names it could have been
        check_logger_name(name)


def _check_run_folder_choice(autoresume: bool, overwrite: bool, extend_duration: bool, max_duration) -> None:
    """What to do with a run folder that holds an earlier run: continue it or replace it, not both."""
    if autoresume and overwrite:
        raise ValueError("autoresume=True (--autoresume) continues the run in its folder and overwrite=True "
                         "(--overwrite) deletes it: choose one")
    if extend_duration and not autoresume:
        raise ValueError("extend_duration=True (--extend-duration) lengthens a run being continued: use it with "
                         "autoresume=True (--autoresume)")
    if extend_duration and max_duration is None:
        raise ValueError("extend_duration=True (--extend-duration) needs the new, longer max_duration (--duration)")


def check_run_name(run_name) -> None:
    """None, or a folder name under run_dir."""
    if run_name is not None:
        if not isinstance(run_name, str):
            raise TypeError(f"run_name must be a string (a folder name under run_dir) or None, got {_kind(run_name)}")
        if run_name.strip() in (".", "..") or "\x00" in run_name:
            raise ValueError(f"run_name must name a folder under run_dir, got {show(run_name)}")


def _check_paths(run_name, run_dir, save_folder, load_path) -> None:
    check_run_name(run_name)
    if run_name is not None and _is_path(run_dir):
        run_folder_path(run_dir, run_name)  # refuses '../x' and absolute paths
    if not _is_path(run_dir):
        raise TypeError(f"run_dir must be a path (str or os.PathLike), got {_kind(run_dir)}")
    for name, path in (("save_folder", save_folder), ("load_path", load_path)):
        if path is not None and not _is_path(path):
            raise TypeError(f"{name} must be a path (str or os.PathLike) or None, got {_kind(path)}")


# -- the first training batch -------------------------------------------------------------------
def describe(value: Any) -> str:
    """A batch (or part of one) as shapes and dtypes: ``([32, 1, 28, 28] float32, [32] int64)``."""
    if isinstance(value, torch.Tensor):
        return f"{list(value.shape)} {str(value.dtype).removeprefix('torch.')}"
    if isinstance(value, (list, tuple)):
        inner = ", ".join(describe(v) for v in value[:4]) + (", ..." if len(value) > 4 else "")
        return f"({inner})" if isinstance(value, tuple) else f"[{inner}]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{show(k, 20)}: {describe(v)}" for k, v in list(value.items())[:4]) + "}"
    return _kind(value)


def _model_name(model: torch.nn.Module) -> str:
    return type(model).__name__


def check_first_batch(state, tokens: int) -> None:
    """The first batch a fit trains on: it holds samples, and carries tokens if durations count them.

    A duration in ``tok`` over batches without tokens (or ``sp`` over empty batches) would never end.
    """
    batch = state.batch
    first = batch_inputs(batch)  # a dict without an inputs key is refused here, naming its keys
    if not isinstance(first, torch.Tensor) or first.dim() == 0:
        raise TypeError(f"train_dataloader's batches must be a tensor, a tuple (inputs, targets, ...) whose "
                        f"first item is a batched tensor [batch, ...], or a dict of tensors with the inputs under "
                        f"'input_ids' or 'pixel_values'; the first batch is {describe(batch)}")
    if first.shape[0] == 0:
        raise ValueError(f"train_dataloader's first batch holds no samples: {describe(batch)}")
    if tokens == 0 and not state.tokens_per_batch:
        in_tokens = [("max_duration", state.max_duration)]
        in_tokens += [(f"eval_interval of evaluator {ev.label!r}", ev.interval) for ev in state.evaluators]
        # Callbacks say which durations they count in (Callback.durations); duck-typed ones may not.
        in_tokens += [item for cb in state.callbacks for item in getattr(cb, "durations", dict)().items()]
        for name, time in in_tokens:
            if time is not None and time.unit is TimeUnit.TOKEN:
                raise ValueError(f"{name}={time} counts tokens, but the batches carry none (their inputs "
                                 f"{describe(first)} are not integer token ids); give it in ep, ba, sp or s")


def check_first_outputs(state, default_loss: bool) -> None:
    """Before the first loss: with the default cross-entropy, the labels must fit the model's outputs.

    Index labels ``[B]`` (or ``[B, T]``) in ``[0, classes)``, or class probabilities shaped like the logits.
    Checked here rather than left to ``F.cross_entropy``, whose errors (an IndexError on CPU, a device-side
    assert on CUDA) do not say which batch or model.
    """
    if not default_loss or output_loss(state.outputs) is not None:  # a model that computes its own loss
        return
    batch, outputs, model = state.batch, output_logits(state.outputs), _model_name(state.model)
    custom = "or pass loss_fn=... for a different loss"
    targets = batch_targets(batch)
    if targets is None and is_dict_batch(batch):
        raise ValueError(f"the first batch is {describe(batch)} with no 'labels' and {model} computed no loss of its "
                         f"own (no .loss in its output); add the labels under 'labels', {custom}")
    if targets is None:
        raise ValueError(f"the default cross-entropy loss needs (inputs, targets) batches, but the first batch is "
                         f"{describe(batch)}; yield (inputs, labels) from the loader, {custom}")
    if not isinstance(outputs, torch.Tensor) or not outputs.is_floating_point() or outputs.dim() < 2:
        raise ValueError(f"{model} returned {describe(outputs)} for inputs {describe(batch_inputs(batch))}; the default "
                         f"cross-entropy loss needs logits [batch, classes] (or [batch, time, classes]); "
                         f"return logits, {custom}")
    classes = outputs.shape[-1]
    if classes < 2:
        raise ValueError(f"{model} outputs {classes} class score per sample (logits {describe(outputs)}): "
                         f"cross-entropy over one class is always zero, so nothing would train; give the model "
                         f"one output per class, {custom}")
    expected = (f"class indices of shape {list(outputs.shape[:-1])} in [0, {classes - 1}] or class probabilities "
                f"of shape {list(outputs.shape)}")
    where = f"the first batch's labels {describe(targets)} do not fit {model}, which outputs {classes} classes " \
            f"(logits {describe(outputs)})"
    if not isinstance(targets, torch.Tensor):
        raise TypeError(f"the first batch's labels are {_kind(targets)}; expected a tensor of {expected}")
    if targets.is_floating_point():
        if targets.shape != outputs.shape:
            raise ValueError(f"{where}: float labels are class probabilities and must have shape "
                             f"{list(outputs.shape)}; for class indices use an integer tensor of shape "
                             f"{list(outputs.shape[:-1])}")
        if not bool(torch.isfinite(targets).all()) or bool((targets < 0).any()):
            raise ValueError(f"{where}: class probabilities must be finite and >= 0")
        return
    if targets.dtype not in _INDEX_DTYPES:
        hint = "; convert them with labels.long()" if not targets.is_complex() and targets.dtype != torch.bool else ""
        raise TypeError(f"{where}: labels of dtype {str(targets.dtype).removeprefix('torch.')}; expected int64 "
                        f"{expected}{hint}")
    if targets.shape != outputs.shape[:-1]:
        raise ValueError(f"{where}: expected {expected}")
    indices = targets.long()
    valid = ((indices >= 0) & (indices < classes)) | (indices == IGNORE_INDEX)
    if not bool(valid.all()):
        bad = indices[~valid]
        raise ValueError(f"{where}: {bad.numel()} of {targets.numel()} labels are outside [0, {classes - 1}] "
                         f"(from {int(bad.min())} to {int(bad.max())}); class indices must be in [0, {classes - 1}] "
                         f"({IGNORE_INDEX} marks positions to ignore)")


def check_first_loss(state, loss) -> None:
    """The first ``loss`` must be a single number that backward can start from."""
    if not isinstance(loss, torch.Tensor):
        raise TypeError(f"the loss must be a scalar tensor, but the loss function returned {_kind(loss)}")
    if loss.numel() != 1 or not loss.is_floating_point():
        raise ValueError(f"the loss must be a single floating-point number (a mean over the batch), but the loss "
                         f"function returned a tensor {describe(loss)}; reduce it with .mean()")
    if not loss.requires_grad and not state.skip_step:
        raise ValueError(f"the loss on the first batch does not depend on any trainable parameter of "
                         f"{_model_name(state.model)} (it has no gradient); is the forward pass run under "
                         f"torch.no_grad() or are its outputs detached?")


def is_out_of_memory(error: BaseException) -> bool:
    """CUDA's OutOfMemoryError, or another backend's RuntimeError that says 'out of memory' (MPS, HIP)."""
    return isinstance(error, torch.OutOfMemoryError) or "out of memory" in str(error).lower()


def explain_first_batch_error(state, stage: str, error: Exception) -> None:
    """The first step's forward or loss failed: raise it again as a ValueError that names the batch's
    shapes and the model. Out-of-memory errors are left alone (``microbatch_size="auto"`` handles them)."""
    if is_out_of_memory(error):
        return
    model, batch = _model_name(state.model), state.batch
    if stage == "forward":
        inputs = batch_inputs(batch)
        message = (f"the first training batch does not fit the model: {model} raised {type(error).__name__} on "
                   f"inputs {describe(inputs)} (the whole batch is {describe(batch)}): {error}")
    else:
        message = (f"the loss failed on the first training batch: {type(error).__name__}: {error} — {model} "
                   f"returned {describe(state.outputs)} and the batch is {describe(batch)}")
    raise ValueError(message) from error
