"""What a sandboxed run may use (:class:`Limits`) and what it produced (:class:`ExecResult`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

Status = Literal["ok", "error", "timeout", "memory", "killed"]


@dataclass(frozen=True)
class Limits:
    """Resource limits of one run. ``cpu_seconds`` 0 means the wall timeout, rounded up."""

    timeout: float = 10.0
    memory_mb: int = 512
    cpu_seconds: float = 0.0
    max_processes: int = 16
    max_file_mb: int = 16
    max_output_bytes: int = 65536

    def __post_init__(self) -> None:
        if self.timeout <= 0 or self.memory_mb <= 0 or self.max_processes < 1 or self.max_file_mb < 0:
            raise ValueError(f"sandbox limits must be positive: {self}")

    def request(self) -> dict[str, Any]:
        """The limits as the fork server reads them."""
        return {
            "timeout": self.timeout,
            "memory_bytes": self.memory_mb << 20,
            "cpu_seconds": self.cpu_seconds or self.timeout,
            "max_processes": self.max_processes,
            "max_file_bytes": self.max_file_mb << 20,
            "max_output_bytes": self.max_output_bytes,
        }


@dataclass
class ExecResult:
    """The outcome of one program.

    ``status``: ``ok`` (exit code 0), ``error`` (non-zero exit, e.g. an uncaught exception),
    ``timeout`` (wall or CPU time limit), ``memory`` (MemoryError under the address-space limit),
    ``killed`` (ended by a signal, or left processes behind that the sandbox killed; ``message``
    says which). ``stdout``/``stderr`` hold at most ``Limits.max_output_bytes`` each
    (``truncated`` says whether anything was cut).
    """

    status: Status
    exit_code: int | None
    stdout: str
    stderr: str
    duration: float
    truncated: bool = False
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
