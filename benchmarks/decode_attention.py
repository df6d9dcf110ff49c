"""A decode step's attention over long caches: our kernel against PyTorch's operations, one run.

An agent's rollouts decode over long contexts (a multi-turn episode's observations and tool results, a
shared system prompt), where a decode step reads every cached key and value of every layer: at 32
rows over 1600 columns, 2.4 GB a step in float32 for the default model, four times its weights. This
times one decode step's attention over the default model's 30 layers (9 query heads over 3 KV heads
of 64), as :mod:`posttrain.rollout.fast_decode` runs it: PyTorch's operations
(``torch_append_and_attend``: rotary embedding, cache write, fused attention up to 8 rows and two
batched matmuls above) and our kernel (``decode_layer.append_and_attend``) over a float32 cache, and
our kernel over a bf16 one (what ``rollout.decode_dtype: bfloat16`` decodes over where every step is
bf16). The contenders alternate call by call; the table reports medians and the cache's bytes read
a second.

    python benchmarks/decode_attention.py [--repeats 7] [--out benchmarks/results/decode_attention.json]

Run it alone: on a 2-core machine any other process distorts the timings.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from machine import console, describe, write_json  # benchmarks/machine.py: the CPU model and flags beside every table

from posttrain.models import decode_layer
from posttrain.rollout.fast_decode import torch_append_and_attend

ROOT = Path(__file__).resolve().parents[1]
LAYERS, HEADS, KV_HEADS, DIM = 30, 9, 3, 64  # the default model's attention
SHAPES = [(1, 1600), (8, 400), (8, 1600), (32, 100), (32, 400), (32, 1600)]  # rows, cached columns


def contenders(rows: int, columns: int) -> dict[str, tuple[object, int]]:
    """Each contender's step (30 layers' attention of one new token per row at column ``columns - 1``) and
    the cache bytes it reads."""
    torch.manual_seed(0)
    qkv = torch.randn(rows, HEADS + 2 * KV_HEADS, DIM)
    cos, signed_sin = torch.randn(rows, DIM), torch.randn(rows, DIM)
    bias = torch.zeros(rows, 1, 1, columns)
    caches = {dtype: [(torch.randn(rows, KV_HEADS, columns, DIM).to(dtype),
                       torch.randn(rows, KV_HEADS, columns, DIM).to(dtype)) for _ in range(LAYERS)]
              for dtype in (torch.float32, torch.bfloat16)}

    def pytorch() -> None:
        for keys, values in caches[torch.float32]:
            torch_append_and_attend(qkv, cos.unsqueeze(1), signed_sin.unsqueeze(1), keys, values, columns - 1, bias,
                                    HEADS)

    def ours(dtype: torch.dtype):
        def step() -> None:
            for keys, values in caches[dtype]:
                decode_layer.append_and_attend(qkv, cos, signed_sin, keys, values, columns - 1, bias, HEADS)
        return step

    read = LAYERS * rows * KV_HEADS * columns * DIM * 2
    return {"PyTorch fp32 cache": (pytorch, read * 4), "ours fp32 cache": (ours(torch.float32), read * 4),
            "ours bf16 cache": (ours(torch.bfloat16), read * 2)}


def main() -> None:
    print(describe(), flush=True)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "decode_attention.json"))
    args = parser.parse_args()
    reason = decode_layer.unavailable_reason()
    if reason:
        raise SystemExit(f"our decode kernels cannot run here: {reason}")
    from rich.table import Table

    table = Table(title=f"One decode step's attention, 30 layers of SmolLM2-135M, {torch.get_num_threads()} threads, "
                        f"ms (cache GB/s), medians of {args.repeats}")
    for column in ("rows", "columns", "PyTorch fp32 cache", "ours fp32 cache", "ours bf16 cache",
                   "ours fp32 / PyTorch", "ours bf16 / fp32"):
        table.add_column(column, justify="right")
    results = []
    for rows, columns in SHAPES:
        steps = contenders(rows, columns)
        times: dict[str, list[float]] = {name: [] for name in steps}
        for repeat in range(args.repeats + 1):  # the first round warms up
            for name, (step, _) in steps.items():
                start = time.perf_counter()
                step()
                if repeat:
                    times[name].append(time.perf_counter() - start)
        median = {name: statistics.median(t) for name, t in times.items()}
        cells = [f"{median[n] * 1e3:.1f} ({steps[n][1] / median[n] / 1e9:.0f})" for n in steps]
        table.add_row(str(rows), str(columns), *cells,
                      f"{median['PyTorch fp32 cache'] / median['ours fp32 cache']:.2f}x",
                      f"{median['ours fp32 cache'] / median['ours bf16 cache']:.2f}x")
        results.append({"rows": rows, "columns": columns, "seconds": median, "cache_bytes": {n: b for n, (_, b) in
                                                                                            steps.items()}})
    console().print(table)
    write_json(args.out, {"repeats": args.repeats, "shapes": results})


if __name__ == "__main__":
    main()
