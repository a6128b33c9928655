"""Fault tolerance: kills, signals, bad losses, broken checkpoints, out-of-memory and errors never cost a run.

The kill tests start tests/support/fault_child.py (a real Fashion-MNIST run) as a real subprocess, send it a real
signal, and start the same command again; the others inject the fault in-process on the toy problem.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from helpers import needs_fmnist, toy_loaders, toy_model

from speedkit import RunRecord, Trainer
from speedkit.callbacks import Callback, NaNGuard, NonFiniteLossError
from speedkit.train.checkpoint import MAGIC, CheckpointError, load_checkpoint, save_checkpoint

CHILD = Path(__file__).resolve().parents[1] / "support" / "fault_child.py"
BATCHES = 48  # fault_child.py: 2 epochs of 24 batches, a checkpoint every 5


# -- helpers ----------------------------------------------------------------------------------------
def start_child(run_dir: Path, **env) -> subprocess.Popen:
    """``python tests/support/fault_child.py RUN_DIR``; it inherits this process's environment and CPU affinity."""
    with open(run_dir / f"child-{time.monotonic_ns()}.out", "w") as log:  # the child keeps its own copy
        return subprocess.Popen([sys.executable, str(CHILD), str(run_dir)], stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, **env}, cwd=CHILD.parent.parent)


def finish(proc: subprocess.Popen, timeout: float = 120) -> int:
    try:
        return proc.wait(timeout)
    finally:
        if proc.poll() is None:  # never leave a child behind
            proc.kill()
            proc.wait()


def wait_until(condition, proc: subprocess.Popen, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            raise AssertionError(f"the child ended (code {proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def run_to_completion(run_dir: Path, **env) -> RunRecord:
    proc = start_child(run_dir, **env)
    assert finish(proc) == 0, "the child failed:\n" + "".join(p.read_text() for p in run_dir.glob("child-*.out"))
    return RunRecord.load(run_dir / "r")


def checkpoint_batch(path: Path) -> int:
    return load_checkpoint(path)["timestamp"]["batch"]


def final_weights(run_dir: Path) -> dict:
    return load_checkpoint(run_dir / "r" / "checkpoints" / "latest.ckpt")["model"]


def assert_same_run(record: RunRecord, weights: dict, reference: tuple) -> None:
    """Bit-identical to the uninterrupted run: final metrics, every logged loss, every eval, every weight."""
    ref_record, ref_weights = reference
    assert record.status == "completed" and record.steps[-1]["batch"] == BATCHES
    assert record.final_metrics == ref_record.final_metrics
    assert set(record.final_metrics) >= {"eval/accuracy", "eval/loss"}
    assert [(s["batch"], s["loss"]) for s in record.steps] == [(s["batch"], s["loss"]) for s in ref_record.steps]
    assert [{k: v for k, v in e.items() if k.startswith("eval/") or k == "batch"} for e in record.evals] == \
        [{k: v for k, v in e.items() if k.startswith("eval/") or k == "batch"} for e in ref_record.evals]
    assert weights.keys() == ref_weights.keys()
    for name in weights:
        assert torch.equal(weights[name], ref_weights[name]), name


def log_texts(run_dir: Path, run: str = "r") -> list[str]:
    texts = []
    for line in (run_dir / run / "log.jsonl").read_text().splitlines():
        try:  # a SIGKILL can cut the last line of a killed process's log short
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        texts += [row["text"]] if "text" in row else []
    return texts


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The same command, never interrupted; started in the background, awaited when first compared."""
    run_dir = tmp_path_factory.mktemp("reference")
    proc, result = start_child(run_dir), []

    def get():
        if not result:
            assert finish(proc) == 0, "".join(p.read_text() for p in run_dir.glob("child-*.out"))
            record = RunRecord.load(run_dir / "r")
            assert record.evals[-1]["eval/accuracy"] > 0.5  # it learns, so equal metrics mean something
            result.append((record, final_weights(run_dir)))
        return result[0]

    yield get
    finish(proc)


# -- real signals to a real subprocess -----------------------------------------------------------------
@needs_fmnist
def test_sigkill_mid_save_then_mid_epoch_and_the_same_command_ends_identical_to_an_uninterrupted_run(tmp_path,
                                                                                                    reference):
    checkpoints, latest = tmp_path / "r" / "checkpoints", tmp_path / "r" / "checkpoints" / "latest.ckpt"
    # 1. SIGKILL during a checkpoint write: the second checkpoint (batch 10) writes half its temp file, then
    #    stalls there (fault_child.py's test-only SPEEDKIT_TEST_SLOW_SAVE), and is killed.
    proc = start_child(tmp_path, SPEEDKIT_TEST_SLOW_SAVE="2")
    partial = lambda: [p for p in checkpoints.glob(".ba000000010.ckpt.*.tmp") if p.stat().st_size > 0]
    wait_until(lambda: checkpoints.is_dir() and partial(), proc, "the half-written batch-10 checkpoint")
    proc.send_signal(signal.SIGKILL)
    assert finish(proc) == -signal.SIGKILL
    [leftover] = partial()
    assert 0 < leftover.stat().st_size < latest.stat().st_size  # really cut off halfway
    assert not (checkpoints / "ba000000010.ckpt").exists()
    assert checkpoint_batch(latest) == 5  # still the previous, complete, checksummed checkpoint
    assert RunRecord.load(tmp_path / "r").status == "running"  # whole JSON; a SIGKILL cannot record itself

    # 2. The same command again resumes from batch 5; SIGKILL it mid-epoch 2, once batch 30 is saved.
    proc = start_child(tmp_path, SPEEDKIT_TEST_BATCH_SLEEP="0.02")
    wait_until(lambda: (checkpoints / "ba000000030.ckpt").exists(), proc, "the batch-30 checkpoint")
    time.sleep(0.05)  # a few more batches: work after the checkpoint is lost and redone
    proc.send_signal(signal.SIGKILL)
    assert finish(proc) == -signal.SIGKILL
    assert "resumed from" in " ".join(log_texts(tmp_path)) and "epoch 0, batch 5" in " ".join(log_texts(tmp_path))
    assert not leftover.exists()  # the resumed run cleared what the killed save left
    saved = checkpoint_batch(latest)
    assert 30 <= saved < BATCHES and saved % 24 != 0  # mid-epoch 2

    # 3. A bad sector then corrupts latest.ckpt (and so the checkpoint it names: the same file). The same
    #    command once more passes over both, resumes from the newest one that verifies, keeps the bad file,
    #    and finishes bit-identical to the run that was never killed.
    with open(latest, "r+b") as f:
        f.truncate(latest.stat().st_size // 2)
    previous = max(int(p.name[2:11]) for p in checkpoints.glob("ba*.ckpt") if int(p.name[2:11]) < saved)
    resumed = run_to_completion(tmp_path)
    assert resumed.notes["resumed_from"].endswith(f"ba{previous:09d}.ckpt")
    assert [Path(n["file"]).name for n in resumed.notes["resume_passed_over"]] == ["latest.ckpt", f"ba{saved:09d}.ckpt"]
    assert (checkpoints / f"ba{saved:09d}.ckpt.unusable").stat().st_size > 0
    texts = " ".join(log_texts(tmp_path))
    assert f"passed over {latest} and kept it as latest.ckpt.unusable: {latest} is corrupt" in texts
    assert f"epoch 1, batch {previous}" in texts
    assert_same_run(resumed, final_weights(tmp_path), reference())


@needs_fmnist
def test_sigterm_saves_a_checkpoint_and_a_complete_record_then_exits_143(tmp_path, reference):
    checkpoints = tmp_path / "r" / "checkpoints"
    proc = start_child(tmp_path, SPEEDKIT_TEST_BATCH_SLEEP="0.02")
    wait_until(lambda: (checkpoints / "latest.ckpt").exists(), proc, "the first checkpoint")
    proc.send_signal(signal.SIGTERM)
    assert finish(proc, timeout=60) == 143  # SystemExit(143) once saved; killed by the signal itself: -15

    record = RunRecord.load(tmp_path / "r")
    assert record.status == "terminated" and record.stop_reason == "SIGTERM" and record.error is None
    stopped_at = record.steps[-1]["batch"]
    assert 5 <= stopped_at < BATCHES and record.timings["train_s"] > 0
    assert checkpoint_batch(checkpoints / "latest.ckpt") == stopped_at  # saved where it stopped
    assert any("SIGTERM: stopped after batch" in text for text in log_texts(tmp_path))
    # Every step it took is the uninterrupted run's step (so the checkpoint continues that run).
    ref_losses = [(s["batch"], s["loss"]) for s in reference()[0].steps]
    assert [(s["batch"], s["loss"]) for s in record.steps] == ref_losses[:stopped_at]


# -- SIGTERM handler bookkeeping (in-process) ------------------------------------------------------------
class At(Callback):
    """Calls ``action(trainer)`` at the end of batch ``batch``."""

    def __init__(self, batch, action):
        self.batch, self.action, self.trainer = batch, action, None

    def batch_end(self, state, logger):
        if state.timestamp.batch == self.batch:
            self.action(self.trainer)


def make_trainer(tmp_path, callbacks=(), **kwargs):
    train, test = toy_loaders()
    options = dict(max_duration="2ep", device="cpu", run_dir=tmp_path, run_name="t", log_interval=1)
    options.update(kwargs)
    trainer = Trainer(options.pop("model", None) or toy_model(), options.pop("train", train),
                      callbacks=list(callbacks), **options)
    for cb in callbacks:
        cb.trainer = trainer
    return trainer


@pytest.fixture
def sigterm_handler():
    """A Python SIGTERM handler of the test's own (so a missed signal cannot kill pytest), restored after."""
    calls = []

    def handler(signum, frame):
        calls.append(signum)

    previous = signal.signal(signal.SIGTERM, handler)
    yield handler, calls
    signal.signal(signal.SIGTERM, previous)


def test_sigterm_handler_is_installed_only_while_fit_runs(tmp_path, sigterm_handler):
    handler, _ = sigterm_handler
    seen = []
    trainer = make_trainer(tmp_path, [At(2, lambda t: seen.append(signal.getsignal(signal.SIGTERM)))],
                           max_duration="3ba")
    trainer.fit()
    assert seen == [trainer.sigterm.on_sigterm]
    assert signal.getsignal(signal.SIGTERM) is handler  # restored after a normal end

    def boom(t):
        raise ValueError("boom")

    failing = make_trainer(tmp_path / "f", [At(1, boom)], max_duration="3ba")
    with pytest.raises(ValueError):
        failing.fit()
    assert signal.getsignal(signal.SIGTERM) is handler  # and after a failure


def test_fit_in_a_worker_thread_leaves_sigterm_alone(tmp_path, sigterm_handler):
    handler, _ = sigterm_handler
    seen, errors = [], []
    trainer = make_trainer(tmp_path, [At(1, lambda t: seen.append(signal.getsignal(signal.SIGTERM)))],
                           max_duration="2ba")

    def run():
        try:
            trainer.fit()
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    worker = threading.Thread(target=run)
    worker.start()
    worker.join(60)
    assert not errors and trainer.record.status == "completed"
    assert seen == [handler]


def test_sigterm_stops_at_the_batch_boundary_then_hands_over_to_the_previous_handler(tmp_path, sigterm_handler):
    _, calls = sigterm_handler
    checkpoints = tmp_path / "t" / "checkpoints"
    at_handover = []
    handler, _ = sigterm_handler

    def chained(signum, frame):  # the previous handler runs only once the work is on disk
        at_handover.append((checkpoint_batch(checkpoints / "latest.ckpt"), RunRecord.load(tmp_path / "t").status))
        handler(signum, frame)

    signal.signal(signal.SIGTERM, chained)
    trainer = make_trainer(tmp_path, [At(3, lambda t: os.kill(os.getpid(), signal.SIGTERM))],
                           eval_dataloader=toy_loaders()[1])
    record = trainer.fit()  # a Python handler was there before: fit hands over to it instead of exiting
    assert record.status == "terminated" and record.stop_reason == "SIGTERM"
    assert trainer.state.timestamp.batch == 3  # the very next boundary
    assert at_handover == [(3, "terminated")] and calls == [signal.SIGTERM]
    assert not record.evals  # no final evaluation on the way out


def test_sigterm_exits_143_when_nothing_else_handles_it(tmp_path, monkeypatch):
    """With the default disposition, fit raises SystemExit(143) once the checkpoint and record are saved."""
    # Pretend the disposition is the default (as in a plain script) without risking pytest itself.
    installed = []
    monkeypatch.setattr(signal, "getsignal", lambda signum: signal.SIG_DFL)
    monkeypatch.setattr(signal, "signal", lambda signum, handler: installed.append((signum, handler)))
    trainer = make_trainer(tmp_path, [At(2, lambda t: installed[0][1](signal.SIGTERM, None))])
    with pytest.raises(SystemExit) as exit_info:
        trainer.fit()
    assert exit_info.value.code == 143
    sigterm = [handler for signum, handler in installed if signum == signal.SIGTERM]
    assert sigterm == [trainer.sigterm.on_sigterm, signal.SIG_DFL]  # installed, then the default put back
    sighup = [handler for signum, handler in installed if signum == signal.SIGHUP]
    assert sighup == [trainer.sigterm.on_sigterm, signal.SIG_DFL]  # SIGHUP (an SSH drop) is handled as SIGTERM
    assert RunRecord.load(tmp_path / "t").status == "terminated"
    assert checkpoint_batch(tmp_path / "t" / "checkpoints" / "latest.ckpt") == 2


def test_an_ignored_sigterm_stays_ignored(tmp_path):
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        trainer = make_trainer(tmp_path, [At(2, lambda t: os.kill(os.getpid(), signal.SIGTERM))], max_duration="4ba")
        assert trainer.fit().status == "completed"
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, previous)


# -- the NaN guard ------------------------------------------------------------------------------------
def bad_after(batches, value):
    calls = {"n": 0}

    def loss(outputs, targets):
        calls["n"] += 1
        good = torch.nn.functional.cross_entropy(outputs, targets)
        return good * value if calls["n"] > batches else good

    return loss


class FolderSnapshot(Callback):
    """The checkpoint folder's bytes at the start of every batch."""

    def __init__(self, folder):
        self.folder, self.last = folder, {}

    def batch_start(self, state, logger):
        self.last = snapshot(self.folder)


def snapshot(folder: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.glob("*"))} \
        if folder.is_dir() else {}


@pytest.mark.parametrize("value, shown", [(float("inf"), "inf"), (float("nan"), "nan"), (-float("inf"), "-inf")])
def test_a_non_finite_loss_stops_with_a_clear_message_and_leaves_the_checkpoint_bytes_alone(tmp_path, value,
                                                                                            shown):
    folder = tmp_path / "t" / "checkpoints"
    watcher = FolderSnapshot(folder)
    trainer = make_trainer(tmp_path, [watcher], max_duration="3ep", loss_fn=bad_after(10, value),
                           save_interval="4ba")
    with pytest.raises(NonFiniteLossError) as failure:
        trainer.fit()
    message = str(failure.value)
    assert f"the loss is {shown} at batch 10 (epoch 1)" in message
    for fix in ("Lower the learning rate", "NaNGuard(policy='skip')", "No checkpoint is written after it"):
        assert fix in message
    assert watcher.last and snapshot(folder) == watcher.last  # not one byte of any checkpoint changed
    assert checkpoint_batch(folder / "latest.ckpt") == 8
    assert all(torch.isfinite(p).all() for p in trainer.state.model.parameters())
    record = RunRecord.load(tmp_path / "t")
    assert record.status == "failed" and record.error.startswith("NonFiniteLossError: the loss is")
    # and the run carries on from the good checkpoint with a sane loss
    again = make_trainer(tmp_path / "again", load_path=folder / "latest.ckpt", max_duration="12ba")
    assert again.fit().status == "completed" and again.state.timestamp.batch == 12


def test_skip_policy_leaves_the_weights_of_an_infinite_step_untouched(tmp_path):
    guard = NaNGuard(policy="skip", lr_factor=0.5)
    before, after = {}, {}

    class Watch(Callback):
        def batch_start(self, state, logger):
            before[state.timestamp.batch + 1] = [p.detach().clone() for p in state.model.parameters()]

        def batch_end(self, state, logger):
            after[state.timestamp.batch] = [p.detach().clone() for p in state.model.parameters()]

    trainer = make_trainer(tmp_path, [guard, Watch()], max_duration="1ep", loss_fn=bad_after_once(3),
                           nan_policy=None, optimizers=lambda p: torch.optim.SGD(p, lr=0.1))
    record = trainer.fit()
    assert record.status == "completed" and guard.skips == 1
    changed = {b: not all(torch.equal(x, y) for x, y in zip(before[b], after[b])) for b in after}
    assert changed == {b: b != 4 for b in range(1, 9)}  # the 4th batch (the infinite loss) changed nothing
    assert trainer.state.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.05)


def bad_after_once(batches, value=float("inf")):
    calls = {"n": 0}

    def loss(outputs, targets):
        calls["n"] += 1
        good = torch.nn.functional.cross_entropy(outputs, targets)
        return good * value if calls["n"] == batches + 1 else good

    return loss


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.reshape(-1).view(torch.uint8)


def test_the_masked_update_zeroes_nan_and_inf_and_otherwise_keeps_every_bit():
    from speedkit.callbacks.monitors import zero_where

    torch.manual_seed(0)
    special = [float("nan"), float("inf"), -float("inf"), -0.0, 1e-40, -3.5]  # 1e-40: a float32 subnormal
    grads = [torch.cat([torch.tensor(special, dtype=dtype), torch.randn(5, dtype=dtype)])
             for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64)]
    grads += [torch.randn(2, 3, 4).transpose(0, 2), torch.tensor(float("nan")), torch.randn(3, 2).bfloat16().t()]
    kept = [grad.clone() for grad in grads]
    zero_where(torch.tensor(False), grads)
    assert all(torch.equal(_bits(grad), _bits(k)) for grad, k in zip(grads, kept))  # NaNs and -0.0 too
    zero_where(torch.tensor(True), grads)
    assert all(torch.equal(_bits(grad), _bits(torch.zeros_like(grad))) for grad in grads)  # +0.0 everywhere


def test_fsdps_sharded_gradients_are_checked_and_masked_as_their_local_shards(tmp_path):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from speedkit.callbacks.monitors import _any_non_finite, _numbers_of, zero_where

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
        fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
        model(torch.randn(3, 4)).sum().backward()
        sharded = [p.grad for p in model.parameters()]
        numbers = [_numbers_of(grad) for grad in sharded]  # plain tensors: no DTensor op per gradient
        assert all(type(n) is torch.Tensor and n.data_ptr() == g.to_local().data_ptr()
                   for n, g in zip(numbers, sharded))
        kept = [_bits(n.clone()) for n in numbers]
        zero_where(_any_non_finite(numbers, torch.device("cpu")), numbers)
        assert all(torch.equal(_bits(g.to_local()), k) for g, k in zip(sharded, kept))
        numbers[1][0] = float("nan")
        zero_where(_any_non_finite(numbers, torch.device("cpu")), numbers)
        assert all(torch.equal(g.to_local(), torch.zeros_like(g.to_local())) for g in sharded)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("value", [float("inf"), float("nan")])
def test_a_sparse_gradient_is_checked_and_masked_by_its_values(tmp_path, value):
    class Bag(torch.nn.Module):  # a sparse embedding, as a recommender's or word2vec's
        def __init__(self):
            super().__init__()
            self.embedding = torch.nn.Embedding(20, 8, sparse=True)
            self.head = torch.nn.Linear(8, 4)

        def forward(self, x):
            return self.head(self.embedding(x).mean(1))

    words, labels = torch.randint(0, 20, (64, 5)), torch.randint(0, 4, (64,))
    loader = torch.utils.data.DataLoader(list(zip(words, labels)), batch_size=16)
    guard = NaNGuard(policy="skip")
    trainer = Trainer(Bag(), loader, max_duration="4ba", loss_fn=bad_after_once(2, value), nan_policy=None,
                      callbacks=[guard], optimizers=lambda p: torch.optim.SGD(p, lr=0.1), device="cpu",
                      run_dir=tmp_path, save_checkpoints=False)
    assert trainer.fit().status == "completed" and guard.skips == 1
    assert all(torch.isfinite(p).all() for p in trainer.state.model.parameters())


# -- broken checkpoint files ----------------------------------------------------------------------------
@pytest.fixture
def good_checkpoint(tmp_path):
    make_trainer(tmp_path, max_duration="2ba").fit()
    return tmp_path / "t" / "checkpoints" / "latest.ckpt"


def framed(payload_bytes: bytes) -> bytes:
    """A checkpoint file around ``payload_bytes`` with a valid checksum: only the payload is wrong."""
    return MAGIC + hashlib.sha256(payload_bytes).hexdigest().encode() + b"\n" + payload_bytes


def torch_bytes(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


class _Exploit:
    def __reduce__(self):
        return (os.system, ("touch EXPLOITED_MARKER",))


BROKEN = {
    # name: (make the file's bytes from a good checkpoint's bytes, what the message says, what it advises)
    "empty": (lambda good: b"", "is empty (0 bytes)", "use an earlier checkpoint"),
    "truncated": (lambda good: good[: len(good) // 3], "is corrupt", "use an earlier checkpoint"),
    "header only": (lambda good: good[: len(MAGIC) + 65], "is corrupt", "use an earlier checkpoint"),
    "one bit flipped": (lambda good: good[:-50] + bytes([good[-50] ^ 1]) + good[-49:], "checksum does not match",
                        "use an earlier checkpoint"),
    "not a checkpoint": (lambda good: torch_bytes({"weight": torch.zeros(2)}), "not a speedkit checkpoint",
                         "model.load_state_dict"),
    "wrong format version": (lambda good: framed(torch_bytes({"format_version": 99, "model": {}})),
                             "has checkpoint format 99, this speedkit reads 1", "the speedkit version that wrote it"),
    "no format version": (lambda good: framed(torch_bytes({"model": {}})), "has checkpoint format None",
                          "the speedkit version that wrote it"),
    "not a dictionary": (lambda good: framed(torch_bytes(torch.zeros(3))), "holds a Tensor", "use a checkpoint"),
    "code, valid checksum": (lambda good: framed(torch_bytes({"format_version": 1, "model": _Exploit()})),
                             "will not unpickle", "do not use it"),
    "code, stale checksum": (lambda good: good[:len(MAGIC) + 65] + torch_bytes({"model": _Exploit()}),
                             "is corrupt", "use an earlier checkpoint"),
    "garbage payload": (lambda good: framed(b"\x80\x04not a pickle at all"), "will not unpickle", "do not use it"),
}


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")  # the garbage payload's, from torch.load
@pytest.mark.parametrize("kind", list(BROKEN))
def test_a_broken_checkpoint_gives_a_clear_error_and_runs_no_code(good_checkpoint, tmp_path, monkeypatch, kind):
    make, says, advises = BROKEN[kind]
    monkeypatch.chdir(tmp_path)
    path = tmp_path / f"{kind.replace(' ', '_')}.ckpt"
    path.write_bytes(make(good_checkpoint.read_bytes()))
    with pytest.raises(CheckpointError) as failure:
        load_checkpoint(path)
    message = str(failure.value)
    assert str(path) in message and says in message and advises in message, message
    assert not (tmp_path / "EXPLOITED_MARKER").exists()
    # The Trainer refuses it the same way, and records why.
    trainer = make_trainer(tmp_path / "resume", load_path=path)
    with pytest.raises(CheckpointError):
        trainer.fit()
    record = RunRecord.load(tmp_path / "resume" / "t")
    assert record.status == "failed" and record.error.startswith("CheckpointError") and str(path) in record.error
    assert not (tmp_path / "EXPLOITED_MARKER").exists()


def test_a_good_checkpoint_round_trips(good_checkpoint, tmp_path):
    """The control for the cases above: the same helpers on unbroken bytes load fine."""
    payload = load_checkpoint(good_checkpoint)
    assert payload["timestamp"]["batch"] == 2
    copy = save_checkpoint(tmp_path / "copy.ckpt", {k: v for k, v in payload.items() if k != "format_version"})
    assert load_checkpoint(copy)["timestamp"] == payload["timestamp"]


# -- autoresume past a broken latest.ckpt ---------------------------------------------------------------
def interrupted_at_6(tmp_path) -> Path:
    """A toy run stopped by Ctrl-C after batch 6, a checkpoint after every batch; its checkpoint folder."""
    trainer = make_trainer(tmp_path, [At(6, lambda t: raise_(KeyboardInterrupt()))], save_interval="1ba")
    with pytest.raises(KeyboardInterrupt):
        trainer.fit()
    folder = tmp_path / "t" / "checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == ["ba000000004.ckpt", "ba000000005.ckpt",
                                                        "ba000000006.ckpt", "latest.ckpt"]
    return folder


def corrupt_in_place(path: Path) -> None:
    """A bad sector: bytes change under every name of the file (latest.ckpt is a hard link to ba6)."""
    with open(path, "r+b") as f:
        f.seek(-50, os.SEEK_END)
        byte = f.read(1)
        f.seek(-50, os.SEEK_END)
        f.write(bytes([byte[0] ^ 1]))


def replace_with_empty(path: Path) -> None:
    """A latest.ckpt replaced by an empty file of its own (its checkpoint ba6 stays intact)."""
    path.unlink()
    path.write_bytes(b"")


@pytest.mark.parametrize("damage, resumes_at, passed_over, why", [
    (corrupt_in_place, 5, ["latest.ckpt", "ba000000006.ckpt"], "checksum does not match"),
    (replace_with_empty, 6, ["latest.ckpt"], "is empty (0 bytes)"),
])
def test_autoresume_passes_over_a_broken_latest_to_the_newest_checkpoint_that_verifies(
        tmp_path, damage, resumes_at, passed_over, why):
    folder = interrupted_at_6(tmp_path)
    damage(folder / "latest.ckpt")
    bad_bytes = {name: (folder / name).read_bytes() for name in passed_over}
    resumed = make_trainer(tmp_path, autoresume=True)
    with pytest.warns(UserWarning) as caught:
        record = resumed.fit()
    assert [str(w.message).split(" and kept")[0] for w in caught] == \
        [f"autoresume: passed over {folder / name}" for name in passed_over]
    assert record.status == "completed" and resumed.state.timestamp.batch == 16
    assert record.notes["resumed_from"] == f"checkpoints/ba{resumes_at:09d}.ckpt"  # relative to the run folder
    assert [Path(n["file"]).name for n in record.notes["resume_passed_over"]] == passed_over
    assert all(why in n["reason"] for n in record.notes["resume_passed_over"])
    for name, data in bad_bytes.items():  # kept, byte for byte, out of the way of the resumed run's saves
        assert (folder / f"{name}.unusable").read_bytes() == data
    log = " ".join(log_texts(tmp_path, run="t"))
    assert f"passed over {folder / 'latest.ckpt'}" in log and f"resumed from {folder / f'ba{resumes_at:09d}.ckpt'}" in log
    # Neither a batch repeated nor one skipped: the same weights as a run that was never interrupted.
    reference = make_trainer(tmp_path / "reference")
    reference.fit()
    for name, value in reference.state.model.state_dict().items():
        assert torch.equal(resumed.state.model.state_dict()[name], value), name


def test_autoresume_with_no_checkpoint_that_verifies_stops_and_keeps_them_all(tmp_path):
    folder = interrupted_at_6(tmp_path)
    for name in ("ba000000004.ckpt", "ba000000005.ckpt", "latest.ckpt"):
        corrupt_in_place(folder / name)  # latest is ba6
    before = sorted(p.name for p in folder.iterdir())
    with pytest.raises(CheckpointError) as failure:
        make_trainer(tmp_path, autoresume=True).fit()
    message = str(failure.value)
    assert f"no checkpoint in {folder} can be used" in message and "start afresh under another run name" in message
    assert all(f"{folder / n} is corrupt" in message for n in ("ba000000004.ckpt", "ba000000005.ckpt", "latest.ckpt"))
    assert sorted(p.name for p in folder.iterdir()) == before  # nothing deleted, nothing renamed


# -- Ctrl-C inside a step ---------------------------------------------------------------------------------
def two_optimizers(model):
    """One optimizer for the first layer, one for the rest: an interrupt between their steps is mid-update."""
    first = list(model[0].parameters())
    rest = [p for p in model.parameters() if all(p is not q for q in first)]
    return [torch.optim.SGD(first, lr=0.1, momentum=0.9), torch.optim.SGD(rest, lr=0.1, momentum=0.9)]


def on_fifth(action):
    """A hook that calls ``action()`` the fifth time it runs in training (the step of batch 5)."""
    calls = {"n": 0}

    def hook(*args):
        calls["n"] += 1
        if calls["n"] == 5:
            action()
    return hook


def sigint() -> None:
    os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C, delivered to this (the main) thread


def interrupt_inside(phase: str, model, optimizers, action) -> None:
    """Arrange ``action`` inside batch 5's forward, backward, or optimizer step (after the first optimizer)."""
    hook = on_fifth(action)
    if phase == "forward":
        model[0].register_forward_hook(lambda module, args, out: hook() if module.training else None)
    elif phase == "backward":
        model[3].register_full_backward_hook(lambda module, grad_in, grad_out: hook())  # the last Linear
    else:
        optimizers[0].register_step_post_hook(lambda optimizer, args, kwargs: hook())


def interrupted_run(tmp_path, phase, action, **kwargs):
    model = toy_model()
    optimizers = two_optimizers(model)
    interrupt_inside(phase, model, optimizers, action)
    trainer = make_trainer(tmp_path, model=model, optimizers=optimizers, save_interval="2ba", **kwargs)
    with pytest.raises(KeyboardInterrupt):
        trainer.fit()
    return RunRecord.load(tmp_path / "t")


def resumed_equals_uninterrupted(tmp_path) -> None:
    """Resume the run to its end: the same weights as a run never interrupted (no batch repeated or skipped)."""
    model = toy_model()
    resumed = make_trainer(tmp_path, model=model, optimizers=two_optimizers(model), autoresume=True)
    assert resumed.fit().status == "completed" and resumed.state.timestamp.batch == 16
    model = toy_model()
    reference = make_trainer(tmp_path / "reference", model=model, optimizers=two_optimizers(model))
    reference.fit()
    for name, value in reference.state.model.state_dict().items():
        assert torch.equal(resumed.state.model.state_dict()[name], value), name


@pytest.mark.parametrize("phase", ["forward", "backward", "optimizer step"])
def test_ctrl_c_inside_a_step_saves_after_that_batch_and_resume_neither_repeats_nor_skips(tmp_path, phase):
    record = interrupted_run(tmp_path, phase, sigint)
    assert record.status == "interrupted" and record.steps[-1]["batch"] == 5
    assert checkpoint_batch(tmp_path / "t" / "checkpoints" / "latest.ckpt") == 5  # the whole batch, then saved
    assert "interrupted_mid_step" not in record.notes
    resumed_equals_uninterrupted(tmp_path)


def raise_keyboard_interrupt():
    raise KeyboardInterrupt


@pytest.mark.parametrize("phase", ["forward", "optimizer step"])
@pytest.mark.parametrize("action", [lambda: (sigint(), sigint()), raise_keyboard_interrupt],
                         ids=["second Ctrl-C", "raised by code"])
def test_an_interrupt_that_cannot_wait_keeps_the_last_checkpoint(tmp_path, phase, action):
    record = interrupted_run(tmp_path, phase, action)
    assert record.status == "interrupted" and record.steps[-1]["batch"] == 4  # batch 5 was never counted
    assert checkpoint_batch(tmp_path / "t" / "checkpoints" / "latest.ckpt") == 4  # not the half-done state
    assert "inside the step of batch 5" in record.notes["interrupted_mid_step"]
    assert "no checkpoint was written" in " ".join(log_texts(tmp_path, run="t"))
    resumed_equals_uninterrupted(tmp_path)


def ema_run(tmp_path, **kwargs):
    from speedkit.methods import EMA

    train, test = toy_loaders()
    return make_trainer(tmp_path, methods=[EMA(half_life="2ba")], eval_dataloader=test, eval_interval="2ba",
                        **kwargs)


def test_ctrl_c_during_an_evaluation_with_ema_swapped_in_saves_the_trained_weights(tmp_path):
    """EMA swaps its average into the model for an evaluation: a checkpoint written then would hold the average
    as the trained weights. A Ctrl-C there waits for the evaluation to end (and the weights to be swapped back)."""
    trainer = ema_run(tmp_path)
    hook = on_fifth(sigint)  # eval-mode forwards: one at fit start, two per evaluation: the 5th is after batch 4
    trainer.state.model[0].register_forward_hook(lambda module, args, out: None if module.training else hook())
    with pytest.raises(KeyboardInterrupt):
        trainer.fit()
    assert checkpoint_batch(tmp_path / "t" / "checkpoints" / "latest.ckpt") == 4
    resumed = ema_run(tmp_path, autoresume=True)
    resumed.fit()
    reference = ema_run(tmp_path / "reference")
    reference.fit()
    for name, value in reference.state.model.state_dict().items():
        assert torch.equal(resumed.state.model.state_dict()[name], value), name


def test_a_double_ctrl_c_during_an_evaluation_is_reported_as_one_not_as_a_step(tmp_path):
    trainer = ema_run(tmp_path)
    hook = on_fifth(lambda: (sigint(), sigint()))  # the second one cannot wait for the evaluation's end
    trainer.state.model[0].register_forward_hook(lambda module, args, out: None if module.training else hook())
    with pytest.raises(KeyboardInterrupt):
        trainer.fit()
    note = RunRecord.load(tmp_path / "t").notes["interrupted_mid_step"]
    assert note.startswith("interrupted during an evaluation or a checkpoint write after batch 4")
    assert "inside the step" not in note


def test_a_resumed_run_saves_at_the_uninterrupted_runs_moments_not_one_batch_after_the_resume(tmp_path):
    """The save interval's last mark rides in the checkpoint: resumed at a save, the next save is an interval
    later (not the next batch), so no extra checkpoint pushes an older good one out of the few kept."""
    stopped = make_trainer(tmp_path, [At(4, lambda t: t.stop())], max_duration="8ba", save_interval="2ba",
                           keep_checkpoints=2)
    assert stopped.fit().status == "stopped"
    folder, seen = tmp_path / "t" / "checkpoints", []
    listing = lambda t: seen.extend(sorted(p.name for p in folder.glob("ba*.ckpt")))
    resumed = make_trainer(tmp_path, [At(6, listing)], max_duration="8ba", save_interval="2ba", keep_checkpoints=2,
                           autoresume=True)
    assert resumed.fit().status == "completed"
    assert seen == ["ba000000002.ckpt", "ba000000004.ckpt"]  # at batch 6: no save at 5 pushed batch 2 out
    assert sorted(p.name for p in folder.glob("ba*.ckpt")) == ["ba000000006.ckpt", "ba000000008.ckpt"]


def test_sighup_saves_and_exits_129_as_sigterm_saves_and_exits_143(tmp_path, monkeypatch):
    installed = {}
    monkeypatch.setattr(signal, "getsignal", lambda signum: signal.SIG_DFL)
    monkeypatch.setattr(signal, "signal", lambda signum, handler: installed.setdefault(signum, handler))
    trainer = make_trainer(tmp_path, [At(2, lambda t: installed[signal.SIGHUP](signal.SIGHUP, None))])
    with pytest.raises(SystemExit) as exit_info:
        trainer.fit()
    assert exit_info.value.code == 129
    record = RunRecord.load(tmp_path / "t")
    assert record.status == "terminated" and record.stop_reason == "SIGHUP"
    assert checkpoint_batch(tmp_path / "t" / "checkpoints" / "latest.ckpt") == 2


def test_ctrl_c_between_runs_is_python_s_own_again(tmp_path):
    """The handler is routed to the Trainer only while a step runs: after fit, Ctrl-C raises at once."""
    make_trainer(tmp_path, max_duration="2ba").fit()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with pytest.raises(KeyboardInterrupt):
        sigint()
        time.sleep(1)  # the handler runs at the next bytecode; this is never reached in full


# -- microbatch_size="auto" under out-of-memory ------------------------------------------------------------
class MemoryHungry(torch.nn.Module):
    """The toy model, with a simulated device memory: training forwards of more than ``limit`` samples raise
    an out-of-memory error, and so does the ``fail_calls``-th training forward (as fragmentation might)."""

    def __init__(self, limit, fail_calls=(), error=lambda: torch.cuda.OutOfMemoryError("CUDA out of memory.")):
        super().__init__()
        self.net, self.limit, self.fail_calls, self.error = toy_model(), limit, set(fail_calls), error
        self.sizes, self.errors = [], 0

    def forward(self, x):
        if self.training:
            self.sizes.append(x.shape[0])
            if x.shape[0] > self.limit or len(self.sizes) in self.fail_calls:
                self.errors += 1
                raise self.error()
        return self.net(x)


def weights_after(tmp_path, model, batches="1ba", **kwargs):
    train, _ = toy_loaders(shuffle=False)
    trainer = Trainer(model, train, max_duration=batches, optimizers=lambda p: torch.optim.SGD(p, lr=0.5),
                      device="cpu", run_dir=tmp_path, save_checkpoints=False, **kwargs)
    record = trainer.fit()
    return trainer, record, [p.detach().clone() for p in trainer.state.model.parameters()]


def test_auto_microbatch_halves_on_out_of_memory_and_keeps_the_full_batch_gradient(tmp_path):
    # 32 samples: out of memory; 16: the first microbatch fits, the second (3rd call) fails; 8 fits.
    hungry = MemoryHungry(limit=20, fail_calls=[3])
    trainer, record, auto = weights_after(tmp_path / "auto", hungry, microbatch_size="auto")
    assert hungry.sizes == [32, 16, 16, 8, 8, 8, 8] and hungry.errors == 2
    assert trainer.microbatch_size == 8
    assert record.config["microbatch_size"] == "auto"
    assert record.notes["auto_microbatch"] == {"microbatch_size": 8, "reductions": [
        {"batch": 0, "from": 32, "to": 16}, {"batch": 0, "from": 16, "to": 8}]}
    assert sum("out of memory at batch 0" in t for t in trainer.memory_logger.texts) == 2
    # The half-accumulated gradient of the failed attempt is dropped: exactly the explicit-size run's step...
    _, _, explicit = weights_after(tmp_path / "explicit", MemoryHungry(limit=8), microbatch_size=8)
    for a, b in zip(auto, explicit):
        assert torch.equal(a, b)
    # ...which is the full batch's step, up to float summation order.
    _, _, full = weights_after(tmp_path / "full", MemoryHungry(limit=10**6))
    for a, b in zip(auto, full):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_auto_microbatch_keeps_the_size_for_later_steps_and_after_resume(tmp_path):
    hungry = MemoryHungry(limit=10)
    trainer = make_trainer(tmp_path, [At(3, lambda t: t.stop())], model=hungry, microbatch_size="auto")
    trainer.fit()
    assert hungry.errors == 2 and hungry.sizes[:2] == [32, 16]  # 32 and 16 fail once, on the first batch
    assert set(hungry.sizes[2:]) == {8} and trainer.microbatch_size == 8
    resumed_model = MemoryHungry(limit=10)
    resumed = make_trainer(tmp_path, model=resumed_model, microbatch_size="auto", autoresume=True)
    assert resumed.fit().status == "completed"
    assert resumed_model.errors == 0 and set(resumed_model.sizes) == {8}  # starts at the size it settled on


def rewrite_checkpoint(path: Path, change) -> None:
    """``change(payload)`` applied to the checkpoint at ``path``, written back with a valid checksum."""
    payload = load_checkpoint(path)
    change(payload)
    save_checkpoint(path, {k: v for k, v in payload.items() if k != "format_version"})


def forget_the_note(payload: dict) -> None:
    record = json.loads(payload["record"])
    del record["notes"]["auto_microbatch"]
    payload["record"] = json.dumps(record)


def as_written_before_microbatching_kept_its_state(payload: dict) -> None:
    del payload["microbatching"]


@pytest.mark.parametrize("change", [forget_the_note, as_written_before_microbatching_kept_its_state],
                         ids=["from the component's state, not the record", "an older checkpoint: from its record"])
def test_a_resumed_auto_microbatch_size_comes_from_the_microbatching_state_in_the_checkpoint(tmp_path, change):
    trainer = make_trainer(tmp_path, [At(3, lambda t: t.stop())], model=MemoryHungry(limit=10), microbatch_size="auto")
    trainer.fit()
    latest = tmp_path / "t" / "checkpoints" / "latest.ckpt"
    assert load_checkpoint(latest)["microbatching"] == {"size": 8, "reductions": [
        {"batch": 0, "from": 32, "to": 16}, {"batch": 0, "from": 16, "to": 8}]}
    rewrite_checkpoint(latest, change)
    resumed_model = MemoryHungry(limit=10)
    resumed = make_trainer(tmp_path, model=resumed_model, microbatch_size="auto", load_path=latest)
    assert resumed.microbatch_size is None  # nothing read from the record.json beside the checkpoint
    assert resumed.fit().status == "completed"
    assert resumed_model.errors == 0 and set(resumed_model.sizes) == {8}  # the size the first part settled on


@pytest.mark.parametrize("error", [lambda: torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate"),
                                   lambda: RuntimeError("CUDA error: out of memory"),
                                   lambda: RuntimeError("MPS backend out of memory (MPS allocated: 1 GB)")],
                         ids=["OutOfMemoryError", "cuda RuntimeError", "mps RuntimeError"])
def test_auto_microbatch_recognises_out_of_memory_errors(tmp_path, error):
    hungry = MemoryHungry(limit=16, error=error)
    trainer, record, _ = weights_after(tmp_path, hungry, microbatch_size="auto")
    assert record.status == "completed" and trainer.microbatch_size == 16 and hungry.errors == 1


def test_auto_microbatch_gives_up_below_one_sample_with_a_clear_message(tmp_path):
    hungry = MemoryHungry(limit=0)
    train, _ = toy_loaders(shuffle=False)
    trainer = Trainer(hungry, train, max_duration="1ba", microbatch_size="auto", device="cpu", run_dir=tmp_path,
                      run_name="t")
    with pytest.raises(torch.OutOfMemoryError, match="even with microbatches of 1 sample") as failure:
        trainer.fit()
    assert isinstance(failure.value.__cause__, torch.OutOfMemoryError)
    assert hungry.sizes == [32, 16, 8, 4, 2, 1]
    record = RunRecord.load(tmp_path / "t")
    assert record.status == "failed" and "even with microbatches of 1 sample" in record.error


@pytest.mark.parametrize("microbatch_size, error", [
    ("auto", lambda: RuntimeError("mat1 and mat2 shapes cannot be multiplied")),  # not memory: not retried
    (None, lambda: torch.cuda.OutOfMemoryError("CUDA out of memory.")),  # memory, but "auto" is off
    (8, lambda: torch.cuda.OutOfMemoryError("CUDA out of memory.")),
], ids=["auto, not a memory error", "memory error, auto off", "memory error, fixed size"])
def test_only_out_of_memory_in_auto_mode_is_retried(tmp_path, microbatch_size, error):
    hungry = MemoryHungry(limit=0, error=error)
    train, _ = toy_loaders(shuffle=False)
    trainer = Trainer(hungry, train, max_duration="1ba", microbatch_size=microbatch_size, device="cpu",
                      run_dir=tmp_path, run_name="t")
    with pytest.raises(Exception):  # (the first batch's non-memory errors come back explained, as ValueError)
        trainer.fit()
    assert hungry.errors == 1
    assert RunRecord.load(tmp_path / "t").status == "failed"


def test_microbatch_size_accepts_auto_and_refuses_other_words(tmp_path):
    train, _ = toy_loaders()
    with pytest.raises(ValueError, match="'auto'"):
        Trainer(toy_model(), train, microbatch_size="max", run_dir=tmp_path)


def test_auto_microbatch_is_refused_under_torchrun_where_ranks_would_halve_apart(tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")  # what torchrun sets; refused before any process group opens
    train, _ = toy_loaders()
    with pytest.raises(ValueError, match="microbatch_size='auto' runs in one process only"):
        Trainer(toy_model(), train, microbatch_size="auto", run_dir=tmp_path)


# -- any failure during fit ---------------------------------------------------------------------------
class Failing(Exception):
    pass


class FailingBase(BaseException):
    """Not an Exception: like SystemExit or GeneratorExit, it still must leave a record."""


def raise_(error):
    raise error


FAILURES = {
    "ValueError in a callback": (lambda: ValueError("bad value"), "ValueError: bad value"),
    "RuntimeError in a callback": (lambda: RuntimeError("device-side assert"), "RuntimeError: device-side assert"),
    "custom exception": (lambda: Failing("custom"), "Failing: custom"),
    "BaseException subclass": (lambda: FailingBase("base"), "FailingBase: base"),
    "SystemExit from user code": (lambda: SystemExit(3), "SystemExit: 3"),
    "MemoryError": (lambda: MemoryError("host memory"), "MemoryError: host memory"),
}


@pytest.mark.parametrize("kind", list(FAILURES))
def test_any_exception_during_fit_leaves_a_failed_record_and_the_last_checkpoint(tmp_path, kind):
    make, error_text = FAILURES[kind]
    folder = tmp_path / "t" / "checkpoints"
    watcher = FolderSnapshot(folder)
    trainer = make_trainer(tmp_path, [watcher, At(7, lambda t: raise_(make()))], save_interval="5ba")
    with pytest.raises(BaseException) as failure:
        trainer.fit()
    assert str(failure.value) in error_text
    record = RunRecord.load(tmp_path / "t")
    assert record.status == "failed" and record.error == error_text
    assert record.steps[-1]["batch"] == 7
    assert snapshot(folder) == watcher.last and checkpoint_batch(folder / "latest.ckpt") == 5


def test_a_failing_data_loader_or_loss_leaves_a_failed_record(tmp_path):
    def broken_batches():
        x, y = next(iter(toy_loaders()[0]))
        yield x, y
        raise OSError("the data disk went away")

    class Loader:
        batch_size = 32

        def __len__(self):
            return 8

        def __iter__(self):
            return broken_batches()

    trainer = make_trainer(tmp_path, train=Loader())
    with pytest.raises(OSError):
        trainer.fit()
    assert RunRecord.load(tmp_path / "t").error == "OSError: the data disk went away"

    calls = []

    def loss(outputs, targets):  # fails at the third batch, after the first-batch checks
        calls.append(1)
        if len(calls) == 3:
            raise TypeError("loss got the wrong targets")
        return torch.nn.functional.cross_entropy(outputs, targets)

    trainer = make_trainer(tmp_path / "loss", loss_fn=loss)
    with pytest.raises(TypeError):
        trainer.fit()
    record = RunRecord.load(tmp_path / "loss" / "t")
    assert record.status == "failed" and "loss got the wrong targets" in record.error


def failing_write_on(call, monkeypatch):
    """The ``call``-th checkpoint write dies mid-way with a full disk, inside the real atomic write."""
    import speedkit.train.checkpoint.format as checkpoint_module
    from speedkit.record.runs import atomic_write_bytes

    calls = {"n": 0}
    real_fsync = os.fsync

    def write(path, data):
        calls["n"] += 1
        if calls["n"] != call:
            return atomic_write_bytes(path, data)

        def full_disk(fd):
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(os, "fsync", full_disk)
        try:
            return atomic_write_bytes(path, data)
        finally:
            monkeypatch.setattr(os, "fsync", real_fsync)

    monkeypatch.setattr(checkpoint_module, "atomic_write_bytes", write)


def test_a_failed_checkpoint_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    failing_write_on(2, monkeypatch)
    folder = tmp_path / "t" / "checkpoints"
    trainer = make_trainer(tmp_path, save_interval="4ba")
    with pytest.raises(OSError, match="No space left"):
        trainer.fit()
    record = RunRecord.load(tmp_path / "t")
    assert record.status == "failed" and "No space left on device" in record.error
    assert checkpoint_batch(folder / "latest.ckpt") == 4
    assert sorted(p.name for p in folder.iterdir()) == ["ba000000004.ckpt", "latest.ckpt"]  # no temp file left


def test_a_failed_final_save_marks_the_run_failed(tmp_path, monkeypatch):
    failing_write_on(1, monkeypatch)  # the only checkpoint is the final one
    trainer = make_trainer(tmp_path, max_duration="3ba")
    with pytest.raises(OSError):
        trainer.fit()
    record = RunRecord.load(tmp_path / "t")
    assert record.status == "failed" and "No space left on device" in record.error


def test_keyboard_interrupt_saves_a_checkpoint_and_an_interrupted_record(tmp_path):
    trainer = make_trainer(tmp_path, [At(5, lambda t: raise_(KeyboardInterrupt()))])
    with pytest.raises(KeyboardInterrupt):
        trainer.fit()
    record = RunRecord.load(tmp_path / "t")
    assert record.status == "interrupted" and record.error == "KeyboardInterrupt"
    assert checkpoint_batch(tmp_path / "t" / "checkpoints" / "latest.ckpt") == 5
    resumed = make_trainer(tmp_path, autoresume=True)
    assert resumed.fit().status == "completed" and resumed.state.timestamp.batch == 16
