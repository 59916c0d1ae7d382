"""Example tools for a multi-turn rollout (docs/agents.md): each is a plain function with type hints and a
Google-style docstring, from which easyrl builds the JSON schema the chat template shows the model.

    worker.rollout.multi_turn.tools=[examples/agents/tools.py:calculator]
"""

import ast
import operator

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.Pow: operator.pow, ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Mod: operator.mod}


def _eval(node):
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.left), _eval(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.operand))
    raise ValueError("only numbers and + - * / % ** are allowed")


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly as written.

    Args:
        expression: the expression, with numbers, parentheses and + - * / % ** only, e.g. "(3 + 4) * 12".
    """
    value = _eval(ast.parse(expression, mode="eval"))
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"
