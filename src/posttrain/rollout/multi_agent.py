"""Multi-agent episodes: several agents act in one PettingZoo env, each seat played by its own player.

A *lineup* says who plays each role of a game: a language-model player (a generation backend, and
optionally a hook that switches to that role's LoRA adapter before it generates) or a fixed one
(random legal moves, or the game's scripted strategy). Many games run at once: at every round each
unfinished game's agent to move is asked for its move, the language-model turns are batched per
player, and every env is stepped.

Token in, token out, as in :mod:`posttrain.rollout.episodes`, with one trajectory per
language-model seat: its first observation is the chat prompt, its sampled ids are kept exactly
(loss mask 1), and each later observation (what happened since its last move) is appended as the
chat-template delta ids (loss mask 0). A turn's step reward is what the env paid that agent from
its move until its next one; the trajectory's reward is the seat's return.

Bad moves are the env's business (an observation and a penalty, see posttrain.envs.games); an env
that raises or hangs past ``step_timeout`` ends its game with ``error`` set on every trajectory.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pettingzoo import AECEnv, ParallelEnv
from pettingzoo.utils.conversions import parallel_to_aec

from posttrain.rollout.backend import GenerationBackend, SamplingParams
from posttrain.rollout.episodes import EnvPool, _call_all, encode_prompt, observation_delta
from posttrain.types import AgentOutcome, GameResult, Step, Task, Trajectory


@dataclass(eq=False)
class LLMPlayer:
    """A language model at the table. ``prepare`` runs before each batch it generates (for example
    ``lambda: model.set_adapter("x")`` for one LoRA adapter per role)."""

    name: str
    backend: GenerationBackend
    prepare: Callable[[], None] | None = None


@dataclass(eq=False)
class FixedPlayer:
    """A player that needs no model: ``random`` legal moves, or the game's ``scripted`` strategy."""

    name: str

    def move(self, game: Any, agent: str, rng: random.Random) -> str:
        if self.name == "random":
            return game.move_text(rng.choice(game.legal_moves(agent)))
        return game.move_text(game.scripted_move(agent, rng))


Player = LLMPlayer | FixedPlayer


def as_aec(env: AECEnv | ParallelEnv) -> AECEnv:
    """An AEC view of ``env``; a ParallelEnv's agents then move in turn, and see each other's
    moves only when the round is resolved, as in the parallel game."""
    return parallel_to_aec(env) if isinstance(env, ParallelEnv) else env


@dataclass(eq=False)
class _Game:
    env: AECEnv
    task: Task
    lineup: dict[str, Player]
    rng: random.Random
    trajectories: dict[str, Trajectory] = field(default_factory=dict)
    returns: dict[str, float] = field(default_factory=dict)
    infos: dict[str, dict] = field(default_factory=dict)
    turns: dict[str, int] = field(default_factory=dict)
    done: bool = False
    error: str | None = None

    def trajectory(self, agent: str) -> Trajectory:
        if agent not in self.trajectories:
            self.trajectories[agent] = Trajectory(task=self.task, prompt_ids=[], completion_ids=[], loss_mask=[],
                                                  behaviour_logprobs=[],
                                                  metadata={"role": agent, "player": self.lineup[agent].name})
        return self.trajectories[agent]

    def fail(self, where: str, error: BaseException) -> None:
        self.error = f"{where}: {type(error).__name__}: {error}"
        for traj in self.trajectories.values():
            traj.error, traj.reward, traj.finish_reason = self.error, 0.0, "error"
        self.done = True


def run_games(envs: EnvPool, tasks: list[Task], lineups: list[dict[str, Player]], tokenizer,
              params: SamplingParams, max_context: int = 4096, step_timeout: float = 60.0,
              seed: int = 0) -> list[GameResult]:
    """Play one game per ``(task, lineup)`` pair, all at once; a result per game, in order.

    Repeat a task G times (with G lineups) for G games of one seed, the group of a group baseline.
    """
    if len(tasks) != len(lineups):
        raise ValueError(f"run_games: {len(tasks)} tasks but {len(lineups)} lineups (need one each)")
    games = [_Game(as_aec(env), task, lineup, random.Random(f"{seed}-{task.id}-{i}"))
             for i, (env, task, lineup) in enumerate(zip(envs.take(len(tasks)), tasks, lineups))]
    resets = _call_all([lambda g=g: g.env.reset(options={"task": g.task}) for g in games], step_timeout)
    for game, (ok, value) in zip(games, resets):
        if not ok:
            game.fail("reset", value)
            if isinstance(value, TimeoutError):
                envs.replace(game.env.unwrapped)
    while True:
        turns = [t for t in (_next_turn(g, tokenizer, max_context) for g in games if not g.done) if t]
        if not turns:
            break
        actions = _choose(turns, params, tokenizer)
        steps = _call_all([lambda g=g, a=a: g.env.step(a) for (g, _), a in zip(turns, actions)], step_timeout)
        for (game, agent), action, (ok, value) in zip(turns, actions, steps):
            if not ok:
                game.fail("step", value)
                if isinstance(value, TimeoutError):
                    envs.replace(game.env.unwrapped)
                continue
            _record_step(game, agent, action)
    return [_result(g) for g in games]


def _next_turn(game: _Game, tokenizer, max_context: int) -> tuple[_Game, str] | None:
    """Step past finished agents; return (game, agent to move), or None when the game is over.
    A language-model seat gets its observation appended to its trajectory here."""
    env = game.env
    try:
        while env.agents and (env.terminations[env.agent_selection] or env.truncations[env.agent_selection]):
            env.step(None)
        if not env.agents:
            game.done = True
            return None
        agent = env.agent_selection
        observation = env.observe(agent)
    except Exception as e:  # noqa: BLE001 - a failing environment is data, not a crash
        game.fail("step", e)
        return None
    if isinstance(game.lineup[agent], LLMPlayer) and not _deliver(game.trajectory(agent), observation, tokenizer,
                                                                   max_context):
        game.done = True  # the conversation would not fit: the game stops where it is
        return None
    return game, agent


def _deliver(traj: Trajectory, observation: str, tokenizer, max_context: int) -> bool:
    """Put ``observation`` into the agent's context; False when it does not fit in ``max_context``."""
    if traj.steps:
        traj.steps[-1].observation = observation
    if not traj.prompt_ids:
        traj.prompt_ids = encode_prompt(tokenizer, observation)
        return len(traj.prompt_ids) < max_context
    sampled_eos = bool(traj.completion_ids) and traj.completion_ids[-1] == tokenizer.eos_token_id
    delta = observation_delta(tokenizer, observation, sampled_eos)
    if len(traj.prompt_ids) + len(traj.completion_ids) + len(delta) >= max_context:
        traj.finish_reason = "max_context"
        if traj.steps:
            traj.steps[-1].truncated = True
        return False
    traj.completion_ids += delta
    traj.loss_mask += [0] * len(delta)
    traj.behaviour_logprobs += [0.0] * len(delta)
    return True


def _choose(turns: list[tuple[_Game, str]], params: SamplingParams, tokenizer) -> list[str]:
    """Every agent's move: fixed players at once, each language-model player in one batch."""
    actions: list[str] = [""] * len(turns)
    by_player: dict[int, list[int]] = {}
    for i, (game, agent) in enumerate(turns):
        player = game.lineup[agent]
        if isinstance(player, FixedPlayer):
            actions[i] = player.move(game.env.unwrapped, agent, game.rng)
        else:
            by_player.setdefault(id(player), []).append(i)
    for rows in by_player.values():
        game, agent = turns[rows[0]]
        player: LLMPlayer = game.lineup[agent]  # type: ignore[assignment]
        if player.prepare is not None:
            player.prepare()
        trajs = [turns[i][0].trajectory(turns[i][1]) for i in rows]
        generations = player.backend.generate([t.prompt_ids + t.completion_ids for t in trajs], params)
        for i, traj, gen in zip(rows, trajs, generations):
            traj.completion_ids += gen.token_ids
            traj.loss_mask += [1] * len(gen.token_ids)
            traj.behaviour_logprobs += gen.logprobs
            traj.finish_reason = gen.finish_reason
            actions[i] = tokenizer.decode(gen.token_ids, skip_special_tokens=True)
    return actions


def _record_step(game: _Game, agent: str, action: str) -> None:
    """Credit what the env paid each agent after ``agent``'s move, and keep the agents' infos."""
    env = game.env
    game.turns[agent] = game.turns.get(agent, 0) + 1
    if agent in game.trajectories:
        game.trajectories[agent].steps.append(Step(action, "", 0.0, False, False, {}))
    for a in env.agents:
        reward = float(env.rewards.get(a, 0.0))
        game.returns[a] = game.returns.get(a, 0.0) + reward
        game.infos[a] = dict(env.infos.get(a, {}))
        traj = game.trajectories.get(a)
        if traj is not None and traj.steps:
            step = traj.steps[-1]
            step.reward += reward
            step.terminated = bool(env.terminations.get(a))
            step.truncated = step.truncated or bool(env.truncations.get(a))
            step.info = game.infos[a]


def _result(game: _Game) -> GameResult:
    outcomes = {}
    for role, player in game.lineup.items():
        info = game.infos.get(role, {})
        outcomes[role] = AgentOutcome(role=role, player=player.name, reward=game.returns.get(role, 0.0),
                                      payoff=float(info.get("payoff", 0.0)), outcome=info.get("outcome"),
                                      invalid_moves=int(info.get("invalid_moves", 0)), turns=game.turns.get(role, 0))
    for role, traj in game.trajectories.items():
        if traj.error is None:
            traj.reward = outcomes[role].reward
            traj.metadata.update(outcome=outcomes[role].outcome, payoff=outcomes[role].payoff,
                                 invalid_moves=outcomes[role].invalid_moves)
    return GameResult(task=game.task, outcomes=outcomes, trajectories=dict(game.trajectories), error=game.error)
