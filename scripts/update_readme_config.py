"""Rewrite the README's config reference table from the code (`posttrain config` prints the same).

Run after adding or changing a config field: python scripts/update_readme_config.py
"""

from pathlib import Path

from posttrain.config import reference_markdown

README = Path(__file__).resolve().parents[1] / "README.md"
HEADER = "| key | default | meaning |"

lines = README.read_text().splitlines(keepends=True)
start = next(i for i, line in enumerate(lines) if line.startswith(HEADER))
end = start
while end < len(lines) and lines[end].startswith("|"):
    end += 1
README.write_text("".join(lines[:start]) + reference_markdown() + "\n" + "".join(lines[end:]))
