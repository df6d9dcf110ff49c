"""Tools for agents: a registry built from typed functions, and built-in tools."""

from posttrain.tools.calculator import calculator
from posttrain.tools.python_tool import python
from posttrain.tools.registry import Tool, ToolError, ToolRegistry, tool
from posttrain.tools.search import search_tool
from posttrain.tools.sql import sql_tool

__all__ = ["Tool", "ToolError", "ToolRegistry", "calculator", "python", "search_tool", "sql_tool", "tool"]
