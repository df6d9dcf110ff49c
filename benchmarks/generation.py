"""Generation throughput: posttrain's HF backend, plain ``model.generate`` and vLLM, same prompts, one run.

The default model (fp32) samples at temperature 1 up to 64 new tokens for arithmetic prompts, at
batch 1, 8, 32 and 64 distinct prompts, and in the GRPO shape (4 prompts x 8 samples each:
``num_samples=8`` for posttrain and vLLM, ``num_return_sequences=8`` for ``generate``). Tokens/s
counts the tokens each sequence generated up to and including its EOS (what the trainer
receives), over the wall time of the call. The contenders alternate call by call; the table
reports medians. Where ``rollout.decode_dtype: auto`` picks bf16 (on a CPU with bf16 units, or on
one without them where one-row steps gain from bf16 weights), posttrain's bf16 decoding joins as
its own column. Where vLLM is installed (``make test-vllm`` builds .venv-vllm), posttrain's vLLM
backend joins as it runs in training: in this process, eager, on a copy of the same weights
(``--vllm-dtype``, float32 by default like the trainer), and its engine start time is reported.

    python benchmarks/generation.py [--repeats 3] [--max-new-tokens 64] [--no-vllm] [--vllm-dtype float32]
                                    [--out benchmarks/results/generation.json]

Run it alone: on a 2-core machine any other process distorts the timings.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import time
from pathlib import Path

import torch
from machine import console, describe, write_json  # benchmarks/machine.py: the CPU model and flags beside every table

from posttrain.envs import make_env
from posttrain.models import load_model, load_tokenizer
from posttrain.models.cpu_probe import decode_dtype
from posttrain.rollout import HFBackend, SamplingParams
from posttrain.rollout.episodes import encode_prompt

ROOT = Path(__file__).resolve().parents[1]
MODEL = "smollm2-135m-instruct"
SHAPES = [("batch 1", 1, 1), ("batch 8", 8, 1), ("batch 32", 32, 1), ("batch 64", 64, 1), ("GRPO 4 x 8", 4, 8)]


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
    parser.add_argument("--no-vllm", action="store_true", help="leave vLLM out even where it is installed")
    parser.add_argument("--vllm-dtype", default="float32", choices=["float32", "bfloat16"])
    args = parser.parse_args()
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
    if decode_dtype("auto") == torch.bfloat16:  # what rollout.decode_dtype: auto decodes in here
        bf16_backend = HFBackend(model, tokenizer, batch_size=64, seed=0, decode_dtype="bfloat16")

        def ours_bf16(batch: list[list[int]], n: int) -> int:
            return sum(len(g.token_ids) for g in bf16_backend.generate(batch, params, num_samples=n))

        contenders["posttrain bf16"] = ours_bf16
    vllm_start = None
    if not args.no_vllm and importlib.util.find_spec("vllm") is not None:
        from posttrain.config import VllmSection
        from posttrain.rollout.vllm_backend import VLLMBackend

        start = time.perf_counter()
        engine = VLLMBackend(model, tokenizer, VllmSection(dtype=args.vllm_dtype), batch_size=64, max_model_len=1024)
        vllm_start = time.perf_counter() - start

        def vllm(batch: list[list[int]], n: int) -> int:
            return sum(len(g.token_ids) for g in engine.generate(batch, params, num_samples=n))

        contenders["vLLM"] = vllm
    rates: dict[str, dict[str, list[float]]] = {s[0]: {c: [] for c in contenders} for s in SHAPES}
    load_before = os.getloadavg()[0]
    cursor = 0
    for shape, batch, n in SHAPES:
        for repeat in range(args.repeats + 1):  # the first round warms up
            chunk = [prompts[(cursor + i) % len(prompts)] for i in range(batch)]  # fresh prompts per call
            cursor += batch
            for name, fn in contenders.items():
                start = time.perf_counter()
                tokens = fn(chunk, n)
                if repeat:
                    rates[shape][name].append(tokens / (time.perf_counter() - start))
    load_after = os.getloadavg()[0]

    engine_note = f"; vLLM {args.vllm_dtype} engine start {vllm_start:.1f} s" if vllm_start is not None else ""
    table = Table(title=f"Sampling tokens/s, SmolLM2-135M fp32, <= {args.max_new_tokens} new tokens, "
                        f"{torch.get_num_threads()} threads, medians of {args.repeats}; load {load_before:.1f} -> "
                        f"{load_after:.1f}{engine_note}")
    names = list(contenders)
    table.add_column("shape")
    for name in names:
        table.add_column(f"{name} tok/s", justify="right")
    for name in names[:1] + names[2:]:
        table.add_column(f"{name} / generate", justify="right")
    result = {"max_new_tokens": args.max_new_tokens, "repeats": args.repeats, "load_average": [load_before, load_after],
              "vllm_dtype": args.vllm_dtype if vllm_start is not None else None, "vllm_engine_start_s": vllm_start,
              "shapes": {}}
    for shape, *_ in SHAPES:
        median = {name: statistics.median(rates[shape][name]) for name in names}
        base = median["model.generate"]
        result["shapes"][shape] = {**median, "speedup": median["posttrain"] / base, "all": rates[shape]}
        if "vLLM" in median:
            result["shapes"][shape]["vllm_speedup"] = median["vLLM"] / base
        if "posttrain bf16" in median:
            result["shapes"][shape]["bf16_speedup"] = median["posttrain bf16"] / base
        table.add_row(shape, *(f"{median[n]:.0f}" for n in names),
                      *(f"{median[n] / base:.2f}x" for n in names[:1] + names[2:]))
    console().print(table)
    write_json(args.out, result)


if __name__ == "__main__":
    main()
