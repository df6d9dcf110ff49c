"""Read-only SQL over a SQLite database.

Four guards, because the query comes from an untrusted model: the database is opened read-only
(``mode=ro``), an authorizer refuses every action except reading and selecting, a progress
handler aborts a query that runs longer than the time limit, and no string or blob it builds may
be longer than 10,000 bytes (``SELECT zeroblob(500000000)`` made a 2-billion-character result).
Results are cut to a row limit, and their text to 4,000 characters.
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
MAX_VALUE_BYTES = 10_000
MAX_TEXT_CHARS = 4_000


def _authorize(action: int, *_args) -> int:
    return sqlite3.SQLITE_OK if action in _ALLOWED else sqlite3.SQLITE_DENY


def run_query(db_path: str | Path, query: str, max_rows: int = 20, timeout_s: float = 2.0) -> list[tuple]:
    """Rows of a read-only ``query``; :class:`ToolError` for anything that is not a valid read."""
    uri = f"{Path(db_path).resolve().as_uri()}?mode=ro"
    conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
    deadline = time.monotonic() + timeout_s
    conn.set_progress_handler(lambda: int(time.monotonic() > deadline), 10_000)
    conn.set_authorizer(_authorize)
    if hasattr(conn, "setlimit"):  # Python 3.11+; on 3.10 only the text shown to the agent is bounded
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
    try:
        cursor = conn.execute(query)
        return cursor.fetchmany(max_rows + 1)
    except sqlite3.DatabaseError as e:
        message = "query took too long" if "interrupted" in str(e) else str(e)
        if "not authorized" in message:
            message += " (the database is read-only: only SELECT queries are allowed)"
        elif "too big" in message:
            message += f" (a string or blob may hold at most {MAX_VALUE_BYTES:,} bytes)"
        raise ToolError(f"SQL error: {message}") from None
    except (sqlite3.Warning, ValueError) as e:  # e.g. several statements at once
        raise ToolError(f"SQL error: {e}") from None
    finally:
        conn.close()


def format_rows(rows: list[tuple], max_rows: int, max_chars: int = MAX_TEXT_CHARS) -> str:
    """One line per row, values separated by " | "; at most ``max_rows`` rows and ``max_chars`` characters."""
    if not rows:
        return "no rows"
    lines = [" | ".join("NULL" if v is None else str(v) for v in row) for row in rows[:max_rows]]
    text = "\n".join(lines)
    if len(text) > max_chars:
        return text[:max_chars] + f"\n... (cut at {max_chars:,} characters)"
    return text + (f"\n... (more than {max_rows} rows)" if len(rows) > max_rows else "")


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
