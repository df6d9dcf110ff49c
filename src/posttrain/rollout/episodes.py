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
So does one that answers out of contract: a reward that is not a finite number, an observation
that is neither text nor chat messages, a first prompt longer than the context (or than the
model's positions), or a replacement instance whose constructor raises.
"""

from __future__ import annotations

import ctypes
import math
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from posttrain.envs.contract import (
    EnvError,
    EnvWorkerLost,
    as_messages,
    env_tasks,
    observation_text,
    reset_episode,
    success,
)
from posttrain.rollout.backend import Generation, GenerationBackend, SamplingParams
from posttrain.types import Step, Task, Trajectory


def seeded(env: Any, seed: int | None, k: int) -> Any:
    """``env`` with its ``np_random`` seeded from (seed, k) when it is a gymnasium env and a seed is set."""
    if seed is not None and isinstance(env, gym.Env):
        env.unwrapped.np_random = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, k])))
    return env


def rng_state(env: Any) -> dict[str, Any] | None:
    """The env's ``np_random`` state, or None for an env that is not a gymnasium env. Arrays in it (the state of
    an MT19937, Philox or SFC64 generator; gymnasium's default PCG64 has none) become lists, which numpy takes
    back: a checkpoint then holds only what ``torch.load(weights_only=True)`` reads."""
    if not isinstance(env, gym.Env):
        return None
    return _plain(env.unwrapped.np_random.bit_generator.state)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value.tolist() if isinstance(value, np.ndarray) else value


def load_rng_state(env: Any, state: dict[str, Any] | None) -> None:
    """Set the env's ``np_random`` to ``state``; an env that had made itself a generator of another kind than the
    pool's PCG64 (in ``reset``, say) gets one of that kind again."""
    if state is None or not isinstance(env, gym.Env):
        return
    env = env.unwrapped
    if type(env.np_random.bit_generator).__name__ != state["bit_generator"]:
        kind = getattr(np.random, str(state["bit_generator"]), None)
        if not (isinstance(kind, type) and issubclass(kind, np.random.BitGenerator)):
            raise ValueError(f"{state['bit_generator']!r} is not one of numpy's bit generators")
        env.np_random = np.random.Generator(kind())
    env.np_random.bit_generator.state = state


class EnvPool:
    """Independent instances of one environment, one per concurrent episode, reused across steps.

    The first instance is built at once (its errors stop the run: the config is wrong); a later
    one whose constructor raises takes the place of its episode as the exception, so that
    episode fails and the run goes on.

    With a ``seed``, the k-th instance created gets its own ``np_random`` seeded from (seed, k), so
    that environments that draw randomness do so reproducibly (gymnasium otherwise seeds an unseeded
    env from the OS on first use); :meth:`rng_states` and :meth:`load_rng_states` save and restore
    every instance's generator for an exact resume.
    """

    def __init__(self, factory: Callable[[], gym.Env], seed: int | None = None):
        self._factory = factory
        self._seed = seed
        self._created = 0
        self._envs = [self._make()]

    def _make(self) -> gym.Env:
        env = seeded(self._factory(), self._seed, self._created)
        self._created += 1
        return env

    def take(self, n: int) -> list[gym.Env | Exception]:
        out: list[gym.Env | Exception] = list(self._envs[:n])
        while len(out) < n:
            try:
                env = self._make()
            except Exception as e:  # noqa: BLE001 - a failing constructor fails its episode only
                out.append(e)
                continue
            self._envs.append(env)
            out.append(env)
        return out

    def replace(self, env: gym.Env) -> None:
        """Swap out an instance that may still be busy (a step that timed out) for a fresh one;
        if none can be built now, drop it (the next ``take`` builds one or reports why not)."""
        i = self._envs.index(env)
        try:
            self._envs[i] = self._make()
        except Exception:  # noqa: BLE001
            del self._envs[i]

    def rng_states(self) -> dict[str, Any]:
        """Every instance's ``np_random`` state (None for an env without one) and the creation count."""
        return {"created": self._created, "envs": [rng_state(env) for env in self._envs]}

    def load_rng_states(self, state: dict[str, Any]) -> None:
        self.take(len(state["envs"]))
        for env, rng in zip(self._envs, state["envs"]):
            load_rng_state(env, rng)
        self._created = state["created"]

    def close(self) -> None:
        """Nothing to stop: the instances live in this process (see :class:`~posttrain.rollout.env_workers.RayEnvPool`)."""

    def tasks(self, split: str, train_seeds: int = 1000, eval_seed_start: int = 1_000_000,
              eval_seeds: int = 1000) -> list[Task]:
        """The env's tasks of ``split``, or seed tasks when it has no ``tasks()`` (see envs.contract)."""
        return env_tasks(self._envs[0] if self._envs else self._factory(), split, train_seeds, eval_seed_start,
                         eval_seeds)


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


class EpisodesFailed(RuntimeError):
    """Every episode of a batch failed: nothing was learnt or measured; the message says why."""


def raise_if_all_failed(trajectories: list[Trajectory], what: str) -> None:
    """:class:`EpisodesFailed` when there were episodes and every one ended with an error."""
    if trajectories and all(t.error is not None for t in trajectories):
        kinds = sorted({t.error_kind or "error" for t in trajectories})
        raise EpisodesFailed(f"every episode of {what} failed ({len(trajectories)} of {len(trajectories)}: "
                             f"{', '.join(kinds)}); the first: {' '.join(trajectories[0].error.split())[:300]}")


class _Episode:
    """One trajectory being built, with its own environment instance."""

    def __init__(self, env: gym.Env, task: Task):
        self.env = env
        self.traj = Trajectory(task=task, prompt_ids=[], completion_ids=[], loss_mask=[], behaviour_logprobs=[])
        self.done = False

    @property
    def context(self) -> list[int]:
        return self.traj.prompt_ids + self.traj.completion_ids

    def fail(self, where: str, error: BaseException, kind: str | None = None) -> None:
        self.traj.error = f"{where}: {type(error).__name__}: {error}"
        self.traj.error_kind = kind or ("timeout" if isinstance(error, TimeoutError) else
                                        "worker_lost" if isinstance(error, EnvWorkerLost) else
                                        "bad_observation" if isinstance(error, EnvError) else where)
        self.traj.reward = 0.0
        self.traj.finish_reason = "error"
        self.done = True


class EnvCallAbandoned(BaseException):
    """Raised inside an environment call that overran its timeout, so that a call spinning in
    Python code stops instead of taking CPU from every later step. A BaseException, so that an
    environment's own ``except Exception`` does not swallow it."""


def _call_all(calls: list[Callable[[], Any]], timeout: float) -> list[tuple[bool, Any]]:
    """Run ``calls`` concurrently; ``(True, result)`` or ``(False, exception)`` for each.

    Daemon threads rather than an executor: a call that hangs past ``timeout`` is abandoned and
    must not keep the process alive at exit. Python cannot kill a thread; what it can do is raise
    an exception in it at its next bytecode (``PyThreadState_SetAsyncExc``): a late call busy in
    Python code is stopped that way. One blocked inside C (a sleep, a socket read, a C extension's
    loop) only stops when it returns to Python; it keeps its thread, not the CPU, until then.
    """
    results: list[tuple[bool, Any] | None] = [None] * len(calls)

    def work(i: int) -> None:
        try:
            try:
                results[i] = (True, calls[i]())
            except Exception as e:  # noqa: BLE001 - a failing environment is data, not a crash
                results[i] = (False, e)
        except EnvCallAbandoned:
            pass  # abandoned: nobody waits for this result

    threads = [threading.Thread(target=work, args=(i,), daemon=True, name="posttrain-env-call")
               for i in range(len(calls))]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    for i, t in enumerate(threads):
        if results[i] is None and t.is_alive():
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(t.ident), ctypes.py_object(EnvCallAbandoned))
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
    ``success_reward``; that verdict is recorded in the last step's info. The context is
    ``max_context`` tokens, or less where the model has fewer positions than that plus
    ``params.max_new_tokens``.
    """
    positions = getattr(backend, "max_positions", None)
    if positions:
        max_context = max(1, min(max_context, positions - params.max_new_tokens))
    episodes = [_Episode(env, task) for env, task in
                zip(envs.take(len(tasks) * num_samples), [t for t in tasks for _ in range(num_samples)])]
    for ep in episodes:
        if isinstance(ep.env, Exception):
            ep.fail("make_env", ep.env, kind="make_env")  # its instance could not be built
    _reset_all(envs, [ep for ep in episodes if not ep.done], tokenizer, max_context, step_timeout)
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


def _reset_all(envs: EnvPool, episodes: list[_Episode], tokenizer, max_context: int, timeout: float) -> None:
    """Reset every episode's environment on its task and encode its first prompt."""
    resets = _call_all([lambda ep=ep: reset_episode(ep.env, ep.traj.task) for ep in episodes], timeout)
    for ep, (ok, value) in zip(episodes, resets):
        try:
            if not ok:
                raise value
            observation, info = value
            _refuse_surely_too_long(tokenizer, observation, max_context)
            prompt = encode_prompt(tokenizer, observation, (info or {}).get("tools"))
            if len(prompt) >= max_context:
                raise _TooLong(f"the first prompt is {len(prompt)} tokens, more than the {max_context} the context "
                               "holds (rollout.max_context_tokens, less the turn's max_new_tokens where the model's "
                               "positions end first)")
            ep.traj.prompt_ids = prompt
        except Exception as e:  # noqa: BLE001 - a failing environment is data, not a crash
            ep.fail("reset", e, kind="too_long" if isinstance(e, _TooLong) else None)
            if isinstance(e, (TimeoutError, EnvWorkerLost)):
                envs.replace(ep.env)


class _TooLong(ValueError):
    """An observation that does not fit in the context."""


def _refuse_surely_too_long(tokenizer, observation: Any, room: int) -> None:
    """:class:`_TooLong` for an observation with more characters than ``room`` tokens can hold even at
    the vocabulary's longest token, decided without tokenizing it (a 1 MB text takes seconds to encode)."""
    chars = sum(len(m["content"]) for m in as_messages(observation))
    longest = _longest_token(tokenizer)
    if chars > room * longest:
        raise _TooLong(f"the observation is {chars} characters: more than {max(room, 0)} tokens of at most "
                       f"{longest} characters each, the room left in the context (rollout.max_context_tokens)")


_LONGEST_TOKEN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _longest_token(tokenizer) -> int:
    if tokenizer not in _LONGEST_TOKEN:
        _LONGEST_TOKEN[tokenizer] = max(map(len, tokenizer.get_vocab()), default=1)
    return _LONGEST_TOKEN[tokenizer]


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
    except Exception as e:  # noqa: BLE001 - whatever the env returned, its episode fails, not the run
        ep.fail("bad_return", ValueError(f"step() must return (observation, reward, terminated, truncated, info): "
                                         f"{type(e).__name__}: {e}"))
        return
    if not math.isfinite(step.reward):
        ep.fail("bad_return", ValueError(f"step() returned reward {step.reward}, expected a finite number"))
        return
    traj.steps.append(step)
    traj.reward += step.reward  # the episode's return
    if step.terminated or step.truncated:
        ep.done = True
        return
    if last_turn:
        traj.finish_reason = "max_turns"
        ep.done = True
        return
    sampled_eos = bool(gen.token_ids) and gen.token_ids[-1] == tokenizer.eos_token_id
    try:
        _refuse_surely_too_long(tokenizer, observation, max_context - len(ep.context))
        delta = observation_delta(tokenizer, observation, sampled_eos)
    except _TooLong as e:
        ep.fail("step", e, kind="too_long")
        return
    except Exception as e:  # noqa: BLE001 - an observation the chat template rejects
        ep.fail("step", e)
        return
    if len(ep.context) + len(delta) >= max_context:
        step.truncated = True
        traj.finish_reason = "max_context"
        ep.done = True
        return
    traj.completion_ids += delta
    traj.loss_mask += [0] * len(delta)
    traj.behaviour_logprobs += [0.0] * len(delta)
