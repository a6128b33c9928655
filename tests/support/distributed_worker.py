"""What tests/train/test_distributed.py runs on two CPU processes (torchrun, gloo), and the builders it shares
with the one-process runs it compares against.

Run as ``torchrun --nproc-per-node 2 tests/support/distributed_worker.py OUT_DIR [SCENARIO ...]``; each scenario
writes its findings as JSON (rank 0) into OUT_DIR. One launch runs them all, because starting two
Python processes that import torch costs more than the training itself.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from helpers import leave_torchrun

from speedkit import Trainer
from speedkit.core import distributed
from speedkit.data import Augment, TokenBatchLoader, fashion_mnist_loaders
from speedkit.methods import EMA, GradientClipping, Muon
from speedkit.models import get_model
from speedkit.record.metrics import Accuracy, CrossEntropy, Evaluator

STEPS = 10
LR = 0.01
GLOBAL_BATCH = 64
EVAL_BATCH = 128  # 300 eval images: 128, 128, 44 globally, split unevenly on the last batch


def eval_metrics() -> dict:
    """speedkit's accuracy and loss, and torchmetrics' accuracy beside them where it is installed (it gathers
    its own states across ranks; tests/train/test_distributed.py fails under CI=true when it is missing)."""
    metrics = {"accuracy": Accuracy(), "loss": CrossEntropy()}
    try:
        from torchmetrics.classification import MulticlassAccuracy
    except ImportError:
        return metrics
    return {**metrics, "tm_accuracy": MulticlassAccuracy(num_classes=10, average="micro")}


def resnet_trainer(run_dir, run_name: str, steps: int = STEPS, **kwargs) -> Trainer:
    """The small ResNet on a real Fashion-MNIST slice, with the same seed, data and augmentations in one
    process or in several (where each rank takes its slice of every global batch)."""
    torch.manual_seed(0)
    model = get_model("resnet8", num_classes=10)
    train, test = fashion_mnist_loaders(batch_size=GLOBAL_BATCH, eval_batch_size=EVAL_BATCH, data_fraction=0.02,
                                        eval_fraction=0.03, seed=0, augment=Augment(crop_pad=2, flip="random"))
    return Trainer(model, train, evaluators=[Evaluator(test, eval_metrics())],
                   max_duration=f"{steps}ba", eval_interval="1000ba", log_interval=1, device="cpu",
                   precision="fp32", seed=0, deterministic=True, run_dir=run_dir, run_name=run_name,
                   optimizers=lambda p: torch.optim.SGD(p, lr=LR, momentum=0.9, nesterov=True, weight_decay=5e-4),
                   methods=[EMA(half_life="4ba", final_weights="model")], **kwargs)


def text_tokens() -> torch.Tensor:
    """Real English text that is always there: speedkit's own guide, as bytes (the README alone is short)."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "guide.md").read_bytes()
    return torch.frombuffer(bytearray(text), dtype=torch.uint8)


def gpt_trainer(run_dir, run_name: str, steps: int, methods=None, optimizers=None, **kwargs) -> Trainer:
    torch.manual_seed(0)
    model = get_model("gpt-nano")
    tokens = text_tokens()
    split = int(len(tokens) * 0.9)
    train = TokenBatchLoader(tokens[:split], seq_len=64, batch_size=8, seed=0)
    val = TokenBatchLoader(tokens[split:], seq_len=64, batch_size=8, shuffle=False, steps_per_epoch=3)
    return Trainer(model, train, evaluators=[Evaluator(val, {"loss": CrossEntropy()})], max_duration=f"{steps}ba",
                   eval_interval="1000ba", log_interval=1, device="cpu", precision="fp32", seed=0,
                   run_dir=run_dir, run_name=run_name, methods=[EMA(half_life="2ba")] if methods is None else methods,
                   optimizers=optimizers or (lambda p: torch.optim.AdamW(p, lr=3e-3, weight_decay=0.01)), **kwargs)


def losses(record) -> list[float]:
    return [step["loss"] for step in record.steps if "loss" in step]


def _ema_digest(trainer) -> list[float]:
    ema = next(a for a in trainer.state.methods if a.name == "ema")
    return [float(t.double().sum()) for t in ema.ema.values()]


def _unsynced(wrapped) -> float | None:
    """What a torchmetrics metric computes from this rank's states alone: what it would report without its sync."""
    if wrapped is None:
        return None
    metric = wrapped.metric
    metric._to_sync, metric._computed = False, None  # what compute() reads from sync_on_compute
    value = float(metric.compute())
    metric._to_sync, metric._computed = True, None
    return value


# -- scenarios (every rank runs each; rank 0 writes the result) ----------------------------------------
def ddp_resnet(out: Path) -> dict:
    trainer = resnet_trainer(out / "runs", "ddp-resnet")
    before = trainer.eval()["eval"]  # the initial weights, each rank on its shard of the eval set
    counted = trainer.state.evaluators[0].metrics["accuracy"].total
    shard_accuracy = distributed.all_gather_object(_unsynced(trainer.state.evaluators[0].metrics.get("tm_accuracy")))
    record = trainer.fit()
    model = trainer.state.model
    digests = distributed.all_gather_object(_ema_digest(trainer))
    params = distributed.all_gather_object([float(p.detach().double().sum()) for p in model.parameters()])
    return {"losses": losses(record), "eval_before": before, "eval_samples_counted": counted,
            "tm_shard_accuracy_by_rank": shard_accuracy,
            "final_metrics": record.final_metrics, "ema_by_rank": digests, "params_by_rank": params,
            "config": {k: record.config.get(k) for k in ("world_size", "parallel", "distributed", "batch_size")},
            "samples": trainer.state.timestamp.sample, "checkpoint": str(record.last_checkpoint),
            "sync_batchnorms": sum(type(m).__name__ == "CpuSyncBatchNorm" for m in model.modules()),
            "rank_files": sorted(p.name for p in (out / "runs" / "ddp-resnet").iterdir())}


def fsdp_gpt(out: Path) -> dict:
    from torch.distributed.tensor import DTensor

    trainer = gpt_trainer(out / "runs", "fsdp-gpt", steps=8, parallel="fsdp", save_interval="3ba")
    params = list(trainer.state.model.parameters())
    record = trainer.fit()
    full = {name: p.full_tensor() for name, p in trainer.state.model.named_parameters()}
    if distributed.is_main():
        torch.save(full, out / "fsdp_full_weights.pt")
    local_sizes = distributed.all_gather_object([p.to_local().numel() for p in params])
    # A fresh sharded run resumes from the sharded checkpoint at batch 6 and trains batches 7 and 8 again.
    middle = record.last_checkpoint.with_name("ba000000006.ckpt")
    resumed = gpt_trainer(out / "runs", "fsdp-gpt-resumed", steps=8, parallel="fsdp", load_path=middle)
    resumed_record = resumed.fit()
    return {"losses": losses(record), "all_dtensors": all(isinstance(p, DTensor) for p in params),
            "local_sizes_by_rank": local_sizes, "global_sizes": [p.numel() for p in params],
            "checkpoint": str(record.last_checkpoint), "resumed_losses": losses(resumed_record),
            "resumed_batches": resumed.state.timestamp.batch, "config": record.config.get("distributed"),
            "model_class": record.config.get("model"), "final_metrics": record.final_metrics,
            "checkpoint_files": sorted(p.name for p in record.last_checkpoint.parent.iterdir()),
            "ema_is_sharded": all(isinstance(t, DTensor) for t in
                                  next(a for a in resumed.state.methods if a.name == "ema").ema.values()
                                  if t.is_floating_point() and t.dim() > 0)}


# Methods that need a whole matrix or every gradient at once, where FSDP2 gives each rank a shard of both: Muon
# orthogonalizes each matrix, gradient clipping scales by the norm of all gradients together (under SGD, whose step
# follows that scale).
def whole_tensor_methods() -> dict:
    return {"methods": [Muon(), GradientClipping(clipping_threshold=0.5)],
            "optimizers": lambda params: torch.optim.SGD(params, lr=0.1)}


def fsdp_whole_tensors(out: Path) -> dict:
    trainer = gpt_trainer(out / "runs", "fsdp-whole-tensors", steps=4, parallel="fsdp", save_checkpoints=False,
                          **whole_tensor_methods())
    return {"losses": losses(trainer.fit())}


# Methods with global state or a varying set of used parameters, together under DDP: ghost batch norm
# (per-rank statistics, averaged), stochastic depth per batch and layer freezing (unused parameters),
# selective backprop (fewer samples, every rank still runs backward), SAM (a second forward/backward),
# SWA (a batch-norm pass at the end). What must hold: no rank waits forever, and all ranks end identical.
METHODS = {"ghost_batchnorm": {"ghost_batch_size": 8}, "stochastic_depth": {"drop_rate": 0.5, "mode": "block"},
           "layer_freezing": {"freeze_start": 0.0, "freeze_level": 0.5},
           "selective_backprop": {"start": 0.0, "end": 1.0, "keep": 0.5, "interrupt": 0},
           "sam": {"rho": 0.05}, "swa": {"swa_start": 0.5, "bn_update_batches": 2}}


def ddp_methods(out: Path) -> dict:
    from speedkit.methods import build_methods

    torch.manual_seed(0)
    model = get_model("resnet8", num_classes=10)
    train, test = fashion_mnist_loaders(batch_size=32, eval_batch_size=100, data_fraction=0.002, eval_fraction=0.01,
                                        seed=0)
    trainer = Trainer(model, train, eval_dataloader=test, max_duration="6ba", device="cpu", precision="fp32",
                      run_dir=out / "runs", run_name="ddp-methods", log_interval=1,
                      methods=build_methods(METHODS))
    record = trainer.fit()
    tensors = [float(t.detach().double().sum()) for t in trainer.state.model.state_dict().values()]
    return {"losses": losses(record), "weights_by_rank": distributed.all_gather_object(tensors),
            "distributed": record.config.get("distributed"), "status": record.status,
            "frozen": record.notes.get("layer_freezing"), "batches_per_epoch": trainer.state.batches_per_epoch,
            "final_metrics": record.final_metrics}


def auto_precision(out: Path) -> dict:
    """"auto" measures bf16 in each process; here rank 0 finds it fast and rank 1 slow. Both must train in rank 0's."""
    from speedkit.core import devices

    measured = devices.cpu_bf16_speedup
    devices.cpu_bf16_speedup = lambda threads=None: 2.0 if distributed.rank() == 0 else 0.5
    try:
        trainer = Trainer(get_model("resnet8", num_classes=10), device="cpu", precision="auto", run_dir=out / "runs",
                          run_name="auto-precision", save_checkpoints=False)
    finally:
        devices.cpu_bf16_speedup = measured
    return {"precision_by_rank": distributed.all_gather_object(trainer.state.precision)}


def surgery_order(out: Path) -> dict:
    """Squeeze-excite's surgery (its plain function, which has no check) on a model DDP wrapped first, and on one
    wrapped after it; each rank trains three steps on batches of its own. How far apart the ranks' weights end."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from speedkit.methods.squeeze_excite import apply_squeeze_excite

    distributed.init_distributed()
    apart = {}
    for order in ("wrapped_first", "surgery_first"):
        torch.manual_seed(0)
        model = get_model("resnet8", num_classes=10)
        if order == "wrapped_first":
            model = DDP(model)
            apply_squeeze_excite(model.module, min_channels=16)
        else:
            apply_squeeze_excite(model, min_channels=16)
            model = DDP(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        generator = torch.Generator().manual_seed(100 + distributed.rank())
        for _ in range(3):
            images = torch.randn(8, 1, 28, 28, generator=generator)
            labels = torch.randint(0, 10, (8,), generator=generator)
            torch.nn.functional.cross_entropy(model(images), labels).backward()
            optimizer.step()
            optimizer.zero_grad()
        flat = torch.cat([p.detach().flatten() for p in model.parameters()])
        ranks = distributed.all_gather_object(flat)
        apart[order] = float((ranks[0] - ranks[1]).abs().max())
    return apart


SCENARIOS = {"ddp_resnet": ddp_resnet, "fsdp_gpt": fsdp_gpt, "ddp_methods": ddp_methods,
             "auto_precision": auto_precision, "surgery_order": surgery_order,
             "fsdp_whole_tensors": fsdp_whole_tensors}


def main(argv: list[str]) -> None:
    out = Path(argv[0])
    for name in argv[1:] or list(SCENARIOS):
        result = SCENARIOS[name](out)
        if distributed.is_main():
            (out / f"{name}.json").write_text(json.dumps(result, indent=1))
    leave_torchrun()


if __name__ == "__main__":
    main(sys.argv[1:])
