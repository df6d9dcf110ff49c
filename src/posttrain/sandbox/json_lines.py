"""JSON lines from a child process's pipe, read against a deadline: how the sandbox's workers
(:mod:`posttrain.sandbox.pool`) and the isolated verifiers (:mod:`posttrain.rewards.isolated`) answer."""

from __future__ import annotations

import json
import os
import select
import time


class JsonLineReader:
    """Reads one JSON line at a time from the file descriptor ``fd``, keeping what arrived beyond it."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.ended = False  # the writer closed its end (it exited)
        self._buffer = b""

    def read(self, deadline: float) -> dict | None:
        """The next JSON line, or None when the writer ended or ``deadline`` (``time.monotonic()``) passed."""
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                return None
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                self.ended = True
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)
