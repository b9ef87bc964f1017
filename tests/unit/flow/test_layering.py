"""The core is sans-I/O: no module of ``retrysafe/_core/`` imports an event loop, a thread
primitive, a framework, or anything of the package outside ``_core/`` (runners, shells, stores).

The core is found by folder: a module added to ``_core/`` is checked without being listed here.
Read from the source with :mod:`ast` (every ``import``, including ones inside functions and
under ``TYPE_CHECKING``), following imports within the package transitively. Importing the
modules would not do: ``import retrysafe._core.http`` runs ``retrysafe/__init__.py`` first, which
loads the shells and stores.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

import pytest

import retrysafe

PACKAGE = "retrysafe"
ROOT = Path(retrysafe.__file__).parent
CORE = f"{PACKAGE}._core"


def _core_modules() -> frozenset[str]:
    found = set()
    for path in (ROOT / "_core").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found.add(".".join((PACKAGE, *parts)))
    return frozenset(found)


CORE_MODULES = _core_modules()

#: Every source of the package, parsed once when this module is collected: CPython 3.11.7's
#: ``ast.parse`` can fail with "AST constructor recursion depth mismatch" after an unrelated test
#: left the interpreter's recursion counter off (gh-106905), so no parse waits for the tests.
_TREES = {
    path: ast.parse(path.read_text(encoding="utf-8"), str(path)) for path in ROOT.rglob("*.py")
}

FORBIDDEN_EXTERNAL = frozenset(
    {
        "asyncio",
        "threading",
        "_thread",
        "concurrent",
        "multiprocessing",
        "trio",
        "anyio",
        "sniffio",
        "starlette",
        "fastapi",
        "django",
        "flask",
        "werkzeug",
        "litestar",
        "uvicorn",
        "gunicorn",
    }
)


def _path(module: str) -> Path | None:
    """The source file of a package module, or ``None`` when there is none."""
    parts = module.split(".")[1:]
    base = ROOT.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imports(module: str) -> tuple[set[str], set[str]]:
    """``(package modules, top-level external names)`` that ``module``'s source imports."""
    path = _path(module)
    assert path is not None, f"no source for {module}"
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    internal: set[str] = set()
    external: set[str] = set()

    def add(name: str, names: Iterable[str] = ()) -> None:
        if name != PACKAGE and not name.startswith(PACKAGE + "."):
            external.add(name.partition(".")[0])
            return
        found_submodule = False
        for alias in names:  # ``from .stores import _base`` imports the module ``_base``
            if alias != "*" and _path(f"{name}.{alias}") is not None:
                internal.add(f"{name}.{alias}")
                found_submodule = True
        if not found_submodule:
            internal.add(name)

    for node in ast.walk(
        _TREES.get(path) or ast.parse(path.read_text(encoding="utf-8"), str(path))
    ):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            names = [alias.name for alias in node.names]
            if node.level == 0:
                assert node.module is not None
                if node.module != "__future__":
                    add(node.module, names)
                continue
            base = package.split(".")
            if node.level > 1:
                base = base[: -(node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
            add(target, names)
    return internal, external


def _closure(start: Iterable[str]) -> dict[str, tuple[set[str], set[str]]]:
    """Every package module reachable from ``start``, with what each imports."""
    seen: dict[str, tuple[set[str], set[str]]] = {}
    todo = list(start)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen[module] = _imports(module)
        todo.extend(m for m in seen[module][0] if _path(m) is not None)
    return seen


@pytest.mark.parametrize("module", sorted(CORE_MODULES))
def test_a_core_module_imports_no_event_loop_thread_or_framework(module: str) -> None:
    reached = _closure([module])
    offenders = {
        name: sorted(external & FORBIDDEN_EXTERNAL)
        for name, (_, external) in reached.items()
        if external & FORBIDDEN_EXTERNAL
    }
    assert offenders == {}


@pytest.mark.parametrize("module", sorted(CORE_MODULES))
def test_a_core_module_reaches_nothing_outside_the_core(module: str) -> None:
    reached = _closure([module])
    outside = {
        name: sorted(internal - CORE_MODULES)
        for name, (internal, _) in reached.items()
        if internal - CORE_MODULES
    }
    assert outside == {}


def test_the_core_is_found_by_folder() -> None:
    # Guards the finder and the resolver: each layer reaches the modules it is built from.
    assert {f"{CORE}.operation", f"{CORE}.http", f"{CORE}.call", f"{CORE}.errors"} <= CORE_MODULES
    reached = set(_closure([f"{CORE}.http"]))
    assert {f"{CORE}.operation", f"{CORE}.codec", f"{CORE}.keys", f"{CORE}.scope"} <= reached
    assert {f"{CORE}.operation", f"{CORE}.keys"} <= set(_closure([f"{CORE}.call"]))


def test_a_module_outside_the_core_is_not_taken_for_it() -> None:
    assert f"{PACKAGE}.asgi" not in CORE_MODULES
    assert not any(m.startswith(f"{PACKAGE}.stores") for m in CORE_MODULES)


def test_the_check_sees_asyncio_behind_the_async_runner() -> None:
    # The runner imports asyncio only through ``_async/_keeper.py``: found transitively.
    reached = _closure([f"{PACKAGE}._async.runner"])
    assert "asyncio" in reached[f"{PACKAGE}._async._keeper"][1]
    assert "asyncio" not in reached[f"{PACKAGE}._async.runner"][1]
    assert f"{CORE}.transaction" in reached[f"{PACKAGE}._async.runner"][0]


def test_the_check_resolves_parent_relative_and_submodule_imports() -> None:
    internal, external = _imports(f"{PACKAGE}._async.runner")
    assert {f"{CORE}.operation", f"{PACKAGE}.stores._base", f"{PACKAGE}._async._keeper"} <= internal
    assert "collections" in external


def test_the_http_and_call_layers_share_only_the_operation() -> None:
    # Each layer is built on the keyed operation; neither reaches the other.
    assert f"{CORE}.call" not in _closure([f"{CORE}.http"])
    assert f"{CORE}.http" not in _closure([f"{CORE}.call"])
    assert f"{CORE}.http" not in _closure([f"{CORE}.operation"])
