"""``speedkit train | demo``: the command line over the same make_trainer the notebooks use."""
from __future__ import annotations

import argparse
import sys


def _catalogue() -> str:
    from speedkit.algorithms import REGISTRY
    from speedkit.models import list_models
    from speedkit.recipes import RECIPES
    from speedkit.tasks import TASKS

    lines = ["tasks:"]
    lines += [f"  {name:<14} {spec.summary} (target {spec.target_metric} {spec.target_value})"
              for name, spec in TASKS.items()]
    lines.append("recipes:")
    lines += [f"  {task:<14} {', '.join(recipes)}" for task, recipes in RECIPES.items()]
    lines.append("models:\n  " + ", ".join(list_models()))
    lines.append("methods:")
    lines += [f"  {name:<18} {cls.CARD.summary}" for name, cls in sorted(REGISTRY.items())]
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="speedkit", description="Faster PyTorch training by composing "
                                     "speed-up methods.", epilog=_catalogue(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)

    train = commands.add_parser("train", help="train a task with a recipe and methods",
                                epilog=_catalogue(), formatter_class=argparse.RawDescriptionHelpFormatter)
    train.add_argument("--task", default="fashion-mnist")
    train.add_argument("--recipe", default="baseline", help="preset to start from (see below)")
    train.add_argument("--model", help="model name, overriding the recipe's")
    train.add_argument("--duration", help="training budget such as 3ep, 500ba, 90s")
    train.add_argument("--algorithms", "--methods", dest="methods",
                       help="comma-separated methods, replacing the recipe's (use '' for none)")
    train.add_argument("--precision", choices=["fp32", "bf16", "fp16", "auto"])
    train.add_argument("--batch-size", type=int)
    train.add_argument("--device", default="auto")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--data-fraction", type=float, default=1.0, help="train on this class-balanced fraction")
    train.add_argument("--eval-fraction", type=float, help="evaluate on this fraction of the test set")
    train.add_argument("--target", type=float, help="target value of the task's metric")
    train.add_argument("--stop-at-target", action="store_true", help="end the run when the target is reached")
    train.add_argument("--run-dir", default="runs")
    train.add_argument("--run-name")
    train.add_argument("--autoresume", action="store_true", help="continue the named run from its checkpoint")
    train.add_argument("--download", action="store_true", help="let torchvision download missing data")
    train.add_argument("--no-progress", action="store_true", help="no progress bar")

    methods = commands.add_parser("methods", help="the method catalogue, from the cards")
    methods.add_argument("--markdown", action="store_true", help="print the README's markdown table")
    methods.add_argument("name", nargs="?", help="show one method's whole card")

    demo = commands.add_parser("demo", help="baseline vs a speed-up recipe on Fashion-MNIST, side by side")
    demo.add_argument("--duration", default=None, help="budget for both runs (default: the demo's)")
    demo.add_argument("--data-fraction", type=float, default=None)
    demo.add_argument("--run-dir", default="runs/demo")
    demo.add_argument("--device", default="auto")
    return parser


def _summary(record) -> str:
    metrics = "  ".join(f"{k}={v:.4f}" for k, v in record.final_metrics.items() if isinstance(v, float))
    reached = record.time_to_target
    target = (f"  {record.target['metric']} {record.target['value']} reached after {reached:.1f}s"
              if record.target and reached is not None else "")
    return (f"{record.status}: {record.timings.get('train_s', 0):.1f}s training "
            f"({record.timings.get('eval_s', 0):.1f}s eval apart)  {metrics}{target}\nrecord: {record.path}")


def _train(args) -> int:
    from speedkit.tasks import make_trainer

    trainer = make_trainer(args.task, args.recipe, model=args.model, duration=args.duration,
                           methods=args.methods, precision=args.precision, batch_size=args.batch_size,
                           device=args.device, seed=args.seed, data_fraction=args.data_fraction,
                           eval_fraction=args.eval_fraction, target=args.target,
                           stop_at_target=args.stop_at_target, download=args.download, run_dir=args.run_dir,
                           run_name=args.run_name, autoresume=args.autoresume,
                           progress_bar=not args.no_progress, console=True)
    record = trainer.fit()
    print(_summary(record))
    return 0


def _methods(args) -> int:
    import json

    from speedkit.algorithms import REGISTRY, get_algorithm, methods_table

    if args.name:
        print(json.dumps(get_algorithm(args.name).CARD.to_dict(), indent=2, default=str))
    elif args.markdown:
        print(methods_table())
    else:
        for name, cls in REGISTRY.items():
            print(f"{name:<26} {cls.CARD.domain:<9} {cls.CARD.summary}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "train":
            return _train(args)
        if args.command == "methods":
            return _methods(args)
        if args.command == "demo":
            from speedkit.demo import run_demo

            run_demo(duration=args.duration, data_fraction=args.data_fraction, run_dir=args.run_dir,
                     device=args.device)
            return 0
    except (ValueError, TypeError, FileNotFoundError) as e:
        print(f"speedkit: error: {e}", file=sys.stderr)
        return 2
    return 1


if __name__ == "__main__":
    sys.exit(main())
