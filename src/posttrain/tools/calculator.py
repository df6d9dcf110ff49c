"""A calculator tool that evaluates arithmetic by walking the expression's syntax tree.

Never ``eval``: only numbers, + - * / // % ** and parentheses are accepted, and exponents and
intermediate sizes are bounded so that ``9**9**9`` is an error message, not a hung process.
"""

from __future__ import annotations

import ast
import math
import operator

from posttrain.tools.registry import ToolError

_BINARY = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_DIGITS = 100
MAX_EXPONENT = 1000
MAX_LENGTH = 500


def evaluate_expression(expression: str) -> int | float:
    """The value of an arithmetic expression; :class:`ToolError` says what is wrong with a bad one."""
    text = expression.strip().replace("×", "*").replace("÷", "/").replace("^", "**")
    if not text:
        raise ToolError("empty expression; expected arithmetic such as 12 * (3 + 4)")
    if len(text) > MAX_LENGTH:
        raise ToolError(f"expression longer than {MAX_LENGTH} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise ToolError(f"cannot parse {expression.strip()!r}; expected arithmetic such as 12 * (3 + 4)") from None
    return _value(tree.body)


def _value(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_value(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ToolError(f"exponent {right} is too large (at most {MAX_EXPONENT})")
        try:
            result = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise ToolError("division by zero") from None
        except OverflowError:
            raise ToolError("result too large") from None
        if isinstance(result, complex):
            raise ToolError("result is not a real number")
        if isinstance(result, int) and result.bit_length() > MAX_DIGITS * 3.33:
            raise ToolError(f"result has more than {MAX_DIGITS} digits")
        if isinstance(result, float) and not math.isfinite(result):
            raise ToolError("result too large")
        return result
    raise ToolError(f"unsupported element {ast.unparse(node)!r}; only numbers, + - * / // % ** and parentheses")


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression and return its value.

    Args:
        expression: Arithmetic with numbers, + - * / // % ** and parentheses, e.g. "12 * (3 + 4)".
    """
    value = evaluate_expression(expression)
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        value = int(value)
    elif isinstance(value, float):
        value = round(value, 10)
    return str(value)
