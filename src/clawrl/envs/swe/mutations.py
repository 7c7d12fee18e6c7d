"""Bug injection for the SWE family: small edits of Python source found through its syntax tree.

Each `Mutation` replaces one span of the source text, so the rest of the file keeps its layout and
comments and the bug's diff is a line or two, as a real one would be. The kinds:

- `operator`: an arithmetic operator swapped (`+` and `-`, `*` and `/`, `//` to `/`, `%` to `//`,
  `**` to `*`), also in augmented assignments (`+=` to `-=`);
- `comparison`: a boundary moved or a test inverted (`<` and `<=`, `>` and `>=`, `==` and `!=`,
  `in` and `not in`, `is` and `is not`);
- `boolean`: `and` and `or` swapped; `not` dropped;
- `constant`: an integer off by one (0 and 1 swapped), a float literal with its last digit lost,
  `True` and `False` swapped;
- `condition`: the test of an `if` negated;
- `removal`: a call statement, an augmented assignment or a whole `if` block (a guard)
  deleted, where the block holding it keeps another statement.

A candidate is kept only when the result parses and its syntax tree differs from the original's
(dropping the last digit of `1000.0` changes nothing); which candidates make a real bug is for the
tests to say (`generate.py` runs them).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

_ARITHMETIC_SWAPS: dict[type[ast.operator], tuple[str, str]] = {
    ast.Add: ("+", "-"),
    ast.Sub: ("-", "+"),
    ast.Mult: ("*", "/"),
    ast.Div: ("/", "*"),
    ast.FloorDiv: ("//", "/"),
    ast.Mod: ("%", "//"),
    ast.Pow: ("**", "*"),
}
_COMPARISON_SWAPS: dict[type[ast.cmpop], tuple[str, str]] = {
    ast.Lt: ("<", "<="),
    ast.LtE: ("<=", "<"),
    ast.Gt: (">", ">="),
    ast.GtE: (">=", ">"),
    ast.Eq: ("==", "!="),
    ast.NotEq: ("!=", "=="),
    ast.In: ("in", "not in"),
    ast.NotIn: ("not in", "in"),
    ast.Is: ("is", "is not"),
    ast.IsNot: ("is not", "is"),
}
MUTATION_KINDS = ("operator", "comparison", "boolean", "constant", "condition", "removal")
_BOOLEAN_SWAPS: dict[type[ast.boolop], tuple[str, str]] = {ast.And: ("and", "or"), ast.Or: ("or", "and")}
_NOISE = re.compile(r"[\s()]")  # what may stand beside an operator between its operands


@dataclass(frozen=True)
class Mutation:
    """Replace `source[start:end]` of the file `path` with `replacement`."""

    path: str
    start: int
    end: int
    replacement: str
    kind: str
    line: int

    def apply(self, source: str) -> str:
        return source[: self.start] + self.replacement + source[self.end :]


class _Source:
    """A module's text and tree, with node positions turned into offsets in the text."""

    def __init__(self, path: str, text: str) -> None:
        self.path, self.text = path, text
        self.tree = ast.parse(text)
        self.lines = text.splitlines(keepends=True)
        self.line_starts = [0]
        for line in self.lines:
            self.line_starts.append(self.line_starts[-1] + len(line))

    def offset(self, lineno: int, col_offset: int) -> int:
        """The text offset of an ast position (whose column counts UTF-8 bytes)."""
        line = self.lines[lineno - 1]
        return self.line_starts[lineno - 1] + len(line.encode()[:col_offset].decode(errors="ignore"))

    def start(self, node: ast.AST) -> int:
        return self.offset(node.lineno, node.col_offset)  # type: ignore[attr-defined]

    def end(self, node: ast.AST) -> int:
        return self.offset(node.end_lineno, node.end_col_offset)  # type: ignore[attr-defined]

    def mutation(self, start: int, end: int, replacement: str, kind: str, line: int) -> Mutation:
        return Mutation(self.path, start, end, replacement, kind, line)

    def between(self, left: ast.AST, right: ast.AST, token: str, new_token: str, kind: str) -> Mutation | None:
        """Swap the operator `token` written between two operands; None when anything else stands there."""
        start, end = self.end(left), self.start(right)
        gap = self.text[start:end]
        if _NOISE.sub("", gap) != token.replace(" ", ""):
            return None  # a comment or a line continuation: leave it alone
        at = gap.find(token)
        if at < 0:
            return None
        return self.mutation(start + at, start + at + len(token), new_token, kind, left.lineno)  # type: ignore[attr-defined]


def mutations(path: str, text: str) -> list[Mutation]:
    """Every candidate mutation of the module `text` (stored at `path`), in source order."""
    source = _Source(path, text)
    original = ast.dump(source.tree)
    found: list[Mutation] = []
    for node in ast.walk(source.tree):
        for finder in (_operators, _comparisons, _booleans, _constants, _conditions, _removals):
            found.extend(finder(source, node))
    kept, seen = [], set()
    for mutation in sorted(found, key=lambda item: (item.start, item.end, item.replacement)):
        mutated = mutation.apply(text)
        if mutated not in seen and _changes_the_tree(mutated, original):
            seen.add(mutated)
            kept.append(mutation)
    return kept


def _changes_the_tree(text: str, original_dump: str) -> bool:
    try:
        return ast.dump(ast.parse(text)) != original_dump
    except SyntaxError:
        return False


def _operators(source: _Source, node: ast.AST) -> list[Mutation]:
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC_SWAPS:
        token, new = _ARITHMETIC_SWAPS[type(node.op)]
        found = source.between(node.left, node.right, token, new, "operator")
        return [found] if found else []
    if isinstance(node, ast.AugAssign) and type(node.op) in _ARITHMETIC_SWAPS:
        token, new = _ARITHMETIC_SWAPS[type(node.op)]
        found = source.between(node.target, node.value, token + "=", new + "=", "operator")
        return [found] if found else []
    return []


def _comparisons(source: _Source, node: ast.AST) -> list[Mutation]:
    if not isinstance(node, ast.Compare):
        return []
    found = []
    operands = [node.left, *node.comparators]
    for index, operator in enumerate(node.ops):
        if type(operator) in _COMPARISON_SWAPS:
            token, new = _COMPARISON_SWAPS[type(operator)]
            mutation = source.between(operands[index], operands[index + 1], token, new, "comparison")
            found += [mutation] if mutation else []
    return found


def _booleans(source: _Source, node: ast.AST) -> list[Mutation]:
    if isinstance(node, ast.BoolOp):
        token, new = _BOOLEAN_SWAPS[type(node.op)]
        pairs = zip(node.values, node.values[1:])
        return [mutation for left, right in pairs if (mutation := source.between(left, right, token, new, "boolean"))]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        operand = source.text[source.start(node.operand) : source.end(node.operand)]
        return [source.mutation(source.start(node), source.end(node), operand, "boolean", node.lineno)]
    return []


def _constants(source: _Source, node: ast.AST) -> list[Mutation]:
    if not isinstance(node, ast.Constant):
        return []
    start, end = source.start(node), source.end(node)
    written = source.text[start:end]
    if isinstance(node.value, bool):
        replacement = str(not node.value)
    elif isinstance(node.value, int):
        replacement = {0: "1", 1: "0"}.get(node.value, str(node.value + 1))
    elif isinstance(node.value, float) and written[-1:].isdigit():
        replacement = written[:-1] if written[:-1][-1:].isdigit() else written[:-1] + "0"
    else:
        return []  # strings, bytes, None, and floats in exponent notation
    return [source.mutation(start, end, replacement, "constant", node.lineno)]


def _conditions(source: _Source, node: ast.AST) -> list[Mutation]:
    if not isinstance(node, ast.If) or (isinstance(node.test, ast.UnaryOp) and isinstance(node.test.op, ast.Not)):
        return []  # `if not x` is already covered by dropping the `not`
    start, end = source.start(node.test), source.end(node.test)
    return [source.mutation(start, end, f"not ({source.text[start:end]})", "condition", node.lineno)]


def _removals(source: _Source, node: ast.AST) -> list[Mutation]:
    found = []
    for field in ("body", "orelse"):
        block = getattr(node, field, None)
        if not isinstance(block, list) or len(block) < 2:
            continue  # removing a block's only statement would leave it empty
        for statement in block:
            if _removable(statement) and (mutation := _whole_lines(source, statement)):
                found.append(mutation)
    return found


def _removable(statement: ast.stmt) -> bool:
    if isinstance(statement, ast.Expr):
        return isinstance(statement.value, ast.Call)  # not docstrings
    return isinstance(statement, ast.AugAssign) or (isinstance(statement, ast.If) and not statement.orelse)


def _whole_lines(source: _Source, statement: ast.stmt) -> Mutation | None:
    """Delete the lines of `statement`, when nothing else is written on them (a comment aside)."""
    first, last = source.lines[statement.lineno - 1], source.lines[statement.end_lineno - 1]  # type: ignore[index]
    before = first.encode()[: statement.col_offset].decode(errors="ignore")
    after = last.encode()[statement.end_col_offset :].decode(errors="ignore")  # type: ignore[misc]
    if before.strip() or (after.strip() and not after.strip().startswith("#")):
        return None
    start = source.line_starts[statement.lineno - 1]
    end = source.line_starts[statement.end_lineno]  # type: ignore[index]
    return source.mutation(start, end, "", "removal", statement.lineno)
