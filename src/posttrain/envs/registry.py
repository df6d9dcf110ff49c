"""Environment registry: built-in ids, and any user class named as 'package.module:ClassName'."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
from pettingzoo import AECEnv, ParallelEnv


class EnvError(ValueError):
    """The configured environment cannot be found or built; the message says why."""


@dataclass(frozen=True)
class EnvSpec:
    id: str
    entry_point: str
    description: str
    multi_agent: bool = False


_REGISTRY: dict[str, EnvSpec] = {}


def register(env_id: str, entry_point: str, description: str, multi_agent: bool = False) -> None:
    """Make ``env_id`` resolvable in configs (``env: {id: ...}``); ``multi_agent`` for PettingZoo envs."""
    _REGISTRY[env_id] = EnvSpec(env_id, entry_point, description, multi_agent)


def registered() -> list[EnvSpec]:
    return sorted(_REGISTRY.values(), key=lambda s: s.id)


def _import(entry_point: str):
    module_name, _, attr = entry_point.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise EnvError(f"env.id {entry_point!r}: cannot import module {module_name!r} ({e})") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise EnvError(f"env.id {entry_point!r}: module {module_name!r} has no attribute {attr!r}") from None


def is_multi_agent(env: Any) -> bool:
    """True for a PettingZoo env (AEC or parallel), False for a single-agent gymnasium.Env."""
    return isinstance(env, (AECEnv, ParallelEnv))


def make_env(env_id: str, kwargs: dict[str, Any] | None = None) -> gym.Env | AECEnv | ParallelEnv:
    """Build the environment named by a registered id or a 'package.module:ClassName' path:
    a gymnasium.Env, or for multi-agent envs a PettingZoo AECEnv or ParallelEnv."""
    if env_id in _REGISTRY:
        cls = _import(_REGISTRY[env_id].entry_point)
    elif ":" in env_id:
        cls = _import(env_id)
    else:
        known = ", ".join(s.id for s in registered())
        raise EnvError(f"env.id {env_id!r} is not registered (known: {known}; or use 'package.module:ClassName')")
    try:
        env = cls(**(kwargs or {}))
    except (TypeError, ValueError) as e:
        raise EnvError(f"env {env_id!r} with kwargs {kwargs or {}}: {e}") from None
    if not isinstance(env, gym.Env) and not is_multi_agent(env):
        raise EnvError(f"env.id {env_id!r} built a {type(env).__name__}, expected a gymnasium.Env "
                       "(or a PettingZoo AECEnv or ParallelEnv)")
    if not hasattr(env, "tasks"):
        raise EnvError(
            f"env {env_id!r} has no tasks(split) method: posttrain needs it to draw training "
            "and held-out tasks"
        )
    return env


register(
    "arithmetic",
    "posttrain.envs.arithmetic:ArithmeticEnv",
    "Arithmetic (word) problems, difficulty 1-5; reward 1 for the exact final number",
)
register(
    "tool_math",
    "posttrain.envs.tool_math:ToolMathEnv",
    "Multi-digit arithmetic solved over several turns with a calculator tool (ReAct or JSON calls)",
)
register(
    "chain_arithmetic",
    "posttrain.envs.chain_arithmetic:ChainArithmeticEnv",
    "Sums of several terms solved one operation per line (the steps process rewards score); reward 1 for the "
    "right answer, each line marked right or wrong in info['step_correct']",
)
register(
    "sql_qa",
    "posttrain.envs.sql_qa:SQLQAEnv",
    "Questions about a generated SQLite employees database, answered with a read-only SQL tool",
)
register(
    "wordle",
    "posttrain.envs.wordle:WordleEnv",
    "Wordle: find a five-letter word in six guesses from G/Y/- letter feedback",
)
register(
    "reflexion",
    "posttrain.envs.reflexion:ReflexionEnv",
    "Reflexion wrapper: after a failed attempt the agent reflects, then retries the same task",
)
register(
    "code",
    "posttrain.envs.code:CodeEnv",
    "Write a Python function; reward = share of its unit tests passed in the sandbox (source: generated, "
    "humaneval or a JSONL path; max_attempts > 1 shows failing tests and lets the agent revise)",
)
register(
    "tictactoe",
    "posttrain.envs.games.tictactoe:TicTacToe",
    "Tic-tac-toe, X against O; win +1, draw 0, loss -1; an invalid move loses the turn",
    multi_agent=True,
)
register(
    "kuhn_poker",
    "posttrain.envs.games.kuhn_poker:KuhnPoker",
    "Kuhn poker (J < Q < K, ante 1, one bet); payoff = chips won or lost",
    multi_agent=True,
)
register(
    "negotiation",
    "posttrain.envs.games.negotiation:Negotiation",
    "Split books, hats and balls with private values, claims made at once; payoff = value of the deal / 10",
    multi_agent=True,
)
register(
    "textarena",
    "posttrain.envs.games.textarena_env:TextArenaGame",
    "A TextArena two-player game (kwargs: game, e.g. TicTacToe-v0), offline",
    multi_agent=True,
)
register(
    "coder_tester",
    "posttrain.envs.games.coder_tester:CoderTester",
    "A tester writes asserts, a coder writes the function; shared reward = share of hidden reference tests passed",
    multi_agent=True,
)
