"""A trade game where both agents act at once (a PettingZoo ParallelEnv).

A pool of books, hats and balls is on the table; each agent values the items privately (its
values add up to 10 over the pool, and the two agents' values differ, so splitting by who values
what more gains both). Each round both agents claim a bundle at the same time. When the claims fit
in the pool (no item over-claimed) the deal is struck and each agent's payoff is the value of its
bundle over 10, in [0, 1]; what nobody claimed is lost. Otherwise both see the other's claim and
claim again, for up to ``max_rounds`` rounds; no deal pays 0. The payoff is checked by arithmetic
on the values, nothing else (a multi-issue Nash demand game, Nash 1953).

An unparsable or impossible claim counts as no claim for that round and costs ``invalid_penalty``;
after ``max_invalid`` of them the game ends without a deal.
"""

from __future__ import annotations

import itertools
import random
import re

from pettingzoo import ParallelEnv

from posttrain.envs.games.base import MAX_TEXT, SeededTextSpaces

ITEMS = ("books", "hats", "balls")
TOTAL_VALUE = 10
_NUMBER = re.compile(r"\d+")


def value_of(bundle: tuple[int, ...], values: tuple[int, ...]) -> int:
    return sum(n * v for n, v in zip(bundle, values))


def fits(claims: list[tuple[int, ...]], pool: tuple[int, ...]) -> bool:
    """True when the claims together take no more of any item than the pool holds."""
    return all(sum(c[i] for c in claims) <= pool[i] for i in range(len(pool)))


def _value_vectors(pool: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Every per-item value vector (0..10 each) whose pool total is exactly TOTAL_VALUE."""
    return [v for v in itertools.product(range(TOTAL_VALUE + 1), repeat=len(pool))
            if value_of(pool, v) == TOTAL_VALUE]


class Negotiation(SeededTextSpaces, ParallelEnv):
    """Agents ``alice`` and ``bob``; an action is a claim, three numbers (books hats balls)."""

    metadata = {"name": "negotiation", "render_modes": ["ansi"]}
    game = "negotiation"
    possible_agents = ["alice", "bob"]
    fixed_players = True  # random and scripted players can take a seat (legal_moves, scripted_move)

    def __init__(self, max_rounds: int = 3, invalid_penalty: float = 0.1, max_invalid: int = 3,
                 num_train: int = 1000, num_eval: int = 200, render_mode: str | None = None):
        if max_rounds < 1 or max_invalid < 1 or invalid_penalty < 0:
            raise ValueError(f"need max_rounds >= 1, max_invalid >= 1, invalid_penalty >= 0; got {max_rounds}, "
                             f"{max_invalid}, {invalid_penalty}")
        self.max_rounds, self.invalid_penalty, self.max_invalid = max_rounds, invalid_penalty, max_invalid
        self.num_train, self.num_eval = num_train, num_eval
        self.render_mode = render_mode
        self.agents: list[str] = []

    def reset(self, seed: int | None = None, options: dict | None = None):
        rng = random.Random(self.reset_seed(seed, options))
        vectors: list[tuple[int, ...]] = []
        while len(vectors) < 2:  # (3, 3, 3) has no values adding up to 10: draw the pool again
            self.pool = tuple(rng.randint(1, 3) for _ in ITEMS)
            vectors = _value_vectors(self.pool)
        first = rng.choice(vectors)
        second = rng.choice([v for v in vectors if v != first])
        self.values = dict(zip(self.possible_agents, (first, second)))
        self.agents = list(self.possible_agents)
        self.round = 0
        self.invalid = {a: 0 for a in self.agents}
        self._news = {a: self._rules(a) for a in self.agents}
        return {a: self._observe(a) for a in self.agents}, {a: self._info(a, 0.0) for a in self.agents}

    def step(self, actions: dict[str, str]):
        claims: dict[str, tuple[int, ...] | None] = {}
        rewards = {a: 0.0 for a in self.agents}
        for a in self.agents:
            claims[a] = self.parse(str(actions.get(a, "")))
            if claims[a] is None or not fits([claims[a]], self.pool):
                claims[a] = None
                self.invalid[a] += 1
                rewards[a] -= self.invalid_penalty
        self.round += 1
        deal = all(c is not None for c in claims.values()) and fits(list(claims.values()), self.pool)
        payoffs = {a: value_of(claims[a], self.values[a]) / TOTAL_VALUE if deal else 0.0 for a in self.agents}
        over = deal or self.round >= self.max_rounds or any(n >= self.max_invalid for n in self.invalid.values())
        for a in self.agents:
            other = next(b for b in self.agents if b != a)
            self._news[a] = self._round_report(claims[a], claims[other], deal)
            if over:
                rewards[a] += payoffs[a]
        infos = {a: self._info(a, payoffs[a], over, payoffs) for a in self.agents}
        observations = {a: self._observe(a) for a in self.agents}
        done = {a: over for a in self.agents}
        truncated = {a: False for a in self.agents}
        if over:
            self.agents = []
        return observations, rewards, done, truncated, infos

    def parse(self, text: str) -> tuple[int, ...] | None:
        found = _NUMBER.findall(text)[: len(ITEMS)]
        if len(found) < len(ITEMS) or any(len(n) > 9 for n in found):  # thousands of digits: more than int() takes
            return None
        return tuple(int(n) for n in found)

    def render(self) -> str:
        return f"pool {self.pool}, values {self.values}, round {self.round}"

    def close(self) -> None:
        pass

    # -------------------------------------------------------------- text

    def _describe(self, bundle: tuple[int, ...]) -> str:
        return ", ".join(f"{n} {item}" for n, item in zip(bundle, ITEMS))

    def _rules(self, agent: str) -> str:
        values = ", ".join(f"a {item[:-1]} is worth {v}" for item, v in zip(ITEMS, self.values[agent]))
        return (f"You are {agent.capitalize()}, trading with another player. On the table: "
                f"{self._describe(self.pool)}. To you {values} (the whole table is worth {TOTAL_VALUE}); the "
                "other player values them differently. Each round you both claim items at the same time. If the "
                "two claims fit on the table, each gets its claim; if not, you both claim again. After "
                f"{self.max_rounds} rounds without a deal nobody gets anything.")

    def _round_report(self, mine, theirs, deal: bool) -> str:
        said = lambda c: self._describe(c) if c is not None else "nothing valid"  # noqa: E731
        result = "Deal." if deal else "The claims do not fit: no deal yet."
        return f"Round {self.round}: you claimed {said(mine)}; the other player claimed {said(theirs)}. {result}"

    def _observe(self, agent: str) -> str:
        ask = ("Reply with three numbers: how many books, hats and balls you claim, for example 1 0 2."
               if self.round < self.max_rounds else "")
        return "\n".join(p for p in (self._news[agent], ask) if p)[-MAX_TEXT:]

    def _info(self, agent: str, payoff: float, over: bool = False, payoffs: dict | None = None) -> dict:
        outcome = None
        if over and payoffs:
            other = max(payoffs[b] for b in payoffs if b != agent)
            outcome = "win" if payoff > other else "loss" if payoff < other else "draw"
        return {"invalid_moves": self.invalid[agent], "payoff": payoff, "outcome": outcome}

    # -------------------------------------------------------------- fixed players

    def legal_moves(self, agent: str) -> list[tuple[int, ...]]:
        return list(itertools.product(*(range(n + 1) for n in self.pool)))

    def move_text(self, move: tuple[int, ...]) -> str:
        return " ".join(map(str, move))

    def scripted_move(self, agent: str, rng: random.Random) -> tuple[int, ...]:
        """Claim every item worth more to this agent than the average item, nothing else."""
        values = self.values[agent]
        mean = TOTAL_VALUE / sum(self.pool)
        return tuple(n if v > mean else 0 for n, v in zip(self.pool, values))
