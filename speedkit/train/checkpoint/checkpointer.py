"""The Checkpointer: when and where a run's checkpoints are written, which are kept, and resuming from one.

What a checkpoint file holds and how it is laid out is ``speedkit.train.checkpoint.format``'s; what each rank
gathers for it and who writes is the run's parallel plan's (``speedkit.train.parallel``); remote folders are
``speedkit.train.checkpoint.storage``'s.
"""
from __future__ import annotations

import os
import shutil
import time
import warnings
from pathlib import Path

import torch

from speedkit.core import Timestamp, distributed
from speedkit.record.runs import RunRecord
from speedkit.train.checkpoint import format as checkpoint_format
from speedkit.train.checkpoint.format import SHARDED_SUFFIX, CheckpointContents, CheckpointError
from speedkit.train.checkpoint.storage import LATEST, RemoteFolder, download, is_remote, local_path


# -- a run's checkpoints ------------------------------------------------------------------------------
class Checkpointer:
    """A run's checkpoints: writing ``ba{batch}.ckpt`` and ``latest.ckpt``, keeping the newest few, and
    resuming from one. The run's parallel plan (``speedkit.train.parallel``) says what each rank gathers and
    who writes: under DDP rank 0 writes with every rank's RNG; under FSDP every rank writes its shards.

    ``state`` is the run's State, ``logger`` its Logger, ``plan`` its parallel plan, ``microbatching`` its
    Microbatching (whose state rides in the checkpoint). ``folder`` is the run's ``save_folder``: None for
    the run folder's ``checkpoints/``, a path, or an fsspec URL (``s3://...``, ``memory://...``), whose
    checkpoints are written in ``checkpoints/`` and mirrored there (see ``speedkit.train.checkpoint.storage``).
    The record names checkpoints inside ``run_folder`` relative to it, so a copied or moved run names its own.
    """

    def __init__(self, folder: str | os.PathLike | None, state, logger, plan, microbatching, *, run_name: str,
                 run_folder: str | os.PathLike, keep: int = 3):
        local = Path(run_folder) / "checkpoints"
        self.remote = RemoteFolder(str(folder)) if is_remote(folder) else None
        self.folder = local if not folder or self.remote else local_path(folder)
        self.run_folder = Path(run_folder)
        self.resumed_from: Path | None = None  # the checkpoint this run continued from, once one is loaded
        self.keep = keep
        self.state, self.logger, self.plan, self.run_name = state, logger, plan, run_name
        self.microbatching = microbatching
        self.last_checkpoint: Path | None = None  # the newest checkpoint this run wrote or resumed from

    @property
    def latest(self) -> Path:
        return self.folder / LATEST

    def recorded(self, path: str | os.PathLike) -> str:
        """How the record names a checkpoint: relative to the run folder when inside it, else absolute."""
        absolute = Path(os.path.abspath(path))
        try:
            return absolute.relative_to(os.path.abspath(self.run_folder)).as_posix()
        except ValueError:
            return str(absolute)

    # -- writing -----------------------------------------------------------------------------
    def contents(self, share, rng: dict) -> CheckpointContents:
        """Everything a resume needs: what the plan gathered (``share``), every component's own state, and
        this process's RNG state ``rng``."""
        state = self.state
        return CheckpointContents(
            model=share.model, optimizers=share.optimizers,
            schedulers=[s.state_dict() for s in _torch_schedulers(state)],
            grad_scaler=state.grad_scaler.state_dict() if state.grad_scaler is not None else None,
            methods={a.name: a.state_dict() for a in state.methods},
            callbacks={type(cb).__name__: cb.state_dict() for cb in state.callbacks},
            microbatching=self.microbatching.state_dict(),
            timestamp=state.timestamp.to_dict(), rng=rng, record=state.record.to_json(), run_name=self.run_name,
            rng_by_rank=share.rng_by_rank, sharded=share.sharded, dataloader=_loader_state(state.train_dataloader))

    def save(self) -> Path:
        """Write ``ba{batch}.ckpt`` and point ``latest.ckpt`` at it, both atomically; keep the newest few.

        Under torchrun only rank 0 writes (DDP: the plain module's weights, so one process can resume
        it); under FSDP every rank writes its shards beside it (``ba{batch}.dcp/``).
        """
        state = self.state
        start = time.perf_counter()
        path = self.folder / f"ba{state.timestamp.batch:09d}.ckpt"
        last, rng = self.recorded(self.last_checkpoint) if self.last_checkpoint else None, checkpoint_format.rng_state()
        share = self.plan.gather_checkpoint(state, self.logger, rng, last)
        if share is None:  # the plan writes none now (e.g. FSDP without its other ranks)
            return path
        if share.sharded:  # a collective: every rank writes its shards
            checkpoint_format.write_sharded(path, self.contents(share, rng))
        elif share.writes:
            checkpoint_format.write(path, self.contents(share, rng))
        self.last_checkpoint = path  # on a file system all ranks share
        self.logger.log_note("last_checkpoint", self.recorded(path))
        if distributed.is_main():
            self._point_latest_at(path)
            if self.remote is not None:
                self.remote.upload(path, self.latest, self.keep, SHARDED_SUFFIX)
                self.logger.log_note("remote_checkpoints", self.remote.url)
            state.record.save()
            self.logger.log_timing("checkpoint_s", time.perf_counter() - start, add=True)
        return path

    def point_latest_at(self, path: Path) -> None:
        """``latest.ckpt`` names ``path`` (a finished run's final checkpoint), unless it does already."""
        if distributed.is_main() and not _same_file(path, self.latest):
            self._point_latest_at(path)

    def _point_latest_at(self, path: Path) -> None:
        """Make ``latest.ckpt`` name ``path`` atomically, then drop all but the newest few checkpoints."""
        tmp = self.folder / f".{LATEST}.link"
        tmp.unlink(missing_ok=True)
        try:
            os.link(path, tmp)  # a second name for the same bytes: instant, and atomic with the rename
        except OSError:  # file systems without hard links
            shutil.copyfile(path, tmp)
        os.replace(tmp, self.latest)
        for old in sorted(self.folder.glob("ba*.ckpt"))[:-self.keep]:
            old.unlink()
            shutil.rmtree(old.with_suffix(SHARDED_SUFFIX), ignore_errors=True)  # an FSDP checkpoint's shards

    def remove_partial_writes(self) -> None:
        """Delete temp files that a killed save left behind (they never replaced a checkpoint)."""
        if not self.folder.is_dir():
            return
        for pattern in (".ba*.ckpt.*.tmp", f".{LATEST}.link"):
            for leftover in self.folder.glob(pattern):
                leftover.unlink(missing_ok=True)

    # -- resuming ----------------------------------------------------------------------------
    def resume(self, load_path: str | os.PathLike | None = None, autoresume: bool = False) -> dict | None:
        """Load ``load_path`` (or, with ``autoresume``, the newest checkpoint of the run that verifies) into
        the run's state.

        An explicit ``load_path`` that cannot be used is an error. With ``autoresume`` a checkpoint that does
        not verify (``latest.ckpt`` cut off or corrupted on disk) is passed over for the next newest one; it
        is kept, renamed ``<name>.unusable`` (so that the resumed run's saves neither overwrite nor prune
        it), and the log, a warning and ``record.notes["resume_passed_over"]`` say which file and why.
        Returns the RNG state the run continues from (set when its next epoch starts), None when nothing
        was loaded.
        """
        load_path = self._fetch_remote(load_path, autoresume)
        candidates = [Path(load_path)] if load_path is not None else self._autoresume_candidates() if autoresume else []
        seen = self.plan.ranks_that_see(bool(candidates))
        if len(set(seen)) > 1:
            raise CheckpointError(f"ranks disagree on resuming from {self.latest}: ranks "
                                  f"{[r for r, s in enumerate(seen) if not s]} do not see it; checkpoints must "
                                  f"be on a file system every rank shares")
        if not candidates:
            return None
        if load_path is not None:
            path, contents, passed_over = candidates[0], self._verified(candidates[0]), []
        else:
            path, contents, passed_over = self._newest_verified(candidates)
        self._load(contents, path)
        if passed_over:
            self._keep_aside(passed_over, path)
        if self.plan.world > 1 and len(contents.rng_by_rank or ()) != self.plan.world:
            note = (f"resumed from {path}, which holds one RNG state (written by one process, or by rank 0 alone "
                    f"after a failed or interrupted run): all {self.plan.world} ranks continue from it until the "
                    f"next epoch re-seeds each, so their random draws differ from an uninterrupted run")
            self.logger.log_note("rng_not_restored_per_rank", note)
            self.logger.log_text(note)
        return self.plan.resume_rng(contents.rng, contents.rng_by_rank)

    def newest_description(self) -> tuple[Path, dict] | None:
        """The newest checkpoint of the run that verifies and its own copy of the run's record (what its weights
        were trained under), or None when none verifies. Reads and checks the files, loads nothing."""
        for path in self._autoresume_candidates():
            try:
                return path, checkpoint_format.read_record(path)
            except CheckpointError:
                continue
        return None

    def _fetch_remote(self, load_path, autoresume: bool) -> Path | None:
        """Remote checkpoints copied into the local folder before a resume (rank 0 copies, the others wait);
        ``load_path`` as a local path."""
        if is_remote(load_path):
            if distributed.is_main():
                download(str(load_path), self.folder)
            distributed.barrier()
            return self.folder / str(load_path).rstrip("/").rsplit("/", 1)[-1]
        if self.remote is not None and autoresume and load_path is None:
            if distributed.is_main():
                self.remote.download_missing(self.folder, SHARDED_SUFFIX)
            distributed.barrier()
        return None if load_path is None else local_path(load_path)

    def _verified(self, path: Path) -> CheckpointContents:
        """The checkpoint's contents, every check passed (shards included); CheckpointError otherwise."""
        return checkpoint_format.read(path, map_location=self.state.device,
                                      mesh=self.plan.device_mesh(self.state.model))

    def _autoresume_candidates(self) -> list[Path]:
        """The run's checkpoints newest first: ``ba{batch}.ckpt`` by batch, ``latest.ckpt`` before the file it
        names (it is a second name for it), or, when it names none of them (copied, not linked, or its file
        rewritten since), before the first file written before it."""
        files = sorted(self.folder.glob("ba*.ckpt"), reverse=True)
        if not self.latest.exists():
            return files
        same = [i for i, f in enumerate(files) if _same_file(f, self.latest)]
        if same:
            at = same[0]
        else:  # a copy, or a checkpoint rewritten at its batch since (a final save after a periodic one there,
            # cut off before latest.ckpt was pointed at it): by time written, newest first
            written = _mtime(self.latest)
            at = next((i for i, f in enumerate(files) if _mtime(f) < written), len(files))
        return files[:at] + [self.latest] + files[at:]

    def _newest_verified(self, candidates: list[Path]) -> tuple[Path, CheckpointContents, list[tuple[Path, str]]]:
        """The first candidate that verifies on every rank, its contents, and (path, why) for those passed over."""
        passed_over: list[tuple[Path, str]] = []
        for path in candidates:
            earlier = [why for bad, why in passed_over if _same_file(bad, path)]
            if earlier:  # ba{batch}.ckpt after a bad latest.ckpt that names it: the same bytes
                passed_over.append((path, f"{earlier[0]} (the same file as {self.latest.name})"))
                continue
            try:
                contents, why = self._verified(path), None
            except CheckpointError as error:
                contents, why = None, str(error)
            # Every rank must load the same checkpoint (a sharded load is collective): any rank's failure counts.
            reasons = [r for r in distributed.all_gather_object(why) if r is not None]
            if not reasons:
                return path, contents, passed_over
            passed_over.append((path, reasons[0]))
        raise CheckpointError(f"autoresume: no checkpoint in {self.folder} can be used (all are kept as they "
                              "are): " + "; ".join(why for _, why in passed_over) +
                              ". Resume from a copy of the run, or start afresh under another run name")

    def _keep_aside(self, passed_over: list[tuple[Path, str]], resumed_from: Path) -> None:
        """Rename the checkpoints passed over to ``<name>.unusable`` (never delete them) and say so."""
        notes = []
        for path, why in passed_over:
            kept = _free_name(path.with_name(path.name + ".unusable"))
            if distributed.is_main():
                os.replace(path, kept)
                shards = path.with_suffix(SHARDED_SUFFIX)
                if shards.is_dir():  # an FSDP checkpoint's shards go with it, out of later saves' way
                    os.replace(shards, _free_name(shards.with_name(shards.name + ".unusable")))
            message = f"autoresume: passed over {path} and kept it as {kept.name}: {why}"
            self.logger.log_text(message + f"; resumed from {resumed_from} instead")
            warnings.warn(message, stacklevel=3)
            notes.append({"file": self.recorded(path), "kept_as": self.recorded(kept), "reason": why})
        self.logger.log_note("resume_passed_over", notes)

    def _load(self, contents: CheckpointContents, path) -> None:
        """Every component's state from ``contents``; the record carries on the history of the run's earlier part."""
        state = self.state
        try:
            self._load_weights(contents)
        except (RuntimeError, ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"{path} does not fit this model/optimizer ({_gist(e)}); it was written by a "
                                  f"different configuration: resume it with the settings it was trained with, or "
                                  f"start this run under another --run-name") from e
        for method in state.methods:
            method.load_state_dict(contents.methods.get(method.name, {}))
        for callback in state.callbacks:
            if type(callback).__name__ in contents.callbacks:
                callback.load_state_dict(contents.callbacks[type(callback).__name__])
        self.microbatching.load_state_dict(contents.microbatching)
        if contents.dataloader and _keeps_state(state.train_dataloader):  # refuses other data with the fix
            state.train_dataloader.load_state_dict(contents.dataloader)
        for callback in state.callbacks:  # a target reached at the checkpoint's batch: the run ends there again
            reason = getattr(callback, "stop_after_resume", None)
            if reason:
                state.request_stop(reason)
        state.timestamp = Timestamp.from_dict(contents.timestamp)
        state.record.continue_from(RunRecord.from_dict(contents.record_dict))
        self.logger.log_note("resumed_from", self.recorded(path))
        self.last_checkpoint = self.resumed_from = Path(path)
        state.eval_metrics = {}
        self.logger.log_text(f"resumed from {path} at epoch {state.timestamp.epoch}, batch {state.timestamp.batch}")

    def _load_weights(self, contents: CheckpointContents) -> None:
        """Model, optimizers, schedulers and loss scaler; a sharded checkpoint's are keyed by parameter name."""
        state = self.state
        if contents.sharded:
            from torch.distributed.checkpoint.state_dict import set_state_dict

            set_state_dict(state.model, [getattr(o, "base_optimizer", o) for o in state.optimizers],
                           model_state_dict=contents.model, optim_state_dict=contents.optimizers)
        else:
            state.model.load_state_dict(contents.model)
            for opt, sd in zip(state.optimizers, contents.optimizers):
                opt.load_state_dict(sd)
        for sched, sd in zip(_torch_schedulers(state), contents.schedulers):
            sched.load_state_dict(sd)
        if state.grad_scaler is not None and contents.grad_scaler:
            state.grad_scaler.load_state_dict(contents.grad_scaler)


def _keeps_state(loader) -> bool:
    """A loader that resumes from its own state: ``iter_from`` continues from what ``load_state_dict`` loaded
    (the streaming loaders). A loader whose ``iter_from`` is a pure function of the epoch needs none."""
    return all(callable(getattr(loader, name, None)) for name in ("state_dict", "load_state_dict", "iter_from"))


def _loader_state(loader) -> dict | None:
    return loader.state_dict() if _keeps_state(loader) else None


def _gist(error: Exception, limit: int = 300) -> str:
    """An error's message short enough to read: load_state_dict lists every key that does not fit."""
    text = " ".join(str(error).split())
    return text if len(text) <= limit else text[:limit] + " ..."


def _mtime(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _free_name(path: Path) -> Path:
    """``path``, or ``path-2``, ``path-3``, ... : the first that does not exist."""
    n, free = 1, path
    while free.exists():
        n += 1
        free = path.with_name(f"{path.name}-{n}")
    return free


def _torch_schedulers(state) -> list:
    return [s for s in state.schedulers if isinstance(s, torch.optim.lr_scheduler.LRScheduler)]
