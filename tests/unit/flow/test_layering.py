"""The core is sans-I/O: no module of ``retrysafe/_core/`` imports an event loop, a thread
primitive, a framework, or anything of the package outside ``_core/`` (runners, shells, stores).

The core is found by folder: a module added to ``_core/`` is checked without being listed here.
Read from the source with :mod:`ast` (every ``import``, including ones inside functions and
under ``TYPE_CHECKING``), following imports within the package transitively. Importing the
modules would not do: ``import retrysafe._core.http`` runs ``retrysafe/__init__.py`` first, which
loads the shells and stores.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from ..imports import MODULES, PACKAGE, closure, imports_of

CORE = f"{PACKAGE}._core"
CORE_MODULES = frozenset(m for m in MODULES if m == CORE or m.startswith(CORE + "."))

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


def _imports(module: str) -> tuple[set[str], set[str]]:
    """``(package modules, top-level external names)`` that ``module``'s source imports."""
    found = imports_of(module)
    return {i.target for i in found if i.internal}, {i.target for i in found if not i.internal}


def _closure(start: Iterable[str]) -> dict[str, tuple[set[str], set[str]]]:
    """Every package module reachable from ``start``, with what each imports."""
    return {module: _imports(module) for module in closure(start)}


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
