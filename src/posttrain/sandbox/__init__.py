"""Isolated execution of untrusted Python: bubblewrap around a warm pool of fork servers."""

from posttrain.sandbox.backends import SandboxUnavailable, find_bwrap
from posttrain.sandbox.pool import Sandbox, shared_sandbox
from posttrain.sandbox.result import ExecResult, Limits, Status

__all__ = ["ExecResult", "Limits", "Sandbox", "SandboxUnavailable", "Status", "find_bwrap", "shared_sandbox"]
