"""One short run per method against the same run without it, at an equal budget.

Vision methods (and "any" methods) run on Fashion-MNIST from the `mild` recipe with its methods
removed; language methods on the byte-level GPT from the `pydocs` baseline. One seed each: these are
indications of direction and cost, not benchmark results (those come from `speedkit bench`).

    python bench/results/2026-11-29-method-effects/method_effects.py --out runs/method-effects [--only mixup,cutmix]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from speedkit.methods import REGISTRY
from speedkit.tasks import make_trainer

VISION = dict(task="fashion-mnist", recipe="mild", duration="1ep", data_fraction=0.5)
LANGUAGE = dict(task="pydocs", recipe="baseline", duration="100ba", batch_size=16, eval_fraction=0.25)
# Methods whose defaults do not fit the short run, and the parameters used instead.
PARAMS: dict[str, dict] = {"factorize": {"min_channels": 64}}


def run(setup: dict, methods: dict, out: Path, name: str) -> dict:
    options = dict(setup)
    task, recipe = options.pop("task"), options.pop("recipe")
    trainer = make_trainer(task, recipe, methods=methods, device="cpu", run_dir=out, run_name=name,
                           save_checkpoints=False, **options)
    record = trainer.fit()
    metric = "eval/accuracy" if task == "fashion-mnist" else "eval/bpb"
    return {"metric": metric, "value": record.final_metrics[metric], "train_s": record.timings["train_s"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="runs/method-effects")
    parser.add_argument("--only", help="comma-separated method names")
    args = parser.parse_args()
    out = Path(args.out)
    names = args.only.split(",") if args.only else list(REGISTRY)
    bases = {"vision": run(VISION, {}, out, "base-vision"), "language": run(LANGUAGE, {}, out, "base-language")}
    results = {}
    for name in names:
        domain = "language" if REGISTRY[name].CARD.domain == "language" else "vision"
        setup = LANGUAGE if domain == "language" else VISION
        try:
            result = run(setup, {name: PARAMS.get(name, {})}, out, name)
        except Exception as e:  # a method that cannot apply to this task says why
            results[name] = {"error": f"{type(e).__name__}: {e}"}
            print(f"{name:<26} not applicable here: {e}", flush=True)
            continue
        base = bases[domain]
        result.update(base_value=base["value"], base_train_s=base["train_s"])
        results[name] = result
        print(f"{name:<26} {result['metric']} {result['value']:.4f} vs {base['value']:.4f} without; "
              f"{result['train_s']:.1f}s vs {base['train_s']:.1f}s", flush=True)
    (out / "effects.json").write_text(json.dumps({"bases": bases, "methods": results}, indent=1))
    print(f"bases: {bases}")


if __name__ == "__main__":
    main()
