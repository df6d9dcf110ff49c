"""The run directory (``output_dir``): one writer at a time, and no silent mixing of two runs.

``open_run_dir`` is what a command that writes a run (train, dpo, sft; rm train and prm train on their logs
directory) does first:

- it checks that ``output_dir`` is (or can be made) a writable directory, so a path that is a
  file, read-only or not creatable stops before any model is loaded;
- it takes an exclusive ``flock`` on ``output_dir/.lock`` for the life of the run, so a second run
  into the same directory stops at once instead of interleaving its metrics with the first's
  (the lock dies with the process, however it ends: no stale lock to clean up);
- it refuses a directory that holds a previous run unless asked to replace it (``overwrite``:
  the old metrics, events, samples and summary are removed; old checkpoints stay until the new
  run writes the same step, which replaces them atomically) or to continue it (``resume``);
- it finishes any checkpoint replacement a crash interrupted (see ``recover_checkpoints``).
"""

from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path

from posttrain.train.checkpoint import recover_checkpoints

# What a run leaves in its directory; any of them means the directory was used.
# (labels.pt: `posttrain prm train`'s labelled solutions.)
RUN_FILES = ("metrics.jsonl", "summary.json", "config.json", "checkpoints", "tensorboard", "eval_samples",
             "labels.pt")
_REPLACED_BY_OVERWRITE = ("metrics.jsonl", "summary.json", "config.json", "tensorboard", "eval_samples", "labels.pt")


class RunDirError(ValueError):
    """The run directory cannot be used as asked; the message says why and what to do."""


class RunDir:
    """A locked run directory; ``close()`` (or leaving the ``with`` block) releases the lock."""

    def __init__(self, path: Path, lock_fd: int):
        self.path = path
        self._lock_fd = lock_fd

    def close(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = -1

    def __enter__(self) -> "RunDir":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def previous_run_files(path: Path) -> list[str]:
    """The files and folders of an earlier run in ``path`` (empty for a fresh directory)."""
    return [name for name in RUN_FILES if (path / name).exists()]


def open_run_dir(output_dir: str | Path, overwrite: bool = False, resume: bool = False,
                 what: str = "output_dir") -> RunDir:
    """Lock ``output_dir`` for one run; raise :class:`RunDirError` if it cannot be used as asked (the messages
    call the directory ``what``)."""
    path = Path(output_dir)
    if path.exists() and not path.is_dir():
        raise RunDirError(f"{what} {path} is a file (expected a directory for the run's checkpoints and metrics)")
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd = os.open(path / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise RunDirError(f"{what} {path} cannot be written: {e.strerror or e} (choose a writable output_dir)") \
            from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise RunDirError(f"{what} {path} is in use by another run (pid {holder}); wait for it to finish or "
                          "choose another output_dir") from None
    run = RunDir(path, fd)
    try:
        used = previous_run_files(path)
        if used and not (overwrite or resume):
            raise RunDirError(f"{what} {path} holds a previous run ({', '.join(used)}); pass --overwrite to "
                              "replace it or --resume to continue it, or choose another output_dir")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        if overwrite and not resume:
            for name in _REPLACED_BY_OVERWRITE:
                target = path / name
                if target.is_dir():
                    shutil.rmtree(target)
                elif target.exists():
                    target.unlink()
        recover_checkpoints(path)
    except OSError as e:
        run.close()
        raise RunDirError(f"{what} {path} cannot be written: {e.strerror or e}") from None
    except BaseException:
        run.close()
        raise
    return run
