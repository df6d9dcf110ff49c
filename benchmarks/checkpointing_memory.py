"""Peak memory of a GRPO step on the default model, with and without gradient checkpointing.

Each configuration runs in a fresh process (peak RSS is per process): the trainer is built, one
step is taken from the base model, and ru_maxrss is read. Prints a table and writes JSON to
benchmarks/results/checkpointing_memory.json.

    python benchmarks/checkpointing_memory.py [--steps 2] [--model smollm2-135m-instruct]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

from machine import describe, write_json  # benchmarks/machine.py: the CPU model and flags beside every table

ROOT = Path(__file__).resolve().parents[1]


def one_run(model: str, checkpointing: bool, steps: int) -> dict:
    from posttrain.config import load_config
    from posttrain.train import Trainer

    cfg = load_config(ROOT / "examples" / "arithmetic_grpo.yaml", [
        f"model.name={model}", f"model.gradient_checkpointing={checkpointing}", "output_dir=/tmp/ckpt-memory",
        # rewards must vary within groups, or the update (where activations live) is skipped
        "algorithm.beta=0", "algorithm.overlong_buffer=0", "train.tasks_per_step=4", "train.microbatch_size=16",
        "rollout.max_new_tokens=64"])
    trainer = Trainer(cfg)
    start = time.time()
    trained = 0
    for _ in range(steps):
        metrics = trainer.train_step()
        trained += int(metrics["optimizer_steps"])
    return {"gradient_checkpointing": checkpointing, "steps": steps, "optimizer_steps": trained,
            "seconds_per_step": (time.time() - start) / steps,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    print(describe(), flush=True)
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--child", choices=["on", "off"])
    args = parser.parse_args()
    if args.child:
        print(json.dumps(one_run(args.model, args.child == "on", args.steps)))
        return
    rows = []
    for mode in ("off", "on"):
        out = subprocess.run([sys.executable, __file__, "--child", mode, "--model", args.model,
                              "--steps", str(args.steps)], capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print("| gradient checkpointing | optimizer steps | s/step | peak RSS (MB) |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {'on' if r['gradient_checkpointing'] else 'off'} | {r['optimizer_steps']} | "
              f"{r['seconds_per_step']:.2f} | {r['peak_rss_mb']:.0f} |")
    write_json(ROOT / "benchmarks" / "results" / "checkpointing_memory.json", rows)


if __name__ == "__main__":
    main()
