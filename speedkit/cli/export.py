"""Trained weights for other tools: a run's checkpoint written as a plain state dict.

``export_weights(run)`` writes ``model.safetensors`` (read with ``safetensors.torch.load_file``) or ``model.pt``
(read with ``torch.load(path, weights_only=True)``); either loads with ``model.load_state_dict`` into a fresh
model of the run's architecture. Which weights:

- a run that finished (completed, stopped, target reached) ran FIT_END, where EMA and SWA load their average
  into the model, so its last checkpoint already holds the weights the run ended with;
- a checkpoint written before that (an interval checkpoint, an interrupted or terminated run) holds the raw
  weights and the methods' averages beside them: the export takes the average FIT_END would have loaded
  (SWA's before EMA's, as at FIT_END; EMA's only with ``final_weights="ema"``).

Surgery: tensors are written contiguous (``channels_last`` is a memory layout, not a different model) and
each under its own name (a tied weight is written under both names, so ``load_state_dict`` with
``strict=True`` fills both). Methods that change the model's structure (``squeeze_excite`` adds layers,
``weight_standardization`` renames weights to ``parametrizations.weight.original``) or its computation
with the same names (``blurpool`` blurs before strided convolutions) cannot be undone on a state dict
exactly. A fresh model must have the same methods applied first, with the run's parameters, through
their functional forms (``speedkit.functional``): ``sf.apply_blurpool(model, **params)`` and so on.
:attr:`ExportResult.model_methods` lists them, a safetensors file carries them in its metadata
(key ``"speedkit.model_methods"``), and the CLI prints them.
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from speedkit.version import __version__

# Imported where used (torch, the record, the checkpoint reader), so that the command line's parser, built from
# add_parser below, imports nothing heavy.

FORMATS = {"safetensors": "model.safetensors", "pt": "model.pt"}
FINISHED = ("completed", "stopped", "target_reached")  # statuses whose last checkpoint was written after FIT_END


@dataclasses.dataclass
class ExportResult:
    path: Path
    format: str
    weights: str  # which tensors were written: "model", or the averaging method's name ("ema", "swa")
    checkpoint: Path
    model_methods: list  # [{"name", "params"}] of the run's methods that change the model; a fresh model needs them

    def instructions(self) -> str:
        """What a user runs to load the file, surgery included."""
        reader = ("safetensors.torch.load_file(path)" if self.format == "safetensors"
                  else "torch.load(path, weights_only=True)")
        lines = [f"wrote {self.path} ({self.weights} weights from {self.checkpoint})",
                 f"load: model.load_state_dict({reader})"]
        if self.model_methods:
            calls = "; ".join(f"{m['name']}({m['params']})" for m in self.model_methods)
            lines.append(f"this run changed the model ({calls}): apply the same methods to the fresh model first, "
                         f"through speedkit.functional (e.g. sf.apply_blurpool(model, **params)), then load")
        return "\n".join(lines)


def find_checkpoint(run: str | os.PathLike) -> Path:
    """The checkpoint of ``run``: a ``.ckpt`` file, or a run folder (its record's last checkpoint, else
    ``checkpoints/latest.ckpt``). The record names a checkpoint inside the run folder relative to it, so a
    copied or moved run folder gives its own checkpoint."""
    from speedkit.record.runs import RunRecord
    from speedkit.train.checkpoint import LATEST

    run = Path(run)
    if run.is_file():
        return run
    if not run.is_dir():
        raise FileNotFoundError(f"no run at {run}: pass a run folder (runs/NAME) or a .ckpt file")
    candidates = []
    if (run / "record.json").is_file():
        last = RunRecord.load(run).last_checkpoint  # this folder's own, even when the folder was copied or moved
        if last is not None:
            candidates.append(last)
    candidates.append(run / "checkpoints" / LATEST)
    for path in candidates:
        if path.is_file():
            return path
    raise FileNotFoundError(f"{run} has no checkpoint (looked for {', '.join(map(str, candidates))}); the run "
                            f"was trained with save_checkpoints=False, or its checkpoints are in its save_folder: "
                            f"pass that .ckpt file")


def export_weights(run: str | os.PathLike, out: str | os.PathLike | None = None, format: str = "safetensors",
                   weights: str = "auto") -> ExportResult:
    """Write the trained weights of ``run`` (a run folder or a ``.ckpt`` file) to ``out`` (default: beside the
    checkpoints, ``<run folder>/model.safetensors`` or ``model.pt``). ``weights``: ``auto`` (the weights the run
    ended with, see the module notes), ``model``, or an averaging method's name (``ema``, ``swa``, or a registered
    method of one's own) to pick one set."""
    from speedkit.record.runs import RunRecord, atomic_write_bytes
    from speedkit.train.checkpoint import read

    if format not in FORMATS:
        raise ValueError(f"format must be one of {sorted(FORMATS)}, got {format!r}")
    if weights not in ("auto", "model") and weights not in _averaging_method_names():
        raise ValueError(f"weights must be 'auto', 'model' or an averaging method's name "
                         f"({', '.join(_averaging_method_names())}), got {weights!r}")
    checkpoint = find_checkpoint(run)
    if out is not None:
        _check_out(Path(out), checkpoint)
    contents = read(checkpoint)  # FSDP shards come back as whole tensors in this process
    record = RunRecord.from_dict(contents.record_dict)
    source, chosen = _choose_weights(contents, record, weights, checkpoint)
    tensors = _plain_tensors(chosen)
    out = Path(out) if out else _default_out(run, checkpoint, format)
    model_methods = _model_methods(record)
    if format == "safetensors":
        _write_safetensors(out, tensors, {"speedkit.version": __version__, "speedkit.run": record.name,
                                          "speedkit.weights": source,
                                          "speedkit.model_methods": json.dumps(model_methods)})
    else:
        atomic_write_bytes(out, _torch_bytes(tensors))
    return ExportResult(out, format, source, checkpoint, model_methods)


def _choose_weights(contents, record, weights: str,
                    checkpoint: Path) -> tuple[str, dict]:
    """Which weights to write and the tensors: the model's, or an averaging method's, asked through the method's
    own interface (``Method.averaged_weights``, ``ends_with_average``) rebuilt from the record and the checkpoint."""
    methods = _averaging_methods(contents, record)
    if weights not in ("auto", "model"):
        if weights not in methods:
            raise ValueError(f"{checkpoint} holds no {weights} average (the run did not use {weights}, or it had "
                             f"not started averaging); choose weights='model' or one of {sorted(methods)}")
        return weights, methods[weights].averaged_weights()
    if weights == "auto" and record.status not in FINISHED:
        # The average FIT_END would have loaded; the last in run order wins, as at FIT_END (SWA's over EMA's).
        ending = [name for name, method in methods.items() if method.ends_with_average()]
        if ending:
            return ending[-1], methods[ending[-1]].averaged_weights()
    return "model", contents.model  # a finished run's FIT_END already loaded the average its methods chose


def _averaging_methods(contents, record) -> dict:
    """The run's methods that hold averaged weights in this checkpoint, by name, in run order."""
    from speedkit.core.method import order_methods
    from speedkit.methods import REGISTRY, get_method

    built = []
    for entry in record.methods:
        name = entry.get("name")
        if name not in REGISTRY or name not in contents.methods:
            continue
        method = get_method(name, **entry.get("params", {}))
        method.load_state_dict(contents.methods[name])
        built.append(method)
    return {m.name: m for m in order_methods(built) if m.averaged_weights() is not None}


def _averaging_method_names() -> list[str]:
    from speedkit.core.method import Method
    from speedkit.methods import REGISTRY

    return sorted(name for name, cls in REGISTRY.items() if cls.averaged_weights is not Method.averaged_weights)


def _plain_tensors(state_dict: dict) -> dict:
    """CPU, contiguous, one storage per name: what safetensors writes and any model can load."""
    import torch

    return {name: t.detach().to("cpu").contiguous().clone() for name, t in state_dict.items()
            if isinstance(t, torch.Tensor)}


# Methods that write the model without changing what a fresh one needs to load and run the weights: a memory
# layout (tensors are written contiguous), compilation in place, which parameters train, initial values only,
# and norms that keep their parameters and only compute in lower precision.
LOADS_AS_IS = ("channels_last", "torch_compile", "layer_freezing", "identity_init", "low_precision_groupnorm",
               "low_precision_layernorm")


def _model_methods(record) -> list:
    from speedkit.methods import REGISTRY

    return [m for m in record.methods if m.get("name") in REGISTRY and "model" in REGISTRY[m["name"]].CARD.writes
            and m["name"] not in LOADS_AS_IS]


def _check_out(out: Path, checkpoint: Path) -> None:
    """Refuse an ``out`` that is a folder, or that would replace a run's own files (its checkpoints, record, log):
    an export writes a new file, it never replaces what a resume or a report reads."""
    from speedkit.train.checkpoint import LATEST

    if out.is_dir():
        raise IsADirectoryError(f"export --out {out} is a folder; name the file to write, such as "
                                f"{out / 'model.safetensors'}")
    ours = out.suffix in (".ckpt", ".unusable") or out.name in ("record.json", "log.jsonl", "run.lock")
    try:
        ours = ours or os.path.samefile(out, checkpoint)
    except OSError:
        pass
    if ours or out.parent.name == "checkpoints" and (out.parent / LATEST).exists():
        raise ValueError(f"export --out {out} would replace a run's own file (its checkpoints, record or log, which "
                         f"a resume reads); write the weights elsewhere, e.g. {checkpoint.parent.parent / 'model.safetensors'}")


def _default_out(run, checkpoint: Path, format: str) -> Path:
    run = Path(run)
    folder = run if run.is_dir() else checkpoint.parent
    if folder.name == "checkpoints":
        folder = folder.parent
    return folder / FORMATS[format]


def _write_safetensors(out: Path, tensors: dict, metadata: dict) -> None:
    from speedkit.record.runs import atomic_write_bytes

    try:
        from safetensors.torch import save
    except ImportError:
        raise ImportError("format='safetensors' needs the safetensors package: pip install 'torch-speedkit[export]' "
                          "(or use format='pt')") from None
    atomic_write_bytes(out, save(tensors, metadata=metadata))


def _torch_bytes(tensors: dict) -> bytes:
    import io

    import torch

    buffer = io.BytesIO()
    torch.save(tensors, buffer)
    return buffer.getvalue()


def add_parser(commands) -> None:
    export = commands.add_parser("export", allow_abbrev=False, help="write a run's trained weights for other tools (safetensors, pt)",
                                 description="Writes the weights the run ended with (EMA/SWA averages where it used "
                                             "them) as a plain state dict that safetensors.torch.load_file or "
                                             "torch.load(weights_only=True) reads into a fresh model.")
    export.add_argument("run", help="a run folder (runs/NAME) or a .ckpt file")
    export.add_argument("--format", default="safetensors", choices=["safetensors", "pt"],
                        help="safetensors (default) or pt (torch.save of the state dict)")
    export.add_argument("--out", help="file to write (default: model.safetensors or model.pt in the run folder)")
    # Not a fixed list: export_weights checks the name, and any registered averaging method (one's own too) is one.
    export.add_argument("--weights", default="auto",
                        help="auto (default): what the run ended with; or one set from the checkpoint: model (the "
                             "raw weights), or an averaging method's name: ema, swa, or a registered one of yours")


def run(args) -> int:
    print(export_weights(args.run, out=args.out, format=args.format, weights=args.weights).instructions())
    return 0


__all__ = ["ExportResult", "export_weights", "find_checkpoint"]
