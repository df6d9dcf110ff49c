"""Training FLOP/s of posttrain's policy update vs the measured fp32 matmul peak of this machine.

Peak: the best of square fp32 matmuls (1024 to 4096, through MKL and through oneDNN) through torch (the same BLAS the model
uses). Training step: forward + backward of :func:`posttrain.models.logprobs.policy_forward` (the
path the trainer runs) with full fine-tuning of the default model, for two batch shapes: the GRPO
shape of ``benchmarks/grpo_vs_trl.py`` (16 rows: 2 prompts x 8 completions of 64 tokens, each group
sharing its prompt) and 8 rows of 256 tokens. Model FLOPs are those of one forward times 3 for
forward + backward (the backward of a linear layer, and of attention's two products, is two matmuls
of the forward's size), as executed: each shared prompt counted once, and attention over the
query-key pairs a causal mask leaves (``torch.utils.flop_counter.FlopCounterMode`` counts the
matmuls; it does not see PyTorch's CPU attention kernel or ours, so attention's products are
counted here: 4 x head dim FLOPs a visible pair a head, 3-4% of the 8 x 256 pass, 2% of the GRPO
shape's). Recomputation (by activation checkpointing, or attention's backward) is not counted as
useful work. MFU = model FLOPs / median step time / peak. Each shape is timed on
the matmul kernels the trainer picks on this CPU (oneDNN where a start-up probe finds it faster
than PyTorch's MKL path, :mod:`posttrain.models.onednn_linear`) and on PyTorch's own; the GRPO
shape also under bf16 autocast (the ``model.autocast`` option), against the same float32 peak,
on CPUs with bf16 units. As in the trainer on CPU, attention runs in float32
(:mod:`posttrain.models.attention`), which only changes the bf16 row.

    python benchmarks/mfu.py [--repeats 5] [--out benchmarks/results/mfu.json]

Run it alone: on a 2-core machine any other process distorts the timings.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch
from machine import console, describe, write_json  # benchmarks/machine.py: the CPU model and flags beside every table
from torch.utils.flop_counter import FlopCounterMode

from posttrain.models import load_model
from posttrain.models.cpu_probe import has_bf16_units, onednn_training_pays
from posttrain.models.logprobs import policy_forward
from posttrain.models.onednn_linear import onednn_training
from posttrain.models.packed_linear import packing_available
from posttrain.models.policy import use_training_kernels

ROOT = Path(__file__).resolve().parents[1]
MODEL = "smollm2-135m-instruct"
WARMUP = 2


def matmul_peak(sizes: tuple[int, ...] = (1024, 2048, 4096), repeats: int = 8) -> float:
    """Best FLOP/s of square fp32 matmuls over a few sizes, through MKL (``torch.mm``) and through
    oneDNN with a pre-packed weight (faster on some CPUs), whichever is higher."""
    best = 0.0
    for size in sizes:
        a, b = torch.randn(size, size), torch.randn(size, size)
        products = [lambda: a @ b]
        if packing_available():
            packed = torch.ops.mkldnn._reorder_linear_weight(b, size)
            products.append(lambda: torch.ops.mkldnn._linear_pointwise(a, packed, None, "none", [], ""))
        for product in products:
            product()
            for _ in range(repeats):
                start = time.perf_counter()
                product()
                best = max(best, 2 * size**3 / (time.perf_counter() - start))
    return best


def batch_shape(rows: int, prompt: int, completion: int, groups: int, vocab: int, seed: int = 0):
    """Right-padded ids where every ``rows // groups`` rows share a prompt, with the loss mask on completions,
    and the number of query-key pairs causal attention computes on them (each distinct prompt once)."""
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(0, vocab, (groups, prompt), generator=g).repeat_interleave(rows // groups, 0)
    ids = torch.cat([prompts, torch.randint(0, vocab, (rows, completion), generator=g)], dim=1)
    mask = torch.ones_like(ids)
    loss_mask = torch.zeros_like(ids)
    loss_mask[:, prompt:] = 1
    plens = torch.full((rows,), prompt) if groups < rows else None
    pairs = groups * prompt * (prompt + 1) // 2 + rows * (completion * prompt + completion * (completion + 1) // 2)
    return ids, mask, loss_mask, plens, pairs


def measure(model, shape: tuple, repeats: int, autocast: bool = False, kernels: bool | None = None) -> dict:
    """``kernels``: None for the trainer's choice on this CPU, False for PyTorch's own matmuls."""
    ids, mask, loss_mask, plens, pairs = shape
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        policy_forward(model, ids, mask, loss_mask, prompt_lengths=plens)
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    attention = 4 * head_dim * config.num_attention_heads * config.num_hidden_layers * pairs  # q.k and p.v
    flops = 3 * (counter.get_total_flops() + attention)
    times = []
    # Two steps warm up: the first steps at a new shape grow the heap (page faults), which a training run pays
    # once (benchmarks/first_step.py measures that); the 8 x 256 shape's first step after the GRPO shape's
    # ran 15-25% slower than the ones after it.
    for i in range(repeats + WARMUP):
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast), onednn_training(model, kernels):
            out = policy_forward(model, ids, mask, loss_mask, prompt_lengths=plens)
        (out.logprobs * loss_mask).sum().backward()
        model.zero_grad(set_to_none=True)
        if i >= WARMUP:
            times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    return {"model_flops": flops, "attention_flops": 3 * attention, "median_seconds": seconds,
            "flops_per_second": flops / seconds,
            "tokens": int(mask.sum()), "all_seconds": times}


def main() -> None:
    print(describe(), flush=True)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "mfu.json"))
    args = parser.parse_args()
    from rich.table import Table

    model = load_model(MODEL).train()
    use_training_kernels(model)  # as the trainer's policy on CPU
    vocab = model.config.vocab_size
    shapes = {
        "GRPO 2 prompts x 8, 35 + 64 tokens": batch_shape(16, 35, 64, 2, vocab),
        "8 x 256 tokens": batch_shape(8, 0, 256, 8, vocab),
    }
    load_before = os.getloadavg()[0]
    peak = matmul_peak()
    kernels = "oneDNN matmuls" if onednn_training_pays() else "PyTorch's matmuls"
    results = {}
    for name, shape in shapes.items():
        results[f"{name}, the trainer's kernels ({kernels})"] = measure(model, shape, args.repeats)
        results[f"{name}, PyTorch's matmuls"] = measure(model, shape, args.repeats, kernels=False)
    # The model.autocast option, for comparison (its MFU is against the float32 peak), on CPUs with
    # bf16 units only: elsewhere bf16 is emulated (Zen 3: 189 s a step against 12.6 s in fp32).
    if has_bf16_units():
        grpo = next(iter(shapes))
        results[f"{grpo}, bf16 autocast"] = measure(model, shapes[grpo], args.repeats, autocast=True)
    peak = max(peak, matmul_peak())  # measured before and after: the better of the two
    load_after = os.getloadavg()[0]

    table = Table(title=f"Training step (forward + backward, full fine-tuning, fp32), SmolLM2-135M, "
                        f"{torch.get_num_threads()} threads; matmul peak {peak / 1e9:.0f} GFLOP/s; "
                        f"load {load_before:.1f} -> {load_after:.1f}")
    for col in ("batch", "tokens", "model GFLOP", "of which attention", "median s", "GFLOP/s", "MFU"):
        table.add_column(col, justify="left" if col == "batch" else "right")
    for name, r in results.items():
        r["mfu"] = r["flops_per_second"] / peak
        table.add_row(name, str(r["tokens"]), f"{r['model_flops'] / 1e9:.0f}", f"{r['attention_flops'] / 1e9:.0f}",
                      f"{r['median_seconds']:.2f}",
                      f"{r['flops_per_second'] / 1e9:.0f}", f"{100 * r['mfu']:.0f}%")
    console().print(table)
    out = {"matmul_peak_flops": peak, "threads": torch.get_num_threads(), "load_average": [load_before, load_after],
           "shapes": results}
    write_json(args.out, out)


if __name__ == "__main__":
    main()
