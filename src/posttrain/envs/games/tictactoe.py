"""Tic-tac-toe for two language-model agents: X moves first, a move is a free cell number 0-8."""

from __future__ import annotations

import random
import re

from posttrain.envs.games.base import TextGame

LINES = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)]
_NUMBER = re.compile(r"\d+")


def winner(board: list[str]) -> str | None:
    """'X' or 'O' when that mark holds a line, else None."""
    for a, b, c in LINES:
        if board[a] != " " and board[a] == board[b] == board[c]:
            return board[a]
    return None


class TicTacToe(TextGame):
    """Win +1, loss -1, draw 0 (minus the invalid-move penalties). Agents ``x`` and ``o``."""

    metadata = {**TextGame.metadata, "name": "tictactoe"}
    game = "tictactoe"
    possible_agents = ["x", "o"]

    def _start(self) -> None:
        self.board = [" "] * 9
        for agent in self.agents:
            mark, other = self.mark(agent), self.mark(self._next_agent(agent))
            first = "You move first." if agent == "x" else "X moves first."
            self.tell(agent, f"You are {mark} in tic-tac-toe against {other}. {first} Take three cells in a row, "
                      "column or diagonal to win. Free cells show their number.")

    @staticmethod
    def mark(agent: str) -> str:
        return agent.upper()

    def name(self, agent: str) -> str:
        return self.mark(agent)

    def parse(self, agent: str, text: str) -> int | None:
        found = _NUMBER.search(text)
        # A number of thousands of digits is no cell, and more than int() takes from a string.
        return int(found.group()) if found and len(found.group()) <= 9 else None

    def legal_moves(self, agent: str) -> list[int]:
        return [i for i, c in enumerate(self.board) if c == " "]

    def _play(self, agent: str, move: int) -> None:
        mark = self.mark(agent)
        self.board[move] = mark
        other = self._next_agent(agent)
        self.tell(other, f"{mark} took cell {move}.")
        won = winner(self.board)
        if won:
            self.finish({agent: 1.0, other: -1.0}, {agent: "win", other: "loss"})
        elif " " not in self.board:
            self.finish({agent: 0.0, other: 0.0}, {agent: "draw", other: "draw"})

    def state_text(self, agent: str) -> str:
        rows = ["|".join(c if c != " " else str(r * 3 + i) for i, c in enumerate(self.board[r * 3 : r * 3 + 3]))
                for r in range(3)]
        return "\n".join(rows) + f"\nYou are {self.mark(agent)}. Reply with the number of a free cell."

    def scripted_move(self, agent: str, rng: random.Random) -> int:
        """Win if possible, else block the opponent's line, else the centre, else a random free cell."""
        mine, theirs = self.mark(agent), self.mark(self._next_agent(agent))
        free = self.legal_moves(agent)
        for mark in (mine, theirs):
            for cell in free:
                board = list(self.board)
                board[cell] = mark
                if winner(board) == mark:
                    return cell
        return 4 if 4 in free else rng.choice(free)
