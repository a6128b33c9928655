"""Training on several processes: DDP and FSDP2 through torchrun on two CPU processes (gloo, 127.0.0.1).

One torchrun launch runs every two-rank scenario of ``distributed_worker.py`` (starting two Python
processes that import torch costs more than the training); the tests below read what it found and
compare it with the same runs in this one process.

Tolerance of the DDP-vs-one-process comparison (resnet8, Fashion-MNIST, global batch 64, SGD lr 0.01,
momentum 0.9, fp32, 10 steps): the first three steps agree to 1e-6 relative; all ten within 1e-3
(measured: at most 1.0e-4). The looser bound is the problem's own noise floor, not DDP's: in one process,
multiplying the initial weights by (1 + 1e-7 * noise) moves the step-10 loss by 1.9e-4 relative. Without
synchronized batch norm the second step is already 1.4e-3 off, so the test tells the two apart.
"""
from __future__ import annotations

import json
import os
import pickle
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import needs_fmnist, toy_loaders, toy_model
from prerequisites import import_or_missing, require

from speedkit import Trainer
from speedkit.core import distributed
from speedkit.data import BatchLoader, TokenBatchLoader
from speedkit.data.fashion_mnist import locate_fashion_mnist
from speedkit.train import parallel
from speedkit.train.checkpoint import CheckpointError, load_checkpoint, load_sharded_checkpoint, save_checkpoint

pytestmark = pytest.mark.distributed

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).resolve().parents[1] / "support" / "distributed_worker.py"
TIMEOUT_S = 400


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)  # the launcher sets its own
    return env


def _fmnist_available() -> bool:
    try:
        locate_fashion_mnist()
        return True
    except FileNotFoundError:
        return False


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """Runs every two-rank scenario once: ``(out_dir, {scenario: result}, seconds)``."""
    out = tmp_path_factory.mktemp("two-ranks")
    scenarios = ["ddp_resnet", "ddp_methods", "fsdp_gpt"] if _fmnist_available() else ["fsdp_gpt"]
    scenarios += ["auto_precision", "surgery_order", "fsdp_whole_tensors"]
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--nnodes", "1",
               "--master-addr", "127.0.0.1", "--master-port", str(_free_port()), str(WORKER), str(out), *scenarios]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=TIMEOUT_S)
    seconds = time.perf_counter() - start
    assert done.returncode == 0, f"the two-rank worker failed:\n{done.stdout[-4000:]}\n{done.stderr[-8000:]}"
    results = {name: json.loads((out / f"{name}.json").read_text()) for name in scenarios}
    print(f"\ntwo-rank scenarios {scenarios}: {seconds:.1f}s")
    return out, results, seconds


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The DDP scenario's run in this one process: same seed, same global batch."""
    from distributed_worker import resnet_trainer

    trainer = resnet_trainer(tmp_path_factory.mktemp("one-process"), "one-process")
    before = trainer.eval()["eval"]
    counted = trainer.state.evaluators[0].metrics["accuracy"].total
    return trainer, before, counted, trainer.fit()


def _result(two_ranks, name):
    results = two_ranks[1]
    if name not in results:
        require("fashion-mnist")
    return results[name]


# -- DDP ----------------------------------------------------------------------------------------------
@needs_fmnist
def test_ddp_two_ranks_match_one_process_step_by_step(two_ranks, one_process):
    from distributed_worker import STEPS, losses

    ddp = _result(two_ranks, "ddp_resnet")
    single = np.array(losses(one_process[3]))
    double = np.array(ddp["losses"])
    assert len(single) == len(double) == STEPS
    assert double[0] == pytest.approx(single[0], rel=1e-6)  # the same weights, the same 64 samples
    # after a step, gradients summed over two ranks round differently from one batch's (a few 1e-6 seen)
    np.testing.assert_allclose(double[:3], single[:3], rtol=2e-5)
    np.testing.assert_allclose(double, single, rtol=1e-3)
    assert ddp["samples"] == one_process[0].state.timestamp.sample == STEPS * 64  # counted globally
    assert ddp["sync_batchnorms"] > 0  # plain BatchNorm2d became synchronized batch norm
    assert ddp["config"]["world_size"] == 2 and ddp["config"]["parallel"] == "ddp"
    assert ddp["config"]["batch_size"] == 64 and ddp["config"]["distributed"]["backend"] == "gloo"


@needs_fmnist
def test_eval_metrics_are_reduced_across_ranks(two_ranks, one_process):
    ddp = _result(two_ranks, "ddp_resnet")
    _, before, counted, _ = one_process
    assert ddp["eval_samples_counted"] == counted == 300  # each sample once over both ranks, no padding
    assert ddp["eval_before"]["accuracy"] == before["accuracy"]  # the same weights: the same count correct
    assert ddp["eval_before"]["loss"] == pytest.approx(before["loss"], rel=1e-6)


@needs_fmnist
def test_a_torchmetrics_metric_syncs_itself_and_matches_speedkits_accuracy(two_ranks, one_process):
    import_or_missing("torchmetrics", "pip install 'torch-speedkit[metrics]'")
    ddp = _result(two_ranks, "ddp_resnet")
    _, before, _, record = one_process
    whole_set = ddp["eval_before"]["accuracy"]
    assert ddp["eval_before"]["tm_accuracy"] == pytest.approx(whole_set, abs=1e-6) == before["tm_accuracy"]
    # what each rank would report without torchmetrics' own gather: its shard only, a different number
    assert any(abs(shard - whole_set) > 1e-3 for shard in ddp["tm_shard_accuracy_by_rank"])
    assert ddp["final_metrics"]["eval/tm_accuracy"] == pytest.approx(ddp["final_metrics"]["eval/accuracy"], abs=1e-6)


@needs_fmnist
def test_ema_and_weights_identical_on_both_ranks(two_ranks):
    ddp = _result(two_ranks, "ddp_resnet")
    assert ddp["ema_by_rank"][0] == ddp["ema_by_rank"][1]
    assert ddp["params_by_rank"][0] == ddp["params_by_rank"][1]


@needs_fmnist
def test_only_rank_zero_writes_the_run_folder(two_ranks):
    out, _, _ = two_ranks
    _result(two_ranks, "ddp_resnet")
    folder = out / "runs" / "ddp-resnet"
    record = json.loads((folder / "record.json").read_text())
    assert record["config"]["world_size"] == 2 and record["config"]["parallel"] == "ddp"
    rows = [json.loads(line) for line in (folder / "log.jsonl").read_text().splitlines()]
    assert sum("loss" in row for row in rows) == 10  # one writer: each step logged once
    assert sorted(p.name for p in (folder / "checkpoints").iterdir()) == ["ba000000010.ckpt", "latest.ckpt"]


@needs_fmnist
def test_two_rank_checkpoint_resumes_in_one_process(two_ranks, tmp_path):
    from distributed_worker import losses, resnet_trainer

    ddp = _result(two_ranks, "ddp_resnet")
    payload = load_checkpoint(ddp["checkpoint"])
    assert not any(k.startswith("module.") for k in payload["model"])  # the plain module's names
    assert len(payload["rng_by_rank"]) == 2
    trainer = resnet_trainer(tmp_path, "resumed", steps=12, load_path=ddp["checkpoint"])
    record = trainer.fit()
    assert trainer.state.timestamp.batch == 12 and trainer.parallel is None
    assert losses(record)[:10] == ddp["losses"]  # the record carries on from the two-rank run
    assert all(np.isfinite(losses(record)[10:])) and len(losses(record)) == 12


@needs_fmnist
def test_methods_with_global_state_keep_ranks_identical(two_ranks):
    result = _result(two_ranks, "ddp_methods")
    assert result["status"] == "completed" and len(result["losses"]) == 6
    assert result["weights_by_rank"][0] == result["weights_by_rank"][1]  # parameters and buffers
    assert result["distributed"]["find_unused_parameters"]  # layer freezing, stochastic depth per batch
    assert result["distributed"]["averaged_buffers"]  # ghost batch norm keeps per-rank statistics
    assert result["frozen"]  # freezing happened at an epoch end and training went on


def test_ranks_train_in_rank_zeros_auto_precision_when_their_measurements_differ(two_ranks):
    assert _result(two_ranks, "auto_precision")["precision_by_rank"] == ["bf16", "bf16"]


def test_a_surgery_after_ddp_wrapped_the_model_leaves_each_rank_training_its_own(two_ranks):
    """Why speedkit refuses a model wrapped before its surgery (tests/hosts/test_loop_host.py): squeeze-excite's
    blocks added after DDP wrapped the model are never averaged, so two ranks on their own batches drift apart;
    added before, the ranks stay equal."""
    apart = _result(two_ranks, "surgery_order")
    assert apart["surgery_first"] == 0.0
    assert apart["wrapped_first"] > 1e-6  # synced weights are equal to the bit, as surgery_first's are


# -- FSDP2 --------------------------------------------------------------------------------------------
def test_fsdp_shards_and_trains_the_gpt(two_ranks):
    result = _result(two_ranks, "fsdp_gpt")
    assert result["all_dtensors"]
    assert result["local_sizes_by_rank"][0] == [n // 2 for n in result["global_sizes"]]
    assert result["local_sizes_by_rank"][0] == result["local_sizes_by_rank"][1]
    losses = result["losses"]
    assert len(losses) == 8 and all(np.isfinite(losses)) and losses[-1] < losses[0] - 1.0
    assert result["config"]["strategy"] == "fsdp" and result["model_class"] == "GPT"
    assert {"ba000000008.ckpt", "ba000000008.dcp", "latest.ckpt"} <= set(result["checkpoint_files"])


def test_fsdp_matches_one_process(two_ranks, tmp_path):
    """No batch norm in the GPT, so sharding changes only the order of float sums (measured: 1e-7)."""
    from distributed_worker import gpt_trainer, losses

    result = _result(two_ranks, "fsdp_gpt")
    single = losses(gpt_trainer(tmp_path, "one-gpt", steps=8, save_checkpoints=False).fit())
    np.testing.assert_allclose(result["losses"], single, rtol=1e-5)


def test_muon_and_gradient_clipping_under_fsdp_act_on_whole_matrices_and_the_global_norm(two_ranks, tmp_path):
    """Each rank holds a shard of every matrix and gradient, as DTensors: Muon orthogonalizes the whole matrix and
    clipping scales by the norm of every gradient, so the sharded run follows one process (measured 1e-4 apart,
    Newton-Schulz in bf16 where it is fast). Clipping each shard by its own norm instead is 1e-3 apart at the second
    step and 6e-3 at the fourth."""
    from distributed_worker import gpt_trainer, losses, whole_tensor_methods

    result = _result(two_ranks, "fsdp_whole_tensors")
    single = losses(gpt_trainer(tmp_path, "one-whole-tensors", steps=4, save_checkpoints=False,
                                **whole_tensor_methods()).fit())
    np.testing.assert_allclose(result["losses"], single, rtol=1e-3)


def test_fsdp_sharded_checkpoint_resumes_exactly(two_ranks):
    result = _result(two_ranks, "fsdp_gpt")
    assert result["resumed_batches"] == 8
    assert result["resumed_losses"] == result["losses"]  # steps 7 and 8 again, bit for bit
    assert result["ema_is_sharded"]  # the EMA's copy of the weights is sharded too, and went through DCP


def test_sharded_checkpoint_loads_in_one_process(two_ranks, tmp_path):
    from distributed_worker import gpt_trainer

    out, _, _ = two_ranks
    result = _result(two_ranks, "fsdp_gpt")
    trainer = gpt_trainer(tmp_path, "from-shards", steps=9, load_path=result["checkpoint"])
    trainer.checkpointer.resume(trainer.load_path)
    full = torch.load(out / "fsdp_full_weights.pt", weights_only=True)
    for name, p in trainer.state.model.named_parameters():
        torch.testing.assert_close(p.detach(), full[name], rtol=0, atol=0)
    assert trainer.state.timestamp.batch == 8


def _copy_checkpoints(two_ranks, tmp_path) -> Path:
    result = _result(two_ranks, "fsdp_gpt")
    folder = tmp_path / "checkpoints"
    shutil.copytree(Path(result["checkpoint"]).parent, folder)
    return folder / "ba000000008.ckpt"


def _load(path):
    return load_sharded_checkpoint(path, load_checkpoint(path))


def test_sharded_checkpoint_refuses_truncated_or_missing_shards(two_ranks, tmp_path):
    path = _copy_checkpoints(two_ranks, tmp_path)
    shards = path.with_suffix(".dcp")
    assert _load(path)["model"]  # intact: loads
    data = (shards / "__1_0.distcp").read_bytes()
    (shards / "__1_0.distcp").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="corrupt"):
        _load(path)
    (shards / "__1_0.distcp").unlink()
    with pytest.raises(CheckpointError, match="missing"):
        _load(path)
    shutil.rmtree(shards)
    with pytest.raises(CheckpointError, match="shard folder .* is missing"):
        _load(path)


class _Boom:
    def __reduce__(self):
        return (os.system, ("touch BOOM",))


def test_sharded_checkpoint_never_unpickles_code(two_ranks, tmp_path):
    """Even with the manifest rewritten to match (a deliberate edit, not a crash), the shard metadata is
    read by an unpickler that builds only DCP's record types."""
    import hashlib

    path = _copy_checkpoints(two_ranks, tmp_path)
    metadata = path.with_suffix(".dcp") / ".metadata"
    metadata.write_bytes(pickle.dumps(_Boom()))
    payload = load_checkpoint(path)
    payload["sharded"]["files"][".metadata"] = hashlib.sha256(metadata.read_bytes()).hexdigest()
    del payload["format_version"]
    save_checkpoint(path, payload)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        with pytest.raises(CheckpointError, match="posix.system|os.system|never holds"):
            _load(path)
    finally:
        os.chdir(cwd)
    assert not (tmp_path / "BOOM").exists()


# -- the launcher -------------------------------------------------------------------------------------
TINY_SCRIPT = """
import sys
import torch
import torch.distributed as dist

dist.init_process_group("gloo")  # from the RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT torchrun set
total = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(total)
with open(f"{sys.argv[1]}/rank{dist.get_rank()}.txt", "w") as f:
    f.write(f"{dist.get_world_size()} {total.item()} {sys.argv[2]}")
dist.destroy_process_group()
"""


def test_speedkit_launch_runs_a_script_on_two_processes(tmp_path):
    script = tmp_path / "tiny.py"
    script.write_text(TINY_SCRIPT)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "speedkit", "launch", "-n", "2", str(script), str(tmp_path), "hello"],
                          cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=TIMEOUT_S)
    print(f"\nspeedkit launch -n 2: {time.perf_counter() - start:.1f}s")
    assert done.returncode == 0, done.stderr[-4000:]
    for rank in (0, 1):
        assert (tmp_path / f"rank{rank}.txt").read_text() == "2 3.0 hello"


@needs_fmnist
def test_speedkit_train_under_launch(tmp_path):
    """`speedkit launch -n 2 -m speedkit train ...`: the baseline recipe's DataLoader with a DistributedSampler."""
    done = subprocess.run([sys.executable, "-m", "speedkit", "launch", "-n", "2", "-m", "speedkit", "train",
                           "--duration", "3ba", "--data-fraction", "0.01", "--eval-fraction", "0.02", "--device", "cpu",
                           "--run-dir", str(tmp_path), "--run-name", "launched", "--no-progress"],
                          cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-4000:]
    record = json.loads((tmp_path / "launched" / "record.json").read_text())
    assert record["status"] == "completed" and record["config"]["world_size"] == 2
    assert record["config"]["train_loader"] == "DataLoader" and len(record["evals"]) >= 1
    assert done.stdout.count("record: ") == 1  # the summary comes from rank 0 only


def test_launch_passes_rendezvous_options_to_torchrun():
    from speedkit.cli.launch import torchrun_args
    from speedkit.cli.main import _parser

    args = _parser().parse_args(["launch", "-n", "4", "--nnodes", "2", "--node-rank", "1", "--rdzv-backend", "c10d",
                                 "--rdzv-endpoint", "head:29400", "--rdzv-id", "job7", "train.py", "--lr", "0.1"])
    assert torchrun_args(args) == ["--nproc-per-node", "4", "--nnodes", "2", "--node-rank", "1", "--rdzv-backend",
                                   "c10d", "--rdzv-endpoint", "head:29400", "--rdzv-id", "job7", "train.py",
                                   "--lr", "0.1"]
    one_machine = _parser().parse_args(["launch", "-n", "2", "-m", "speedkit", "train", "--recipe", "mild"])
    assert torchrun_args(one_machine) == ["--nproc-per-node", "2", "--nnodes", "1", "--standalone", "--module",
                                          "speedkit", "train", "--recipe", "mild"]
    static = _parser().parse_args(["launch", "-n", "2", "--master-addr", "10.0.0.1", "--master-port", "29500", "x.py"])
    assert "--standalone" not in torchrun_args(static) and "10.0.0.1" in torchrun_args(static)


# -- pieces that need no second process ----------------------------------------------------------------
def test_strategy_names_are_checked():
    with pytest.raises(ValueError, match="'ddp', 'fsdp'"):
        parallel.resolve_strategy("zero3")
    with pytest.raises(ValueError, match="'ddp', 'fsdp'"):
        parallel.wrap_model(toy_model(), "deepspeed", "cpu")
    train, _ = toy_loaders()
    with pytest.raises(ValueError, match="parallel strategy must be one of"):
        Trainer(toy_model(), train, parallel="fdsp", save_checkpoints=False)


def test_parallel_in_one_process_trains_as_usual(tmp_path):
    train, _ = toy_loaders()
    trainer = Trainer(toy_model(), train, max_duration="2ba", parallel="ddp", run_dir=tmp_path, run_name="one")
    record = trainer.fit()
    assert trainer.parallel is None and record.config["world_size"] == 1 and record.config["parallel"] is None
    assert distributed.rank() == 0 and distributed.world_size() == 1 and distributed.is_main()
    assert distributed.all_reduce_mean(torch.tensor(3.0)) == 3.0 and distributed.any_rank(True)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_batch_loader_ranks_take_slices_of_the_same_global_batch(world):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randint(0, 256, (203, 1, 8, 8), dtype=torch.uint8, generator=g), torch.arange(203)
    batch = 12
    whole = list(BatchLoader(x, y, batch, seed=3, world_size=1))
    shards = [list(BatchLoader(x, y, batch, seed=3, rank=r, world_size=world)) for r in range(world)]
    assert len({len(s) for s in shards}) == 1  # every rank the same number of batches (DDP needs it)
    for b, (images, labels) in enumerate(shards[0]):
        joined_x = torch.cat([s[b][0] for s in shards])
        joined_y = torch.cat([s[b][1] for s in shards])
        assert len({len(s[b][1]) for s in shards}) == 1
        n = len(joined_y)
        torch.testing.assert_close(joined_x, whole[b][0][:n])  # same crops and flips
        assert torch.equal(joined_y, whole[b][1][:n])
    seen = sum(len(s[b][1]) for s in shards for b in range(len(s)))
    assert 203 - (world - 1) <= seen <= 203  # at most world - 1 samples of the last batch left out


@pytest.mark.parametrize("world", [2, 3, 5])
def test_eval_loaders_split_without_padding(world):
    x, y = torch.zeros(101, 4, 4, dtype=torch.uint8), torch.arange(101)
    labels = [t for r in range(world)
              for _, t in BatchLoader(x, y, 16, shuffle=False, augment=None, rank=r, world_size=world)]
    assert sorted(torch.cat(labels).tolist()) == list(range(101))
    tokens = torch.arange(250, dtype=torch.uint8)
    windows = [w for r in range(world)
               for w, _ in TokenBatchLoader(tokens, 8, 5, shuffle=False, rank=r, world_size=world)]
    starts = sorted(torch.cat(windows)[:, 0].tolist())
    assert starts == [8 * i for i in range(249 // 8)]


def test_token_loader_ranks_take_slices_and_sizes_are_checked():
    tokens = torch.arange(200, dtype=torch.uint8).repeat(5)
    whole = list(TokenBatchLoader(tokens, 16, 8, seed=1, world_size=1))
    parts = [list(TokenBatchLoader(tokens, 16, 8, seed=1, rank=r, world_size=2)) for r in range(2)]
    for b in range(len(whole)):
        assert torch.equal(torch.cat([parts[0][b][0], parts[1][b][0]]), whole[b][0])
    assert parts[0][0][0].shape[0] == 4 and TokenBatchLoader(tokens, 16, 8, world_size=2).global_batch_size == 8
    with pytest.raises(ValueError, match="global batch size and must split evenly"):
        TokenBatchLoader(tokens, 16, 6, rank=0, world_size=4)
    with pytest.raises(ValueError, match="global batch size and must split evenly"):
        BatchLoader(torch.zeros(10, 4, 4, dtype=torch.uint8), torch.arange(10), 5, world_size=2, rank=1)
    with pytest.raises(ValueError, match="rank must be in"):
        BatchLoader(torch.zeros(10, 4, 4, dtype=torch.uint8), torch.arange(10), 4, world_size=2, rank=2)


def test_loaders_take_rank_and_world_size_from_torchrun(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    loader = BatchLoader(torch.zeros(10, 4, 4, dtype=torch.uint8), torch.arange(10), 4, shuffle=False)
    assert (loader.rank, loader.world_size, loader.local_batch_size) == (1, 2, 2)
    assert loader.with_options(batch_size=8).rank == 1  # copies keep the shard
    assert BatchLoader(torch.zeros(10, 4, 4, dtype=torch.uint8), torch.arange(10), 4, world_size=1).rank == 0


@needs_fmnist
def test_torch_loader_gets_a_distributed_sampler(monkeypatch):
    from speedkit.tasks.builtin import fashion_mnist_torch_loader

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    loader = fashion_mnist_torch_loader(128, None, 0.01, seed=0)
    assert isinstance(loader.sampler, torch.utils.data.DistributedSampler)
    assert loader.batch_size == 64 and loader.sampler.rank == 1 and loader.sampler.num_replicas == 2
    with pytest.raises(ValueError, match="must split evenly"):
        fashion_mnist_torch_loader(129, None, 0.01, seed=0)


def test_fsdp_units_are_the_transformer_blocks():
    from speedkit.models import get_model

    model = get_model("gpt-nano")
    units = parallel.shard_units(model)
    assert units == list(model.transformer.h)  # the tied embedding / head stays with the root


def test_rank_seeds_differ_except_on_rank_zero(monkeypatch):
    assert distributed.rank_seed(1234) == 1234
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert distributed.rank_seed(1234) not in (1234, distributed.rank_seed(1235))
