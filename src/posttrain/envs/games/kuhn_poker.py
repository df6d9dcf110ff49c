"""Kuhn poker (Kuhn 1950): three cards J < Q < K, one hand, ante 1, one bet of 1.

Every chip is accounted for: each player antes 1 into the pot, a bet and a call each move 1 more
from the player's stack into the pot, and the winner (the higher card at showdown, or the one who
did not fold) takes the pot. A player's payoff is its stack change, -2 to +2. (TextArena 0.7.4's
KuhnPoker never moves chips on bet or call; this one does, and its tests count them.)
"""

from __future__ import annotations

import random
import re

from posttrain.envs.games.base import TextGame

CARDS = ["J", "Q", "K"]
ACTIONS = ("check", "bet", "call", "fold")
_ACTION = re.compile(r"\b(" + "|".join(ACTIONS) + r")\b", re.I)


class KuhnPoker(TextGame):
    """Agents ``player_0`` (acts first) and ``player_1``; a move is check, bet, call or fold."""

    metadata = {**TextGame.metadata, "name": "kuhn_poker"}
    game = "kuhn_poker"
    possible_agents = ["player_0", "player_1"]

    def __init__(self, chips: int = 2, **kwargs):
        super().__init__(**kwargs)
        if chips < 2:
            raise ValueError(f"chips must be at least 2 (ante and bet), got {chips}")
        self.chips = chips

    def _start(self) -> None:
        dealt = self.rng.sample(CARDS, 2)
        self.cards = dict(zip(self.agents, dealt))
        self.stacks = {a: self.chips - 1 for a in self.agents}  # the ante is in the pot
        self.put_in = {a: 1 for a in self.agents}
        self.history: list[str] = []
        for agent in self.agents:
            first = "You act first." if agent == "player_0" else "Your opponent acts first."
            self.tell(agent, f"You are {self.name(agent)} in Kuhn poker: three cards J < Q < K, one card each; "
                      f"both players put 1 chip in the pot. {first} A bet or a call puts 1 more chip in. "
                      "The higher card wins the pot at showdown; folding gives the pot away.")

    @property
    def pot(self) -> int:
        return sum(self.put_in.values())

    def name(self, agent: str) -> str:
        return agent.replace("_", " ")

    def parse(self, agent: str, text: str) -> str | None:
        found = _ACTION.search(text)
        return found.group(1).lower() if found else None

    def legal_moves(self, agent: str) -> list[str]:
        facing_bet = bool(self.history) and self.history[-1] == "bet"
        return ["call", "fold"] if facing_bet else ["check", "bet"]

    def pass_turn(self, agent: str) -> None:
        """A forfeited turn checks where it can and folds when facing a bet."""
        self._play(agent, "check" if "check" in self.legal_moves(agent) else "fold")

    def forfeit(self, agent: str) -> None:
        if "fold" in self.legal_moves(agent):
            self._play(agent, "fold")
        else:
            self._award(self._next_agent(agent))

    def _play(self, agent: str, move: str) -> None:
        other = self._next_agent(agent)
        if move in ("bet", "call"):
            self.stacks[agent] -= 1
            self.put_in[agent] += 1
        self.history.append(move)
        self.tell(other, f"Your opponent {'checks' if move == 'check' else move + 's'}.")
        if move == "fold":
            self._award(other)
        elif self.history[-2:] in (["check", "check"], ["bet", "call"]):
            best = max(self.agents, key=lambda a: CARDS.index(self.cards[a]))
            self.tell_all(f"Showdown: {self.name(agent)} has {self.cards[agent]}, "
                          f"{self.name(other)} has {self.cards[other]}.")
            self._award(best)

    def _award(self, winner: str) -> None:
        """``winner`` takes the pot; payoffs are the stack changes."""
        self.stacks[winner] += self.pot
        payoffs = {a: float(self.stacks[a] - self.chips) for a in self.agents}
        self.finish(payoffs, {a: ("win" if a == winner else "loss") for a in self.agents})

    def state_text(self, agent: str) -> str:
        moves = " or ".join(self.legal_moves(agent))
        return (f"Your card: {self.cards[agent]}. Pot: {self.pot} chips; you put in {self.put_in[agent]}, "
                f"you have {self.stacks[agent]} left. Reply with one word: {moves}.")

    def scripted_move(self, agent: str, rng: random.Random) -> str:
        """Bet or call with K, check or call with Q, check or fold with J."""
        card, legal = self.cards[agent], self.legal_moves(agent)
        if card == "K":
            return "bet" if "bet" in legal else "call"
        if card == "Q":
            return "check" if "check" in legal else "call"
        return "check" if "check" in legal else "fold"
