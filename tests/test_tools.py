"""Tools: schemas from typed functions, argument checking, and the built-in tools' guards."""

import os
import sqlite3
import sys
import time

import pytest

from posttrain.tools import ToolError, ToolRegistry, calculator, python, search_tool, sql_tool, tool
from posttrain.tools.calculator import evaluate_expression


def convert(amount: float, unit: str, precise: bool = False) -> str:
    """Convert a length to metres.

    Args:
        amount: How much.
        unit: One of "cm" or "km".
        precise: Keep all digits.
    """
    factor = {"cm": 0.01, "km": 1000.0}[unit]
    return str(amount * factor)


def test_schema_comes_from_signature_and_docstring():
    t = tool(convert)
    assert t.name == "convert"
    assert t.description == "Convert a length to metres."
    params = t.parameters
    assert params["properties"]["amount"] == {"type": "number", "description": "How much."}
    assert params["properties"]["precise"]["type"] == "boolean"
    assert params["required"] == ["amount", "unit"]


def test_registry_calls_and_explains_bad_calls():
    tools = ToolRegistry([convert, calculator])
    assert tools.names == ["convert", "calculator"]
    assert tools.schemas()[1]["function"]["name"] == "calculator"
    assert tools.call("convert", {"amount": 2, "unit": "km"}) == "2000.0"
    assert tools.call("calculator", "6 * 7") == "42"  # plain text for a one-argument tool
    with pytest.raises(ToolError, match="unknown tool 'calc'; available tools: convert, calculator"):
        tools.call("calc", "1")
    with pytest.raises(ToolError, match="missing required argument 'unit'"):
        tools.call("convert", {"amount": 2})
    with pytest.raises(ToolError, match="has no argument 'speed'"):
        tools.call("convert", {"amount": 2, "unit": "km", "speed": 1})
    with pytest.raises(ToolError, match="argument 'amount' of convert must be number, got list"):
        tools.call("convert", {"amount": [2], "unit": "km"})
    with pytest.raises(ToolError, match="give them as a JSON object"):
        tools.call("convert", "2 km")
    # A failure inside the tool is the agent's problem, reported, not raised as is.
    with pytest.raises(ToolError, match="convert failed: KeyError"):
        tools.call("convert", {"amount": 2, "unit": "mile"})
    assert tools.call("convert", {"amount": "3", "unit": "cm"}) == "0.03"  # numbers given as text are read
    with pytest.raises(ValueError, match="two tools are named 'calculator'"):
        tools.add(calculator)


@pytest.mark.parametrize("expr, value", [("12 * (3 + 4)", 84), ("2 ** 10", 1024), ("7 / 2", 3.5), ("-3 + 5", 2),
                                          ("17 // 5", 3), ("17 % 5", 2), ("3 × 4", 12), ("2^3", 8)])
def test_calculator_evaluates_arithmetic(expr, value):
    assert evaluate_expression(expr) == value


@pytest.mark.parametrize("expr, message", [
    ("__import__('os').system('touch /tmp/pwned')", "unsupported element"),
    ("open('/etc/passwd').read()", "unsupported element"),
    ("(1).__class__", "unsupported element"),
    ("9 ** 9 ** 9", "exponent .* is too large"),
    ("10 ** 500", "more than 100 digits"),
    ("1 / 0", "division by zero"),
    ("2 +", "cannot parse"),
    ("", "empty expression"),
])
def test_calculator_refuses_what_is_not_bounded_arithmetic(expr, message):
    with pytest.raises(ToolError, match=message):
        evaluate_expression(expr)
    assert not os.path.exists("/tmp/pwned")


def test_python_tool_runs_code_and_reports_failures(monkeypatch):
    monkeypatch.setenv("POSTTRAIN_TEST_SECRET", "hunter2")
    assert python("print(sum(range(10)))") == "45"
    assert python("x = 1") == "(no output; use print to show a value)"
    with pytest.raises(ToolError, match="ZeroDivisionError"):
        python("print(1 / 0)")
    seen = python("import os; print(sorted(os.environ))")  # the host's environment is not passed
    assert "POSTTRAIN_TEST_SECRET" not in seen
    with pytest.raises(ToolError, match="MemoryError"):
        python("x = bytearray(2 * 1024**3)")


def test_python_tool_stops_long_programs_and_their_children(tmp_path):
    marker = tmp_path / "survivor"
    child = f"import time; time.sleep(7); open({str(marker)!r}, 'w').write('x')"
    code = f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', {child!r}])\nwhile True: pass"
    start = time.monotonic()
    with pytest.raises(ToolError, match="ran longer than"):
        python(code)
    assert time.monotonic() - start < 10
    time.sleep(4)  # past the moment the child would have written
    assert not marker.exists(), "a child of the program outlived it"


def test_search_ranks_the_relevant_document_first():
    search = tool(search_tool(["Paris is the capital of France.", "Berlin is the capital of Germany.",
                               "Bananas are yellow."], top_k=2))
    result = search.call("capital of Germany")
    assert result.splitlines()[0] == "[1] Berlin is the capital of Germany."
    assert search.call("zebra") == "no results"
    with pytest.raises(ToolError, match="empty query"):
        search.call("   ")


@pytest.fixture
def database(tmp_path):
    path = tmp_path / "shop.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE items (name TEXT, price INTEGER)")
        conn.executemany("INSERT INTO items VALUES (?, ?)", [("pen", 2), ("book", 12), ("lamp", 30)])
    return path


def test_sql_tool_answers_select_queries(database):
    sql = tool(sql_tool(database, max_rows=2))
    assert sql.call("SELECT name FROM items WHERE price > 10 ORDER BY price") == "book\nlamp"
    assert sql.call("SELECT name, price FROM items ORDER BY price") == "pen | 2\nbook | 12\n... (more than 2 rows)"
    assert sql.call("SELECT name FROM items WHERE price > 100") == "no rows"
    with pytest.raises(ToolError, match="no such column"):
        sql.call("SELECT colour FROM items")


@pytest.mark.parametrize("query", [
    "DELETE FROM items", "INSERT INTO items VALUES ('cup', 1)", "UPDATE items SET price = 0", "DROP TABLE items",
    "CREATE TABLE t (x)", "ATTACH DATABASE '/tmp/other.db' AS other", "PRAGMA writable_schema = 1",
    "SELECT 1; DELETE FROM items",
])
def test_sql_tool_is_read_only(database, query):
    sql = tool(sql_tool(database))
    with pytest.raises(ToolError, match="SQL error"):
        sql.call(query)
    with sqlite3.connect(database) as conn:
        assert conn.execute("SELECT COUNT(*), SUM(price) FROM items").fetchone() == (3, 44)
    assert not os.path.exists("/tmp/other.db")


def test_sql_tool_stops_runaway_queries(database):
    sql = tool(sql_tool(database))
    endless = "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n) SELECT COUNT(*) FROM n"
    start = time.monotonic()
    with pytest.raises(ToolError, match="took too long"):
        sql.call(endless)
    assert time.monotonic() - start < 10


@pytest.mark.skipif(sys.version_info < (3, 11), reason="sqlite3's setlimit is Python 3.11+")
@pytest.mark.parametrize("query", ["SELECT zeroblob(500000000)", "SELECT length(randomblob(900000000))",
                                   "SELECT group_concat(name) FROM (SELECT hex(randomblob(4000)) AS name FROM items)"])
def test_sql_tool_refuses_values_past_its_length_limit(database, query):
    """Before, ``SELECT zeroblob(500000000)`` handed the agent a 2-billion-character observation (3 GB in the
    trainer)."""
    with pytest.raises(ToolError, match="at most 10,000 bytes"):
        tool(sql_tool(database)).call(query)


def test_sql_tool_cuts_a_long_result(database):
    wide = "SELECT " + ", ".join(["hex(randomblob(4000))"] * 50) + " FROM items"
    text = tool(sql_tool(database)).call(wide)
    assert len(text) < 4_100 and text.endswith("... (cut at 4,000 characters)")
