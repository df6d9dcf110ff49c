"""Scale-out figures: env workers (Ray actors), asynchronous rollouts, data-parallel processes.

Three parts, medians reported:

- ``env``: episodes/s of ``run_episodes`` with 0 (in process), 1, 2 and 4 env workers, on an env whose
  step waits on I/O (``io_envs.SleepEnv``, 0.2 s) and one whose step spins Python for 0.05 s
  (``io_envs.BusyEnv``), and on the code sandbox (``code``: each answer runs against its task's unit
  tests in bubblewrap); generation is left out (every answer is one fixed token), so the figure is the
  envs' own throughput;
- ``async``: step time of ``posttrain train`` synchronous vs ``train.async_steps: 1`` (``--model``,
  the default model by default), first step excluded;
- ``dp``: step time of one process (``train.threads`` = all cores) vs two data-parallel processes
  under torchrun (one thread each), same global batch.

    python benchmarks/scale.py [--part env,async,dp] [--steps 6] [--model smollm2-135m-instruct]
                               [--out benchmarks/results/scale.json]

Wall times depend on what else runs on the machine: the load average is printed with the table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from machine import console, describe, write_json  # benchmarks/machine.py: the CPU model and flags beside every table
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent
DEMO = ROOT / "examples" / "arithmetic_grpo.yaml"


class FixedAnswer:
    """A generation backend that answers every prompt with one EOS token at once: env time only."""

    def __init__(self, eos_id: int):
        self.eos_id = eos_id

    def generate(self, prompts, params, num_samples=1):
        from posttrain.rollout import Generation

        return [Generation([self.eos_id], [0.0], "stop") for _ in range(len(prompts) * num_samples)]


# The env part's environments: a step that waits (sleeps), one that holds the GIL, and the real code
# sandbox (each answer, empty, is run against the task's unit tests in a bubblewrap sandbox).
ENVS = (("io_envs:SleepEnv", {"delay": 0.2}), ("io_envs:BusyEnv", {"delay": 0.05}), ("code", {}))


def env_throughput(env_id: str, workers: int, repeats: int, kwargs: dict) -> float:
    """Median episodes/s over ``repeats`` batches of 16 single-turn episodes (4 tasks x 4 samples),
    generation excluded (a fixed one-token answer), so that the figure is the envs' own."""
    from posttrain.envs import make_env
    from posttrain.models import load_tokenizer
    from posttrain.rollout import EnvPool, SamplingParams, run_episodes
    from posttrain.rollout.env_workers import RayEnvPool

    pool = (RayEnvPool(env_id, kwargs, workers, timeout=60.0) if workers else
            EnvPool(lambda: make_env(env_id, kwargs)))
    tokenizer = load_tokenizer("tiny-random")
    backend = FixedAnswer(tokenizer.eos_token_id)
    tasks = pool.tasks("train")[:4]
    params = SamplingParams(max_new_tokens=4)
    run_episodes(pool, backend, tokenizer, tasks, params, 4)  # warm: every env instance built
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = run_episodes(pool, backend, tokenizer, tasks, params, 4)
        rates.append(len(out) / (time.perf_counter() - start))
        assert not any(t.error for t in out), [t.error for t in out if t.error][:1]
    pool.close()
    return statistics.median(rates)


def env_part(repeats: int) -> list[dict]:
    import ray

    sys.path.insert(0, str(BENCH))  # io_envs, for the workers too
    from posttrain.rollout.ray_runtime import LOCAL_SYSTEM_CONFIG

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _system_config=LOCAL_SYSTEM_CONFIG)
    rows = []
    try:
        for env_id, kwargs in ENVS:
            for workers in (0, 1, 2, 4):
                rate = env_throughput(env_id, workers, repeats, kwargs)
                rows.append({"part": "env", "env": env_id.split(":")[-1], "workers": workers, "episodes_per_s": rate})
                print(rows[-1], flush=True)
    finally:
        ray.shutdown()
    return rows


def step_seconds(run_dir: Path) -> list[float]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [x["step_seconds"] for x in lines if x["split"] == "train"][1:]  # the first step warms up


def train_run(run_dir: Path, model: str, steps: int, overrides: list[str], launcher: list[str]) -> float:
    cmd = [*launcher, "-m", "posttrain.cli", "train", str(DEMO), "--set", f"model.name={model}",
           "--set", f"train.steps={steps}", "--set", f"output_dir={run_dir}", "--set", "eval.before_training=false",
           "--set", "eval.num_tasks=2", "--set", "eval.every=0",
           # the demo's earlier recipe (2 tasks x 8, no overlong penalty), with which the README's step times
           # were measured
           "--set", "train.tasks_per_step=2", "--set", "train.microbatch_size=16",
           "--set", "algorithm.overlong_buffer=0",
           *[a for o in overrides for a in ("--set", o)]]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
    return statistics.median(step_seconds(run_dir))


def async_part(model: str, steps: int, scratch: Path) -> list[dict]:
    rows = []
    for k in (0, 1):
        s = train_run(scratch / f"async{k}", model, steps, [f"train.async_steps={k}"], [sys.executable])
        rows.append({"part": "async", "model": model, "async_steps": k, "step_seconds": s})
        print(rows[-1], flush=True)
    return rows


def dp_part(model: str, steps: int, scratch: Path) -> list[dict]:
    cores = os.cpu_count() or 2
    one = train_run(scratch / "dp1", model, steps, [f"train.threads={cores}"], [sys.executable])
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    two = train_run(scratch / "dp2", model, steps, [f"train.threads={max(1, cores // 2)}"], torchrun)
    rows = [{"part": "dp", "model": model, "processes": 1, "step_seconds": one},
            {"part": "dp", "model": model, "processes": 2, "step_seconds": two}]
    print(rows, flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--part", default="env,async,dp")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--out", default=str(BENCH / "results" / "scale.json"))
    args = ap.parse_args()
    parts = args.part.split(",")
    scratch = Path("/tmp") / f"posttrain-scale-{os.getpid()}"
    rows = []
    if "env" in parts:
        rows += env_part(args.repeats)
    if "async" in parts:
        rows += async_part(args.model, args.steps, scratch)
    if "dp" in parts:
        rows += dp_part(args.model, args.steps, scratch)
    screen = console()
    table = Table(title="scale-out (medians)")
    for col in ("part", "setting", "figure"):
        table.add_column(col)
    for r in rows:
        if r["part"] == "env":
            table.add_row("env workers", f"{r['env']}, {r['workers']} workers", f"{r['episodes_per_s']:.1f} episodes/s")
        elif r["part"] == "async":
            table.add_row("rollouts", f"{r['model']}, async_steps {r['async_steps']}", f"{r['step_seconds']:.2f} s/step")
        else:
            table.add_row("data parallel", f"{r['model']}, {r['processes']} process(es)", f"{r['step_seconds']:.2f} s/step")
    screen.print(table)
    machine = describe()
    screen.print(machine)
    write_json(args.out, {"machine": machine, "rows": rows})


if __name__ == "__main__":
    main()
