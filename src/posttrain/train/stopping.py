"""Stopping a training run without losing it: SIGINT/SIGTERM, a failing disk, a step with no working episode.

A signal does not kill the run where it stands: :class:`RunGuard` records it, the trainer finishes
the step in flight (an optimiser step is never half-applied) and calls :meth:`RunGuard.check`,
which saves a checkpoint and raises :class:`TrainingStopped`; the CLI reports it in one line with
the checkpoint's path and exit code 128 + the signal number (130 for Ctrl-C, 143 for SIGTERM), as
for a process the signal killed. A second signal stops at once (KeyboardInterrupt), for a step that
takes too long. A write that fails (a full or read-only disk) or a step in which every episode
failed also stops the run, but only after the trained weights are saved (or rescued, see
:mod:`posttrain.train.checkpoint`) and the message says where.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from pathlib import Path

from posttrain.rollout.episodes import EpisodesFailed
from posttrain.train.checkpoint import CheckpointError


class TrainingStopped(RuntimeError):
    """The run stopped before its last step; the message says why, at which step and where it was saved."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


class RunGuard:
    """``with RunGuard(save, steps_done) as guard:`` around a training loop; ``guard.check()`` at each
    step boundary. ``save()`` writes a checkpoint of the current weights and returns its path;
    ``steps_done()`` is the number of completed training steps (0: nothing to save). ``after(done)`` and
    ``saved`` word the stop line for other work done in units (``prm train``'s labelling saves labels)."""

    def __init__(self, save: Callable[[], Path], steps_done: Callable[[], int],
                 after: Callable[[int], str] = "step {}".format, saved: str = "checkpoint"):
        self._save = save
        self._steps_done = steps_done
        self._after = after
        self._saved = saved
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "RunGuard":
        # Python delivers signals to the main thread only; elsewhere the default handling stays.
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handler) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def _handler(self, signum, frame) -> None:
        if self.signum is not None:
            raise KeyboardInterrupt  # the second signal: stop now, without saving
        self.signum = signum

    def check(self) -> None:
        """At a step boundary: if a signal came, save and raise :class:`TrainingStopped`."""
        if self.signum is None:
            return
        name, done = signal.Signals(self.signum).name, self._steps_done()
        if not done:
            raise TrainingStopped(f"stopped by {name} before the first training step: nothing to save",
                                  128 + self.signum)
        raise TrainingStopped(f"stopped by {name} after {self._after(done)}: {self._saved} saved to {self._save()}",
                              128 + self.signum)

    def __exit__(self, exc_type, exc, tb) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        if exc is None or not isinstance(exc, (OSError, EpisodesFailed)) or not self._steps_done():
            return  # a clean end, a stop already handled, or nothing trained yet
        try:
            path = self._save()
        except CheckpointError as saving:
            raise TrainingStopped(f"{_describe(exc)}; {saving}", 2) from None
        raise TrainingStopped(f"{_describe(exc)}; stopped after {self._after(self._steps_done())}: {self._saved} "
                              f"saved to {path}", 2) from None


def _describe(error: BaseException) -> str:
    if isinstance(error, OSError) and error.filename and error.strerror:
        return f"{error.filename}: {error.strerror}"
    return str(error)
