"""TextArena's two-player games as a PettingZoo AEC env (``kwargs: {game: "TicTacToe-v0"}``).

TextArena 0.7.4 (Guertler et al. 2025, arXiv:2504.11442) runs offline: ``make``,
``reset(num_players, seed)``, ``get_observation() -> (player_id, messages)``, ``step(action) ->
(done, info)``, ``close() -> (rewards, game_info)``. We use the game's raw version (its messages
since the player last moved, which is what a chat turn needs) with TextArena's action formatting
(a move without brackets gets them).

TextArena seeds and draws from Python's global ``random`` (``reset(seed)`` calls ``random.seed``);
every call into it here runs on this env's own saved ``random`` state, so neither the trainer's
random stream nor another env's is disturbed.

Invalid moves follow TextArena's rules: the same player is asked again, and loses after the
game's error allowance; each invalid move also costs ``invalid_penalty``. Since a player may move
twice in a row, this env is turn-based and converts to a ParallelEnv with PettingZoo's
``turn_based_aec_to_parallel`` (not ``aec_to_parallel``, which needs strict cycles).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager

from pettingzoo import AECEnv

from posttrain.envs.games.base import MAX_TEXT, SeededTextSpaces, begin_episode


class TextArenaGame(SeededTextSpaces, AECEnv):
    """A two-player TextArena game; agents ``player_0`` and ``player_1``."""

    metadata = {"name": "textarena", "render_modes": ["ansi"], "is_parallelizable": False}
    possible_agents = ["player_0", "player_1"]

    def __init__(self, game: str = "TicTacToe-v0", invalid_penalty: float = 0.1, num_train: int = 1000,
                 num_eval: int = 200, render_mode: str | None = None):
        super().__init__()
        try:
            import textarena as ta
        except ImportError as e:
            raise ValueError(f"the textarena env needs the textarena package (pip install textarena): {e}") from None
        from textarena.wrappers import ActionFormattingWrapper

        self._rng_state = random.Random(0).getstate()
        with self._own_random():
            try:
                self._env = ActionFormattingWrapper(ta.make(f"{game}-raw"))
            except ValueError as e:
                raise ValueError(f"TextArena game {game!r}: {e}") from None
        self.game, self.invalid_penalty = game, invalid_penalty
        self.num_train, self.num_eval = num_train, num_eval
        self.render_mode = render_mode
        self.agents: list[str] = []

    @contextmanager
    def _own_random(self) -> Iterator[None]:
        """Run TextArena on this env's random state, leaving the caller's global state as it was."""
        outer = random.getstate()
        random.setstate(self._rng_state)
        try:
            yield
        finally:
            self._rng_state = random.getstate()
            random.setstate(outer)

    def reset(self, seed: int | None = None, options: dict | None = None) -> None:
        with self._own_random():
            self._env.reset(num_players=2, seed=self.reset_seed(seed, options))
        begin_episode(self)
        self._pending = {a: "" for a in self.agents}
        self._pull_observation()

    def _pull_observation(self) -> None:
        """Take the messages TextArena holds for the player to move; that player moves next."""
        with self._own_random():
            player, messages = self._env.get_observation()
        agent = f"player_{player}"
        self._pending[agent] += "\n".join(_message_text(m) for m in messages)
        self.agent_selection = agent

    def observe(self, agent: str) -> str:
        return self._pending.get(agent, "")[-MAX_TEXT:]

    def step(self, action: str | None) -> None:
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(None)
            return
        self._clear_rewards()
        self._pending[agent] = ""
        with self._own_random():
            done, _ = self._env.step("" if action is None else str(action))
            state = self._env.state
            invalid = not done and state.current_player_id == int(agent[-1]) and state.error_count > 0
        if invalid:
            self.infos[agent]["invalid_moves"] += 1
            self.rewards[agent] -= self.invalid_penalty
        if done:
            self._finish()
        else:
            self._pull_observation()
        self._accumulate_rewards()

    def _finish(self) -> None:
        with self._own_random():
            rewards, game_info = self._env.close()
        payoffs = {f"player_{p}": float(r) for p, r in (rewards or {}).items()}
        for p, info in (game_info or {}).items():
            if info.get("invalid_move") and f"player_{p}" in self.infos:  # the move that lost the game
                self.infos[f"player_{p}"]["invalid_moves"] += 1
                self.rewards[f"player_{p}"] -= self.invalid_penalty
        for a in self.agents:
            payoff = payoffs.get(a, 0.0)
            best_other = max((payoffs.get(b, 0.0) for b in self.agents if b != a), default=0.0)
            self.rewards[a] += payoff
            self.infos[a]["payoff"] = payoff
            self.infos[a]["outcome"] = "win" if payoff > best_other else "loss" if payoff < best_other else "draw"
            self.terminations[a] = True

    def render(self) -> str:
        return self.observe(self.agent_selection) if self.agents else ""

    def close(self) -> None:
        pass


def _message_text(message) -> str:
    """One TextArena message ``(from_id, text, type)`` as a line; a player's own words are tagged."""
    if isinstance(message, tuple) and len(message) >= 2:
        sender, text = message[0], str(message[1])
        return text if sender < 0 else f"[Player {sender}] {text}"
    return str(message)
