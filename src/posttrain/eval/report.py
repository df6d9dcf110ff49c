"""The run report: one self-contained HTML file per run directory.

``posttrain report RUN_DIR`` reads what training left there (see :mod:`posttrain.eval.run_data`)
and writes ``RUN_DIR/report.html``: the training curves as inline SVG, the held-out evaluation
tables, and a trajectory viewer (our own small script, inlined) that shows episodes turn by turn
with their step rewards, tool calls and observations, and every token marked as trained on or
not (its loss mask). Nothing is fetched from anywhere: no CDN, fonts or remote scripts, and a
Content-Security-Policy that forbids any request, so the file opens the same offline, attached
to an issue, or years later. Every text from the run is escaped: model output is untrusted.
"""

from __future__ import annotations

import json
import time
from html import escape
from pathlib import Path
from typing import Any

from posttrain.eval.plots import Series, format_number, line_chart
from posttrain.eval.run_data import RunData, load_run
from posttrain.eval.viewer_data import asset, load_tokenizer_for, script_json, viewer_data

# No request of any kind may leave the page; inline styles and scripts are ours.
# Images: the charts' data URIs, and screenshots beside the report (relative paths, opened as files or served).
CSP = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data: 'self' file:"

# (chart title, y label, [(split, metric, legend label)]); a chart none of whose metrics was
# logged is left out, and so is Turns in a single-turn run (every point 1).
CHARTS: list[tuple[str, str, list[tuple[str, str, str]]]] = [
    ("Reward", "mean reward", [("train", "reward_mean", "train"), ("eval", "reward_mean", "held-out")]),
    ("Success", "share solved", [("train", "accuracy", "train"), ("eval", "accuracy", "held-out")]),
    ("KL to the reference", "KL", [("train", "kl", "KL")]),
    ("Entropy", "nats / token", [("train", "entropy", "entropy")]),
    ("Length", "sampled tokens", [("train", "completion_tokens_mean", "train"), ("eval", "tokens_mean", "held-out")]),
    ("Throughput", "tokens / s", [("train", "tokens_per_second", "sampled tokens / s")]),
    ("Step time", "seconds", [("train", "step_seconds", "step"), ("train", "generation_seconds", "generation")]),
    ("Loss", "loss", [("train", "loss", "loss"), ("train", "policy_loss", "policy loss")]),
    ("Gradient norm", "norm", [("train", "grad_norm", "grad norm")]),
    ("Turns", "turns / episode", [("train", "turns_mean", "train"), ("eval", "turns_mean", "held-out")]),
    ("Curriculum level", "level", [("train", "curriculum/level", "level")]),
]
EVAL_COLUMNS = [("accuracy", "success", True), ("reward_mean", "mean reward", False),
                ("turns_mean", "mean turns", False), ("tokens_mean", "mean tokens", False)]


def _series(run: RunData, split: str, key: str, label: str) -> Series:
    records = run.train if split == "train" else run.evals
    return Series(label, [(float(r["step"]), float(r[key])) for r in records
                          if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)])


def game_opponents(run: RunData) -> list[str]:
    """A multi-agent run's evaluation opponents (its held-out records' ``OPPONENT/payoff`` keys); [] for a
    single-agent run."""
    return sorted({k.split("/")[0] for r in run.evals for k in r if k.count("/") == 1 and k.endswith("/payoff")})


def game_charts(opponents: list[str]) -> list[tuple[str, str, list[tuple[str, str, str]]]]:
    """Charts of a multi-agent run: the policy's seats in training games ("train") and in the held-out games
    against each evaluation opponent ("vs random", ...)."""
    def held_out(key: str) -> list[tuple[str, str, str]]:
        return [("eval", f"{o}/{key}", f"vs {o}") for o in opponents]

    return [("Wins", "share of games", [("train", "win", "train"), *held_out("win")]),
            ("Payoff", "mean payoff", [("train", "payoff", "train"), *held_out("payoff")]),
            ("Invalid moves", "share of turns", [("train", "invalid_rate", "train"), *held_out("invalid_rate")])]


def charts_html(run: RunData) -> str:
    charts, opponents = [], game_opponents(run)
    for title, y_label, metrics in [*game_charts(opponents), *CHARTS]:
        if opponents:  # in a game's records "loss" is the share of games lost (in the Wins table), not a loss
            metrics = [m for m in metrics if m[:2] != ("train", "loss")]
        series = [_series(run, *m) for m in metrics]
        if title == "Turns" and all(y == 1.0 for s in series for _, y in s.points):
            continue
        if any(s.points for s in series):
            charts.append(line_chart(title, series, y_label))
    return "".join(charts) or "<p>No metrics were logged.</p>"


def _cell(value: Any, percent: bool = False) -> str:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return "<td>-</td>"
    return f'<td class="num">{value:.1%}</td>' if percent else f'<td class="num">{format_number(value)}</td>'


def eval_table_html(run: RunData) -> str:
    """One row per evaluation: success, pass@k, reward, turns, tokens, errors (a multi-agent run: its games)."""
    if not run.evals:
        return "<p>No held-out evaluation was logged.</p>"
    opponents = game_opponents(run)
    if opponents:
        return games_table_html(run, opponents)
    pass_keys = sorted({k for r in run.evals for k in r if k.startswith("pass@")}, key=lambda k: int(k[5:]))
    columns = [EVAL_COLUMNS[0], *((k, k, True) for k in pass_keys), *EVAL_COLUMNS[1:], ("errors", "errors", False)]
    head = "".join(f"<th>{escape(label)}</th>" for _, label, _ in columns)
    rows = "".join(f"<tr><td>{r['step']}</td>{''.join(_cell(r.get(k), pct) for k, _, pct in columns)}</tr>"
                   for r in run.evals)
    out = f'<table id="eval-table"><thead><tr><th>step</th>{head}</tr></thead><tbody>{rows}</tbody></table>'
    return out + difficulty_table_html(run)


GAME_COLUMNS = [("games", False), ("win", True), ("draw", True), ("loss", True), ("payoff", False),
                ("invalid_rate", True)]


def games_table_html(run: RunData, opponents: list[str]) -> str:
    """Held-out games at each evaluation against each opponent: the policy's seats together, then each role."""
    rows = []
    for r in run.evals:
        for opponent in opponents:
            roles = sorted({k.split("/")[1] for k in r if k.count("/") == 2 and k.startswith(f"{opponent}/")
                            and k.endswith("/payoff")})
            for seat, prefix in [("all", f"{opponent}/"), *((role, f"{opponent}/{role}/") for role in roles)]:
                cells = "".join(_cell(r.get(prefix + key), percent) for key, percent in GAME_COLUMNS)
                rows.append(f"<tr><td>{r['step']}</td><td>{escape(opponent)}</td><td>{escape(seat)}</td>{cells}</tr>")
    head = "".join(f"<th>{name}</th>" for name in ("step", "opponent", "seat", "games", "win", "draw", "loss",
                                                   "payoff", "invalid moves"))
    return f'<table id="games-table"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def difficulty_table_html(run: RunData) -> str:
    """Held-out success per difficulty level (columns) at each evaluation (rows)."""
    levels = sorted({k.split("/")[0].removeprefix("difficulty_") for r in run.evals for k in r
                     if k.startswith("difficulty_") and k.endswith("/accuracy")})
    if not levels:
        return ""
    head = "".join(f"<th>level {escape(level)}</th>" for level in levels)
    rows = "".join(f"<tr><td>{r['step']}</td>"
                   + "".join(_cell(r.get(f"difficulty_{level}/accuracy"), True) for level in levels) + "</tr>"
                   for r in run.evals)
    return (f"<h3>Success per difficulty level</h3><table id=\"difficulty-table\"><thead><tr><th>step</th>{head}"
            f"</tr></thead><tbody>{rows}</tbody></table>")


def task_table_html(run: RunData) -> str:
    """Per held-out task: successes at the first and the last evaluation (what changed)."""
    if len(run.eval_samples) < 1:
        return ""
    first, last = min(run.eval_samples), max(run.eval_samples)

    def by_task(rows: list[dict[str, Any]]) -> dict[str, tuple[int, int]]:
        out: dict[str, tuple[int, int]] = {}
        for row in rows:
            n, c = out.get(str(row.get("task_id")), (0, 0))
            out[str(row.get("task_id"))] = (n + 1, c + bool(row.get("correct")))
        return out

    before, after = by_task(run.eval_samples[first]), by_task(run.eval_samples[last])
    rows = "".join(
        f"<tr><td>{escape(task)}</td><td class=\"num\">{before.get(task, (0, 0))[1]}/{before.get(task, (0, 0))[0]}"
        f"</td><td class=\"num\">{c}/{n}</td></tr>"
        for task, (n, c) in after.items()
    )
    return (f"<details><summary>Per task: successes at step {first} and step {last} ({len(after)} tasks)</summary>"
            f"<table id=\"task-table\"><thead><tr><th>task</th><th>step {first}</th><th>step {last}</th></tr>"
            f"</thead><tbody>{rows}</tbody></table></details>")


def header_html(run: RunData) -> str:
    """What was trained on what, and the held-out result before and after."""
    cfg = run.config
    model, env, algo = run.section("model"), run.section("env"), run.section("algorithm")
    steps = max((r["step"] for r in run.train), default=0)
    facts = [("model", model.get("name", "?")), ("env", f"{env.get('id', '?')} {json.dumps(env.get('kwargs') or {})}"),
             ("algorithm", algo.get("name", "?")), ("steps logged", str(steps)), ("seed", str(cfg.get("seed", "?")))]
    if run.section("curriculum").get("enabled"):
        facts.append(("curriculum", "on"))
    summary = run.summary or {}
    for when in ("before", "after"):
        result = summary.get(when)
        if isinstance(result, dict) and isinstance(result.get("accuracy"), (int, float)):
            facts.append((f"held-out {when}", f"{result['accuracy']:.1%}"))
    for opponent in game_opponents(run):  # a multi-agent run: its seats' wins (payoff where no one wins)
        key = f"{opponent}/win" if any(f"{opponent}/win" in r for r in run.evals) else f"{opponent}/payoff"
        ends = [summary.get(when) for when in ("before", "after")]
        shown = [f"{e[key]:.0%}" if key.endswith("win") else format_number(e[key]) for e in ends
                 if isinstance(e, dict) and isinstance(e.get(key), (int, float))]
        if shown:
            facts.append((f"held-out {key.split('/')[1]} vs {opponent}", " -> ".join(shown)))
    items = "".join(f"<div><dt>{escape(k)}</dt><dd>{escape(v)}</dd></div>" for k, v in facts)
    note = (f'<p class="warn">{run.skipped_lines} unreadable lines skipped (a run killed while writing).</p>'
            if run.skipped_lines else "")
    return f"<dl class=\"facts\">{items}</dl>{note}"


def render_report(run: RunData, tokenizer, max_train: int = 3000, max_eval: int = 2000,
                  report_dir: Path | None = None) -> str:
    """The whole report page as one string (screenshots linked relative to ``report_dir``)."""
    data = viewer_data(run, tokenizer, max_train, max_eval, report_dir)
    left_out = (f"<p class=\"note\">{data['left_out']} episodes left out to keep the file small (whole steps, "
                "evenly spaced, are kept).</p>" if data["left_out"] else "")
    stored = ("" if run.trajectories or game_opponents(run) else "<p class=\"note\">No training trajectories: the "
              "run did not write its trajectory store (set <code>store.write: true</code>); held-out episodes "
              "only.</p>")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{CSP}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>posttrain run report: {escape(run.name)}</title>
<style>{asset("report.css")}</style></head>
<body>
<header><h1>posttrain run <span class="run-name">{escape(run.name)}</span></h1>
<p class="note">Report written {time.strftime("%Y-%m-%d %H:%M")} from {escape(str(run.run_dir))}.</p>
{header_html(run)}</header>
<section id="curves"><h2>Training curves</h2><div class="charts">{charts_html(run)}</div></section>
<section id="evaluation"><h2>Held-out evaluation</h2>{eval_table_html(run)}{task_table_html(run)}</section>
<section id="viewer"><h2>Trajectories</h2>{stored}{left_out}
<p class="note">Tokens with a <span class="tok m1">green</span> background were sampled by the policy and trained
on (loss mask 1); <span class="tok m0">grey</span> ones are prompt, template and environment tokens (mask 0).</p>
<div id="viewer-root"><noscript>The trajectory viewer needs JavaScript.</noscript></div></section>
<script type="application/json" id="viewer-data">{script_json(data)}</script>
<script>{asset("viewer.js")}</script>
</body></html>
"""


def write_report(run_dir: str | Path, out: str | Path | None = None, max_train: int = 3000,
                 max_eval: int = 2000) -> Path:
    """Write the report of ``run_dir`` to ``out`` (default ``RUN_DIR/report.html``); returns its path."""
    run = load_run(run_dir)
    path = Path(out) if out else run.run_dir / "report.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_report(run, load_tokenizer_for(run), max_train, max_eval, path.parent))
    return path
