"""Command line: ``posttrain train|eval|collect|dpo|sft|rm|prm|report|envs|config|sandbox``.

User mistakes (a bad config, a missing file, an unknown environment or model) print one line
naming what is wrong and exit with code 2, without a traceback.
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from typer.core import TyperCommand

from posttrain.config import ConfigError, load_config

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Reinforcement-learning post-training of LLM agents.")
console = Console(stderr=True)

SET_HELP = "Override a config field, e.g. --set train.steps=10 (repeatable)."
RESUME_HELP = ("Continue the run in this directory from its newest complete checkpoint, exactly (the config must "
               "match the run's).")
OVERWRITE_HELP = ("Replace the previous run in output_dir: its metrics, events, samples and summary go; its "
                  "checkpoints stay until this run writes the same step. Without it a used output_dir is refused.")
FIT_RESUME_HELP = ("Continue the run whose output_dir this is (its <model>-logs hold the checkpoints) from where it "
                   "stopped, exactly (the config must match the run's).")
FIT_OVERWRITE_HELP = ("Replace the previous run's logs (<model>-logs: metrics, labels); its checkpoints stay until "
                      "this run writes the same step. Without it a used logs directory is refused.")


class ConfigCommand(TyperCommand):
    """A command that reads a run config and takes ``--set`` overrides. A stray ``field=value`` argument (the
    form Hydra-based trainers take overrides in) or a dotted option ``--field value`` (as argparse-style CLIs
    spell nested settings) is refused with the ``--set`` that would set it, not click's bare "unexpected extra
    argument" or "no such option"."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        for i, arg in enumerate(args):
            name, eq, value = arg.removeprefix("--").partition("=")
            if arg.startswith("--") and "." in name:  # none of our options has a dot in its name
                if not eq and i + 1 < len(args) and not args[i + 1].startswith("-"):
                    value = args[i + 1]
                ctx.fail(f"no such option --{name}; {_set_hint([name + '=' + (value or 'VALUE')])}")
        ctx.allow_extra_args = True  # collect the strays here instead of click failing on them unexplained
        stray = super().parse_args(ctx, args)
        if stray:
            fields = [a for a in stray if "=" in a]
            ctx.fail(f"unexpected argument{'s' if len(stray) > 1 else ''} {' '.join(stray)}"
                     + (f"; {_set_hint(fields)}" if fields else ""))
        return stray


def _set_hint(settings: list[str]) -> str:
    """How ``settings`` (``field=value``) are given here."""
    return "a config field is set with --set, as in: " + " ".join(f"--set {s}" for s in settings)


def _quiet_libraries() -> None:
    """Keep the terminal for our own progress: no per-file bars from transformers."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


@contextmanager
def _user_errors():
    """Turn what a user or the machine did wrong into one line and exit code 2 (130 on Ctrl-C).

    The named errors carry their own message; any other OSError (a read-only or full disk, a
    directory where a file was expected, permissions) is reported with its file and reason.
    """
    from posttrain.data.store import DataError
    from posttrain.envs.registry import EnvError
    from posttrain.models.loading import ModelLoadError
    from posttrain.rollout.episodes import EpisodesFailed
    from posttrain.rollout.ray_runtime import RayUnavailable
    from posttrain.sandbox import SandboxUnavailable
    from posttrain.train.checkpoint import CheckpointError
    from posttrain.train.run_dir import RunDirError
    from posttrain.train.stopping import TrainingStopped

    _quiet_libraries()
    try:
        yield
    except (ConfigError, EnvError, ModelLoadError, SandboxUnavailable, DataError, RunDirError, CheckpointError,
            EpisodesFailed, RayUnavailable) as e:
        _error_line(str(e))
        raise typer.Exit(2) from None
    except TrainingStopped as e:  # a signal (saved; 128 + its number) or a failure after saving (2)
        if e.exit_code == 2:
            _error_line(str(e))
        else:
            console.print(f"stopped: {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(e.exit_code) from None
    except OSError as e:
        _error_line(f"{e.filename}: {e.strerror}" if e.filename and e.strerror else str(e))
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        _error_line("interrupted")
        raise typer.Exit(130) from None


def _error_line(message: str) -> None:
    """``error: message`` on one line of stderr, whatever newlines the message held."""
    text = " ".join(line.strip() for line in message.splitlines() if line.strip())
    console.print(f"[bold red]error:[/] {escape(text)}", highlight=False, soft_wrap=True, markup=True)


def _progress() -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
        console=console, disable=not _is_rank_zero(),
    )


def _is_rank_zero() -> bool:
    """Under torchrun only rank 0 reports (every rank trains)."""
    return os.environ.get("RANK", "0") == "0"


def _single_agent(cfg, command: str) -> None:
    """Commands that play one agent's episodes refuse a multi-agent env at once, before the model loads."""
    from posttrain.envs import EnvError, env_is_multi_agent

    if env_is_multi_agent(cfg.env.id, cfg.env.kwargs):
        raise EnvError(f"`posttrain {command}` plays single-agent episodes and {cfg.env.id!r} is a multi-agent env: "
                       "`posttrain train` trains on its games and `posttrain eval` plays them against "
                       "multi_agent.eval_opponents")


@app.command(cls=ConfigCommand)
def train(
    config: str = typer.Argument(..., help="YAML run config."),
    overrides: list[str] = typer.Option([], "--set", help=SET_HELP),
    resume: Optional[str] = typer.Option(None, "--resume", help=RESUME_HELP),
    overwrite: bool = typer.Option(False, "--overwrite", help=OVERWRITE_HELP),
) -> None:
    """Train a policy with online RL, evaluating on the held-out split before and after.

    A multi-agent env trains with the self-play trainer (see the multi_agent config section).
    """
    with _user_errors():
        cfg = load_config(config, overrides)
        from posttrain.envs import env_is_multi_agent
        from posttrain.train.run_dir import open_run_dir

        _check_resume_dir(resume)
        if env_is_multi_agent(cfg.env.id, cfg.env.kwargs):
            from posttrain.train.selfplay import SelfPlayTrainer as trainer_class
            reward_key = "reward"
        else:
            from posttrain.train import Trainer as trainer_class
            reward_key = "reward_mean"
        # Under torchrun rank 0 alone holds and writes the run directory.
        run_dir = (open_run_dir(resume or cfg.output_dir, overwrite=overwrite, resume=resume is not None)
                   if _is_rank_zero() else nullcontext())
        with run_dir, _progress() as progress:
            hook = _progress_hook(progress, lambda info: f"reward {info[reward_key]:.2f}  "
                                                         f"{info['step_seconds']:.1f}s/step")
            result = trainer_class(cfg, progress=hook, resume=resume).train()
    title = f"posttrain: {cfg.model.name} on {cfg.env.id}"
    if not _is_rank_zero():
        return
    if reward_key == "reward":
        _print_games_result(title, result)
    else:
        _print_result(title, result)


def _check_resume_dir(resume: str | None) -> None:
    if resume is not None and not Path(resume).is_dir():
        raise ConfigError(f"--resume {resume}: no such run directory")


def _progress_hook(progress, train_text):
    """A trainer progress hook drawing one bar per phase; ``train_text(info)`` labels train steps."""
    bars: dict[str, int] = {}

    def hook(phase: str, done: int, total: int, info: dict) -> None:
        if phase not in bars:
            bars[phase] = progress.add_task(phase, total=total, info="")
        if phase == "eval" and done <= total and progress.tasks[bars[phase]].completed >= total:
            progress.reset(bars[phase], total=total)
        text = train_text(info) if phase == "train" and info else ""
        progress.update(bars[phase], completed=done, info=text)
        if phase == "eval" and info:
            progress.console.print(f"step {info['step']}: held-out accuracy {info['accuracy']:.1%}, "
                                   f"mean reward {info['reward_mean']:.3f}")

    return hook


def _result_table(title: str, result) -> Table:
    """An empty table titled with the run and its length, at least as wide as that title: rich wraps a title at
    the table's width, and a two-column table would break it across lines."""
    heading = f"{title}, {result.steps} steps in {result.seconds / 60:.1f} min"
    return Table(title=heading, min_width=len(heading))


def _print_result(title: str, result) -> None:
    """Held-out accuracy before and after a training run, and where the run lives."""
    table = _result_table(title, result)
    table.add_column("held-out")
    table.add_column("accuracy", justify="right")
    table.add_column("mean reward", justify="right")
    for name, r in (("before", result.before), ("after", result.after)):
        if r is not None:
            table.add_row(name, f"{r.accuracy:.1%}", f"{r.reward_mean:.3f}")
    Console().print(table)
    Console().print(f"run directory: {result.run_dir}")


def _print_games_result(title: str, result) -> None:
    """Held-out games against each evaluation opponent before and after a multi-agent run."""
    table = _games_table(_result_table(title, result), {"before": result.before, "after": result.after})
    Console().print(table)
    Console().print(f"run directory: {result.run_dir}")


def _games_table(table: Table, results: dict[str, dict[str, float] | None]) -> Table:
    """``table`` with a row per held-out result (``results``: its label -> game metrics) and opponent."""
    for column in ("held-out", "opponent", "win", "draw", "loss", "payoff", "invalid moves"):
        table.add_column(column, justify="left" if column in ("held-out", "opponent") else "right")
    for name, metrics in results.items():
        for opponent in sorted({k.split("/")[0] for k in metrics or {}}):
            m = {k.split("/", 1)[1]: v for k, v in metrics.items() if k.startswith(opponent + "/")}
            rate = lambda key: f"{m[key]:.0%}" if key in m else "-"  # noqa: E731
            table.add_row(name, opponent, rate("win"), rate("draw"), rate("loss"), f"{m['payoff']:.3f}",
                          f"{m['invalid_rate']:.0%}")
    return table


@app.command("eval", cls=ConfigCommand)
def eval_cmd(
    config: str = typer.Argument(..., help="YAML run config (its model, env and eval sections are used)."),
    checkpoint: Optional[str] = typer.Option(None, "--checkpoint", help="Checkpoint or model directory to evaluate."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    overrides: list[str] = typer.Option([], "--set", help=SET_HELP),
) -> None:
    """Evaluate a policy on the environment's held-out split.

    A multi-agent env's held-out games are played against each of multi_agent.eval_opponents in each role.
    """
    with _user_errors():
        cfg = load_config(config, overrides)
        from posttrain.envs import EnvError, env_is_multi_agent

        if env_is_multi_agent(cfg.env.id, cfg.env.kwargs):
            _eval_games(cfg, checkpoint, as_json)
            return
        from posttrain.train.context import RunContext

        with RunContext(cfg, checkpoint=checkpoint, generation_batch=cfg.eval.batch_size) as ctx:
            tasks = ctx.tasks("eval")
            if not tasks:
                raise EnvError(f"env {cfg.env.id!r} has no held-out tasks (its tasks('eval') is empty)")
            with _progress() as progress:
                bar = progress.add_task("eval", total=len(tasks), info="")
                result = ctx.evaluate(0, tasks, lambda n: progress.advance(bar, n))
            result.raise_if_all_failed(f"of {checkpoint or cfg.model.name}")
    if as_json:
        sys.stdout.write(json.dumps({"checkpoint": checkpoint, "model": cfg.model.name, "env": cfg.env.id,
                                     "samples_per_task": cfg.eval.samples_per_task, **result.to_json()}) + "\n")
    else:
        _print_eval(result, cfg.eval.samples_per_task)


def _eval_games(cfg, checkpoint: str | None, as_json: bool) -> None:
    from posttrain.train.selfplay import evaluate_checkpoint

    if checkpoint is not None and not Path(checkpoint).is_dir():
        raise ConfigError(f"--checkpoint {checkpoint}: no such directory (expected a checkpoint directory of a "
                          "run, or its model/)")
    with _progress() as progress:
        metrics = evaluate_checkpoint(cfg, checkpoint, _progress_hook(progress, lambda info: ""))
    if as_json:
        sys.stdout.write(json.dumps({"checkpoint": checkpoint, "model": cfg.model.name, "env": cfg.env.id,
                                     **metrics}) + "\n")
        return
    Console().print(_games_table(Table(title=f"held-out games: {cfg.env.id}, {checkpoint or cfg.model.name}"),
                                 {"policy": metrics}))


def _print_eval(result, samples_per_task: int) -> None:
    """The held-out result as a table: every difficulty level, then all tasks together."""
    ks = list(result.pass_at)
    table = Table(title=f"held-out: {result.num_tasks} tasks x {samples_per_task} samples (means per episode)")
    for name in ("level", "tasks", "success", *(f"pass@{k}" for k in ks), "reward", "turns", "tokens", "errors"):
        table.add_column(name, justify="left" if name == "level" else "right", no_wrap=True)
    rows = list(result.per_difficulty.items()) if len(result.per_difficulty) > 1 else []
    for level, s in [*rows, ("all", result.overall)]:
        table.add_row(level, str(s.num_tasks), f"{s.accuracy:.1%}", *(f"{s.pass_at.get(k, 0.0):.1%}" for k in ks),
                      f"{s.reward_mean:.3f}", f"{s.turns_mean:.2f}", f"{s.tokens_mean:.1f}", str(s.errors))
    Console().print(table)


@app.command(cls=ConfigCommand)
def collect(
    config: str = typer.Argument(..., help="YAML run config (its model, env and rollout sections are used)."),
    out: str = typer.Option(..., "--out", help="Trajectory store directory to append to."),
    n: int = typer.Option(..., "--n", min=1, help="Trajectories sampled per task."),
    tasks: Optional[int] = typer.Option(None, "--tasks", min=1, help="Collect on the first N training tasks "
                                        "(default: all)."),
    checkpoint: Optional[str] = typer.Option(None, "--checkpoint", help="Checkpoint or model directory to sample "
                                             "with instead of model.name."),
    overrides: list[str] = typer.Option([], "--set", help=SET_HELP),
) -> None:
    """Sample N trajectories per training task and append them to a trajectory store."""
    with _user_errors():
        cfg = load_config(config, overrides)
        _single_agent(cfg, "collect")
        from posttrain.data.collect import collect as run_collect
        from posttrain.rollout.episodes import EpisodesFailed

        def acknowledge(written: int, total: int, part) -> None:
            # One line per durable part: what an interrupted collection is guaranteed to keep.
            sys.stdout.write(f"appended {written}/{total} {part.name}\n")
            sys.stdout.flush()

        result = run_collect(cfg, out, n, tasks, checkpoint, acknowledge)
        if result.errors == result.trajectories:
            raise EpisodesFailed(f"every episode of the collection failed ({result.errors} of {result.trajectories}; "
                                 f"kept in {out} with their errors, run {result.run_id}): the first: "
                                 f"{result.first_error}")
    Console().print(f"collected {result.trajectories} trajectories ({result.successes / result.trajectories:.1%} "
                    f"successful, {result.errors} errors) in {result.seconds / 60:.1f} min into {out} "
                    f"(run {result.run_id})")


@app.command(cls=ConfigCommand)
def demonstrate(
    config: str = typer.Argument(..., help="YAML run config of a web env (miniwob, web_shop): its env section and "
                                 "rollout.max_turns are used."),
    out: str = typer.Option(..., "--out", help="JSONL file to write (sft.demonstrations reads it)."),
    tasks: int = typer.Option(..., "--tasks", min=1, help="Play the first N training tasks."),
    overrides: list[str] = typer.Option([], "--set", help=SET_HELP),
) -> None:
    """Write the scripted experts' solved training episodes as chat demonstrations, one record per turn."""
    with _user_errors():
        cfg = load_config(config, overrides)
        from posttrain.envs import make_env
        from posttrain.envs.web.demonstrations import write_demonstrations

        env = make_env(cfg.env.id, cfg.env.kwargs)
        try:
            result = write_demonstrations(env, list(env.tasks("train"))[:tasks], out, cfg.rollout.max_turns)
        finally:
            env.close()
    unsolved = f" (not solved: {', '.join(result.unsolved[:5])}{' ...' if len(result.unsolved) > 5 else ''})" \
        if result.unsolved else ""
    Console().print(f"wrote {result.records} demonstrations from {result.solved} of {result.episodes} expert "
                    f"episodes to {out}{unsolved}", highlight=False, soft_wrap=True)


def _offline(config: str, overrides: list[str], methods: tuple[str, ...], command: str, overwrite: bool,
             resume: str | None) -> None:
    with _user_errors():
        cfg = load_config(config, overrides)
        _check_resume_dir(resume)
        if cfg.offline.method not in methods:
            raise ConfigError(f"{config}: `posttrain {command}` trains offline.method {' or '.join(methods)}, "
                              f"got {cfg.offline.method!r}")
        _single_agent(cfg, command)
        from posttrain.train.offline import OfflineTrainer
        from posttrain.train.run_dir import open_run_dir

        with open_run_dir(resume or cfg.output_dir, overwrite=overwrite, resume=resume is not None), \
                _progress() as progress:
            hook = _progress_hook(progress, lambda info: f"loss {info['loss']:.3f}  {info['step_seconds']:.1f}s/step")
            trainer = OfflineTrainer(cfg, progress=hook, resume=resume)
            for part, reason in trainer.skipped_parts:
                progress.console.print(f"skipped store part {part}: {reason}", highlight=False, soft_wrap=True)
            progress.console.print(f"{cfg.offline.method}: {len(trainer.examples)} training examples")
            result = trainer.train()
    _print_result(f"posttrain {command} ({cfg.offline.method}): {cfg.model.name} on {cfg.env.id}", result)


@app.command(cls=ConfigCommand)
def dpo(
    config: str = typer.Argument(..., help="YAML run config; offline.method is dpo, ipo, cdpo or kto."),
    overrides: list[str] = typer.Option([], "--set", help=SET_HELP),
    resume: Optional[str] = typer.Option(None, "--resume", help=RESUME_HELP),
    overwrite: bool = typer.Option(False, "--overwrite", help=OVERWRITE_HELP),
) -> None:
    """Preference optimisation (DPO, IPO, cDPO, KTO) on a trajectory store's successes and failures."""
    _offline(config, overrides, ("dpo", "ipo", "cdpo", "kto"), "dpo", overwrite, resume)


@app.command(cls=ConfigCommand)
def sft(
    config: str = typer.Argument(..., help="YAML run config; offline.method is rft (store) or sft (demonstrations)."),
    overrides: list[str] = typer.Option([], "--set", help=SET_HELP),
    resume: Optional[str] = typer.Option(None, "--resume", help=RESUME_HELP),
    overwrite: bool = typer.Option(False, "--overwrite", help=OVERWRITE_HELP),
) -> None:
    """Supervised fine-tuning: on a store's successful trajectories (rft) or on demonstrations (sft)."""
    _offline(config, overrides, ("rft", "sft"), "sft", overwrite, resume)


@app.command()
def report(
    run_dir: str = typer.Argument(..., help="Run directory (a training run's output_dir)."),
    out: Optional[str] = typer.Option(None, "--out", help="HTML file to write (default RUN_DIR/report.html)."),
    max_episodes: int = typer.Option(3000, "--max-episodes", min=1, help="Most training episodes in the viewer "
                                     "(whole steps, evenly spaced, are kept)."),
) -> None:
    """Write one self-contained HTML report of a run: curves, evaluations and a trajectory viewer."""
    with _user_errors():
        from posttrain.eval.report import write_report

        path = write_report(run_dir, out, max_train=max_episodes)
    Console().print(f"report: {path} ({path.stat().st_size / 1e6:.1f} MB)")


@app.command()
def envs() -> None:
    """List the registered environments, one line each."""
    from posttrain.envs import registered

    specs = registered()
    width = max(len(s.id) for s in specs)
    for spec in specs:
        kind = "multi-agent " if spec.multi_agent else "single-agent"
        sys.stdout.write(f"{spec.id:<{width}}  {kind}  {spec.description}\n")


@app.command("config")
def config_reference() -> None:
    """Print every config field with its default and meaning (Markdown)."""
    from posttrain.config import reference_markdown

    sys.stdout.write(reference_markdown() + "\n")


rm_app = typer.Typer(no_args_is_help=True, help="Outcome reward models (Bradley-Terry on preference pairs).")
app.add_typer(rm_app, name="rm")
prm_app = typer.Typer(no_args_is_help=True, help="Process reward models (step labels from Monte Carlo rollouts).")
app.add_typer(prm_app, name="prm")


@rm_app.command("train", cls=ConfigCommand)
def rm_train(
    config: str = typer.Argument(..., help="YAML run config; its reward_model section says what to train on."),
    overrides: list[str] = typer.Option([], "--set", help=SET_HELP),
    resume: Optional[str] = typer.Option(None, "--resume", help=FIT_RESUME_HELP),
    overwrite: bool = typer.Option(False, "--overwrite", help=FIT_OVERWRITE_HELP),
) -> None:
    """Train a Bradley-Terry reward model on a trajectory store's pairs; report held-out pairwise accuracy."""
    with _user_errors():
        cfg = load_config(config, overrides)
        _check_resume_dir(resume)
        from posttrain.rewards.rm_train import train_reward_model

        with _progress() as progress:
            hook = _progress_hook(progress, lambda info: f"loss {info['loss']:.3f}  acc {info['accuracy']:.2f}")
            result = train_reward_model(cfg, progress=hook, resume=resume, overwrite=overwrite)
    Console().print(f"reward model: {result.train_pairs} training pairs, held-out pairwise accuracy "
                    f"{result.accuracy_before:.1%} -> {result.accuracy_after:.1%} on {result.eval_pairs} pairs "
                    f"({result.seconds / 60:.1f} min); saved to {result.output}")


@prm_app.command("train", cls=ConfigCommand)
def prm_train(
    config: str = typer.Argument(..., help="YAML run config; its prm section says how to label and train."),
    overrides: list[str] = typer.Option([], "--set", help=SET_HELP),
    resume: Optional[str] = typer.Option(None, "--resume", help=FIT_RESUME_HELP),
    overwrite: bool = typer.Option(False, "--overwrite", help=FIT_OVERWRITE_HELP),
) -> None:
    """Label sampled solutions step by step, train a process reward model, report held-out step AUC."""
    with _user_errors():
        cfg = load_config(config, overrides)
        _check_resume_dir(resume)
        from posttrain.rewards.prm_train import train_prm

        with _progress() as progress:
            hook = _progress_hook(progress, lambda info: f"loss {info['loss']:.3f}")
            result = train_prm(cfg, progress=hook, resume=resume, overwrite=overwrite)
    Console().print(f"process reward model: {result.train_solutions} solutions, {result.train_steps} labelled steps "
                    f"({result.train_success:.1%} solved); held-out step AUC {result.auc_before:.3f} -> "
                    f"{result.auc_after:.3f} on {result.eval_steps} steps (labels' own AUC {result.label_auc:.3f}); "
                    f"{result.seconds / 60:.1f} min; saved to {result.output}")


sandbox_app = typer.Typer(no_args_is_help=True, help="Run untrusted Python in the sandbox.")
app.add_typer(sandbox_app, name="sandbox")


@sandbox_app.command("exec")
def sandbox_exec(
    file: str = typer.Argument(..., help="Python file to run."),
    timeout: float = typer.Option(10.0, "--timeout", help="Wall-clock limit in seconds (CPU time too)."),
    memory: int = typer.Option(512, "--memory", help="Address-space limit in MB."),
    backend: str = typer.Option("bwrap", "--backend", help="bwrap, or rlimit (isolates much less; warns)."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Run FILE.py in the sandbox and print its result; exit 0 only if its status is ok."""
    with _user_errors():
        from posttrain.sandbox import Limits, Sandbox

        path = Path(file)
        if not path.is_file():
            raise FileNotFoundError(f"{file}: no such file")
        if timeout <= 0 or memory <= 0 or backend not in ("bwrap", "rlimit"):
            raise ConfigError("--timeout and --memory must be positive and --backend bwrap or rlimit")
        with Sandbox(workers=1, backend=backend) as sandbox:
            result = sandbox.run(path.read_text(errors="replace"), Limits(timeout=timeout, memory_mb=memory))
    if as_json:
        sys.stdout.write(json.dumps(result.to_dict()) + "\n")
    else:
        sys.stdout.write(result.stdout)
        sys.stderr.write(result.stderr)
        console.print(f"status {result.status}, exit code {result.exit_code}, {result.duration:.3f} s"
                      + (f" ({result.message})" if result.message else ""), highlight=False)
    raise typer.Exit(0 if result.ok else 1)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
