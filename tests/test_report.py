"""The run report: written from a real tiny run, opened in headless Chromium.

Chromium is Debian's (scripts/setup.sh installs it where it can), driven by Playwright with
``executable_path`` (Playwright's own browser download is not reachable here).
"""

import json
import shutil
from pathlib import Path

import pytest
from cli_inprocess import assert_one_line_error, invoke
from test_train_e2e import run_cli, tiny_config

from posttrain.config import load_config
from posttrain.data.store import TrajectoryStore
from posttrain.eval.plots import Series, line_chart, nice_ticks
from posttrain.eval.report import charts_html, render_report
from posttrain.eval.run_data import load_run
from posttrain.train import Trainer
from posttrain.types import Step, Task, Trajectory

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"]


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser"):
        if path := shutil.which(name):
            return path
    return None


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api")
    executable = chromium_path()
    if executable is None:
        pytest.skip("no chromium on PATH (scripts/setup.sh installs Debian's chromium as root)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=executable, args=CHROMIUM_FLAGS)
        yield b
        b.close()


def open_page(browser, path: Path):
    """The report loaded in a fresh page, with every console message, page error and request recorded."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.messages, page.requests = [], []
    page.on("console", lambda m: page.messages.append((m.type, m.text)))
    page.on("pageerror", lambda e: page.messages.append(("pageerror", str(e))))
    page.on("request", lambda r: page.requests.append(r.url))
    page.goto(path.as_uri())
    page.wait_for_selector("#episode-detail h3")
    return page


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """Two GRPO steps of the tiny model on mixed-difficulty arithmetic, with the store written."""
    tmp = tmp_path_factory.mktemp("report")
    config = tiny_config(tmp, env={"kwargs": {"difficulty": [1, 2], "num_eval": 4}}, store={"write": True},
                         eval={"num_tasks": 4, "every": 1})
    Trainer(load_config(config)).train()
    proc = run_cli("report", tmp / "run")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp / "run"


def test_report_opens_offline_with_plots_tables_and_a_trajectory(browser, tiny_run):
    page = open_page(browser, tiny_run / "report.html")
    assert [m for m in page.messages if m[0] in ("error", "pageerror", "warning")] == []
    assert page.requests == [(tiny_run / "report.html").as_uri()]  # nothing fetched but the file itself
    charts = page.locator("svg.chart")
    assert charts.count() >= 6 and charts.first.is_visible()
    assert page.locator("svg.chart polyline").count() >= 6
    titles = page.locator(".chart-title").all_text_contents()
    for title in ("Reward", "Success", "KL to the reference", "Entropy", "Length", "Throughput"):
        assert title in titles
    assert "Turns" not in titles  # a single-turn run: one turn an episode says nothing
    rows = page.locator("#eval-table tbody tr")
    assert [r.split("\t")[0] for r in rows.all_inner_texts()] == ["0", "1", "2"]
    assert page.locator("#difficulty-table th").all_inner_texts() == ["step", "level 1", "level 2"]

    # The first training episode is shown: its turn and its tokens, sampled ones marked as trained on.
    assert page.locator("#episode-list tbody tr").count() == 16  # 2 steps x 2 tasks x 4 samples
    task_lines = page.locator("#episode-list tbody tr td.mono").first.evaluate(
        "cell => { const r = document.createRange(); r.selectNodeContents(cell); return r.getClientRects().length; }")
    assert task_lines == 1, f"a task id wraps over {task_lines} lines"
    scroll, shown = page.locator(".episodes").evaluate("e => [e.scrollWidth, e.clientWidth]")
    assert scroll <= shown  # every column of the list in view, none behind a horizontal scroll
    detail = page.locator("#episode-detail")
    assert detail.is_visible() and "step 1, training" in detail.locator("h3").first.inner_text()
    assert detail.locator(".turn").count() == 1 and detail.locator(".turn pre.action").is_visible()
    sampled = detail.locator(".tok.m1").count()
    assert sampled > 0 and f"Tokens: {sampled} of {sampled} after the prompt" in detail.inner_text()  # single-turn
    page.check("#f-prompt")
    assert detail.locator(".tok.m0.prompt").count() > 0 and detail.locator(".tok.m1.prompt").count() == 0
    page.uncheck("#f-prompt")

    # Browsing: by step, by task, by reward, and the held-out episodes.
    page.select_option("#f-step", "2")
    steps = {r.split("\t")[0] for r in page.locator("#episode-list tbody tr").all_inner_texts()}
    assert steps == {"2"}
    task = page.locator("#episode-list tbody tr td.mono").first.inner_text()
    page.fill("#f-task", task)
    assert set(page.locator("#episode-list tbody tr td.mono").all_inner_texts()) == {task}
    page.fill("#f-task", "")
    page.fill("#f-rmin", "5")
    assert page.locator("#episode-list tbody tr").count() == 0  # arithmetic rewards are 0 or 1
    page.fill("#f-rmin", "")
    page.select_option("#f-source", "eval")
    page.select_option("#f-step", "0")
    assert page.locator("#episode-list tbody tr").count() == 4
    assert "held-out" in page.locator("#episode-detail h3").first.inner_text()
    assert page.locator("#token-view .tok.m1").count() > 0  # held-out samples keep their tokens too
    assert [m for m in page.messages if m[0] in ("error", "pageerror")] == []
    page.close()


def test_model_output_is_shown_as_text_never_run_or_fetched(browser, tiny_run, tmp_path):
    """An agent that writes markup: the page shows it literally and makes no request."""
    run_dir = tmp_path / "run"
    shutil.copytree(tiny_run, run_dir)
    evil = '</script><img src="http://192.0.2.1/x.png" onerror="console.error(1)"><script>console.error(2)</script>'
    task = Task("evil-1", f"What is {evil}?", 1, {"difficulty": 1})
    traj = Trajectory(task=task, prompt_ids=[1, 2], completion_ids=[3, 4], loss_mask=[1, 0],
                      behaviour_logprobs=[-1.0, 0.0], steps=[Step(evil, evil, 0.0, True, False, {"tool": evil})],
                      metadata={"step": 3})
    TrajectoryStore(run_dir / "trajectories").append([traj], "evil-run", 2)
    out = run_dir / "evil.html"
    out.write_text(render_report(load_run(run_dir), tokenizer=None))
    page = open_page(browser, out)
    page.select_option("#f-step", "3")
    assert page.locator("#episode-detail pre.action").inner_text() == evil
    assert page.locator("#episode-detail .badge.tool").text_content() == f"tool call: {evil}"
    assert page.locator("#token-view .tok.m1").count() == 1 and page.locator("#token-view .tok.m0").count() == 1
    assert page.requests == [out.as_uri()]
    assert page.messages == []
    page.close()


def test_cli_report_errors_on_a_directory_that_is_not_a_run(tmp_path):
    proc = run_cli("report", tmp_path)
    assert proc.returncode == 2
    assert "not a run directory" in proc.stderr and "Traceback" not in proc.stderr


def test_killed_run_partial_metrics_line_is_skipped_and_counted(tiny_run, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(tiny_run, run_dir)
    with (run_dir / "metrics.jsonl").open("a") as f:
        f.write('{"split": "train", "step": 3, "rew')  # what a SIGKILL mid-write leaves
    run = load_run(run_dir)
    assert run.skipped_lines == 1 and [r["step"] for r in run.train] == [1, 2]
    steps = [t.step for t in run.trajectories]  # the trainer records each stored trajectory's step
    assert steps == [1] * 8 + [2] * 8
    assert "1 unreadable lines skipped" in render_report(run, tokenizer=None)


@pytest.mark.parametrize("file, content, says", [
    ("config.json", b"{\"model\": {\"na", "not JSON"), ("summary.json", b"\xff\xfe", "not JSON"),
    ("config.json", b"[1, 2]", "holds [1, 2], not a JSON object"), ("summary.json", b"null", "holds null"),
])
def test_a_damaged_run_file_is_one_line_naming_it(tiny_run, tmp_path, file, content, says):
    run_dir = tmp_path / "run"
    shutil.copytree(tiny_run, run_dir)
    (run_dir / file).write_bytes(content)
    ended = invoke("report", run_dir, "--out", tmp_path / "report.html")
    assert_one_line_error(ended, str(run_dir / file), says, "posttrain writes a JSON object there")
    assert not (tmp_path / "report.html").exists()


def test_config_sections_of_another_shape_are_left_out_of_the_header(tiny_run, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(tiny_run, run_dir)
    config = json.loads((run_dir / "config.json").read_text())
    (run_dir / "config.json").write_text(json.dumps({**config, "model": "tiny-random", "env": [1], "store": {"path": 3}}))
    page = render_report(load_run(run_dir), tokenizer=None)
    assert "<dt>model</dt><dd>?</dd>" in page and "<dt>algorithm</dt><dd>grpo</dd>" in page


def test_turns_chart_only_where_an_episode_took_more_than_one_turn(tiny_run):
    run = load_run(tiny_run)
    assert "Turns" not in charts_html(run)
    run.train[-1]["turns_mean"] = 2.5
    assert "Turns" in charts_html(run)


def test_line_chart_ticks_and_empty_series():
    ticks = nice_ticks(0.0, 0.93)
    assert ticks[0] <= 0.0 and ticks[-1] >= 0.93 and len(ticks) <= 6
    svg = line_chart("Reward", [Series("train", [(1, 0.1), (2, float("nan")), (3, 0.5)])])
    assert svg.count("<circle") == 2 and "not logged" not in svg
    assert "not logged" in line_chart("KL", [Series("kl", [])])
    assert json.loads(json.dumps(nice_ticks(3.0, 3.0)))  # a flat series still gets a range


def test_web_screenshots_are_shown_beside_their_turn(browser, tiny_run, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(tiny_run, run_dir)
    shots = tmp_path / "screenshots" / "ep-1"  # where a web env's screenshot_dir put them
    shots.mkdir(parents=True)
    page = browser.new_page(viewport={"width": 320, "height": 200})
    page.set_content("<button>Submit</button>")
    page.screenshot(path=str(shots / "step01.png"))
    page.close()
    task = Task("miniwob/click-button/1", "Click Submit.", 1, {"difficulty": 1})
    traj = Trajectory(task=task, prompt_ids=[1, 2], completion_ids=[3, 4], loss_mask=[1, 0],
                      behaviour_logprobs=[-1.0, 0.0], steps=[Step("click('4')", "page", 1.0, True, False,
                                                                 {"screenshot": str(shots / "step01.png")})],
                      reward=1.0, metadata={"step": 3})
    TrajectoryStore(run_dir / "trajectories").append([traj], "web-run", 2)
    run_cli("report", run_dir)
    page = open_page(browser, run_dir / "report.html")
    page.select_option("#f-step", "3")
    image = page.locator("#episode-detail img.screenshot")
    image.wait_for()
    # Wait in a function call, not wait_for_function's string predicate: Playwright polls that
    # with eval, which the report's Content-Security-Policy rightly forbids.
    image.evaluate("img => img.complete || new Promise(done => img.addEventListener('load', done))")
    assert image.evaluate("img => img.naturalWidth") == 320  # the file, loaded next to the report
    assert image.get_attribute("src") == "../screenshots/ep-1/step01.png"
    assert [m for m in page.messages if m[0] in ("error", "pageerror")] == []
    page.close()


def test_a_self_play_run_reports_its_games_per_opponent_and_seat(tmp_path):
    """Kuhn poker against a random player and itself: wins, payoff and invalid moves in charts and a table per
    evaluation, opponent and seat, read from what the run logged; a game's "loss" (games lost) is not charted
    as a training loss."""
    from posttrain.train.selfplay import SelfPlayTrainer

    cfg = load_config(None, ["model.name=tiny-random", "env.id=kuhn_poker", "algorithm.group_size=2",
                             "train.steps=2", "train.tasks_per_step=2", "rollout.max_new_tokens=3",
                             "eval.max_new_tokens=3", "eval.num_tasks=2",
                             "multi_agent.eval_opponents=[random, self]", f"output_dir={tmp_path / 'run'}"])
    SelfPlayTrainer(cfg).train()
    run = load_run(tmp_path / "run")
    page = render_report(run, tokenizer=None)
    table = page[page.index('<table id="games-table">'):]
    table = table[: table.index("</table>")]
    assert table.count("<tr>") == 1 + 2 * 2 * 3  # the head; 2 evaluations x 2 opponents x (both seats, each)
    after = run.evals[-1]
    row = (f"<tr><td>2</td><td>random</td><td>player_1</td><td class=\"num\">{after['random/player_1/games']:g}</td>"
           f"<td class=\"num\">{after['random/player_1/win']:.1%}</td>")
    assert row in table
    charts = charts_html(run)
    assert all(f"vs {o} at step 2" in charts for o in ("random", "self"))
    assert "Wins" in charts and "Payoff" in charts and "Invalid moves" in charts and "Success" not in charts
    assert "policy loss at step 2" in charts and "loss at step 2: " not in charts.replace("policy loss at", "")
    before, last = run.summary["before"]["random/win"], run.summary["after"]["random/win"]
    assert f"<dt>held-out win vs random</dt><dd>{before:.0%} -&gt; {last:.0%}</dd>" in page
    assert "No held-out evaluation" not in page and "<table id=\"eval-table\">" not in page
    assert "store.write" not in page  # a multi-agent run keeps no trajectory store to point to
