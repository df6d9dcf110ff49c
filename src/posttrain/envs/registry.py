"""Environment registry: built-in ids, any user class named as 'package.module:ClassName', and
any id in gymnasium's own registry (built with ``gymnasium.make``, kwargs passed through)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
from pettingzoo import AECEnv, ParallelEnv

from posttrain.envs.contract import EnvError, check_text_env


@dataclass(frozen=True)
class EnvSpec:
    """A registered env; ``example_kwargs`` build a small instance (what tests and docs use) for
    envs whose constructor needs arguments."""

    id: str
    entry_point: str
    description: str
    example_kwargs: dict[str, Any] = field(default_factory=dict)
    multi_agent: bool = False


_REGISTRY: dict[str, EnvSpec] = {}


def register(env_id: str, entry_point: str, description: str, example_kwargs: dict[str, Any] | None = None,
             multi_agent: bool = False) -> None:
    """Make ``env_id`` resolvable in configs (``env: {id: ...}``); ``multi_agent`` for PettingZoo envs."""
    _REGISTRY[env_id] = EnvSpec(env_id, entry_point, description, example_kwargs or {}, multi_agent)


def registered() -> list[EnvSpec]:
    return sorted(_REGISTRY.values(), key=lambda s: s.id)


def _import(entry_point: str):
    module_name, _, attr = entry_point.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise EnvError(f"env.id {entry_point!r}: cannot import module {module_name!r} ({e})") from None
    except Exception as e:  # noqa: BLE001 - the user's module fails while importing (a SyntaxError, ...)
        raise EnvError(f"env.id {entry_point!r}: importing module {module_name!r} raised {type(e).__name__}: "
                       f"{e}") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise EnvError(f"env.id {entry_point!r}: module {module_name!r} has no attribute {attr!r}") from None


def is_multi_agent(env: Any) -> bool:
    """True for a PettingZoo env (AEC or parallel), False for a single-agent gymnasium.Env."""
    return isinstance(env, (AECEnv, ParallelEnv))


def env_is_multi_agent(env_id: str, kwargs: dict[str, Any] | None = None) -> bool:
    """Whether ``env_id`` names a multi-agent env: from its registration, or by building it."""
    if env_id in _REGISTRY:
        return _REGISTRY[env_id].multi_agent
    env = make_env(env_id, kwargs)
    try:
        return is_multi_agent(env)
    finally:
        env.close()


def make_env(env_id: str, kwargs: dict[str, Any] | None = None) -> gym.Env | AECEnv | ParallelEnv:
    """Build the environment named by a registered id, a 'package.module:ClassName' path or a
    gymnasium id: a gymnasium.Env checked to be a text environment (see
    :mod:`posttrain.envs.contract`), or for multi-agent envs a PettingZoo AECEnv or ParallelEnv."""
    kwargs = kwargs or {}
    if env_id in _REGISTRY or ":" in env_id:
        cls = _import(_REGISTRY[env_id].entry_point if env_id in _REGISTRY else env_id)
        build = lambda: cls(**kwargs)  # noqa: E731
    elif env_id in gym.registry:
        build = lambda: gym.make(env_id, **kwargs)  # noqa: E731
    else:
        known = ", ".join(s.id for s in registered())
        raise EnvError(f"env.id {env_id!r} is not registered (known: {known}; or a gymnasium id, or "
                       "'package.module:ClassName')")
    try:
        env = build()
    except EnvError:
        raise
    except (TypeError, ValueError) as e:
        raise EnvError(f"env {env_id!r} with kwargs {kwargs}: {e}") from None
    except Exception as e:  # noqa: BLE001 - a user constructor may raise anything; name it in one line
        raise EnvError(f"env {env_id!r} with kwargs {kwargs}: its constructor raised {type(e).__name__}: {e}") \
            from None
    if not is_multi_agent(env):
        check_text_env(env, env_id)
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
    "reasoning_gym",
    "posttrain.envs.reasoning_gym_env:ReasoningGymEnv",
    "Any reasoning-gym dataset (kwargs: dataset, size, eval_size, seed, config) scored by its own score_answer",
    {"dataset": "basic_arithmetic", "size": 50, "eval_size": 20},
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
register(
    "miniwob",
    "posttrain.envs.web.miniwob:MiniWoBEnv",
    "MiniWoB++ web tasks in Chromium (Playwright): accessibility-tree text in, BrowserGym actions out; "
    "tier easy (default), medium, hard or all, or a list of tasks",
    example_kwargs={"tasks": ["click-test", "enter-text"]},
)
register(
    "web_shop",
    "posttrain.envs.web.shop.env:WebShopEnv",
    "Buy what the instruction asks on a generated shop site in Chromium (search, product options, cart, "
    "checkout); reward = attribute match of the purchase, progress rewards on the way",
    example_kwargs={"num_products": 40, "num_train": 20, "num_eval": 5},
)
