"""The agent loop: tasks -> prompts -> batched generation -> environment -> ... -> trajectories.

Token in, token out. A trajectory's ids are the prompt, then for each turn the exact ids the
sampler produced (including the EOS it sampled, so the policy learns to stop), then the
environment's observation as the token ids of the chat-template delta: what the template adds
after an assistant turn to close it and open the next user (or tool) turn and the next assistant
turn. Nothing the model sampled is decoded and re-encoded. Sampled tokens carry loss-mask 1,
template and environment tokens 0.

An episode ends when the environment says terminated or truncated, after ``max_turns`` turns,
or when the next turn would not fit in ``max_context`` tokens (then it is truncated). An
environment that raises becomes a trajectory with ``error`` set and zero reward; the run goes on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym

from posttrain.rollout.backend import Generation, GenerationBackend, SamplingParams
from posttrain.types import Step, Task, Trajectory


class EnvPool:
    """Independent instances of one environment, one per concurrent episode, reused across steps."""

    def __init__(self, factory: Callable[[], gym.Env]):
        self._factory = factory
        self._envs = [factory()]

    def take(self, n: int) -> list[gym.Env]:
        while len(self._envs) < n:
            self._envs.append(self._factory())
        return self._envs[:n]

    def tasks(self, split: str) -> list[Task]:
        return list(self._envs[0].tasks(split))


def _messages(observation: Any) -> list[dict[str, Any]]:
    """An observation as chat messages: text becomes a user message; messages pass through."""
    if isinstance(observation, dict):
        return [observation]
    if isinstance(observation, list):
        return observation
    return [{"role": "user", "content": str(observation)}]


def encode_prompt(tokenizer, observation: Any) -> list[int]:
    """Token ids of the chat-templated conversation, ending with the assistant header."""
    text = tokenizer.apply_chat_template(_messages(observation), add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


_PROBE = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]


def observation_delta(tokenizer, observation: Any, sampled_eos: bool) -> list[int]:
    """Token ids that follow an assistant turn to deliver ``observation`` and open the next turn.

    Rendered from the chat template itself: the text it adds after a finished assistant
    message, when the conversation grows by the observation's messages and a generation prompt.
    When the turn ended with the sampled EOS, the template's end-of-turn text starts with that
    EOS, which is already in the trajectory and is left out here; otherwise (a turn cut at the
    token limit) the whole end-of-turn text is added as environment tokens.
    """
    base = tokenizer.apply_chat_template(_PROBE, tokenize=False)
    full = tokenizer.apply_chat_template(_PROBE + _messages(observation), add_generation_prompt=True, tokenize=False)
    if not full.startswith(base):
        raise ValueError("the chat template re-renders earlier turns when the conversation grows; "
                         "multi-turn token-in/token-out needs a template that only appends")
    end_of_turn = base[base.rindex("A") + 1 :]
    eos_text = tokenizer.decode([tokenizer.eos_token_id])
    if sampled_eos and end_of_turn.startswith(eos_text):
        end_of_turn = end_of_turn[len(eos_text) :]
    return tokenizer.encode(end_of_turn + full[len(base) :], add_special_tokens=False)


class _Episode:
    """One trajectory being built, with its own environment instance."""

    def __init__(self, env: gym.Env, task: Task):
        self.env = env
        self.traj = Trajectory(task=task, prompt_ids=[], completion_ids=[], loss_mask=[], behaviour_logprobs=[])
        self.done = False

    @property
    def context(self) -> list[int]:
        return self.traj.prompt_ids + self.traj.completion_ids

    def fail(self, where: str, error: Exception) -> None:
        self.traj.error = f"{where}: {type(error).__name__}: {error}"
        self.traj.reward = 0.0
        self.traj.finish_reason = "error"
        self.done = True


def run_episodes(
    envs: EnvPool,
    backend: GenerationBackend,
    tokenizer,
    tasks: list[Task],
    params: SamplingParams,
    num_samples: int = 1,
    max_turns: int = 1,
    max_context: int = 4096,
) -> list[Trajectory]:
    """``num_samples`` trajectories per task, grouped by task, over up to ``max_turns`` turns."""
    episodes = [_Episode(env, task) for env, task in
                zip(envs.take(len(tasks) * num_samples), [t for t in tasks for _ in range(num_samples)])]
    for ep in episodes:
        try:
            observation, _ = ep.env.reset(options={"task": ep.traj.task})
            ep.traj.prompt_ids = encode_prompt(tokenizer, observation)
        except Exception as e:  # noqa: BLE001 - a failing environment is data, not a crash
            ep.fail("reset", e)
    for turn in range(max_turns):
        live = [ep for ep in episodes if not ep.done]
        if not live:
            break
        if turn == 0 and num_samples > 1:
            # The samples of one task share a prompt: prefill it once (see HFBackend).
            firsts = [ep for k, ep in enumerate(episodes) if k % num_samples == 0]
            gens = backend.generate([ep.traj.prompt_ids for ep in firsts], params, num_samples)
            by_episode = {id(ep): g for ep, g in zip(episodes, gens)}
            generations = [by_episode[id(ep)] for ep in live]
        else:
            generations = backend.generate([ep.context for ep in live], params)
        for ep, gen in zip(live, generations):
            _advance(ep, gen, tokenizer, last_turn=turn == max_turns - 1, max_context=max_context)
    for ep in episodes:
        if not ep.done:  # only reachable with max_turns == 0
            ep.traj.finish_reason = "max_turns"
    return [ep.traj for ep in episodes]


def _advance(ep: _Episode, gen: Generation, tokenizer, last_turn: bool, max_context: int) -> None:
    """Append one sampled turn, step the environment, and append its observation if the episode goes on."""
    traj = ep.traj
    traj.completion_ids += gen.token_ids
    traj.loss_mask += [1] * len(gen.token_ids)
    traj.behaviour_logprobs += gen.logprobs
    traj.finish_reason = gen.finish_reason
    text = tokenizer.decode(gen.token_ids, skip_special_tokens=True)
    try:
        observation, reward, terminated, truncated, info = ep.env.step(text)
    except Exception as e:  # noqa: BLE001
        ep.fail("step", e)
        return
    traj.steps.append(Step(text, str(observation), float(reward), bool(terminated), bool(truncated), dict(info)))
    traj.reward = float(reward)
    if terminated or truncated:
        ep.done = True
        return
    if last_turn:
        traj.finish_reason = "max_turns"
        ep.done = True
        return
    sampled_eos = bool(gen.token_ids) and gen.token_ids[-1] == tokenizer.eos_token_id
    delta = observation_delta(tokenizer, observation, sampled_eos)
    if len(ep.context) + len(delta) >= max_context:
        traj.steps[-1].truncated = True
        traj.finish_reason = "max_context"
        ep.done = True
        return
    traj.completion_ids += delta
    traj.loss_mask += [0] * len(delta)
    traj.behaviour_logprobs += [0.0] * len(delta)
