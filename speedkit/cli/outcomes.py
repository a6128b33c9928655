"""How the ``speedkit`` command ends when a run does not: what it prints and the exit status.

* A mistake in what the user typed (an unknown task, a bad flag value, a run folder that is taken) is one
  line, ``speedkit: error: ...``, exit status 2: the message names the flag and the fix, and a traceback
  into speedkit would only hide it.
* An error raised in the user's own code (their model, Task, method or data function, imported through
  ``--task module:attr`` or a plugin) keeps its traceback, which is what they need to fix it; exit status 1.
* Ctrl-C prints one line: where training stopped, the checkpoint it wrote, and the command that continues
  it; exit status 130 (128 + SIGINT, what shells expect). SIGTERM saves and exits 143, SIGHUP (a closed
  terminal, an SSH drop) saves and exits 129: the same command with ``--autoresume`` continues either.
* A file system that refuses a write (full, read-only, a folder where a file is meant, a name too long) is
  one line naming the path and the fix, exit status 2; a run stopped by it says where, and how to continue.
"""
from __future__ import annotations

import errno
import shlex
import sys
import sysconfig
import traceback
from pathlib import Path

INTERRUPTED_EXIT_CODE = 130
INPUT_ERROR_EXIT_CODE = 2
USER_CODE_EXIT_CODE = 1

_SPEEDKIT = Path(__file__).resolve().parents[1]  # the speedkit package
_LIBRARIES = tuple(Path(p).resolve() for p in {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib",
                                                                                    "platlib")})


def _is_user_file(filename: str) -> bool:
    """A file of the user's own code: not speedkit, not Python's standard library, not an installed package."""
    if filename.startswith("<"):  # <frozen importlib._bootstrap>, <string>
        return False
    path = Path(filename).resolve()
    if path.is_relative_to(_SPEEDKIT) or any(path.is_relative_to(lib) for lib in _LIBRARIES):
        return False
    return "site-packages" not in path.parts and "dist-packages" not in path.parts


def _chain(error: BaseException):
    """``error`` and the errors it was raised from or during, each once."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def raised_in_user_code(error: BaseException) -> bool:
    """True when ``error`` (or an error it was raised from) passed through a frame of the user's own code."""
    return any(_is_user_file(frame.filename) for e in _chain(error)
               for frame in traceback.extract_tb(e.__traceback__))


def report_error(error: BaseException) -> int:
    """Print ``error`` the way its kind deserves (see the module's docstring); returns the exit status."""
    if raised_in_user_code(error):
        traceback.print_exception(error)
        print(f"speedkit: error in your code (traceback above): {type(error).__name__}: {error}", file=sys.stderr)
        return USER_CODE_EXIT_CODE
    print(f"speedkit: error: {error}", file=sys.stderr)
    return INPUT_ERROR_EXIT_CODE


def report_refusal(error: BaseException) -> int:
    """A file system, the memory or a diverged loss refusing what was asked: one line, exit status 2; the
    traceback where the error came from the user's own code (exit status 1)."""
    if raised_in_user_code(error) or (isinstance(error, OSError) and not is_file_system_error(error)) \
            or (isinstance(error, MemoryError) and not str(error)):
        raise error
    message = describe_os_error(error) if isinstance(error, OSError) else str(error)
    print(f"speedkit: error: {message}", file=sys.stderr)
    return INPUT_ERROR_EXIT_CODE


def resume_command(argv: list[str], run_name: str) -> str:
    """The ``speedkit`` command line that continues the run ``argv`` started: the same arguments, with
    ``--autoresume`` (never ``--overwrite``) and the run's name, which an unnamed run was given."""
    args = [a for a in argv if a != "--overwrite"]
    if not any(a == "--run-name" or a.startswith("--run-name=") for a in args):
        args += ["--run-name", run_name]
    if "--autoresume" not in args:
        args.append("--autoresume")
    return shlex.join(["speedkit", *args])


def interrupted_line(trainer, argv: list[str]) -> str:
    """One line for a Ctrl-C: where the run stopped, its newest checkpoint, and the command that resumes it."""
    if trainer is None:
        return "speedkit: interrupted before training started; nothing was written"
    stamp = trainer.state.timestamp
    checkpoint = trainer.checkpointer.last_checkpoint  # the newest this run wrote (or resumed from)
    where = f"interrupted after batch {stamp.batch} (epoch {stamp.epoch})"
    if checkpoint is None or not Path(checkpoint).exists():
        return f"speedkit: {where}; no checkpoint was written, so a new run starts from the beginning"
    return f"speedkit: {where}; checkpoint {checkpoint}; resume with: {resume_command(argv, trainer.run_name)}"


_OS_FIXES = {
    errno.ENOSPC: "the disk is full: free space there, or give a --run-dir / --out on another disk",
    errno.EDQUOT: "the disk quota is used up: free space there, or give a --run-dir / --out on another disk",
    errno.EROFS: "the file system is read-only: give a --run-dir / --out you can write to",
    errno.EACCES: "permission denied: give a --run-dir / --out you can write to, or fix its permissions",
    errno.EPERM: "permission denied: give a --run-dir / --out you can write to, or fix its permissions",
    errno.EISDIR: "it is a folder, not a file: name a file",
    errno.ENOTDIR: "a part of the path is a file, not a folder: give a folder path (--run-dir names a folder)",
    errno.EEXIST: "a file of that name is in the way of a folder: give another path",
    errno.ENAMETOOLONG: "the name is too long for the file system: give a shorter --run-name / path",
}


def describe_os_error(error: OSError) -> str:
    """One line for a file system refusal: the path, what the system said, and the fix."""
    where = error.filename if error.filename is not None else "a file"
    fix = _OS_FIXES.get(error.errno)
    said = error.strerror or str(error)
    if isinstance(error, (IsADirectoryError, NotADirectoryError)) and error.strerror is None:
        return str(error)  # speedkit's own message, naming the flag
    return f"cannot write {where}: {said}" + (f"; {fix}" if fix else "")


def is_file_system_error(error: BaseException) -> bool:
    """An OSError from the file system (a path, or an errno that the fixes above know), not a network or other one."""
    return isinstance(error, OSError) and (error.errno in _OS_FIXES or error.filename is not None
                                           or isinstance(error, (IsADirectoryError, NotADirectoryError)))


def stopped_line(trainer, argv: list[str], error: Exception) -> str:
    """One line for a run stopped by the file system (or a diverged loss): what failed, where training stopped,
    which checkpoint is intact, and how to go on."""
    stamp = trainer.state.timestamp
    checkpoint = trainer.checkpointer.last_checkpoint
    if isinstance(error, OSError) and checkpoint is None and _earlier_checkpoints(trainer):
        return kept_run_line(trainer, argv, error)
    what = describe_os_error(error) if isinstance(error, OSError) else str(error)
    where = f"training stopped after batch {stamp.batch} (epoch {stamp.epoch})"
    if isinstance(error, OSError):
        then = f"once fixed, continue with: {resume_command(argv, trainer.run_name)}"
    else:  # the same settings would diverge again: change them and start afresh
        then = "change the settings named above and start again under another --run-name (or with --overwrite)"
    if checkpoint is not None and Path(checkpoint).exists():
        return f"speedkit: error: {what}; {where}; its last checkpoint {checkpoint} is intact: {then}"
    return (f"speedkit: error: {what}; {where} before any checkpoint was written: "
            + (f"once fixed, start it again with: {restart_command(argv, trainer.run_name)}"
               if isinstance(error, OSError) else then))


def _earlier_checkpoints(trainer) -> list[Path]:
    """The checkpoints an earlier run left in this run's folder (what a resume would continue from)."""
    from speedkit.record.run_folder import checkpoint_files

    folder = trainer.owner.claim.checkpoint_folder
    return checkpoint_files(folder) if folder is not None else []


_CANNOT_WRITE = (errno.EROFS, errno.EACCES, errno.EPERM)


def kept_run_line(trainer, argv: list[str], error: OSError) -> str:
    """One line for a run whose folder holds an earlier run's checkpoints and refused a write before anything
    was trained (a resume on a read-only disk): that run is as it was, and the fixes keep it. Never --overwrite,
    which would delete the checkpoints."""
    folder = trainer.run_folder
    newest = _earlier_checkpoints(trainer)[-1]
    said = f"cannot write {error.filename if error.filename is not None else 'a file'}: {error.strerror or error}"
    kept = f"nothing was trained and the run in {folder} is as it was (its checkpoint {newest} is intact)"
    if error.errno not in _CANNOT_WRITE:
        fix = _OS_FIXES.get(error.errno, "fix what the system said")
        return f"speedkit: error: {said}; {kept}; {fix}, then run the same command again"
    elsewhere = f"DIR/{trainer.run_name}"
    return (f"speedkit: error: {said}; {kept}. To continue it, make {folder} writable (remount the disk read-write, "
            f"or fix its permissions) and run the same command again; or copy the run folder to a disk you can "
            f"write to (cp -r {folder} {elsewhere}) and continue it there: "
            f"{resume_command(_with_run_dir(argv, 'DIR'), trainer.run_name)}")


def _with_run_dir(argv: list[str], run_dir: str) -> list[str]:
    """``argv`` with ``--run-dir run_dir`` in place of the one it gave, if any."""
    args, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--run-dir":
            skip = True
        elif not a.startswith("--run-dir="):
            args.append(a)
    return [*args, "--run-dir", run_dir]


def restart_command(argv: list[str], run_name: str) -> str:
    """The ``speedkit`` command line that starts the run again from the beginning, in the same folder."""
    args = [a for a in argv if a not in ("--autoresume", "--overwrite")]
    if not any(a == "--run-name" or a.startswith("--run-name=") for a in args):
        args += ["--run-name", run_name]
    return shlex.join(["speedkit", *args, "--overwrite"])
