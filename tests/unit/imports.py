"""The package's import graph, read from the source with :mod:`ast` (for the layering tests).

Every ``import`` of every module of ``src/retrysafe`` is found, with its line, whether it runs
at import time (module level), only inside a function (lazily), or only for the type checker
(``if TYPE_CHECKING:``), and the package module or external top-level name it reaches.
Importing the modules would not do: ``import retrysafe._core.http`` runs
``retrysafe/__init__.py`` first, and a lazy import inside a function would never be seen.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import retrysafe

PACKAGE = "retrysafe"
ROOT = Path(retrysafe.__file__).parent

#: Every source of the package, parsed once when this module is imported: CPython 3.11.7's
#: ``ast.parse`` can fail with "AST constructor recursion depth mismatch" after an unrelated test
#: left the interpreter's recursion counter off (gh-106905), so no parse waits for the tests.
TREES = {
    path: ast.parse(path.read_text(encoding="utf-8"), str(path)) for path in ROOT.rglob("*.py")
}


def module_name(path: Path) -> str:
    """``retrysafe.stores.postgres`` for ``stores/postgres/__init__.py``."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join((PACKAGE, *parts))


MODULES = frozenset(module_name(path) for path in TREES)


def source(module: str) -> Path | None:
    """The source file of a package module, or ``None`` when there is none."""
    base = ROOT.joinpath(*module.split(".")[1:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def folder(module: str) -> str:
    """The first name under the package (``stores`` for ``retrysafe.stores.redis._lean``, ``cli``
    for ``retrysafe.cli``); ``""`` for the package itself."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


@dataclass(frozen=True, slots=True)
class Import:
    """One imported module (an ``import a, b`` or ``from x import a, b`` line gives several).

    Attributes:
        source: the importing module.
        line: its line.
        target: the package module imported (the deepest that exists), or the external
            top-level name (``asyncio``).
        names: the names a ``from`` import takes from ``target`` (``()`` for ``import x``).
        function: the function the import runs in, ``None`` at module level.
        typing_only: under ``if TYPE_CHECKING:`` (never runs).
    """

    source: str
    line: int
    target: str
    names: tuple[str, ...]
    function: str | None
    typing_only: bool

    @property
    def internal(self) -> bool:
        """Whether it imports a module of the package."""
        return self.target == PACKAGE or self.target.startswith(PACKAGE + ".")

    @property
    def at_import_time(self) -> bool:
        """Whether it runs when its module is imported (module level, not type checking)."""
        return self.function is None and not self.typing_only

    def __str__(self) -> str:
        path = source(self.source)
        where = path.relative_to(ROOT.parent) if path else self.source
        names = f" ({', '.join(self.names)})" if self.names else ""
        return f"{where}:{self.line} -> {self.target}{names}"


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _resolve(name: str) -> str:
    """The deepest package module ``name`` names (``retrysafe.stores.Store`` -> stores)."""
    while name not in MODULES and "." in name:
        name = name.rpartition(".")[0]
    return name


class _Finder(ast.NodeVisitor):
    def __init__(self, module: str, is_package: bool) -> None:
        self.module = module
        self.package = module if is_package else module.rpartition(".")[0]
        self.functions: list[str] = []
        self.typing_only = 0
        self.found: list[Import] = []

    def _add(self, node: ast.stmt, target: str, names: Iterable[str] = ()) -> None:
        function = ".".join(self.functions) or None
        typing_only = self.typing_only > 0
        if target != PACKAGE and not target.startswith(PACKAGE + "."):
            target = target.partition(".")[0]
            self.found.append(Import(self.module, node.lineno, target, (), function, typing_only))
            return
        names = tuple(names)
        submodules = [n for n in names if n != "*" and f"{target}.{n}" in MODULES]
        for name in submodules:  # ``from .stores import _base`` imports the module ``_base``
            self.found.append(
                Import(self.module, node.lineno, f"{target}.{name}", (), function, typing_only)
            )
        rest = tuple(n for n in names if n not in submodules)
        if rest or not submodules:
            self.found.append(
                Import(self.module, node.lineno, _resolve(target), rest, function, typing_only)
            )

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(node, alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        names = [alias.name for alias in node.names]
        if node.level == 0:
            assert node.module is not None
            if node.module != "__future__":
                self._add(node, node.module, names)
            return
        base = self.package.split(".")
        if node.level > 1:
            base = base[: -(node.level - 1)]
        self._add(node, ".".join(base + ([node.module] if node.module else [])), names)

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.functions.append(node.name)
        self.generic_visit(node)
        self.functions.pop()

    visit_FunctionDef = _function
    visit_AsyncFunctionDef = _function

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        # A class body runs at import time: its imports are the module's.
        self.generic_visit(node)

    def visit_If(self, node: ast.If) -> None:
        if not _is_type_checking(node.test):
            self.generic_visit(node)
            return
        self.typing_only += 1
        for child in node.body:
            self.visit(child)
        self.typing_only -= 1
        for child in node.orelse:
            self.visit(child)


@cache
def imports_of(module: str) -> tuple[Import, ...]:
    """Every import in ``module``'s source."""
    path = source(module)
    assert path is not None, f"no source for {module}"
    finder = _Finder(module, path.name == "__init__.py")
    finder.visit(TREES.get(path) or ast.parse(path.read_text(encoding="utf-8"), str(path)))
    return tuple(finder.found)


def every_import() -> Iterator[Import]:
    """Every import of every module of the package."""
    for module in sorted(MODULES):
        yield from imports_of(module)


def closure(
    start: Iterable[str], *, at_import_time: bool = False, parents: bool = False
) -> dict[str, list[Import]]:
    """Every package module reachable from ``start``, with the imports that reach further.

    Args:
        start: the modules to start from.
        at_import_time: follow only the imports that run when a module is imported.
        parents: importing ``a.b.c`` runs the ``__init__`` of ``a`` and ``a.b`` first: follow
            those too (what a real import loads; the core's own check leaves them out).
    """
    seen: dict[str, list[Import]] = {}
    todo = list(start)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        found = [i for i in imports_of(module) if i.at_import_time or not at_import_time]
        seen[module] = found
        todo.extend(i.target for i in found if i.internal and source(i.target) is not None)
        parent = module.rpartition(".")[0]
        if parents and parent and parent not in seen:
            todo.append(parent)
    return seen
