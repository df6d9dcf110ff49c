"""Generation throughput: posttrain's HF backend vs plain ``model.generate``, same prompts, one run.

The default model (fp32) samples at temperature 1 up to 64 new tokens for arithmetic prompts, at
batch 1, 8 and 32 distinct prompts, and in the GRPO shape (4 prompts x 8 samples each:
``num_samples=8`` for posttrain, ``num_return_sequences=8`` for ``generate``). Tokens/s counts the
tokens each sequence generated up to and including its EOS (what the trainer receives), over the
wall time of the call. The contenders alternate call by call; the table reports medians.

    python benchmarks/generation.py [--repeats 3] [--max-new-tokens 64] [--out benchmarks/results/generation.json]

Run it alone: on a 2-core machine any other process distorts the timings.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

from posttrain.envs import make_env
from posttrain.models import load_model, load_tokenizer
from posttrain.rollout import HFBackend, SamplingParams
from posttrain.rollout.episodes import encode_prompt

from machine import describe  # benchmarks/machine.py: the CPU model and flags beside every table

ROOT = Path(__file__).resolve().parents[1]
MODEL = "smollm2-135m-instruct"
SHAPES = [("batch 1", 1, 1), ("batch 8", 8, 1), ("batch 32", 32, 1), ("GRPO 4 x 8", 4, 8)]


def hf_generate(model, tokenizer, prompts: list[list[int]], n: int, max_new_tokens: int) -> int:
    """``model.generate`` on left-padded prompts; returns the tokens generated up to each EOS."""
    width = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = (torch.arange(width) >= torch.tensor([width - len(p) for p in prompts]).unsqueeze(-1)).long()
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_p=1.0,
                             top_k=0, max_new_tokens=max_new_tokens, num_return_sequences=n, pad_token_id=pad)
    completions = out[:, width:]
    eos = model.generation_config.eos_token_id
    eos = torch.tensor(eos if isinstance(eos, list) else [eos])
    is_eos = torch.isin(completions, eos)
    first = torch.where(is_eos.any(-1), is_eos.float().argmax(-1) + 1, torch.tensor(completions.shape[1]))
    return int(first.sum())


def main() -> None:
    print(describe(), flush=True)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "generation.json"))
    args = parser.parse_args()
    from rich.console import Console
    from rich.table import Table

    torch.manual_seed(0)
    model, tokenizer = load_model(MODEL).eval(), load_tokenizer(MODEL)
    env = make_env("arithmetic", {"difficulty": 1, "num_eval": 100})
    prompts = [encode_prompt(tokenizer, t.prompt) for t in env.tasks("train")]
    backend = HFBackend(model, tokenizer, batch_size=64, seed=0)
    params = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=args.max_new_tokens)

    def ours(batch: list[list[int]], n: int) -> int:
        return sum(len(g.token_ids) for g in backend.generate(batch, params, num_samples=n))

    def theirs(batch: list[list[int]], n: int) -> int:
        return hf_generate(model, tokenizer, batch, n, args.max_new_tokens)

    contenders = {"posttrain": ours, "model.generate": theirs}
    rates: dict[str, dict[str, list[float]]] = {s[0]: {c: [] for c in contenders} for s in SHAPES}
    load_before = os.getloadavg()[0]
    cursor = 0
    for shape, batch, n in SHAPES:
        for repeat in range(args.repeats + 1):  # the first round warms up
            chunk = prompts[cursor : cursor + batch]
            cursor += batch
            for name, fn in contenders.items():
                start = time.perf_counter()
                tokens = fn(chunk, n)
                if repeat:
                    rates[shape][name].append(tokens / (time.perf_counter() - start))
    load_after = os.getloadavg()[0]

    table = Table(title=f"Sampling tokens/s, SmolLM2-135M fp32, <= {args.max_new_tokens} new tokens, "
                        f"{torch.get_num_threads()} threads, medians of {args.repeats}; load {load_before:.1f} -> "
                        f"{load_after:.1f}")
    for col in ("shape", "posttrain tok/s", "model.generate tok/s", "speed-up"):
        table.add_column(col, justify="left" if col == "shape" else "right")
    result = {"max_new_tokens": args.max_new_tokens, "repeats": args.repeats, "load_average": [load_before, load_after],
              "shapes": {}}
    for shape, *_ in SHAPES:
        ours_rate = statistics.median(rates[shape]["posttrain"])
        theirs_rate = statistics.median(rates[shape]["model.generate"])
        result["shapes"][shape] = {"posttrain": ours_rate, "model.generate": theirs_rate,
                                   "speedup": ours_rate / theirs_rate, "all": rates[shape]}
        table.add_row(shape, f"{ours_rate:.0f}", f"{theirs_rate:.0f}", f"{ours_rate / theirs_rate:.2f}x")
    Console().print(table)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    Console().print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
