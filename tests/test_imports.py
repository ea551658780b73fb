"""The import graph runs one way (docs/architecture.md, "Layout"): the engine, executors,
models, data and devices never import the strategies, and no two modules import each other
(directly or through others). Lazy imports inside functions and ``TYPE_CHECKING`` imports
count: a circle there is still a circle in the design."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

PKG = REPO / "src" / "fedclock"
LOWER = ("train", "sim", "models", "data", "devices")
#: docs/architecture.md's package order: each imports only packages before it
ORDER = (
    "errors", "rng", "logs", "outputs", "config", "presets", "data", "devices", "models",
    "sim", "metrics", "train", "strategies", "experiment", "deploy", "runs", "report", "tour",
    "cli",
)  # fmt: skip


def _module(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module → the fedclock modules it imports (a name imported from a package counts as
    the submodule when there is one, else the package)."""
    modules = {_module(p): p for p in PKG.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        out: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module.split(".")[0] != "fedclock":
                    continue
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    out.add(sub if sub in modules else node.module)
            elif isinstance(node, ast.Import):
                out.update(a.name for a in node.names if a.name.split(".")[0] == "fedclock")
        graph[name] = {m for m in out if m in modules and m != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_finds_a_planted_circle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_lower_layers_never_import_the_strategies() -> None:
    graph = import_graph()
    assert "fedclock.strategies.salf" in graph  # the walk sees the package
    upward = {
        m: sorted(t for t in targets if t.startswith("fedclock.strategies"))
        for m, targets in graph.items()
        if m.split(".")[1:2] and m.split(".")[1] in LOWER
    }
    assert {m: t for m, t in upward.items() if t} == {}


def test_no_import_circles() -> None:
    """config.py knows no strategy: each strategy's options class lives there and the
    registry points at it, so strategies → config only."""
    assert cycles(import_graph()) == []
    assert not {t for t in import_graph()["fedclock.config"] if t.startswith("fedclock.strategies")}


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""  # "": the package root (__version__)


def test_packages_import_only_packages_before_them() -> None:
    graph = import_graph()
    packages = {_package(m) for m in graph} - {"", "__main__"}
    assert packages <= set(ORDER), f"place {sorted(packages - set(ORDER))} in ORDER and the docs"
    upward = sorted(
        f"{m} -> {t}"
        for m, targets in graph.items()
        for t in targets
        if _package(m) in ORDER
        and _package(t) in ORDER
        and ORDER.index(_package(t)) > ORDER.index(_package(m))
    )
    assert upward == []


def test_the_documented_order_is_the_tested_one() -> None:
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    doc = text.split("**Imports run one way.**", 1)[1].split("(and", 1)[0]
    import re

    assert tuple(re.findall(r"`(\w+)`", doc)) == ORDER


def test_a_function_over_80_lines_says_why() -> None:
    """Issue 42: no function longer than 80 lines (decorators included) without a comment
    just above its ``def`` (or its decorators) saying why it is not split ("over 80
    lines: …")."""
    bare = []
    for path in sorted(PKG.rglob("*.py")):
        lines = path.read_text(encoding="utf-8").splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            start = min([d.lineno for d in node.decorator_list] + [node.lineno])
            if (node.end_lineno or node.lineno) - start + 1 <= 80:
                continue
            # the comment lines right above the first decorator, and any between the
            # decorators and the def
            above = []
            at = start - 2
            while at >= 0 and lines[at].lstrip().startswith("#"):
                above.append(lines[at])
                at -= 1
            above += lines[start - 1 : node.lineno - 1]
            if "over 80 lines" not in " ".join(above):
                bare.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}")
    assert not bare, f"over 80 lines without a comment saying why: {bare}"
