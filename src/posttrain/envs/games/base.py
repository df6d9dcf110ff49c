"""The base of posttrain's multi-agent text environments: a PettingZoo AEC env with text spaces.

A game is played in turns that cycle through its agents (X, O, X, ... or player_0, player_1,
player_0, ...), so PettingZoo's ``aec_to_parallel`` can convert it and ``parallel_api_test`` check
it. An agent's observation is the message it reads at its next turn: the rules and the state at
its first turn, then what happened since its last move and the new state. A language model sees
these as the turns of one chat, one conversation per agent.

Bad moves are data, never exceptions: a move that cannot be parsed or is illegal forfeits that
turn (a pass; in poker the cheapest legal action), costs ``invalid_penalty`` reward, and is told
to the agent in its next observation; after ``max_invalid`` of them in one game the agent loses.
A forfeited turn keeps the cycle, which a retry of the same agent would break.

Every episode is one :class:`~posttrain.types.Task`: for games a seed (the deal, the item values,
the scripted opponents' dice), so the G games of one task form a group for group baselines.
"""

from __future__ import annotations

import functools
import random
import string

from gymnasium.spaces import Text
from pettingzoo import AECEnv

from posttrain.types import Task

MAX_TEXT = 4096
PRINTABLE = string.printable


def text_space(max_length: int = MAX_TEXT) -> Text:
    """A Text space over printable characters (gymnasium's default charset is alphanumerics only)."""
    return Text(max_length=max_length, min_length=0, charset=PRINTABLE)


def seed_tasks(game: str, split: str, num_train: int = 1000, num_eval: int = 200) -> list[Task]:
    """Seeds as tasks: train seeds 0.., eval seeds from 10**6 on, so the splits never overlap."""
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    start, n = (0, num_train) if split == "train" else (10**6, num_eval)
    return [Task(id=f"{game}-{s}", prompt="", metadata={"seed": s}) for s in range(start, start + n)]


def begin_episode(env: AECEnv) -> None:
    """PettingZoo's bookkeeping at the start of a game: every agent in play, no rewards yet, nothing
    ended, and the infos every game here reports (invalid moves, payoff, outcome) at their start."""
    env.agents = list(env.possible_agents)
    env.rewards = {a: 0.0 for a in env.agents}
    env._cumulative_rewards = {a: 0.0 for a in env.agents}
    env.terminations = {a: False for a in env.agents}
    env.truncations = {a: False for a in env.agents}
    env.infos = {a: {"invalid_moves": 0, "payoff": 0.0, "outcome": None} for a in env.agents}


class SeededTextSpaces:
    """What the games here share: text observation and action spaces, seeds as tasks
    (:func:`seed_tasks`), and the seed of a reset (``seed``, else the task's)."""

    game: str
    num_train: int
    num_eval: int

    @functools.lru_cache(maxsize=None)
    def observation_space(self, agent: str) -> Text:
        return text_space()

    @functools.lru_cache(maxsize=None)
    def action_space(self, agent: str) -> Text:
        return text_space()

    def tasks(self, split: str) -> list[Task]:
        return seed_tasks(self.game, split, self.num_train, self.num_eval)

    @staticmethod
    def reset_seed(seed: int | None, options: dict | None) -> int | None:
        """``seed``, or where it is None the seed of the task in ``options`` (``{"task": Task}``)."""
        task = (options or {}).get("task")
        return task.metadata.get("seed") if seed is None and isinstance(task, Task) else seed


class TextGame(SeededTextSpaces, AECEnv):
    """Turn-cycling text game. Subclasses set ``possible_agents`` and ``game`` and implement
    :meth:`_start` (new game state, first messages), :meth:`_play` (apply one parsed move),
    :meth:`parse` (text -> move or None), :meth:`legal_moves` and :meth:`state_text`."""

    metadata = {"name": "text_game", "render_modes": ["ansi"], "is_parallelizable": True}
    game = "text_game"
    possible_agents: list[str] = []
    fixed_players = True  # random and scripted players can take a seat (legal_moves, scripted_move)

    def __init__(self, invalid_penalty: float = 0.1, max_invalid: int = 3, num_train: int = 1000,
                 num_eval: int = 200, render_mode: str | None = None):
        super().__init__()
        if invalid_penalty < 0:
            raise ValueError(f"invalid_penalty must be >= 0 (it is subtracted), got {invalid_penalty}")
        if max_invalid < 1:
            raise ValueError(f"max_invalid must be at least 1, got {max_invalid}")
        self.invalid_penalty = invalid_penalty
        self.max_invalid = max_invalid
        self.num_train, self.num_eval = num_train, num_eval
        self.render_mode = render_mode
        self.rng = random.Random(0)
        self.agents: list[str] = []

    # -------------------------------------------------------------- PettingZoo API

    def reset(self, seed: int | None = None, options: dict | None = None) -> None:
        self.rng = random.Random(self.reset_seed(seed, options))
        begin_episode(self)
        self._inbox = {a: [] for a in self.agents}
        self.agent_selection = self.agents[0]
        self._start()

    def observe(self, agent: str) -> str:
        """What ``agent`` reads at its next turn: its pending messages, then the current state."""
        parts = [*self._inbox.get(agent, []), self.state_text(agent)]
        return "\n".join(p for p in parts if p)[-MAX_TEXT:]

    def step(self, action: str | None) -> None:
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            if action is None:
                self._was_dead_step(None)
            else:
                # aec_to_parallel steps every agent of a cycle with an action, also those whose game
                # ended earlier in the cycle: ignore it, and leave the removal to the None steps.
                self._clear_rewards()
                self.agent_selection = self._next_agent(agent)
            return
        self._clear_rewards()
        self._inbox[agent] = []
        move = self.parse(agent, "" if action is None else str(action))
        if move is None or not self.is_legal(agent, move):
            self._invalid(agent, action)
        else:
            self._play(agent, move)
        self.agent_selection = self._next_agent(agent)
        self._accumulate_rewards()

    def render(self) -> str:
        return self.state_text(self.agent_selection) if self.agents else ""

    def close(self) -> None:
        pass

    # -------------------------------------------------------------- helpers for games

    def _next_agent(self, agent: str) -> str:
        order = self.possible_agents
        return order[(order.index(agent) + 1) % len(order)]

    def tell(self, agent: str, message: str) -> None:
        """Queue ``message`` for ``agent``'s next observation."""
        self._inbox[agent].append(message)

    def tell_all(self, message: str) -> None:
        for a in self.agents:
            self.tell(a, message)

    def finish(self, payoffs: dict[str, float], outcomes: dict[str, str | None]) -> None:
        """End the game: each agent's payoff is added to its reward and kept in its info."""
        for a in self.agents:
            self.rewards[a] += payoffs[a]
            self.infos[a]["payoff"] = payoffs[a]
            self.infos[a]["outcome"] = outcomes[a]
            self.terminations[a] = True

    def _invalid(self, agent: str, action: str | None) -> None:
        self.infos[agent]["invalid_moves"] += 1
        self.rewards[agent] -= self.invalid_penalty
        shown = (action or "").strip().replace("\n", " ")[:80]
        count = self.infos[agent]["invalid_moves"]
        if count >= self.max_invalid:
            self.tell_all(f"{self.name(agent)} made {count} invalid moves and loses the game.")
            self.forfeit(agent)
            return
        self.tell(agent, f"Your reply {shown!r} was not a legal move ({self.legal_hint(agent)}); you lost that turn.")
        for other in self.agents:
            if other != agent:
                self.tell(other, f"{self.name(agent)} made an invalid move and lost the turn.")
        self.pass_turn(agent)

    def name(self, agent: str) -> str:
        return agent

    def legal_hint(self, agent: str) -> str:
        return "legal: " + ", ".join(str(m) for m in self.legal_moves(agent))

    def forfeit(self, agent: str) -> None:
        """``agent`` loses (too many invalid moves); the others win. Games may override."""
        self.finish({a: (-1.0 if a == agent else 1.0) for a in self.agents},
                    {a: ("loss" if a == agent else "win") for a in self.agents})

    def pass_turn(self, agent: str) -> None:
        """What a forfeited turn does to the state; nothing, unless the game says otherwise."""

    # -------------------------------------------------------------- what each game defines

    def _start(self) -> None:
        raise NotImplementedError

    def parse(self, agent: str, text: str):
        raise NotImplementedError

    def legal_moves(self, agent: str) -> list:
        raise NotImplementedError

    def is_legal(self, agent: str, move) -> bool:
        return move in self.legal_moves(agent)

    def _play(self, agent: str, move) -> None:
        raise NotImplementedError

    def state_text(self, agent: str) -> str:
        raise NotImplementedError

    def move_text(self, move) -> str:
        """A move as a reply that :meth:`parse` reads back (for scripted and random players)."""
        return str(move)

    def scripted_move(self, agent: str, rng: random.Random):
        """A simple fixed strategy for ``agent``; by default a random legal move."""
        return rng.choice(self.legal_moves(agent))
