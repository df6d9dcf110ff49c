"""Demonstrations from the scripted experts, for a supervised warm-up before RL on the web envs.

SmolLM2-135M does not write one parseable BrowserGym action zero-shot (0 of 13 easy MiniWoB
tasks), so GRPO on it sees only zero rewards and learns nothing. Behaviour cloning on expert
episodes first, then RL, is how agent RL is usually bootstrapped (AgentGym, Xi et al. 2024;
WebRL, Qi et al. 2024); here the experts of :mod:`posttrain.envs.web.experts` play the training
split, and every turn of an episode they solve becomes one chat record: the conversation up to
that turn, each observation turned into messages exactly as the rollout does
(:func:`posttrain.envs.contract.as_messages`), and the expert's action as the last assistant
message: the format ``sft.demonstrations`` reads (``posttrain sft`` with ``offline.method: sft``).
Held-out tasks are never played, so evaluation stays unseen.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posttrain.envs.contract import as_messages
from posttrain.envs.registry import EnvError
from posttrain.envs.web.experts import MiniWoBExpert, ShopExpert
from posttrain.envs.web.miniwob import MiniWoBEnv
from posttrain.envs.web.shop.env import WebShopEnv
from posttrain.types import Task


@dataclass
class DemonstrationResult:
    episodes: int  # played
    solved: int  # written: their turns are the records
    records: int
    unsolved: list[str]  # task ids the expert did not solve within the turn limit


def expert_for(env: Any, task: Task):
    """The scripted expert that plays ``task`` of ``env``; EnvError where there is none."""
    env = env.unwrapped
    if isinstance(env, WebShopEnv):
        return ShopExpert()
    if isinstance(env, MiniWoBEnv):
        try:
            return MiniWoBExpert(task.metadata["task"])
        except ValueError as e:  # a task without a plan: the expert's message names the ones with one
            raise EnvError(f"{e} (env.kwargs.tasks)") from None
    raise EnvError(f"no scripted expert for {type(env).__name__}: demonstrations come from the web envs "
                   "(miniwob, web_shop)")


def expert_episode(env: Any, task: Task, max_turns: int) -> tuple[list[dict[str, Any]], bool]:
    """The conversation of one expert episode (observations and actions as chat messages) and
    whether it was solved: ``info["correct"]`` at the end, within ``max_turns`` actions."""
    expert = expert_for(env, task)
    observation, _ = env.reset(options={"task": task})
    messages = as_messages(observation)
    info: dict[str, Any] = {}
    for turn in range(max_turns):
        try:
            action = expert.act(observation)
        except Exception:  # noqa: BLE001 - a page the script does not know (an unforeseen seed): not solved
            return messages, False
        messages.append({"role": "assistant", "content": action})
        observation, _, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            break
        if turn < max_turns - 1:
            messages += as_messages(observation)
    return messages, bool(info.get("correct"))


def turn_records(messages: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """One record per assistant message: the conversation up to and including it."""
    for i, message in enumerate(messages):
        if message["role"] == "assistant":
            yield {"messages": messages[: i + 1]}


def write_demonstrations(env: Any, tasks: list[Task], out: str | Path, max_turns: int) -> DemonstrationResult:
    """Play ``tasks`` with the experts; write every turn of the solved episodes to the JSONL ``out``."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    result = DemonstrationResult(0, 0, 0, [])
    tmp = path.with_name(path.name + ".tmp")  # a half-written file never takes the name
    try:
        with tmp.open("w", encoding="utf-8") as f:
            for task in tasks:
                messages, solved = expert_episode(env, task, max_turns)
                result.episodes += 1
                if not solved:
                    result.unsolved.append(task.id)
                    continue
                result.solved += 1
                for record in turn_records(messages):
                    f.write(json.dumps(record, ensure_ascii=False) + "\n")
                    result.records += 1
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return result
