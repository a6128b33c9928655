"""The Trainer's side of "a run folder has one owner" (the rules are ``speedkit.record.run_folder``'s): rank 0
checks and locks the folder, every rank hears a refusal, and a run continuing an earlier one writes nothing
over that run until its checkpoint is loaded."""
from __future__ import annotations

import warnings

from speedkit.core import distributed
from speedkit.record.run_folder import RunFolderClaim, RunFolderError


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
        self.claim = RunFolderClaim(run_folder, None if checkpointer.remote else checkpointer.folder,
                                    autoresume=autoresume, overwrite=overwrite, extend_duration=extend_duration)
        self.run_folder, self.record, self.max_duration = run_folder, record, str(max_duration)
        on_main(self.claim.check, record.config, record.methods, self.max_duration)

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
