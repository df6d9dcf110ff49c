"""What the report's trajectory viewer shows, as compact JSON.

Episodes come from the trajectory store (training, with ``store.write``) and from the held-out
samples of each evaluation. Token ids are kept as ids with one shared table of their decoded
text (``vocab``), prompts once per distinct prompt, and loss masks as strings of 0/1, so a run
of a few thousand episodes stays a few megabytes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from posttrain.eval.run_data import RunData, StoredTrajectory


def _evenly(items: list, limit: int) -> list:
    """At most ``limit`` items spread evenly over ``items`` (the first and last kept)."""
    if len(items) <= limit:
        return items
    if limit <= 1:
        return items[:limit]
    return [items[round(i * (len(items) - 1) / (limit - 1))] for i in range(limit)]


def select_steps(steps: list[int], sizes: dict[int, int], budget: int) -> set[int]:
    """Whole steps, evenly spaced, whose episodes fit in ``budget`` (one step at least)."""
    keep = len(steps)
    while keep > 1 and sum(sizes[s] for s in _evenly(steps, keep)) > budget:
        keep -= 1
    return set(_evenly(steps, keep))


def load_tokenizer_for(run: RunData):
    """The run's tokenizer: the newest checkpoint's copy, else the config's model; None if neither loads."""
    from transformers import AutoTokenizer

    candidates = sorted(run.run_dir.glob("checkpoints/step-*/model"), reverse=True)
    for path in candidates:
        if (path / "tokenizer_config.json").is_file():
            try:
                return AutoTokenizer.from_pretrained(str(path))
            except (OSError, ValueError):
                continue
    name = run.section("model").get("name")
    if name:
        try:
            from posttrain.models import load_tokenizer

            return load_tokenizer(name)
        except Exception:  # noqa: BLE001 - without a tokenizer the viewer shows token ids instead
            return None
    return None


class _Tables:
    """Shared tables of decoded tokens and of prompts."""

    def __init__(self, tokenizer, report_dir: Path | None = None) -> None:
        self.report_dir = report_dir  # screenshots are linked relative to it
        self.tokenizer = tokenizer
        self.ids: set[int] = set()
        self.prompts: list[list[int]] = []
        self._prompt_index: dict[tuple[int, ...], int] = {}

    def prompt(self, ids: list[int]) -> int:
        key = tuple(ids)
        if key not in self._prompt_index:
            self._prompt_index[key] = len(self.prompts)
            self.prompts.append(list(ids))
            self.ids.update(ids)
        return self._prompt_index[key]

    def vocab(self) -> dict[str, str]:
        ordered = sorted(self.ids)
        if self.tokenizer is None:
            return {str(i): f"[{i}]" for i in ordered}
        texts = self.tokenizer.batch_decode([[i] for i in ordered], skip_special_tokens=False,
                                            clean_up_tokenization_spaces=False)
        return {str(i): t for i, t in zip(ordered, texts)}


def _turns(steps: list[dict[str, Any]], report_dir: Path | None) -> list[dict[str, Any]]:
    out = []
    for s in steps:
        info = s.get("info") or {}
        turn = {"action": s.get("action", ""), "observation": s.get("observation", ""),
                "reward": s.get("reward", 0.0), "info": json.loads(json.dumps(info, default=repr))}
        shot = info.get("screenshot") if isinstance(info, dict) else None
        if report_dir is not None and isinstance(shot, str) and Path(shot).is_file():
            # Referenced, not embedded: a browser run's screenshots would make the page hundreds of MB.
            turn["screenshot"] = os.path.relpath(Path(shot).resolve(), report_dir.resolve())
        out.append(turn)
    return out


def _entry(tables: _Tables, source: str, step: int, task_id: str, difficulty: str, prompt_text: str,
           outcome: dict[str, Any], steps: list[dict[str, Any]], prompt_ids: list[int] | None,
           completion_ids: list[int] | None, mask: list[int] | None) -> dict[str, Any]:
    entry = {"source": source, "step": step, "task": task_id, "difficulty": difficulty, "question": prompt_text,
             **outcome, "turns": _turns(steps, tables.report_dir)}
    if prompt_ids is not None and completion_ids is not None and mask is not None:
        tables.ids.update(completion_ids)
        entry.update(prompt=tables.prompt(prompt_ids), completion=list(completion_ids),
                     mask="".join("1" if m else "0" for m in mask))
    return entry


def _train_entry(tables: _Tables, item: StoredTrajectory) -> dict[str, Any]:
    t = item.trajectory
    steps = [{"action": s.action, "observation": s.observation, "reward": s.reward, "info": s.info} for s in t.steps]
    outcome = {"reward": t.reward, "correct": t.correct, "error": t.error, "finish": t.finish_reason}
    return _entry(tables, "train", item.step, t.task.id, str(t.task.metadata.get("difficulty", "all")), t.task.prompt,
                  outcome, steps, t.prompt_ids, t.completion_ids, t.loss_mask)


def _eval_entry(tables: _Tables, step: int, row: dict[str, Any]) -> dict[str, Any]:
    outcome = {"reward": float(row.get("reward", 0.0)), "correct": bool(row.get("correct")),
               "error": row.get("error"), "finish": row.get("finish_reason", "")}
    steps = row.get("steps")
    if steps is None:  # samples written before turns were recorded: the completion as one turn
        steps = [{"action": row.get("completion", ""), "observation": "", "reward": row.get("reward", 0.0)}]
    return _entry(tables, "eval", step, str(row.get("task_id", "")), str(row.get("difficulty", "all")),
                  str(row.get("prompt", "")), outcome, steps, row.get("prompt_ids"), row.get("completion_ids"),
                  row.get("loss_mask"))


def viewer_data(run: RunData, tokenizer, max_train: int = 3000, max_eval: int = 2000,
                report_dir: Path | None = None) -> dict[str, Any]:
    """The viewer's JSON: ``episodes``, ``prompts`` (token ids) and ``vocab`` (id -> text), and
    how many episodes were left out to stay within ``max_train`` and ``max_eval``. Turns whose
    environment saved a screenshot (the web envs' ``screenshot_dir``) link it relative to ``report_dir``."""
    tables = _Tables(tokenizer, report_dir)
    sizes: dict[int, int] = {}
    for item in run.trajectories:
        sizes[item.step] = sizes.get(item.step, 0) + 1
    train_steps = select_steps(sorted(sizes), sizes, max_train) if sizes else set()
    episodes = [_train_entry(tables, item) for item in run.trajectories if item.step in train_steps]
    eval_sizes = {step: len(rows) for step, rows in run.eval_samples.items()}
    eval_steps = select_steps(sorted(eval_sizes), eval_sizes, max_eval) if eval_sizes else set()
    episodes += [_eval_entry(tables, step, row) for step in sorted(eval_steps) for row in run.eval_samples[step]]
    left_out = len(run.trajectories) + sum(eval_sizes.values()) - len(episodes)
    return {"episodes": episodes, "prompts": tables.prompts, "vocab": tables.vocab(), "left_out": left_out,
            "tokens_decoded": tokenizer is not None}


def script_json(value: Any) -> str:
    """JSON safe inside a ``<script type="application/json">`` element (no ``</script>`` break-out)."""
    # "<" occurs in JSON only inside strings, where \u003c means the same character.
    return json.dumps(value, separators=(",", ":")).replace("<", "\\u003c")


def asset(name: str) -> str:
    return (Path(__file__).parent / "report_assets" / name).read_text()
