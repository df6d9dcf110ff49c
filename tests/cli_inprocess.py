"""Run the CLI in this process (fast: the model and libraries load once) and check how it ended."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml
from typer.testing import CliRunner

from posttrain.cli import app

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Ended:
    exit_code: int
    stdout: str
    stderr: str
    exception: BaseException | None  # an exception that escaped the CLI: a traceback for the user

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.startswith("error:")]


def invoke(*args) -> Ended:
    result = CliRunner().invoke(app, [str(a) for a in args])
    escaped = result.exception if not isinstance(result.exception, SystemExit) else None
    return Ended(result.exit_code, result.stdout, result.stderr, escaped)


def assert_one_line_error(ended: Ended, *fragments: str) -> str:
    """Exit 2, no traceback, exactly one `error:` line, naming each of ``fragments``."""
    assert ended.exception is None, f"traceback: {ended.exception!r:.300}"
    assert "Traceback" not in ended.stderr, ended.stderr[-2000:]
    assert ended.exit_code == 2, (ended.exit_code, ended.stderr[-2000:])
    assert len(ended.error_lines) == 1, ended.stderr[-2000:]
    (line,) = ended.error_lines
    for fragment in fragments:
        assert fragment in line, (fragment, line)
    return line


def tiny_config(tmp_path: Path, name: str = "config.yaml", **sections) -> Path:
    """examples/tiny_smoke.yaml with ``sections`` merged in, writing its run under tmp_path/run."""
    cfg = yaml.safe_load((ROOT / "examples" / "tiny_smoke.yaml").read_text())
    for key, value in sections.items():
        if isinstance(value, dict):
            cfg.setdefault(key, {}).update(value)
        else:
            cfg[key] = value
    if "output_dir" not in sections:
        cfg["output_dir"] = str(tmp_path / "run")
    path = tmp_path / name
    path.write_text(yaml.safe_dump(cfg))
    return path


def trained_run(tmp_path: Path) -> tuple[Path, Path]:
    """A one-step run of the tiny model that wrote a checkpoint and a trajectory store: (its config, its directory),
    for the tests that resume from it."""
    config = tiny_config(tmp_path, train={"steps": 1}, eval={"num_tasks": 1}, store={"write": True})
    ended = invoke("train", config)
    assert ended.exit_code == 0 and ended.exception is None, ended.stderr[-2000:]
    return config, tmp_path / "run"
