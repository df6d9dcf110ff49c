"""Self-play and multi-agent training: play G games per seed, credit each seat, update the policy.

One step: draw ``train.tasks_per_step`` seeds, play ``algorithm.group_size`` games of each with the
configured lineup (the policy in every seat for self-play; a fixed player or a past checkpoint in
the other seats otherwise), take the policy's trajectories (one per seat it played), give each an
advantage from its return with a role-aware baseline (``multi_agent.advantage``), and take one
clipped-surrogate update (the GRPO loss of ``posttrain.algorithms``) over them. Evaluation plays
the held-out seeds against each fixed opponent in each role and reports win/draw/loss, payoff and
the invalid-move rate per role.

With ``multi_agent.policies: per_role`` every role has its own LoRA adapter on one base model;
generation switches adapters per role and each role's trajectories train only its adapter.

Checkpoints (``train.checkpoint_every``, a signal, the end) and ``--resume`` work as in the
single-agent trainer (:mod:`posttrain.train.resume`); a checkpoint also holds the role baselines, the
seed sampler, the opponent pool and, with LoRA, every role's adapters. :func:`evaluate_checkpoint`
(``posttrain eval``) plays a checkpoint's held-out games as the run's evaluation at its step did.
"""

from __future__ import annotations

import random
import re
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from peft import PeftModel

from posttrain.algorithms import Algorithm, Normaliser, keyed_group_advantages, role_conditioned_advantages
from posttrain.config import ConfigError, RunConfig
from posttrain.envs import EnvError, is_multi_agent, make_env
from posttrain.rollout import SamplingParams
from posttrain.rollout.multi_agent import FixedPlayer, LLMPlayer, Player, run_games
from posttrain.train.context import ProgressHook, RunContext
from posttrain.train.game_metrics import game_metrics
from posttrain.train.optimizer import adamw, lr_schedule
from posttrain.train.policy_pool import PolicyPool, adapter_name, add_role_adapters
from posttrain.train.resume import (
    cut_run_dir,
    load_adapters,
    load_trainer_state,
    load_weights,
    restoring,
    resume_from,
)
from posttrain.train.stopping import RunGuard
from posttrain.types import Batch, GameResult, Task, Trajectory


@dataclass
class SelfPlayResult:
    run_dir: Path
    before: dict[str, float] | None
    after: dict[str, float]
    steps: int
    seconds: float


class SelfPlayTrainer:
    """The multi-agent trainer, composed from the shared :class:`RunContext` (envs, policy, backend,
    logger, checkpoints) and :class:`Algorithm` (the clipped-surrogate loss)."""

    def __init__(self, cfg: RunConfig, progress: ProgressHook | None = None, resume: str | Path | None = None):
        checkpoint, cfg = resume_from(resume, cfg)
        self.cfg, ma = cfg, cfg.multi_agent
        self.roles = _check_multi_agent(cfg)  # before the model loads: a bad config fails at once
        self.train_roles = ma.train_roles or self.roles
        self.ctx = RunContext(cfg, progress)
        self.progress = self.ctx.progress
        self.envs, self.run_dir, self.policy, self.backend = self.ctx.envs, self.ctx.run_dir, self.ctx.policy, \
            self.ctx.backend
        self.train_tasks, self.eval_tasks = self.ctx.train_tasks(), self.ctx.tasks("eval")
        if ma.policies == "per_role":
            add_role_adapters(self.policy.model, self.roles)
        # One optimiser step per sampled batch: the loss is on-policy (ratio 1, old log-probs not needed).
        self.algorithm = Algorithm(cfg.algorithm.model_copy(update={"beta": 0.0}),
                                   max_new_tokens=cfg.rollout.max_new_tokens)
        self.params = [p for n, p in self.policy.model.named_parameters() if p.requires_grad or "lora_" in n]
        self.optimizer = adamw([{"params": self.params}], cfg.train.learning_rate, cfg.train.weight_decay)
        self.scheduler = lr_schedule(self.optimizer, cfg.train.warmup_steps, cfg.train.steps,
                                     cfg.train.lr_schedule, cfg.train.min_lr_ratio)
        self.pool = PolicyPool(self.policy.model, self.params, ma.pool_size)
        self.learners = self._learners()
        self.sampling = self.ctx.sampling()
        self.baselines: dict = {}
        self._task_rng = random.Random(cfg.seed)
        self.step = 0  # the step being played or trained
        self.trained_steps = 0  # steps whose update is done (what a checkpoint holds)
        self.resumed_from = checkpoint
        if checkpoint is not None:
            self.restore(checkpoint)

    def _learners(self) -> dict[str, LLMPlayer]:
        """The policy's player for each role (one shared player, or one per role adapter)."""
        if self.cfg.multi_agent.policies == "shared":
            player = LLMPlayer("policy", self.backend, prepare=self.pool.activate_live)
            return {role: player for role in self.roles}

        def use(role: str):
            return lambda: (self.pool.activate_live(), self.policy.model.set_adapter(adapter_name(role)))

        return {role: LLMPlayer(f"policy:{role}", self.backend, prepare=use(role)) for role in self.roles}

    # ----------------------------------------------------------------- loop

    def train(self) -> SelfPlayResult:
        cfg, ctx, start = self.cfg, self.ctx, time.time()
        ctx.start_run()
        # A signal or a failing disk stops the run after the step in flight, its weights saved first.
        with RunGuard(self.save, lambda: self.trained_steps) as guard:
            try:
                before = self.evaluate() if cfg.eval.before_training and self.resumed_from is None else None
                while self.step < cfg.train.steps:
                    guard.check()
                    self.step += 1  # before the step: its games' seeds follow it
                    metrics = self.train_step()
                    self.trained_steps = self.step
                    ctx.log("train", self.step, metrics)
                    self.progress("train", self.step, cfg.train.steps, metrics)
                    if cfg.multi_agent.opponent == "pool" and self.step % cfg.multi_agent.pool_every == 0:
                        self.pool.add()
                    if cfg.eval.every and self.step % cfg.eval.every == 0 and self.step < cfg.train.steps:
                        self.evaluate()
                    if ctx.checkpoint_due(self.step):
                        self.save()
                guard.check()
                after = self.evaluate()
                if not ctx.checkpoint_due(self.step):  # the last step's checkpoint, unless just written
                    self.save()
            finally:
                self.pool.activate_live()
                ctx.close()
        result = SelfPlayResult(self.run_dir, before, after, self.step, time.time() - start)
        ctx.write_summary({"steps": self.step, "seconds": result.seconds, "before": before, "after": after})
        return result

    def save(self) -> Path:
        """A checkpoint after the last finished step: the live policy's weights (not a pool member's) and all a
        resumed run needs besides (:meth:`restore`)."""
        self.pool.activate_live()
        extra = {"baselines": [[list(key), value] for key, value in self.baselines.items()],
                 "task_rng": self._task_rng.getstate(),
                 "pool": {"snapshots": list(self.pool.snapshots), "added": self.pool.added}}
        if isinstance(self.policy.model, PeftModel):  # every role's adapters, small enough to keep here as well:
            extra["adapters"] = [p.detach() for p in self.params]  # model/ has them in one folder per adapter
        return self.ctx.save_checkpoint(self.trained_steps, self.optimizer, self.scheduler, extra)

    def restore(self, checkpoint: Path) -> None:
        """Continue exactly where ``checkpoint`` left off: the weights (every role's adapters), optimiser and
        scheduler, the RNGs and the seed sampler's, the role baselines and the opponent pool; the run directory
        is cut back to its step."""
        lora = isinstance(self.policy.model, PeftModel)
        state = load_trainer_state(checkpoint, ("baselines", "task_rng", "pool", *(("adapters",) if lora else ())))
        if not lora:
            load_weights(self.policy, checkpoint / "model")
        with restoring(checkpoint):
            if lora:
                with torch.no_grad():
                    for param, saved in zip(self.params, state["adapters"], strict=True):
                        param.copy_(saved)
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
            self.baselines = {tuple(key): float(value) for key, value in state["baselines"]}
            self._task_rng.setstate(state["task_rng"])
            self.pool.snapshots.extend(state["pool"]["snapshots"])
            self.pool.added = int(state["pool"]["added"])
            self.step = self.trained_steps = int(state["step"])
            self.ctx.restore_rngs(state)
        cut_run_dir(self.run_dir, self.step, None, set())

    def load_policy(self, checkpoint: Path) -> None:
        """The policy of ``checkpoint`` (a checkpoint directory, or its ``model/``) in place of ``model.name``'s:
        its weights, or its LoRA adapters (every role's with ``multi_agent.policies: per_role``)."""
        model_dir = checkpoint / "model" if (checkpoint / "model").is_dir() else checkpoint
        if self.cfg.multi_agent.policies == "shared":
            if not any(model_dir.glob("*.safetensors")):
                raise ConfigError(f"--checkpoint {checkpoint}: no weights or adapters (*.safetensors) in {model_dir}"
                                  " (expected a checkpoint directory of a run, or its model/)")
            load_weights(self.policy, model_dir, "--checkpoint")
            return
        for role in self.roles:
            folder = model_dir / adapter_name(role)
            if not (folder / "adapter_model.safetensors").is_file():
                raise ConfigError(f"--checkpoint {checkpoint}: no adapter for role {role!r} ({folder} has no "
                                  "adapter_model.safetensors): multi_agent.policies=per_role evaluates a checkpoint "
                                  "of a per_role run")
            load_adapters(self.policy.model, adapter_name(role), folder, "--checkpoint")

    def _next_tasks(self, n: int) -> list[Task]:
        return [self.train_tasks[self._task_rng.randrange(len(self.train_tasks))] for _ in range(n)]

    def _lineups(self, n: int) -> list[dict[str, Player]]:
        """Who sits where in each of the ``n`` games of one seed's group."""
        ma = self.cfg.multi_agent
        if ma.opponent == "self" or (ma.opponent == "pool" and not len(self.pool)):
            return [dict(self.learners) for _ in range(n)]
        lineups = []
        for i in range(n):
            seat = self.train_roles[i % len(self.train_roles)]  # the policy takes each trained role in turn
            if ma.opponent == "pool":
                k = self._task_rng.randrange(len(self.pool))
                others = {r: self.pool.player(k, r, self.backend, ma.policies == "per_role") for r in self.roles}
            else:
                others = {r: FixedPlayer(ma.opponent) for r in self.roles}
            lineups.append({r: (self.learners[r] if r == seat else others[r]) for r in self.roles})
        return lineups

    def play(self, tasks: list[Task], lineups: list[dict[str, Player]], params: SamplingParams) -> list[GameResult]:
        try:
            return run_games(self.envs, tasks, lineups, self.policy.tokenizer, params,
                             self.cfg.rollout.max_context_tokens, self.cfg.env.step_timeout, self.cfg.seed + self.step)
        finally:
            self.pool.activate_live()

    def train_step(self) -> dict[str, float]:
        cfg, g = self.cfg, self.cfg.algorithm.group_size
        t0 = time.time()
        tasks = [t for t in self._next_tasks(cfg.train.tasks_per_step) for _ in range(g)]
        lineups = [lineup for _ in range(cfg.train.tasks_per_step) for lineup in self._lineups(g)]
        games = self.play(tasks, lineups, self.sampling)
        learner_names = {p.name for p in self.learners.values()}
        trajectories = [t for game in games for role, t in game.trajectories.items()
                        if t.metadata["player"] in learner_names and role in self.train_roles]
        metrics = {**game_metrics(games, learner_names), "generation_seconds": time.time() - t0}
        if trajectories:
            metrics.update(self._update(trajectories))
        metrics["step_seconds"] = time.time() - t0
        return metrics

    def advantages(self, trajectories: list[Trajectory]) -> torch.Tensor:
        """One advantage per trajectory from its return, with the configured role-aware baseline."""
        ma = self.cfg.multi_agent
        rewards = torch.tensor([t.reward for t in trajectories], dtype=torch.float32)
        roles = [t.metadata["role"] for t in trajectories]
        if ma.advantage == "role_ema":
            adv, self.baselines = role_conditioned_advantages(rewards, [(self.cfg.env.id, r) for r in roles],
                                                              self.baselines, ma.ema_decay)
            return adv
        keys = [(t.task.id, r) if ma.advantage == "role_groups" else t.task.id for t, r in zip(trajectories, roles)]
        return keyed_group_advantages(rewards, keys, scale=ma.scale_advantages)

    def _update(self, trajectories: list[Trajectory]) -> dict[str, float]:
        """One optimiser step of the clipped surrogate over the policy's trajectories."""
        cfg = self.cfg
        per_traj = self.advantages(trajectories)
        failed = torch.tensor([t.error is not None for t in trajectories])
        batch = Batch.from_trajectories(trajectories, self.policy.pad_id)
        batch.loss_mask = batch.loss_mask * (~failed).unsqueeze(-1)
        batch.advantages = per_traj.unsqueeze(-1) * batch.loss_mask
        total_tokens = float(batch.loss_mask.sum().clamp(min=1))
        self.optimizer.zero_grad(set_to_none=True)
        rows_by_role = self._rows_by_role(trajectories)
        loss_total = 0.0
        self.policy.model.train()
        for role, rows in rows_by_role.items():
            if role is not None:
                self.policy.model.set_adapter(adapter_name(role))
            for s in range(0, len(rows), cfg.train.microbatch_size):
                micro = batch.select(torch.tensor(rows[s : s + cfg.train.microbatch_size]))
                outputs = self.policy.forward(micro.input_ids, micro.attention_mask, micro.loss_mask,
                                              micro.prompt_lengths)
                loss = self.algorithm.loss(outputs, micro, Normaliser(total_tokens, float(len(batch)))).loss
                loss.backward()
                loss_total += loss.item()
        self.policy.model.eval()  # generation and evaluation run in eval mode
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, cfg.train.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        return {"policy_loss": loss_total, "grad_norm": float(grad_norm), "advantage_abs_mean": float(per_traj.abs().mean()),
                "trained_trajectories": float(len(trajectories))}

    def _rows_by_role(self, trajectories: list[Trajectory]) -> dict[str | None, list[int]]:
        """Batch rows per adapter: per role with per-role adapters, else all rows together."""
        if self.cfg.multi_agent.policies == "shared":
            return {None: list(range(len(trajectories)))}
        rows: dict[str | None, list[int]] = {}
        for i, t in enumerate(trajectories):
            rows.setdefault(t.metadata["role"], []).append(i)
        return rows

    # ----------------------------------------------------------------- evaluation

    def evaluate(self) -> dict[str, float]:
        """Held-out seeds against each evaluation opponent, the policy in each role in turn."""
        cfg = self.cfg
        params = SamplingParams(temperature=cfg.eval.temperature, max_new_tokens=cfg.eval.max_new_tokens,
                                stop=tuple(cfg.rollout.stop))
        tasks = self.eval_tasks
        learner_names = {p.name for p in self.learners.values()}
        metrics: dict[str, float] = {}
        opponents = cfg.multi_agent.eval_opponents
        for done, opponent in enumerate(opponents, 1):
            with self.ctx.evaluation_sampling(self.step):
                if opponent == "self":
                    games = self.play(tasks, [dict(self.learners) for _ in tasks], params)
                else:
                    lineups = [{r: (self.learners[r] if r == seat else FixedPlayer(opponent)) for r in self.roles}
                               for seat in self.roles for _ in tasks]
                    games = self.play([t for _ in self.roles for t in tasks], lineups, params)
            metrics.update({f"{opponent}/{k}": v for k, v in game_metrics(games, learner_names).items()})
            self.progress("eval", done, len(opponents), {})
        self.ctx.log("eval", self.step, metrics)
        return metrics


def evaluate_checkpoint(cfg: RunConfig, checkpoint: str | None, progress: ProgressHook | None = None
                        ) -> dict[str, float]:
    """``posttrain eval`` of a multi-agent config: the held-out games against each of
    ``multi_agent.eval_opponents`` in each role, played by ``checkpoint``'s policy (``model.name``'s without
    one). Games are dealt from the seed and the step, so a checkpoint directory named ``step-N`` (or its
    ``model/``) plays the games the run's evaluation at step N played, and gives the results it logged."""
    trainer = SelfPlayTrainer(cfg, progress)
    try:
        if checkpoint is not None:
            path = Path(checkpoint)
            trainer.load_policy(path)
            step = re.fullmatch(r"step-(\d+)", (path.parent if path.name == "model" else path).name)
            trainer.step = int(step.group(1)) if step else 0
        return trainer.evaluate()
    finally:
        trainer.ctx.close()


def _check_multi_agent(cfg: RunConfig) -> list[str]:
    """The env's roles, after checking that the multi_agent section fits the env; ConfigError if not."""
    ma, env = cfg.multi_agent, make_env(cfg.env.id, cfg.env.kwargs)
    if not is_multi_agent(env):
        raise EnvError(f"env {cfg.env.id!r} is single-agent: the multi-agent trainer needs a PettingZoo env")
    roles = list(env.possible_agents)
    unknown = sorted(set(ma.train_roles) - set(roles))
    if unknown:
        raise ConfigError(f"multi_agent.train_roles: {unknown} are not roles of {cfg.env.id} ({roles})")
    fixed = {ma.opponent, *ma.eval_opponents} & {"random", "scripted"}
    if fixed and not getattr(env.unwrapped, "fixed_players", False):
        raise ConfigError(f"{cfg.env.id} has no random or scripted player (asked for {sorted(fixed)}): use "
                          "multi_agent.opponent=self and multi_agent.eval_opponents=[self]")
    if cfg.rollout.backend != "hf":
        raise ConfigError("self-play generates with rollout.backend=hf (it switches LoRA adapters per seat); "
                          f"got rollout.backend={cfg.rollout.backend}")
    if ma.policies == "per_role" and not cfg.model.lora.enabled:
        raise ConfigError("multi_agent.policies=per_role needs model.lora.enabled=true (one adapter per role)")
    env.close()
    return roles
