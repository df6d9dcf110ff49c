"""Train the default model on the arithmetic env with each algorithm at the same sampling budget.

Prints a table of held-out accuracy (greedy) and wall time per algorithm and writes it as JSON.
Every run starts from the same base model and the same seed and draws the same tasks; each
step samples tasks_per_step x group_size completions, so equal steps mean an equal budget
(except DAPO's dynamic sampling, which samples more to replace zero-variance groups: the
`samples` column counts what each run actually drew).

    python benchmarks/algorithms.py [--steps 40] [--algorithms grpo,ppo] [--out benchmarks/results/algorithms.json]

Run it alone: other processes on a 2-core machine distort the wall times.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from machine import console, describe  # benchmarks/machine.py: the CPU model and flags beside every table
from rich.table import Table

from posttrain.config import ALGORITHM_PRESETS, load_config
from posttrain.train import Trainer

ROOT = Path(__file__).resolve().parents[1]
ALGORITHMS = ["grpo", "dr_grpo", "dapo", "rloo", "reinforce_pp", "ppo"]


def table_recipe(name: str) -> list[str]:
    """Overrides of the demo's config with which the README's algorithm table was measured for ``name``
    (also benchmarks/reproduce.py's algorithm claims): the demo's earlier batch, rate, rollout and held-out
    set (2 tasks x 8, lr 1e-5, 48 tokens, float32 decoding, 100 held-out problems), and the algorithm's own
    overlong penalty (dapo's preset; none for the others) rather than the demo's."""
    return ["env.kwargs={difficulty: 1, num_eval: 100}", "eval.num_tasks=100",
            "train.tasks_per_step=2", "train.microbatch_size=16", "train.learning_rate=1e-5",
            "rollout.max_new_tokens=48", "rollout.decode_dtype=float32",
            f"algorithm.overlong_buffer={ALGORITHM_PRESETS[name].get('overlong_buffer', 0)}"]


def run(name: str, steps: int, out_dir: Path, evaluate_before: bool) -> dict:
    cfg = load_config(ROOT / "examples" / "arithmetic_grpo.yaml", [
        f"algorithm.name={name}", f"train.steps={steps}", "eval.every=0", *table_recipe(name),
        f"eval.before_training={str(evaluate_before).lower()}", f"output_dir={out_dir / name}",
    ])
    torch.manual_seed(cfg.seed)
    samples = 0

    def count(phase: str, done: int, total: int, info: dict) -> None:
        nonlocal samples
        if phase == "train":
            samples += int(info["samples"])

    trainer = Trainer(cfg, progress=count)
    start = time.time()
    result = trainer.train()
    return {
        "algorithm": name,
        "steps": steps,
        "samples": samples,
        "before": result.before.accuracy if result.before else None,
        "after": result.after.accuracy,
        "seconds": time.time() - start,
    }


def main() -> None:
    print(describe(), flush=True)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--algorithms", default=",".join(ALGORITHMS))
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "algorithms.json"))
    args = parser.parse_args()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, name in enumerate(args.algorithms.split(",")):
        rows.append(run(name, args.steps, out.parent / "runs", evaluate_before=i == 0))
        out.write_text(json.dumps(rows, indent=2))
    base = rows[0]["before"]
    table = Table(title=f"arithmetic difficulty 1, SmolLM2-135M-Instruct, {args.steps} steps x 16 samples, "
                        f"base accuracy {base:.0%}")
    for column in ("algorithm", "samples", "held-out accuracy", "gain (points)", "wall time (min)"):
        table.add_column(column, justify="left" if column == "algorithm" else "right")
    for r in rows:
        table.add_row(r["algorithm"], str(r["samples"]), f"{r['after']:.0%}", f"{100 * (r['after'] - base):+.0f}",
                      f"{r['seconds'] / 60:.1f}")
    console().print(table)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
