"""Environment workers: env instances living in Ray actors, behind the :class:`EnvPool` interface.

``env.workers: N`` starts N actors; each hosts the env instances of the episodes assigned to it
(slot i on worker i mod N) and runs their calls in its own threads, as the in-process pool does, so
an env that waits on I/O overlaps within a worker and one that burns CPU (or crashes, or leaks)
does so in its own process. ``run_episodes`` drives the pool as it drives the in-process one:
reset/step go through :class:`RemoteEnv` with the per-call timeout ``env.step_timeout``.

Failures are data: a worker that dies makes its in-flight calls raise
:class:`~posttrain.envs.contract.EnvWorkerLost`; one that hangs makes them time out. Either way
``run_episodes`` records the episode as an error and calls :meth:`RayEnvPool.replace`, which kills
the worker and starts a fresh one. Episodes that were still open on the replaced worker lose their
env state, so their next step fails as ``worker_lost`` too instead of silently using a new env.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from posttrain.envs.contract import EnvError, EnvWorkerLost, env_tasks
from posttrain.rollout.episodes import load_rng_state, rng_state, seeded
from posttrain.types import Task


class EnvHost:
    """The actor: builds env instances by slot from an env id and kwargs, and runs their calls."""

    def __init__(self, env_id: str, kwargs: dict[str, Any], sys_path: list[str], seed: int | None = None):
        for p in reversed(sys_path):  # user env modules of the driver (tests, scripts) import here too
            if p not in sys.path:
                sys.path.insert(0, p)
        self.env_id, self.kwargs, self.seed = env_id, kwargs, seed
        self.envs: dict[int, Any] = {}
        self._lock = threading.Lock()
        self.error = ""
        try:
            self._env(-1)
        except Exception as e:  # noqa: BLE001 - reported to the driver as one line by ready()
            self.error = str(e) if isinstance(e, EnvError) else f"{type(e).__name__}: {e}"

    def _env(self, slot: int):
        with self._lock:  # threads of one actor may build envs at once
            if slot not in self.envs:
                from posttrain.envs import make_env

                # Seeded by slot, so that a slot's env draws the same randomness on whichever worker hosts it
                # (slot -1 only lists tasks).
                self.envs[slot] = seeded(make_env(self.env_id, self.kwargs), self.seed if slot >= 0 else None, slot)
            return self.envs[slot]

    def ready(self) -> str:
        """Empty when the env could be built, else why not."""
        return self.error

    def pid(self) -> int:
        import os

        return os.getpid()

    def tasks(self, split: str, train_seeds: int, eval_seed_start: int, eval_seeds: int) -> list[Task]:
        return env_tasks(self._env(-1), split, train_seeds, eval_seed_start, eval_seeds)

    def reset(self, slot: int, seed: int | None, options: dict[str, Any] | None):
        return self._env(slot).reset(seed=seed, options=options)

    def step(self, slot: int, action: str):
        return self._env(slot).step(action)

    def rng_states(self) -> dict[int, Any]:
        return {slot: rng_state(env) for slot, env in self.envs.items() if slot >= 0}

    def load_rng_states(self, states: dict[int, Any]) -> None:
        for slot, state in states.items():
            load_rng_state(self._env(slot), state)


class RemoteEnv:
    """One env slot on a worker, with the gymnasium calls ``run_episodes`` makes (over Ray, with a timeout).

    ``generation`` is the worker's incarnation when this slot's episode was reset: a step on a worker
    that has been replaced since is refused (its env state is gone).
    """

    def __init__(self, pool: "RayEnvPool", slot: int):
        self.pool, self.slot = pool, slot
        self.worker = slot % len(pool.workers)
        self.generation = -1

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self.generation = self.pool.generations[self.worker]
        return self.pool.call(self.worker, "reset", self.slot, seed, options)

    def step(self, action: str):
        if self.generation != self.pool.generations[self.worker]:
            raise EnvWorkerLost(f"env worker {self.worker} was replaced during this episode; its env state is gone")
        return self.pool.call(self.worker, "step", self.slot, action)


class RayEnvPool:
    """``workers`` Ray actors hosting env instances; the same interface as :class:`~posttrain.rollout.EnvPool`."""

    def __init__(self, env_id: str, kwargs: dict[str, Any], workers: int, timeout: float, slots_per_worker: int = 64,
                 seed: int | None = None):
        from posttrain.rollout.ray_runtime import RayRuntime, import_ray

        self.ray = import_ray()
        self.env_id, self.kwargs, self.timeout, self.seed = env_id, kwargs, timeout, seed
        # Threads per actor: the episodes of a step run at once on it, as in the in-process pool.
        self._actor_cls = self.ray.remote(EnvHost).options(num_cpus=0, max_concurrency=slots_per_worker,
                                                           scheduling_strategy="SPREAD")
        self._sys_path = RayRuntime.worker_sys_path()
        self.workers = [self._start() for _ in range(workers)]
        self.generations = [0] * workers
        self.replaced = 0
        for i, handle in enumerate(self.workers):
            try:
                error = self.ray.get(handle.ready.remote(), timeout=max(timeout, 600.0))  # a busy machine starts slowly
            except (self.ray.exceptions.RayActorError, self.ray.exceptions.GetTimeoutError) as e:
                self.close()
                raise EnvError(f"env worker {i} for {env_id!r} did not start: {type(e).__name__}") from None
            if error:
                self.close()
                raise EnvError(f"env {env_id!r} could not be built in an env worker: {error}")
        self._slots: list[RemoteEnv] = []

    def _start(self):
        return self._actor_cls.remote(self.env_id, self.kwargs, self._sys_path, self.seed)

    def call(self, worker: int, method: str, *args):
        """One call on a worker, within the pool's timeout; a dead worker raises EnvWorkerLost."""
        ray = self.ray
        ref = getattr(self.workers[worker], method).remote(*args)
        try:
            return ray.get(ref, timeout=self.timeout)
        except ray.exceptions.GetTimeoutError:
            raise TimeoutError(f"env worker {worker}: no answer within {self.timeout:g} s") from None
        except ray.exceptions.RayTaskError as e:  # the env itself raised: its own exception, as in process
            raise e.as_instanceof_cause() from None
        except ray.exceptions.RayActorError as e:
            raise EnvWorkerLost(f"env worker {worker} died: {type(e).__name__}") from None

    # ------------------------------------------------------------------ the EnvPool interface

    def take(self, n: int) -> list[RemoteEnv]:
        while len(self._slots) < n:
            self._slots.append(RemoteEnv(self, len(self._slots)))
        return self._slots[:n]

    def replace(self, env: RemoteEnv) -> None:
        """Kill the env's worker (hung or dead) and start a fresh one in its place."""
        w = env.worker
        if env.generation != self.generations[w]:
            return  # already replaced for another episode of this step
        self.ray.kill(self.workers[w], no_restart=True)
        self.workers[w] = self._start()
        self.generations[w] += 1
        self.replaced += 1

    def tasks(self, split: str, train_seeds: int = 1000, eval_seed_start: int = 1_000_000,
              eval_seeds: int = 1000) -> list[Task]:
        return self.call(0, "tasks", split, train_seeds, eval_seed_start, eval_seeds)

    def rng_states(self) -> dict[str, Any]:
        """Every slot's env ``np_random`` state, gathered from the workers (for an exact resume)."""
        states: dict[int, Any] = {}
        for w in range(len(self.workers)):
            try:
                states.update(self.call(w, "rng_states"))
            except (EnvWorkerLost, TimeoutError):  # a lost worker's slots restart fresh, as they would now
                continue
        return {"slots": {str(slot): state for slot, state in sorted(states.items())}}

    def load_rng_states(self, state: dict[str, Any]) -> None:
        slots = {int(slot): rng for slot, rng in state["slots"].items()}
        self.take(max(slots, default=-1) + 1)
        for w in range(len(self.workers)):
            self.call(w, "load_rng_states", {s: rng for s, rng in slots.items() if s % len(self.workers) == w})

    def close(self) -> None:
        for handle in self.workers:
            self.ray.kill(handle, no_restart=True)
        self.workers = []
