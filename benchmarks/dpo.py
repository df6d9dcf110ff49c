"""Seconds per DPO step: posttrain vs TRL's DPOTrainer on the same pairs, batch size and model, in one run.

The pairs come from a trajectory store (by default the one `examples/arithmetic_dpo.yaml` collects): the
first ``steps x batch`` preference pairs. posttrain trains on their token ids; TRL gets the same pairs as
text (the chat-templated prompt and the decoded answers; TRL tokenizes them and appends EOS, as its docs
ask). Both run the default model in fp32 without gradient checkpointing, full fine-tuning, AdamW, sigmoid
loss, beta 0.1. Steps alternate between the contenders, so load from other processes hits all of them
alike; the table reports medians. TRL is measured twice: with its default (a reference forward in every
step) and with ``precompute_ref_log_probs=True``. posttrain always precomputes the reference once; that
one-time cost is reported separately and amortised over the steps.

    python benchmarks/dpo.py [--store DIR] [--steps 5] [--warmup 1] [--batch 8] [--out benchmarks/results/dpo.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from machine import console, describe, write_json  # benchmarks/machine.py: the CPU model and flags beside every table
from rich.table import Table

from posttrain.config import load_config
from posttrain.data.store import DataError, TrajectoryStore
from posttrain.train.offline import OfflineTrainer

ROOT = Path(__file__).resolve().parents[1]


def posttrain_contender(store: str, n_pairs: int, batch: int, out_dir: str):
    cfg = load_config(ROOT / "examples" / "arithmetic_dpo.yaml", [
        # plain DPO, TRL's sigmoid loss: the example's RPO term off
        f"offline.store={store}", "offline.method=dpo", "offline.beta=0.1", "offline.rpo_alpha=0",
        f"offline.batch_size={batch}", f"offline.microbatch_size={batch}", f"output_dir={out_dir}",
    ])
    trainer = OfflineTrainer(cfg)
    trainer.examples = trainer.examples[:n_pairs]
    start = time.perf_counter()
    trainer.precompute_reference()
    reference_seconds = time.perf_counter() - start
    steps = iter(range(0, n_pairs, batch))

    def step() -> None:
        s = next(steps)
        trainer.train_step(list(range(s, s + batch)))

    return trainer.examples, reference_seconds, step


def trl_contender(pairs, tokenizer, batch: int, steps: int, precompute: bool, out_dir: str):
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    from posttrain.models import load_model

    rows = [{"prompt": tokenizer.decode(p.chosen.prompt_ids),
             "chosen": tokenizer.decode(p.chosen.completion_ids, skip_special_tokens=True),
             "rejected": tokenizer.decode(p.rejected.completion_ids, skip_special_tokens=True)} for p in pairs]
    args = DPOConfig(output_dir=out_dir, per_device_train_batch_size=batch, learning_rate=2e-6, beta=0.1,
                     loss_type=["sigmoid"], bf16=False, fp16=False, gradient_checkpointing=False, use_cpu=True,
                     max_steps=steps, report_to=[], precompute_ref_log_probs=precompute, dataloader_num_workers=0,
                     save_strategy="no", logging_strategy="no", seed=0, max_length=None)
    trainer = DPOTrainer(model=load_model("smollm2-135m-instruct"), args=args, train_dataset=Dataset.from_list(rows),
                         processing_class=tokenizer)
    trainer.create_optimizer_and_scheduler(num_training_steps=steps)
    trainer.current_gradient_accumulation_steps = 1  # what Trainer.train() sets before its first step
    batches = iter(trainer.get_train_dataloader())
    model = trainer.model
    model.train()

    def step() -> None:
        inputs = next(batches)
        trainer.training_step(model, inputs)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
        model.zero_grad(set_to_none=True)

    return step


def main() -> None:
    print(describe(), flush=True)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default=str(ROOT / "runs" / "arithmetic-offline" / "trajectories"))
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps per contender first")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "dpo.json"))
    args = parser.parse_args()
    n_pairs = (args.warmup + args.steps) * args.batch
    tmp = tempfile.mkdtemp(prefix="dpo-bench-")
    if not TrajectoryStore(args.store).files():
        raise SystemExit(f"no trajectories in {args.store}: collect them first with `posttrain collect "
                         "examples/arithmetic_dpo.yaml --out runs/arithmetic-offline/trajectories --n 8 --tasks 64`")

    try:
        ours_pairs, reference_seconds, ours_step = posttrain_contender(args.store, n_pairs, args.batch, f"{tmp}/ours")
    except DataError as e:  # a store of another held-out split, say: the trainer's one line, not a traceback
        raise SystemExit(str(e)) from None
    if len(ours_pairs) < n_pairs:
        raise SystemExit(f"the store has {len(ours_pairs)} pairs; {n_pairs} needed ((--warmup + --steps) x --batch)")
    from posttrain.models import load_tokenizer

    tokenizer = load_tokenizer("smollm2-135m-instruct")
    total = args.warmup + args.steps
    contenders = {
        "posttrain": ours_step,
        "TRL DPOTrainer": trl_contender(ours_pairs, tokenizer, args.batch, total, False, f"{tmp}/trl"),
        "TRL DPOTrainer (precomputed ref)": trl_contender(ours_pairs, tokenizer, args.batch, total, True,
                                                          f"{tmp}/trl-pre"),
    }
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for i in range(total):
        for name, step in contenders.items():
            start = time.perf_counter()
            step()
            if i >= args.warmup:  # the first steps pay for optimiser state and allocator warm-up
                times[name].append(time.perf_counter() - start)

    median = {name: statistics.median(t) for name, t in times.items()}
    agent_tokens = sum(p.chosen.num_sampled_tokens + p.rejected.num_sampled_tokens for p in ours_pairs) / n_pairs
    load = os.getloadavg()
    table = Table(title=f"DPO step, {args.batch} pairs, SmolLM2-135M fp32, {torch.get_num_threads()} threads, "
                        f"load average {load[0]:.1f}")
    table.add_column("contender")
    table.add_column("median s/step", justify="right")
    table.add_column("all steps (s)")
    table.add_column("posttrain speed-up", justify="right")
    for name, t in times.items():
        table.add_row(name, f"{median[name]:.2f}", " ".join(f"{x:.1f}" for x in t),
                      f"{median[name] / median['posttrain']:.2f}x")
    console().print(table)
    console().print(f"posttrain reference log-probs, once for {n_pairs} pairs: {reference_seconds:.1f} s "
                    f"({reference_seconds / total:.2f} s per step amortised over {total} steps)")
    result = {"batch_pairs": args.batch, "steps": args.steps, "mean_agent_tokens_per_pair": agent_tokens,
              "median_seconds": median, "seconds": times, "posttrain_reference_seconds": reference_seconds,
              "speedup_vs_trl": median["TRL DPOTrainer"] / median["posttrain"],
              "speedup_vs_trl_precomputed": median["TRL DPOTrainer (precomputed ref)"] / median["posttrain"],
              "load_average": load, "threads": torch.get_num_threads()}
    write_json(args.out, result)


if __name__ == "__main__":
    main()
