"""GRPO steps: posttrain vs TRL's GRPOTrainer on the same configuration, alternating runs.

Both train the default model (SmolLM2-135M-Instruct, fp32, no gradient checkpointing, 2 threads) on
the arithmetic env (additions of numbers 1-20, reward 1 for the exact answer): 2 prompts x 8
generations per step, at most 64 completion tokens, temperature 1, learning rate 1e-5, AdamW,
token-level loss normalisation (TRL's default ``loss_type="dapo"``, posttrain's default
``loss_aggregation="token"``), rewards scaled by the group's standard deviation, one update per
batch, reward = posttrain's own arithmetic scorer for both. Each configuration (beta 0 and 0.04,
full fine-tuning and LoRA r=16 on all linear layers; optionally ``-bf16``: bf16 autocast, which is
posttrain's ``model.autocast=bfloat16`` and TRL's ``bf16=True``) runs in a fresh process per contender, the
contenders alternating run by run so load from elsewhere hits both alike; the first step of each
run is a warm-up and is not timed. Reported per configuration: median seconds per step, completion
tokens per second, peak resident memory of the process, mean training reward over all steps and
over the second half of each run's steps, and posttrain's speed-up (TRL s/step / posttrain s/step).
TRL runs as its users run it: the model from ``from_pretrained`` and glibc's malloc as it comes.
``--peer-allocator posttrain`` gives TRL's process posttrain's malloc setting too
(:mod:`posttrain.models.allocator`), which shows what that setting alone is worth to TRL.
What posttrain's first step costs beyond a steady one is measured on the same work by
benchmarks/first_step.py.

    python benchmarks/grpo_vs_trl.py [--steps 6] [--repeats 2] [--configs full-b0,lora-b0,full-b0.04,lora-b0.04]
                                     [--peer-allocator default|posttrain] [--out benchmarks/results/grpo_vs_trl.json]

Run it alone: on a 2-core machine any other process distorts the timings.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from machine import console, describe, write_json  # benchmarks/machine.py: the CPU model and flags beside every table
from trl_peer import ENV_OVERRIDE, arithmetic_dataset, step_timer  # benchmarks/trl_peer.py: TRL's side

ROOT = Path(__file__).resolve().parents[1]
MODEL = "smollm2-135m-instruct"
PROMPTS_PER_STEP = 2
GENERATIONS = 8
MAX_NEW_TOKENS = 64
LEARNING_RATE = 1e-5
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def parse_config(name: str) -> tuple[bool, float, bool]:
    """'lora-b0.04' -> (LoRA, beta 0.04, float32); 'full-b0-bf16' -> (full, beta 0, bf16 autocast)."""
    base, bf16 = (name[: -len("-bf16")], True) if name.endswith("-bf16") else (name, False)
    kind, _, beta = base.partition("-b")
    try:
        if kind in ("full", "lora") and beta:
            return kind == "lora", float(beta), bf16
    except ValueError:
        pass
    raise SystemExit(f"unknown configuration {name!r}: expected full-b<beta> or lora-b<beta>, optionally with -bf16 "
                     "(e.g. lora-b0.04, full-b0-bf16)")


# ----------------------------------------------------------------------------- contenders (run in a child)


def posttrain_config(lora: bool, beta: float, bf16: bool, steps: int, out_dir: str):
    """The run config of posttrain's contender (also used by benchmarks/first_step.py)."""
    from posttrain.config import load_config

    return load_config(ROOT / "examples" / "arithmetic_grpo.yaml", [
        f"model.name={MODEL}", f"model.lora.enabled={str(lora).lower()}", "algorithm.name=grpo",
        ENV_OVERRIDE,  # the problems TRL's side trains on
        f"model.autocast={'bfloat16' if bf16 else 'none'}", "rollout.decode_dtype=float32",  # as TRL's generate
        "algorithm.overlong_buffer=0",  # TRL's GRPO shapes no rewards by length
        f"algorithm.beta={beta}", f"algorithm.group_size={GENERATIONS}", f"train.tasks_per_step={PROMPTS_PER_STEP}",
        f"train.microbatch_size={PROMPTS_PER_STEP * GENERATIONS}", f"train.learning_rate={LEARNING_RATE}",
        f"rollout.max_new_tokens={MAX_NEW_TOKENS}", "rollout.temperature=1.0", f"train.steps={steps}",
        f"output_dir={out_dir}",
    ])


def run_posttrain(lora: bool, beta: float, bf16: bool, steps: int, out_dir: str) -> list[dict]:
    from posttrain.train import Trainer

    trainer = Trainer(posttrain_config(lora, beta, bf16, steps, out_dir))
    records = []
    for _ in range(steps):
        start = time.perf_counter()
        metrics = trainer.train_step()
        records.append({"seconds": time.perf_counter() - start, "completion_tokens": metrics["completion_tokens"],
                        "reward": metrics["reward_mean"]})
    return records


def run_trl(lora: bool, beta: float, bf16: bool, steps: int, out_dir: str, allocator: str) -> list[dict]:
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    from posttrain.models import load_tokenizer
    from posttrain.models.allocator import keep_freed_memory
    from posttrain.models.loading import resolve_model_path

    if allocator == "posttrain":
        keep_freed_memory()
    dataset, arithmetic_reward = arithmetic_dataset()
    records: list[dict] = []

    args = GRPOConfig(
        output_dir=out_dir, per_device_train_batch_size=PROMPTS_PER_STEP * GENERATIONS, num_generations=GENERATIONS,
        max_completion_length=MAX_NEW_TOKENS, temperature=1.0, learning_rate=LEARNING_RATE, beta=beta,
        bf16=bf16, fp16=False, gradient_checkpointing=False, use_cpu=True, max_steps=steps, logging_steps=1,
        report_to=[], save_strategy="no", seed=0, dataloader_num_workers=0, lr_scheduler_type="constant",
        max_grad_norm=1.0, weight_decay=0.0,
    )
    peft_config = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=LORA_TARGETS) if lora else None
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path(MODEL), dtype=torch.float32)
    trainer = GRPOTrainer(model=model, reward_funcs=arithmetic_reward, args=args, train_dataset=dataset,
                          processing_class=load_tokenizer(MODEL), peft_config=peft_config,
                          callbacks=[step_timer(records, PROMPTS_PER_STEP * GENERATIONS)])
    trainer.train()
    return records


def child(contender: str, config: str, steps: int, peer_allocator: str) -> None:
    torch.set_num_threads(os.cpu_count() or 1)
    lora, beta, bf16 = parse_config(config)
    with tempfile.TemporaryDirectory(prefix="grpo-bench-") as tmp:
        if contender == "posttrain":
            records = run_posttrain(lora, beta, bf16, steps, tmp)
        else:
            records = run_trl(lora, beta, bf16, steps, tmp, peer_allocator)
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # Linux reports KiB
    print("RESULT " + json.dumps({"steps": records, "peak_rss_mb": peak_kib / 1024}), flush=True)


# ----------------------------------------------------------------------------- driver


def one_run(contender: str, config: str, steps: int, peer_allocator: str) -> dict:
    cmd = [sys.executable, __file__, "--child", contender, "--configs", config, "--steps", str(steps),
           "--peer-allocator", peer_allocator]
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise SystemExit(f"{contender} {config} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def summarise(runs: list[dict]) -> dict:
    timed = [s for r in runs for s in r["steps"][1:]]  # the first step of each run warms up
    seconds = statistics.median(s["seconds"] for s in timed)
    tokens = statistics.median(s["completion_tokens"] / s["seconds"] for s in timed)
    rewards = [s["reward"] for r in runs for s in r["steps"]]
    late = [s["reward"] for r in runs for s in r["steps"][len(r["steps"]) // 2 :]]
    return {"median_seconds": seconds, "median_tokens_per_second": tokens,
            "peak_rss_mb": max(r["peak_rss_mb"] for r in runs), "mean_reward": statistics.mean(rewards),
            "late_reward": statistics.mean(late), "step_seconds": [s["seconds"] for s in timed]}


def main() -> None:
    print(describe(), flush=True)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6, help="steps per run, the first untimed")
    parser.add_argument("--repeats", type=int, default=2, help="runs per contender and configuration")
    parser.add_argument("--configs", default="full-b0,lora-b0,full-b0.04,lora-b0.04")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "grpo_vs_trl.json"))
    parser.add_argument("--peer-allocator", choices=["default", "posttrain"], default="default",
                        help="TRL's malloc: glibc's as it comes, or with posttrain's setting")
    parser.add_argument("--child", choices=["posttrain", "trl"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child, args.configs, args.steps, args.peer_allocator)
    if args.steps < 2:
        raise SystemExit("--steps must be at least 2: the first step of each run is a warm-up")
    from rich.table import Table

    configs = args.configs.split(",")
    for c in configs:
        parse_config(c)
    runs: dict[str, dict[str, list[dict]]] = {c: {"posttrain": [], "trl": []} for c in configs}
    load_before = os.getloadavg()[0]
    for repeat in range(args.repeats):
        for config in configs:
            # Alternate which contender goes first, so neither always runs on a cooler machine.
            order = ["posttrain", "trl"] if repeat % 2 == 0 else ["trl", "posttrain"]
            for contender in order:
                runs[config][contender].append(one_run(contender, config, args.steps, args.peer_allocator))
                print(f"  {config} {contender} run {repeat + 1}: "
                      f"{statistics.median(s['seconds'] for s in runs[config][contender][-1]['steps'][1:]):.2f} s/step",
                      flush=True)
    load_after = os.getloadavg()[0]

    table = Table(title=f"GRPO step: {PROMPTS_PER_STEP} prompts x {GENERATIONS} generations, <= {MAX_NEW_TOKENS} "
                        f"tokens, SmolLM2-135M fp32, {os.cpu_count()} cores; medians of {args.repeats} x "
                        f"{args.steps - 1} timed steps; TRL on {args.peer_allocator} malloc; "
                        f"load {load_before:.1f} -> {load_after:.1f}")
    for col in ("config", "contender", "s/step", "completion tok/s", "peak RSS MB", "reward", "reward 2nd half",
                "speed-up"):
        table.add_column(col, justify="left" if col in ("config", "contender") else "right")
    result: dict = {"peer_allocator": args.peer_allocator, "prompts_per_step": PROMPTS_PER_STEP,
                    "generations": GENERATIONS, "max_new_tokens": MAX_NEW_TOKENS,
                    "steps_per_run": args.steps, "repeats": args.repeats, "load_average": [load_before, load_after],
                    "configs": {}}
    for config in configs:
        ours, trl = summarise(runs[config]["posttrain"]), summarise(runs[config]["trl"])
        speedup = trl["median_seconds"] / ours["median_seconds"]
        result["configs"][config] = {"posttrain": ours, "trl": trl, "speedup": speedup,
                                     "memory_ratio": ours["peak_rss_mb"] / trl["peak_rss_mb"]}
        for name, s in (("posttrain", ours), ("TRL GRPOTrainer", trl)):
            table.add_row(config, name, f"{s['median_seconds']:.2f}", f"{s['median_tokens_per_second']:.0f}",
                          f"{s['peak_rss_mb']:.0f}", f"{s['mean_reward']:.2f}", f"{s['late_reward']:.2f}",
                          f"{speedup:.2f}x" if name == "posttrain" else "")
    console().print(table)
    write_json(args.out, result)


if __name__ == "__main__":
    main()
