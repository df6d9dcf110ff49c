"""Demonstrations for supervised fine-tuning, as trajectories whose every completion token is a target.

A JSONL file, one demonstration per line, either ``{"prompt": ..., "completion": ...}`` or
``{"messages": [...]}`` (chat messages; the last one must be the assistant's answer). The prompt
is rendered with the chat template exactly as the rollout renders it, and the completion ends
with the EOS token, as a sampled answer does, so the model also learns to stop.
"""

from __future__ import annotations

import json
from pathlib import Path

from posttrain.data.store import DataError
from posttrain.rollout.episodes import encode_prompt
from posttrain.types import Task, Trajectory


def _is_message(m: object) -> bool:
    return isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content", ""), str)


def _split(record: dict, where: str) -> tuple[list[dict], str]:
    if "messages" in record:
        messages = record["messages"]
        if not isinstance(messages, list) or not messages or not all(map(_is_message, messages)) \
                or messages[-1]["role"] != "assistant":
            raise DataError(f"{where}: 'messages' must be a list of {{\"role\": ..., \"content\": ...}} objects "
                            "with string values, ending with an assistant message")
        return messages[:-1], messages[-1].get("content", "")
    if "prompt" in record and "completion" in record:
        return [{"role": "user", "content": str(record["prompt"])}], str(record["completion"])
    raise DataError(f"{where}: expected keys 'prompt' and 'completion', or 'messages'")


def load_demonstrations(path: str | Path, tokenizer) -> list[Trajectory]:
    """Every demonstration in the JSONL file ``path`` as a trajectory with loss mask 1 on its answer."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"demonstrations file not found: {p} (expected JSONL)")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{p}: not UTF-8 text (byte {e.start}: {e.reason}); expected JSONL") from None
    out = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{p}:{n}: not valid JSON: {e}") from None
        if not isinstance(record, dict):
            raise DataError(f"{p}:{n}: expected a JSON object")
        context, answer = _split(record, f"{p}:{n}")
        try:
            completion = tokenizer.encode(answer, add_special_tokens=False) + [tokenizer.eos_token_id]
            prompt_ids = encode_prompt(tokenizer, context)
        except Exception as e:  # noqa: BLE001 - the template or tokenizer rejects this record's text
            raise DataError(f"{p}:{n}: the model's chat template or tokenizer cannot render it: "
                            f"{type(e).__name__}: {e}") from None
        prompt = context[-1]["content"] if context else ""
        out.append(Trajectory(task=Task(f"demo-{n}", str(prompt)), prompt_ids=prompt_ids,
                              completion_ids=completion, loss_mask=[1] * len(completion),
                              behaviour_logprobs=[0.0] * len(completion), reward=1.0))
    if not out:
        raise DataError(f"{p}: no demonstrations")
    return out
