"""docs/architecture.md's layer table is the code's: every package's clawrl imports, as the code has them.

Every import counts, also one inside a function. A failure prints the table as the code has it.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "src" / "clawrl"
TABLE_LINE = re.compile(r"^(\S+)\s+->\s*(.*)$")


def unit_of(path: Path) -> str:
    """A file's unit: its top-level package, or the top-level module itself (`clawrl` for the package's own files)."""
    parts = path.relative_to(SOURCE).parts
    if len(parts) > 1:
        return parts[0]
    return "clawrl" if parts[0] in ("__init__.py", "__main__.py") else parts[0].removesuffix(".py")


def imported_units(tree: ast.AST) -> set[str]:
    units = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.split(".")[0] == "clawrl":
            parts = node.module.split(".")
            units |= {parts[1]} if len(parts) > 1 else {alias.name for alias in node.names}
        elif isinstance(node, ast.Import):
            units |= {alias.name.split(".")[1] for alias in node.names if alias.name.startswith("clawrl.")}
    return units


def code_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for path in SOURCE.rglob("*.py"):
        unit = unit_of(path)
        graph[unit] |= imported_units(ast.parse(path.read_text(encoding="utf-8"))) - {unit}
    return dict(graph)


def documented_graph() -> dict[str, set[str]]:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = text.split("## The layers", 1)[1].split("```", 2)[1]
    graph = {}
    for line in block.splitlines():
        if match := TABLE_LINE.match(line.strip()):
            graph[match[1]] = {name.strip() for name in match[2].split(",") if name.strip() not in ("", "-")}
    return graph


def as_table(graph: dict[str, set[str]]) -> str:
    return "\n".join(f"{unit:<16} -> {', '.join(sorted(graph[unit])) or '-'}" for unit in sorted(graph))


def test_the_documented_layers_are_the_imports_of_the_code() -> None:
    code, documented = code_graph(), documented_graph()
    assert documented == code, f"docs/architecture.md should read (in any order):\n{as_table(code)}"


def test_the_layer_rules_of_the_design_hold() -> None:
    """DESIGN §11: serve never imports train, train never imports engines; versions and model sit below both."""
    code = code_graph()
    assert "train" not in code["serve"] and "engines" not in code["train"]
    assert not code["versions"] & {"engines", "train", "serve"} and not code["model"] & {"engines", "train", "serve"}


MAX_MODULE_LINES = 600  # a file longer than this holds more than one concern (issue 29)


def test_every_module_is_short_enough_to_read_top_to_bottom() -> None:
    long = {str(path.relative_to(SOURCE)): count for path in SOURCE.rglob("*.py")
            if (count := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}  # fmt: skip
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"


def test_the_store_exposes_one_facet_per_concern() -> None:
    """Callers reach the store's concerns through its facets (`store.turns`, `store.judging`,
    `store.training`, `store.episodes`), never by wrapping a store in a facet class themselves."""
    wrapping = re.compile(r"\b(TurnStore|JudgingStore|TrainingStore|EpisodeStore)\(")
    offenders = [str(path.relative_to(ROOT)) for path in [*SOURCE.rglob("*.py"), *(ROOT / "tests").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")]
                 if path.parent.name != "store" and wrapping.search(path.read_text(encoding="utf-8"))]  # fmt: skip
    assert not offenders, offenders
