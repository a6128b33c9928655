"""``speedkit env``: what a bug report needs, in one block to paste.

Versions (speedkit, Python, torch and the optional packages speedkit works with), the processor and its
instruction sets, the accelerators, what ``precision="auto"`` picks here and the bf16 speed-up it measured
to decide, the data speedkit finds on its own, and the settings that change a run (threads, open files, CI).
Nothing here trains; the bf16 probe takes about a third of a second.
"""
from __future__ import annotations

import os
import platform
from importlib import metadata

# Optional packages speedkit works with, by distribution name (read from metadata: nothing is imported);
# "a|b": the first of these distributions that is installed (mlflow also ships as mlflow-skinny).
OPTIONAL = ("torchvision", "lightning", "accelerate", "transformers", "torchao", "optuna", "safetensors",
            "torchmetrics", "timm", "tensorboard", "mlflow|mlflow-skinny", "wandb", "ipywidgets", "papermill", "tqdm")
ENV_SETTINGS = ("OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "SPEEDKIT_DATA", "SPEEDKIT_PROGRESS", "CI")
# What the CPU's flags say about fast bf16 (a hint only: "auto" decides by measuring).
BF16_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


# Installed is not importable: a torchvision built for another torch is listed by pip and fails on import
# (its compiled operators), and speedkit's image data needs it. These are imported to say so.
IMPORT_CHECKED = {"torchvision": "torchvision"}


def _version(distributions: str) -> str:
    for name in distributions.split("|"):
        try:
            version = metadata.version(name) + ("" if name == distributions.split("|")[0] else f" ({name})")
        except metadata.PackageNotFoundError:
            continue
        return version + _import_problem(name)
    return "not installed"


def _import_problem(name: str) -> str:
    """`` (installed, but does not import: ...)`` for a checked package that fails to import, else ``""``."""
    module = IMPORT_CHECKED.get(name)
    if module is None:
        return ""
    import importlib

    try:
        importlib.import_module(module)
    except Exception as e:  # any failure on import is what the report must show
        first = (str(e).splitlines() or [""])[0][:160]
        return f" (installed, but does not import: {type(e).__name__}: {first}; reinstall the build that matches torch)"
    return ""


def cpu_flags() -> set[str]:
    """The processor's feature flags (Linux /proc/cpuinfo; empty elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _open_files_limit() -> str:
    try:
        import resource
    except ImportError:  # Windows
        return "n/a"
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return f"{soft} (hard {hard})"


def _devices(torch) -> list[tuple[str, str]]:
    rows = [("cuda", f"{torch.cuda.device_count()} device(s), built for CUDA {torch.version.cuda}"
             if torch.cuda.is_available() else f"not available (torch built for CUDA {torch.version.cuda})")]
    for i in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
        props = torch.cuda.get_device_properties(i)
        rows.append((f"  cuda:{i}", f"{props.name}, {props.total_memory / 2**30:.0f} GiB, compute capability "
                     f"{props.major}.{props.minor}, bf16 {'yes' if torch.cuda.is_bf16_supported() else 'no'}"))
    mps = getattr(torch.backends, "mps", None)
    rows.append(("mps", "available" if mps is not None and mps.is_available() else "not available"))
    return rows


def _precision(torch) -> list[tuple[str, str]]:
    from speedkit.core.devices import BF16_MIN_SPEEDUP, cpu_bf16_speedup, resolve_device, resolve_precision

    device = resolve_device("auto")
    rows = [("auto device", str(device)), ("auto precision", resolve_precision("auto", device))]
    if device.type == "cpu":
        speedup = cpu_bf16_speedup(torch.get_num_threads())
        rows.append(("cpu bf16 speed-up", f"{speedup:.2f}x over fp32, measured now (auto picks bf16 at "
                                          f">= {BF16_MIN_SPEEDUP}x)"))
    return rows


def _data() -> list[tuple[str, str]]:
    from speedkit.data.fashion_mnist import locate_fashion_mnist
    from speedkit.data.text import DEFAULT_TEXT_ROOT

    try:
        fashion = str(os.path.dirname(next(iter(locate_fashion_mnist().values()))))
    except FileNotFoundError:
        fashion = "not found (apt-get install dataset-fashion-mnist, or set SPEEDKIT_DATA)"
    docs = str(DEFAULT_TEXT_ROOT) if DEFAULT_TEXT_ROOT.is_dir() else "not found (apt-get install python3.11-doc)"
    return [("fashion-mnist", fashion), ("pydocs text", docs)]


def environment_rows() -> list[tuple[str, str]]:
    """(name, value) pairs, in the order ``speedkit env`` prints them."""
    import torch

    from speedkit.record.runs import cpu_name
    from speedkit.version import __version__

    flags = cpu_flags()
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    rows = [("speedkit", __version__), ("python", platform.python_version()), ("platform", platform.platform()),
            ("torch", torch.__version__)]
    rows += [(names.split("|")[0], _version(names)) for names in OPTIONAL]
    rows += [("cpu", cpu_name() or platform.processor() or "unknown"),
             ("cpu cores", f"{os.cpu_count()} ({affinity} usable here); torch threads {torch.get_num_threads()}"),
             ("cpu flags", ", ".join(f for f in BF16_FLAGS if f in flags) or "none of " + ", ".join(BF16_FLAGS))]
    rows += _devices(torch) + _precision(torch) + _data()
    rows.append(("open files limit", _open_files_limit()))
    rows += [(name, os.environ[name]) for name in ENV_SETTINGS if name in os.environ]
    return rows


def environment_report() -> str:
    rows = environment_rows()
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)



def add_parser(commands) -> None:
    commands.add_parser("env", help="what a bug report needs: versions, devices, bf16 speed measured here, data found",
                        allow_abbrev=False)


def run(args) -> int:
    print(environment_report())
    return 0


__all__ = ["cpu_flags", "environment_report", "environment_rows"]
