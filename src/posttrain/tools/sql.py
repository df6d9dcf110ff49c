"""Read-only SQL over a SQLite database.

Three guards, because the query comes from an untrusted model: the database is opened read-only
(``mode=ro``), an authorizer refuses every action except reading and selecting, and a progress
handler aborts a query that runs longer than the time limit. Results are cut to a row limit.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

from posttrain.tools.registry import ToolError

# Reading, functions and recursive common table expressions; everything else (writes, schema
# changes, ATTACH, PRAGMA) is refused.
_ALLOWED = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, getattr(sqlite3, "SQLITE_RECURSIVE", 33)}


def _authorize(action: int, *_args) -> int:
    return sqlite3.SQLITE_OK if action in _ALLOWED else sqlite3.SQLITE_DENY


def run_query(db_path: str | Path, query: str, max_rows: int = 20, timeout_s: float = 2.0) -> list[tuple]:
    """Rows of a read-only ``query``; :class:`ToolError` for anything that is not a valid read."""
    uri = f"{Path(db_path).resolve().as_uri()}?mode=ro"
    conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
    deadline = time.monotonic() + timeout_s
    conn.set_progress_handler(lambda: int(time.monotonic() > deadline), 10_000)
    conn.set_authorizer(_authorize)
    try:
        cursor = conn.execute(query)
        return cursor.fetchmany(max_rows + 1)
    except sqlite3.DatabaseError as e:
        message = "query took too long" if "interrupted" in str(e) else str(e)
        if "not authorized" in message:
            message += " (the database is read-only: only SELECT queries are allowed)"
        raise ToolError(f"SQL error: {message}") from None
    except (sqlite3.Warning, ValueError) as e:  # e.g. several statements at once
        raise ToolError(f"SQL error: {e}") from None
    finally:
        conn.close()


def format_rows(rows: list[tuple], max_rows: int) -> str:
    if not rows:
        return "no rows"
    lines = [" | ".join("NULL" if v is None else str(v) for v in row) for row in rows[:max_rows]]
    if len(rows) > max_rows:
        lines.append(f"... (more than {max_rows} rows)")
    return "\n".join(lines)


def sql_tool(db_path: str | Path, max_rows: int = 20) -> Callable[[str], str]:
    """A ``sql(query)`` tool that runs read-only queries on the SQLite database at ``db_path``."""
    if not Path(db_path).is_file():
        raise FileNotFoundError(f"SQLite database {db_path} does not exist")

    def sql(query: str) -> str:
        """Run a read-only SQL query (SQLite) on the database and return the result rows.

        Args:
            query: One SELECT statement, e.g. "SELECT name FROM employees WHERE salary > 5000".
        """
        return format_rows(run_query(db_path, query, max_rows), max_rows)

    return sql
