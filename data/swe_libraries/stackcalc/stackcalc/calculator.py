"""Evaluating an expression in reverse Polish notation with a stack."""

BINARY = ("+", "-", "*", "/", "%", "^")
UNARY = ("neg", "abs")


class CalcError(Exception):
    """The expression cannot be evaluated."""


def parse_number(token):
    """An int when the token is one, else a float; CalcError for anything else."""
    try:
        return int(token)
    except ValueError:
        pass
    try:
        return float(token)
    except ValueError:
        raise CalcError(f"unknown token {token!r}") from None


def apply_binary(operator, left, right):
    if operator == "+":
        return left + right
    if operator == "-":
        return left - right
    if operator == "*":
        return left * right
    if operator == "^":
        return left**right
    if right == 0:
        raise CalcError("division by zero")
    if operator == "%":
        return left % right
    return left / right


def apply_unary(operator, value):
    if operator == "neg":
        return -value
    return abs(value)


def _pop(stack, count, token):
    if len(stack) < count:
        raise CalcError(f"{token!r} needs {count} values, the stack has {len(stack)}")
    values = stack[len(stack) - count :]
    del stack[len(stack) - count :]
    return values


def evaluate(expression):
    """The value of `expression`; exactly one value must remain on the stack."""
    stack = []
    for token in expression.split():
        if token in BINARY:
            left, right = _pop(stack, 2, token)
            stack.append(apply_binary(token, left, right))
        elif token in UNARY:
            (value,) = _pop(stack, 1, token)
            stack.append(apply_unary(token, value))
        elif token == "dup":
            (value,) = _pop(stack, 1, token)
            stack.extend([value, value])
        elif token == "swap":
            left, right = _pop(stack, 2, token)
            stack.extend([right, left])
        else:
            stack.append(parse_number(token))
    if len(stack) != 1:
        raise CalcError(f"expected one result, the stack has {len(stack)} values")
    return stack[0]
