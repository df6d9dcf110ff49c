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

import threading
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym

from posttrain.envs.contract import EnvError, EnvWorkerLost, as_messages, env_tasks, observation_text, reset_episode, success
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

    def replace(self, env: gym.Env) -> None:
        """Swap out an instance that may still be busy (a step that timed out) for a fresh one."""
        self._envs[self._envs.index(env)] = self._factory()

    def close(self) -> None:
        """Nothing to stop: the instances live in this process (see :class:`~posttrain.rollout.env_workers.RayEnvPool`)."""

    def tasks(self, split: str, train_seeds: int = 1000, eval_seed_start: int = 1_000_000,
              eval_seeds: int = 1000) -> list[Task]:
        """The env's tasks of ``split``, or seed tasks when it has no ``tasks()`` (see envs.contract)."""
        return env_tasks(self._envs[0], split, train_seeds, eval_seed_start, eval_seeds)


def encode_prompt(tokenizer, observation: Any, tools: list[dict[str, Any]] | None = None) -> list[int]:
    """Token ids of the chat-templated conversation, ending with the assistant header.

    ``tools`` (JSON schemas, from the environment's reset info) go to the template's ``tools=``;
    templates without tool support ignore them, so tool environments also describe their tools
    in the conversation itself.
    """
    text = tokenizer.apply_chat_template(as_messages(observation), tools=tools or None, add_generation_prompt=True,
                                         tokenize=False)
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
    full = tokenizer.apply_chat_template(_PROBE + as_messages(observation), add_generation_prompt=True, tokenize=False)
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
        self.traj.error_kind = ("timeout" if isinstance(error, TimeoutError) else
                                "worker_lost" if isinstance(error, EnvWorkerLost) else
                                "bad_observation" if isinstance(error, EnvError) else where)
        self.traj.reward = 0.0
        self.traj.finish_reason = "error"
        self.done = True


def _call_all(calls: list[Callable[[], Any]], timeout: float) -> list[tuple[bool, Any]]:
    """Run ``calls`` concurrently; ``(True, result)`` or ``(False, exception)`` for each.

    Daemon threads rather than an executor: a call that hangs past ``timeout`` is abandoned
    (Python cannot kill a thread) and must not keep the process alive at exit.
    """
    results: list[tuple[bool, Any] | None] = [None] * len(calls)

    def work(i: int) -> None:
        try:
            results[i] = (True, calls[i]())
        except Exception as e:  # noqa: BLE001 - a failing environment is data, not a crash
            results[i] = (False, e)

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(len(calls))]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    late = TimeoutError(f"no answer within {timeout:g} s")
    return [r if r is not None else (False, late) for r in results]


def run_episodes(
    envs: EnvPool,
    backend: GenerationBackend,
    tokenizer,
    tasks: list[Task],
    params: SamplingParams,
    num_samples: int = 1,
    max_turns: int = 1,
    max_context: int = 4096,
    step_timeout: float = 60.0,
    success_reward: float = 1.0,
) -> list[Trajectory]:
    """``num_samples`` trajectories per task, grouped by task, over up to ``max_turns`` turns.

    Environments are reset and stepped concurrently; one that raises or takes longer than
    ``step_timeout`` seconds ends its trajectory with an error (and is replaced in the pool).
    An episode whose env gives no verdict (``info["correct"]``) is solved when its return reaches
    ``success_reward``; that verdict is recorded in the last step's info.
    """
    episodes = [_Episode(env, task) for env, task in
                zip(envs.take(len(tasks) * num_samples), [t for t in tasks for _ in range(num_samples)])]
    resets = _call_all([lambda ep=ep: reset_episode(ep.env, ep.traj.task) for ep in episodes], step_timeout)
    for ep, (ok, value) in zip(episodes, resets):
        try:
            if not ok:
                raise value
            observation, info = value
            ep.traj.prompt_ids = encode_prompt(tokenizer, observation, (info or {}).get("tools"))
        except Exception as e:  # noqa: BLE001 - a failing environment is data, not a crash
            ep.fail("reset", e)
            if isinstance(e, (TimeoutError, EnvWorkerLost)):
                envs.replace(ep.env)
    for turn in range(max_turns):
        live = [ep for ep in episodes if not ep.done]
        if not live:
            break
        if turn == 0 and num_samples > 1 and len(live) == len(episodes):
            # The samples of one task share a prompt: prefill it once (see HFBackend).
            generations = backend.generate([ep.traj.prompt_ids for ep in episodes[::num_samples]], params, num_samples)
        else:
            generations = backend.generate([ep.context for ep in live], params)
        texts = [_append_turn(ep, gen, tokenizer) for ep, gen in zip(live, generations)]
        steps = _call_all([lambda ep=ep, text=text: ep.env.step(text) for ep, text in zip(live, texts)], step_timeout)
        for ep, gen, text, (ok, value) in zip(live, generations, texts, steps):
            if not ok:
                ep.fail("step", value)
                if isinstance(value, (TimeoutError, EnvWorkerLost)):
                    envs.replace(ep.env)
                continue
            _after_step(ep, gen, text, value, tokenizer, last_turn=turn == max_turns - 1, max_context=max_context)
    for ep in episodes:
        steps = ep.traj.steps
        if steps and ep.traj.error is None and all(success(s.info) is None for s in steps):
            steps[-1].info["correct"] = ep.traj.reward >= success_reward
    return [ep.traj for ep in episodes]


def _append_turn(ep: _Episode, gen: Generation, tokenizer) -> str:
    """Append one sampled turn to the trajectory; return its text for the environment."""
    traj = ep.traj
    traj.completion_ids += gen.token_ids
    traj.loss_mask += [1] * len(gen.token_ids)
    traj.behaviour_logprobs += gen.logprobs
    traj.finish_reason = gen.finish_reason
    return tokenizer.decode(gen.token_ids, skip_special_tokens=True)


def _after_step(ep: _Episode, gen: Generation, text: str, result: tuple, tokenizer, last_turn: bool,
                max_context: int) -> None:
    """Record the environment's answer; append its observation if the episode goes on."""
    traj = ep.traj
    try:
        observation, reward, terminated, truncated, info = result
        step = Step(text, observation_text(observation), float(reward), bool(terminated), bool(truncated), dict(info))
    except EnvError as e:
        ep.fail("step", e)
        return
    except (TypeError, ValueError) as e:
        ep.fail("bad_return", ValueError(f"step() must return (observation, reward, terminated, truncated, info): {e}"))
        return
    traj.steps.append(step)
    traj.reward += step.reward  # the episode's return
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
        step.truncated = True
        traj.finish_reason = "max_context"
        ep.done = True
        return
    traj.completion_ids += delta
    traj.loss_mask += [0] * len(delta)
    traj.behaviour_logprobs += [0.0] * len(delta)
