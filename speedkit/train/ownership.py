"""The Trainer's side of "a run folder has one owner" (the rules are ``speedkit.record.run_folder``'s): rank 0
checks and locks the folder, every rank hears a refusal, and a run continuing an earlier one writes nothing
over that run until its checkpoint is loaded.

A resume is checked against the run description that the checkpoint it would load holds (its own copy of the
record: what its weights were trained under), not only against ``record.json``, which may be unreadable or
belong to another run. A run whose newest checkpoint says it ended (completed, target reached) is finished:
``autoresume`` trains nothing and leaves its record as it was (or writes it again from that checkpoint, when a
kill landed between the final checkpoint and the record)."""
from __future__ import annotations

import warnings
from pathlib import Path, PurePath

from speedkit.core import distributed
from speedkit.record.run_folder import RunFolderClaim, RunFolderError, record_again
from speedkit.record.runs import RunRecord

FINISHED = ("completed", "target_reached")  # a run in one of these states has nothing left to train


def on_main(fn, *args):
    """``fn(*args)`` on rank 0 (the run folder is rank 0's); a RunFolderError there is raised on every rank."""
    result, refusal = None, None
    if distributed.is_main():
        try:
            result = fn(*args)
        except RunFolderError as error:
            refusal = error
    refused = [r for r in distributed.all_gather_object(None if refusal is None else str(refusal)) if r]
    if refusal is not None:
        raise refusal
    if refused:
        raise RunFolderError(refused[0])
    return result


class FolderOwner:
    """One run's ownership of ``run_folder``: checked when built (a refusal there loses nothing), taken by
    ``begin`` when training starts, given back by ``close``. ``checkpointer`` says where checkpoints are."""

    def __init__(self, run_folder, checkpointer, record, max_duration, *, autoresume: bool, overwrite: bool,
                 extend_duration: bool):
        run_dir = Path(run_folder).parents[len(PurePath(checkpointer.run_name).parts) - 1]
        self.claim = RunFolderClaim(run_folder, None if checkpointer.remote else checkpointer.folder,
                                    autoresume=autoresume, overwrite=overwrite, extend_duration=extend_duration,
                                    run_dir=run_dir)
        self.run_folder, self.record, self.max_duration = run_folder, record, str(max_duration)
        self.checkpointer, self.extend_duration = checkpointer, extend_duration
        self._finished: tuple | None = None  # (checkpoint, its record) of a run that already ended
        on_main(self._check)
        self.finished = bool(distributed.all_gather_object(self._finished is not None)[0])

    def _check(self) -> None:
        self.claim.check(self.record.config, self.record.methods, self.max_duration)
        if not self.claim.continuing or self.claim.checkpoint_folder is None:
            return
        found = self.checkpointer.newest_description()
        if found is None:
            return  # none verifies: the resume says so, naming each file
        path, previous = found
        self.claim.check_against_checkpoint(previous, str(path), self.record.config, self.record.methods,
                                            self.max_duration)
        if previous.get("status") in FINISHED and not self.extend_duration:
            self._finished = (path, previous)

    @property
    def keeps_earlier_run(self) -> bool:
        """The folder's record and checkpoints are still the earlier run's: nothing may be written over them
        (a resume that failed before its checkpoint loaded leaves them as they were)."""
        return self.claim.continuing

    def begin(self) -> None:
        for line in on_main(self.claim.begin, self.record.config, self.record.methods, self.max_duration) or ():
            warnings.warn(line, stacklevel=3)

    def close(self) -> None:
        self.claim.end()

    def already_finished(self, record: RunRecord) -> RunRecord:
        """For a run that had ended (``finished``): its record as it was, nothing trained; the lock given back.
        record.json is kept byte for byte when it is that run's finished record, else written again from the
        final checkpoint's copy (a kill after the final checkpoint, before the record)."""
        try:
            if not distributed.is_main():
                return record
            path, previous = self._finished
            self.checkpointer.point_latest_at(path)  # a kill after the final write left latest.ckpt behind
            on_disk = None
            try:
                on_disk = RunRecord.load(self.run_folder / "record.json")
            except (OSError, ValueError, TypeError, KeyError):
                pass
            if on_disk is not None and on_disk.run_id == previous.get("run_id") and on_disk.status == previous.get("status"):
                finished = on_disk
            else:
                finished = record_again(previous, record.path, self.checkpointer.recorded(path))
            batch = finished.steps[-1]["batch"] if finished.steps else 0
            warnings.warn(f"autoresume: the run in {self.run_folder} had already ended ({finished.status} after "
                          f"{batch} batches); nothing was trained and its record stays as it was", stacklevel=3)
            return finished
        finally:
            self.close()

    def after_resume(self, timestamp, logger, resumed_from) -> None:
        """Continuing an earlier run: its checkpoint is loaded now (none loaded is refused, the earlier record
        kept as it is); from here the record is this run's, and it notes what the claim noted."""
        notes = self.claim.for_record
        if self.claim.continuing and resumed_from is None:
            raise RunFolderError(f"autoresume (--autoresume): no checkpoint of the run in {self.run_folder} could "
                                 f"be loaded, so nothing was changed; start it again with --overwrite "
                                 f"(overwrite=True), or give this run a new --run-name")
        self.claim.continuing = False
        extension = notes.pop("extended_duration", None)
        for key, note in notes.items():  # a lock taken over, an earlier run overwritten
            logger.log_note(key, note)
        if extension is not None:  # a list: a run may be lengthened more than once
            extension = {**extension, "at_batch": timestamp.batch}
            logger.log_note("extended_duration", extension, append=True)
            logger.log_text(f"extend_duration: training on from {extension['from']} to {extension['to']} after "
                            f"batch {extension['at_batch']}; the schedules follow the new budget")
