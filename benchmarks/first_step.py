"""What the first training step costs beyond a steady one, on the same work.

A run's first step pays once for what later steps reuse: kernel warm-up, the allocator's first
growth, and, in the first process on a machine, the CPU probes that choose kernels (kept per machine
afterwards: posttrain.models.probe_cache). Comparing it with later steps of the same run mixes that
with different work: later completions are longer or shorter, and a step whose groups all scored
alike skips the update. So this script checkpoints a fresh trainer at step 0, times its first step
(cold), restores the checkpoint in the same process and times the very same step again (warm:
exact resume makes it sample the same tokens and apply the same update), several times. The
configuration is benchmarks/grpo_vs_trl.py's posttrain contender. Each warm step allocates the
optimiser state again, as the cold one did, so that cost is not counted as one-time.

    python benchmarks/first_step.py [--configs full-b0,lora-b0] [--repeats 3] [--seed 1]
                                    [--out benchmarks/results/first_step.json]

Run it alone: on a 2-core machine any other process distorts the timings.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from grpo_vs_trl import parse_config, posttrain_config
from machine import console, describe, write_json  # benchmarks/machine.py: the CPU model and flags beside every table

ROOT = Path(__file__).resolve().parents[1]


def measure(config: str, repeats: int, seed: int) -> dict:
    from posttrain.train import Trainer

    lora, beta, bf16 = parse_config(config)
    with tempfile.TemporaryDirectory(prefix="first-step-") as tmp:
        cfg = posttrain_config(lora, beta, bf16, steps=2, out_dir=tmp).model_copy(update={"seed": seed})
        trainer = Trainer(cfg)
        checkpoint = trainer.save()

        def step() -> tuple[float, tuple[float, float]]:
            start = time.perf_counter()
            metrics = trainer.train_step()
            return time.perf_counter() - start, (metrics["completion_tokens"], metrics["optimizer_steps"])

        cold, work = step()
        warm = []
        for _ in range(repeats):
            trainer.restore(checkpoint)
            seconds, again = step()
            if again != work:
                raise SystemExit(f"{config}: the restored step (tokens, updates) was {again}, the first {work}: "
                                 "not the same work")
            warm.append(seconds)
    return {"cold": cold, "warm": statistics.median(warm), "tokens": work[0], "updates": work[1]}


def main() -> None:
    print(describe(), flush=True)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="full-b0,lora-b0")
    parser.add_argument("--repeats", type=int, default=3, help="warm repetitions of the step")
    # Seed 0's first step scores every sample alike and skips the update; seed 1's updates.
    parser.add_argument("--seed", type=int, default=1, help="the run's seed (one whose first step updates)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "first_step.json"))
    args = parser.parse_args()
    from rich.table import Table

    table = Table(title=f"posttrain's first GRPO step, cold and warm on the same work (median of {args.repeats} warm)")
    for col in ("config", "completion tokens", "optimiser steps", "first step s", "same step warm s", "one-time s"):
        table.add_column(col, justify="left" if col == "config" else "right")
    results = {}
    for config in args.configs.split(","):
        parse_config(config)
        r = results[config] = measure(config, args.repeats, args.seed)
        table.add_row(config, f"{r['tokens']:.0f}", f"{r['updates']:.0f}", f"{r['cold']:.2f}", f"{r['warm']:.2f}",
                      f"{r['cold'] - r['warm']:+.2f}")
    console().print(table)
    write_json(args.out, {"repeats": args.repeats, "seed": args.seed, "configs": results})


if __name__ == "__main__":
    main()
