"""Run episodes: tasks -> prompts -> batched generation -> environment -> trajectories.

Single-turn episodes: the environment's first observation is the user message, the policy
answers once, and ``step`` scores the answer. Token in, token out: the trajectory keeps the
exact ids the sampler produced (including the EOS it sampled, so the policy learns to stop).
An environment that raises becomes a trajectory with ``error`` set and zero reward; the run
goes on.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from posttrain.rollout.backend import GenerationBackend, SamplingParams
from posttrain.types import Step, Task, Trajectory


def encode_prompt(tokenizer, observation: Any) -> list[int]:
    """Token ids of the chat-templated conversation, ending with the assistant header.

    ``observation`` is the user's text or a list of chat messages.
    """
    messages = observation if isinstance(observation, list) else [{"role": "user", "content": str(observation)}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


def _error_trajectory(task: Task, prompt_ids: list[int], error: str) -> Trajectory:
    return Trajectory(task=task, prompt_ids=prompt_ids, completion_ids=[], loss_mask=[],
                      behaviour_logprobs=[], reward=0.0, error=error, finish_reason="error")


def run_episodes(
    env: gym.Env,
    backend: GenerationBackend,
    tokenizer,
    tasks: list[Task],
    params: SamplingParams,
    num_samples: int = 1,
) -> list[Trajectory]:
    """``num_samples`` single-turn trajectories per task, grouped by task."""
    prompts: list[list[int] | None] = []
    errors: list[str | None] = []
    for task in tasks:
        try:
            observation, _ = env.reset(options={"task": task})
            prompts.append(encode_prompt(tokenizer, observation))
            errors.append(None)
        except Exception as e:  # noqa: BLE001 - a failing environment is data, not a crash
            prompts.append(None)
            errors.append(f"reset: {type(e).__name__}: {e}")
    live = [i for i, p in enumerate(prompts) if p is not None]
    generations = backend.generate([prompts[i] for i in live], params, num_samples)
    by_task = {i: generations[k * num_samples : (k + 1) * num_samples] for k, i in enumerate(live)}

    trajectories: list[Trajectory] = []
    for i, task in enumerate(tasks):
        if i not in by_task:
            trajectories += [_error_trajectory(task, [], errors[i] or "reset failed") for _ in range(num_samples)]
            continue
        for gen in by_task[i]:
            text = tokenizer.decode(gen.token_ids, skip_special_tokens=True)
            traj = Trajectory(task=task, prompt_ids=prompts[i], completion_ids=list(gen.token_ids),
                              loss_mask=[1] * len(gen.token_ids), behaviour_logprobs=list(gen.logprobs),
                              finish_reason=gen.finish_reason)
            try:
                env.reset(options={"task": task})
                obs, reward, terminated, truncated, info = env.step(text)
            except Exception as e:  # noqa: BLE001
                traj.error = f"step: {type(e).__name__}: {e}"
                traj.reward = 0.0
            else:
                traj.steps.append(Step(text, str(obs), float(reward), bool(terminated), bool(truncated), dict(info)))
                traj.reward = float(reward)
            trajectories.append(traj)
    return trajectories
