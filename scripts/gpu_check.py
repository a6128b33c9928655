"""speedkit's two prepared GPU checks, each one call of a lent GPU (issue 54; bench/README.md, "On a GPU").

    scripts/gpu_check.sh next                 # the first check not yet run on this code (what a lease runs)
    scripts/gpu_check.sh throughput           # at most about 5 minutes (scripts/gpu_throughput.py)
    scripts/gpu_check.sh time-to-target       # at most about 9 minutes (scripts/gpu_time_to_target.py)
    python scripts/gpu_check.py throughput --device cpu --tiny    # the same parts at tiny scale (CI runs this)

Each check is a list of named parts run top to bottom; ``next`` also runs, on the same code, the parts an earlier
lease's time budget left out. After each part the check rewrites ``CHECK.json`` and ``CHECK.md`` in its results
folder (``bench/results/<date>-gpu-<device>/``, a study folder; under ``$OUT`` when the device tool runs it,
whose files come back to this machine), so a check stopped at its limit keeps what it finished. A part
that fails is reported with its error and the others still run; a part that does not fit the check's time
budget, or cannot be prepared, is skipped with its reason. A part's ``ok`` says that it ran as meant; what it
found short of issue 54's requirements (a graph break in a preset's compiled run, a host wait or a blocking
host-to-device copy in a quiet step, a compiled step of more than 1.3x its baseline's kernels) it lists in
``unmet``, which the results' top level and ``CHECK.md`` collect. Every result carries the code it ran on (the
git commit where there is one, and a hash of speedkit's source and these scripts, which travel without git).

How it measures (DESIGN.md principle 8): a timed run carries no counter and no profiler, and records the
dispatch modes active while it was timed (none) to prove it; it is timed with CUDA events after warm-up (on a
CPU, ``time.perf_counter``), its compile time apart. Host syncs and blocking host-to-device copies are counted
in separate short runs with ``SyncCounter``.
"""
from __future__ import annotations

import datetime
import hashlib
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHECKS = ("throughput", "time-to-target")
MODULES = {"throughput": "gpu_throughput", "time-to-target": "gpu_time_to_target"}


# -- what code a result ran on ------------------------------------------------------------------------------

def code_version() -> dict:
    """The git commit (where git and the repository are there) and a hash of speedkit's source and the check
    scripts: the device tool sends the working tree without ``.git``, so the hash is what says "this code"."""
    digest = hashlib.sha256()
    files = sorted([*(ROOT / "speedkit").rglob("*.py"), *(ROOT / "speedkit").rglob("*.yaml"),
                    *(ROOT / "scripts").glob("gpu_*")])
    for path in files:
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    changed = git("status", "--porcelain", "--", "speedkit", "scripts") if commit else None
    return {"commit": commit or os.environ.get("SPEEDKIT_COMMIT"), "code_hash": digest.hexdigest()[:16],
            "uncommitted_changes": bool(changed) if commit else None}


def earlier_runs(check: str, results_root: Path = ROOT / "bench" / "results") -> list[dict]:
    """Every committed run of ``check`` (``*gpu-*/CHECK.json``: a results folder may be renamed with a date in
    front), tiny ones left out."""
    found = []
    for path in sorted(results_root.glob(f"*gpu-*/{check}.json")):
        try:
            result = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not result.get("tiny"):
            found.append(result)
    return found


def next_check(code_hash: str, results_root: Path = ROOT / "bench" / "results") -> tuple[str | None, set | None]:
    """The first check not yet run in full on this code (``code_hash``), and its parts still to run: None for all
    of them (no run yet), else those every earlier run left out for its time budget or did not reach before it
    was stopped (a lease goes on where the last one stopped). ``(None, None)`` when both have run in full."""
    for check in CHECKS:
        runs = [run for run in earlier_runs(check, results_root) if run.get("code", {}).get("code_hash") == code_hash]
        if not runs:
            return check, None
        parts = [run.get("parts", {}) for run in runs]
        measured = {name for found in parts for name, part in found.items() if "skipped" not in part}
        left_out = {name for found in parts for name, part in found.items() if part.get("retry")} - measured
        if left_out:
            return check, left_out
    return None, None


# -- where results go and what they hold ---------------------------------------------------------------------

def device_slug(device: str) -> str:
    """``h100``, ``h200``, ... from the GPU's name; ``cpu`` on a CPU."""
    if not device.startswith("cuda"):
        return "cpu"
    import torch

    name = torch.cuda.get_device_name().lower()
    for word in name.replace("nvidia", "").split():
        if any(ch.isdigit() for ch in word):
            return "".join(ch for ch in word if ch.isalnum())
    return "gpu"


def results_folder(out: str | None, device: str, check: str) -> Path:
    """``out``, else ``<date>-gpu-<device>/`` (a dated study folder) under ``$OUT`` (the device tool's folder that
    comes back) or under ``bench/results/``, with ``-2``, ``-3``, ... where that folder holds this check already
    (a second lease that day goes on with the parts the first left out)."""
    if out:
        return Path(out)
    committed = ROOT / "bench" / "results"
    root = Path(os.environ["OUT"]) if os.environ.get("OUT") else committed
    name = f"{datetime.date.today().isoformat()}-gpu-{device_slug(device)}"
    candidates = (name if number == 1 else f"{name}-{number}" for number in range(1, 1000))
    return root / next(c for c in candidates if not any((base / c / f"{check}.json").exists()
                                                         for base in (root, committed)))


def instruments() -> dict:
    """What is attached to torch right now: a timed run must show no torch-function mode, no dispatch mode (a
    ``SyncCounter``, a ``FlopCounterMode``) and no profiler."""
    import torch
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    return {"torch_function_mode": bool(torch._C._is_torch_function_mode_enabled()),
            "dispatch_modes": [type(mode).__name__ for mode in _get_current_dispatch_mode_stack()],
            "profiler": bool(torch._C._autograd._profiler_enabled())}


def nothing_attached(seen: dict) -> bool:
    return not seen["torch_function_mode"] and not seen["dispatch_modes"] and not seen["profiler"]


class Results:
    """One check's results file, ``CHECK.json`` (and ``CHECK.md``), rewritten after each part."""

    def __init__(self, folder: Path, check: str, device: str, tiny: bool, budget_s: float):
        import torch

        self.folder, self.check, self.budget_s, self.started = folder, check, budget_s, time.perf_counter()
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / f"{check}.json"
        self.data = {"check": check, "code": code_version(), "tiny": tiny, "device": device,
                     "device_name": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu",
                     "torch": torch.__version__, "date": datetime.datetime.now().isoformat(timespec="seconds"),
                     "budget_s": budget_s, "seconds": 0.0, "finished": False, "parts": {}}
        self.write()

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def plan(self, names: list[str]) -> None:
        """The parts this run means to run, each marked not reached until it runs: a check stopped at its limit
        says which parts the next lease on this code must run (``next_check``)."""
        for name in names:
            self.data["parts"][name] = {"skipped": "not reached: the check stopped before this part", "retry": True}
        self.write()

    def part(self, name: str, work, needs_s: float = 0.0):
        """Run ``work()`` as part ``name`` and write the results; skipped with its reason when the budget left is
        under ``needs_s``; its error recorded when it fails. Returns what ``work`` returned (None if it did not)."""
        left = self.budget_s - self.elapsed()
        if needs_s > left:
            return self.skip(name, f"about {needs_s:.0f} s needed, {max(0.0, left):.0f} s of the check's "
                                   f"{self.budget_s:.0f} s budget left", retry=True)
        print(f"gpu-check {self.check}: {name} ...", flush=True)
        started = time.perf_counter()
        try:
            result = work()
        except Exception as error:  # noqa: BLE001 -- recorded; the check's other parts still run
            traceback.print_exc()
            result = {"ok": False, "error": f"{type(error).__name__}: {error}"[:2000],
                      "traceback": traceback.format_exc()[-3000:]}
        self.data["parts"][name] = {**result, "part_s": round(time.perf_counter() - started, 1)}
        self.write()
        return result

    def add_unmet(self, name: str, unmet: list[str]) -> None:
        """What part ``name`` falls short of, found once the parts after it could be set beside it."""
        part = self.data["parts"][name]
        part["unmet"] = [*part.get("unmet", []), *unmet]
        self.write()

    def skip(self, name: str, reason: str, retry: bool = False) -> None:
        """Part ``name`` left out for ``reason``; ``retry``: the next lease on this code runs it (``next_check``)."""
        print(f"gpu-check {self.check}: {name} skipped: {reason}", flush=True)
        self.data["parts"][name] = {"skipped": reason, "retry": retry}
        self.write()

    def finish(self) -> bool:
        parts = self.data["parts"].values()
        self.data["finished"] = True
        self.data["ok"] = all(p.get("ok", True) for p in parts if "skipped" not in p)
        self.data["unmet"] = {name: part["unmet"] for name, part in self.data["parts"].items() if part.get("unmet")}
        self.write()
        return self.data["ok"]

    def write(self) -> None:
        self.data["seconds"] = round(self.elapsed(), 1)
        self.path.write_text(json.dumps(self.data, indent=1, default=str) + "\n")
        lines = [f"# speedkit GPU check `{self.check}`: {self.data['device_name']}", "",
                 f"{self.data['date']}, torch {self.data['torch']}, code {self.data['code']}, "
                 f"{self.data['seconds']} s{' (tiny)' if self.data['tiny'] else ''}", ""]
        for name, part in self.data["parts"].items():
            if "skipped" in part:
                lines.append(f"- **{name}**: skipped: {part['skipped']}")
            elif "error" in part:
                lines.append(f"- **{name}**: FAILED: {part['error'][:200]}")
            else:
                unmet = f" **UNMET**: {'; '.join(part['unmet'])}" if part.get("unmet") else ""
                lines.append(f"- **{name}** ({part['part_s']} s): {part.get('headline', 'done')}{unmet}")
        (self.folder / f"{self.check}.md").write_text("\n".join(lines) + "\n")


# -- timing ----------------------------------------------------------------------------------------------

class StepClock:
    """Times steps after warm-up with CUDA events (no host sync until ``result``), on a CPU with perf_counter;
    records what was attached to torch at the first and last timed step."""

    def __init__(self, device, warmup: int):
        import torch

        self.cuda = torch.device(device).type == "cuda"
        self.warmup, self.ticks, self.marks, self.seen = warmup, 0, [], []

    def tick(self) -> None:
        """Call once after each step is queued."""
        import torch

        self.ticks += 1
        if self.ticks < self.warmup:
            return
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())
        if len(self.seen) < 2:
            self.seen.append(instruments())
        else:
            self.seen[1] = instruments()

    def result(self) -> dict:
        """Seconds per timed step (the steps after warm-up), and the instruments seen while they ran."""
        import torch

        if len(self.marks) < 2:
            raise RuntimeError(f"too few steps to time: {self.ticks} steps, {self.warmup} of them warm-up")
        if self.cuda:
            torch.cuda.synchronize()
            total = self.marks[0].elapsed_time(self.marks[-1]) / 1000
        else:
            total = self.marks[-1] - self.marks[0]
        return {"timed_steps": len(self.marks) - 1, "step_s": total / (len(self.marks) - 1),
                "timer": "cuda events" if self.cuda else "perf_counter",
                "instruments_at_timing": self.seen[0],
                "nothing_attached": all(nothing_attached(seen) for seen in self.seen)}


def dynamo_counts() -> dict:
    """Frames TorchDynamo compiled and graph breaks so far (``torch._dynamo.utils.counters``)."""
    from torch._dynamo.utils import counters

    return {"frames": int(counters["frames"]["ok"]), "graph_breaks": int(sum(counters["graph_break"].values())),
            "unique_graphs": int(counters["stats"]["unique_graphs"])}


def fresh_dynamo() -> None:
    """Forget compiled code and counters, so each compiled run counts its own frames and recompiles."""
    import torch
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("check", choices=(*CHECKS, "next"), help="which check; next: the first not yet run here")
    parser.add_argument("--device", default="cuda", help="cuda (the check), or cpu with --tiny (its CI test)")
    parser.add_argument("--tiny", action="store_true", help="every part at tiny scale, for a CPU")
    parser.add_argument("--out", default=None, help="the results folder (default: bench/results/gpu-DEVICE-DATE, "
                                                    "under $OUT when that is set)")
    parser.add_argument("--only", default=None, help="comma-separated parts to run (default: all; `preset` names "
                                                     "every preset of the throughput check)")
    args = parser.parse_args(argv)
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu-check: no CUDA GPU here (torch.cuda.is_available() is False); nothing was checked. Run it on a "
              "machine with a GPU, or pass --device cpu --tiny to exercise its parts", file=sys.stderr)
        return 2
    check, only = args.check, set(args.only.split(",")) if args.only else None
    if check == "next":
        check, only = next_check(code_version()["code_hash"])
        if check is None:
            print("gpu-check: both checks have run in full on this code (bench/results/gpu-*/); nothing to do")
            return 0
        print(f"gpu-check: next is {check}" + (f", parts {sorted(only)}" if only else ""), flush=True)
    sys.path.insert(0, str(ROOT / "scripts"))
    module = __import__(MODULES[check])
    settings = module.settings(args.tiny)
    folder = results_folder(args.out, args.device, check)
    if (folder / f"{check}.json").exists():  # a run's figures are never overwritten
        parser.error(f"{folder / (check + '.json')} holds an earlier run of this check; give this one its own "
                     f"folder: --out DIR")
    results = Results(folder, check, args.device, args.tiny, settings.budget_s)
    module.run(results, settings, args.device, only=only)
    ok = results.finish()
    print((results.folder / f"{check}.md").read_text())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
