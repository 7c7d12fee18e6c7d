"""Writing a reverse Polish expression in the usual infix notation."""

from stackcalc.calculator import BINARY, UNARY, CalcError


def to_infix(expression):
    """The expression with infix operators, every binary operation in parentheses: `(3 + 4)`."""
    stack = []
    for token in expression.split():
        if token in BINARY:
            if len(stack) < 2:
                raise CalcError(f"{token!r} needs 2 values")
            right = stack.pop()
            left = stack.pop()
            stack.append(f"({left} {token} {right})")
        elif token in UNARY:
            if not stack:
                raise CalcError(f"{token!r} needs 1 value")
            stack.append(f"{token}({stack.pop()})")
        else:
            stack.append(token)
    if len(stack) != 1:
        raise CalcError(f"expected one result, the stack has {len(stack)} values")
    return stack[0]
