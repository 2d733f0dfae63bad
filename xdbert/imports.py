"""Which of this package's modules a script or module runs, read from its import statements.

A module counts when it is imported anywhere in the body, lazily inside a function or not, with the
package `__init__`s that importing it runs; the closure follows imported modules' own imports. Two users:
tests/test_layout.py checks that each stage's dvc.yaml deps are exactly its closure, and the finetuning run
cache keys saved runs by the code of the closure of what a run computes (`xdbert.finetuning.compute.keys`), so an
edit to the grid, a report or an analysis leaves them valid. `root` is the folder that holds the package: a
copy of it, for a test that edits one.
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = "xdbert"
ROOT = Path(__file__).resolve().parents[1]  # the folder that holds the package


def module_file(name: str, root: Path = ROOT) -> Path | None:
    """xdbert.a.b -> xdbert/a/b.py or xdbert/a/b/__init__.py (None outside the package or not a module)."""
    if name != PACKAGE and not name.startswith(PACKAGE + "."):
        return None
    base = root.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def package_modules(root: Path = ROOT) -> list[str]:
    """Every module of the package by dotted name (a subpackage by its `__init__`'s: xdbert.data)."""
    return sorted(".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
                  for p in (root / PACKAGE).rglob("*.py"))


def with_packages(name: str) -> list[str]:
    """Importing xdbert.a.b runs xdbert/__init__.py and xdbert/a/__init__.py first."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def imported_modules(path: Path, root: Path = ROOT) -> set[str]:
    """Every xdbert module `path` imports anywhere in its body, by dotted name."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            out |= {m for m in with_packages(name) if module_file(m, root)}
    return out


def closure(script: Path, root: Path = ROOT) -> set[Path]:
    """The script and every package module it runs, followed through imports transitively."""
    seen: set[str] = set()
    todo = list(imported_modules(script, root))
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += imported_modules(module_file(name, root), root)
    return {script} | {module_file(m, root) for m in seen}
