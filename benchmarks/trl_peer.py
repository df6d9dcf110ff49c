"""TRL's GRPOTrainer on the arithmetic env, set up alike for benchmarks/grpo_vs_trl.py (CPU) and
benchmarks/gpu.py (CUDA).

TRL gets each training task as a one-turn chat and scores completions with posttrain's own arithmetic scorer, so
both contenders learn from the same reward; a callback times each optimiser step.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

# Additions of numbers 1-20, the first 100 of the 400 held out: TRL trains on the other 300 problems, and
# posttrain's side of a step benchmark is given the same env (ENV_OVERRIDE) rather than the demo's split.
ARITHMETIC = {"difficulty": 1, "num_eval": 100}
ENV_OVERRIDE = f"env.kwargs={json.dumps(ARITHMETIC)}"


def arithmetic_dataset() -> tuple[object, Callable[..., list[float]]]:
    """The arithmetic env's training split as a TRL dataset, and its reward function."""
    from datasets import Dataset

    from posttrain.envs import make_env

    env = make_env("arithmetic", ARITHMETIC)
    tasks = {t.id: t for t in env.tasks("train")}
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": t.prompt}], "task_id": t.id}
                                 for t in tasks.values()])

    def arithmetic_reward(prompts, completions, task_id, **_) -> list[float]:
        return [env.score(tasks[i], c[-1]["content"])[0] for c, i in zip(completions, task_id)]

    return dataset, arithmetic_reward


def step_timer(records: list[dict], samples_per_step: int):
    """A TrainerCallback that appends one record per step to ``records``: its seconds, and from the step's log its
    completion tokens (mean length x ``samples_per_step``) and mean reward."""
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            records.append({"seconds": time.perf_counter() - self.start})

        def on_log(self, args, state, control, logs=None, **kw):
            if not (logs and records):
                return
            if "completions/mean_length" in logs:
                records[-1]["completion_tokens"] = logs["completions/mean_length"] * samples_per_step
            if "reward" in logs:
                records[-1]["reward"] = logs["reward"]

    return StepTimer()
