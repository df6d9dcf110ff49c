"""Starting and stopping Ray for a run: a local Ray by default, or an existing cluster (``ray.address``).

A run that starts Ray stops it when it ends, on error paths too (:meth:`RayRuntime.close` is called
from ``RunContext.close``; Ray's own exit hook covers a driver that dies before that). A run that finds
Ray already initialised in its process (a test, a notebook) uses it and leaves it running.
"""

from __future__ import annotations

import sys

from posttrain.config import RaySection

# A local Ray on a shared laptop: Ray's own memory monitor kills workers once the *machine* is 95% full,
# whoever uses the memory; the operating system's OOM killer still protects it.
LOCAL_SYSTEM_CONFIG = {"memory_monitor_refresh_ms": 0}


class RayUnavailable(RuntimeError):
    """env.workers or rollout.workers is set but Ray is not installed."""


def import_ray():
    try:
        import ray
    except ImportError:
        raise RayUnavailable("env.workers / rollout.workers need Ray: pip install 'posttrain[ray]'") from None
    return ray


class RayRuntime:
    """Ray, connected for the lifetime of a run."""

    def __init__(self, cfg: RaySection):
        ray = import_ray()
        self.started = not ray.is_initialized()
        if self.started:
            if cfg.address:
                ray.init(address=cfg.address, log_to_driver=False)
            else:
                ray.init(num_cpus=cfg.num_cpus, include_dashboard=False, log_to_driver=False,
                         _system_config=LOCAL_SYSTEM_CONFIG)

    @staticmethod
    def worker_sys_path() -> list[str]:
        """The driver's import path, for workers to find user env modules (``env.id: mymodule:MyEnv``)."""
        return list(sys.path)

    def close(self) -> None:
        if self.started:
            import_ray().shutdown()
            self.started = False
