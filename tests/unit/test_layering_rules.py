"""The layout's rules (docs/design.md, "Layout"), each kept by a test over the import graph read
from the source (:mod:`tests.unit.imports`: every import, lazy ones inside functions included).

Modules are found by folder (the first name under ``retrysafe/``): a module added to a folder is
checked without being listed here, and a new folder fails
:func:`test_every_folder_has_a_layer` until it is given one. A failure names each offending
import as ``file:line -> module (names)``. The core's own rule (it imports nothing outside
``_core/``, no event loop, thread or framework) is ``flow/test_layering.py``.
"""

from __future__ import annotations

from .imports import MODULES, PACKAGE, Import, closure, every_import, folder, imports_of, source

#: Each folder's layer, lowest first: an import may go to its own layer or a lower one, never
#: up. ``""`` is the package's ``__init__`` (the public API: it re-exports, see below).
LAYERS: dict[str, int] = {
    # 0: the sans-I/O core
    "_core": 0,
    # 1: backends
    "stores": 1,
    # 2: runners
    "_async": 2,
    "_sync": 2,
    # 3: shells and faces, and what works on a store from outside a request
    "_body": 3,
    "_asgi_routes": 3,
    "_asgi_startup": 3,
    "asgi": 3,
    "wsgi": 3,
    "calls": 3,
    "functions": 3,
    "consumer": 3,
    "client": 3,
    "ops": 3,
    # 4: integrations over the shells
    "contrib": 4,
    "proxy": 4,
    # 5: test helpers over the integrations
    "testing": 5,
    # 6: programs, not library
    "demo": 6,
    "cli": 6,
    "__main__": 6,
    "": 6,
}
#: Folders that are no library: nothing else imports them.
PROGRAMS = ("demo", "cli", "__main__")
#: Backends: they import the core and each other's shared parts, never a front.
BACKENDS = ("stores",)
BACKENDS_MAY_IMPORT = ("_core", "stores")
#: Third-party frameworks (and servers) a CLI subcommand may need, and the demo.
WEB = {"starlette", "fastapi", "flask", "werkzeug", "django", "rest_framework", "aiohttp", "grpc"}
SERVERS = {"uvicorn", "gunicorn", "httptools"}
QUEUES = {"celery", "kombu", "dramatiq"}
OBSERVERS = {"prometheus_client", "opentelemetry"}
FRAMEWORKS = frozenset(WEB | SERVERS | QUEUES | OBSERVERS)
CLI = f"{PACKAGE}.cli"


#: Known breaks, each in a file another change is reshaping; the test names them so they are
#: not forgotten, and fails once they are gone so this list shrinks with them.
def _in(module: str, folders: tuple[str, ...]) -> bool:
    return folder(module) in folders


def _report(found: list[Import]) -> str:
    return "\n".join(str(i) for i in found)


def _internal() -> list[Import]:
    return [i for i in every_import() if i.internal]


def test_every_folder_has_a_layer() -> None:
    assert sorted({folder(m) for m in MODULES} - set(LAYERS)) == []


def test_contrib_never_imports_the_cli() -> None:
    found = [i for i in _internal() if _in(i.source, ("contrib",)) and folder(i.target) == "cli"]
    assert found == [], _report(found)


def test_no_library_module_imports_the_demo_or_the_cli() -> None:
    found = [
        i for i in _internal() if not _in(i.source, PROGRAMS) and _in(i.target, ("demo", "cli"))
    ]
    assert found == [], _report(found)


def _private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def test_the_demo_imports_no_private_name_of_another_package() -> None:
    found = [
        i
        for i in _internal()
        if _in(i.source, ("demo",))
        and not _in(i.target, ("demo",))
        and (any(_private(p) for p in i.target.split(".")) or any(map(_private, i.names)))
    ]
    assert found == [], _report(found)


def test_backends_never_import_a_front() -> None:
    found = [
        i for i in _internal() if _in(i.source, BACKENDS) and not _in(i.target, BACKENDS_MAY_IMPORT)
    ]
    assert found == [], _report(found)


def _parser_functions() -> set[str]:
    """The functions of ``cli.py`` that building the parser runs: ``build_parser`` and what it
    calls, transitively (by name, within the module)."""
    import ast

    path = source(CLI)
    assert path is not None
    tree = ast.parse(path.read_text(encoding="utf-8"))
    defs = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    todo, seen = ["build_parser"], set()
    while todo:
        name = todo.pop()
        if name in seen or name not in defs:
            continue
        seen.add(name)
        todo += [
            node.func.id
            for node in ast.walk(defs[name])
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        ]
    return seen


def test_the_cli_imports_a_framework_only_in_the_subcommand_serving_it() -> None:
    # What every command runs: cli.py's module level and the parser's construction, and all
    # that those imports load when they run (package __init__s included).
    parser = _parser_functions()
    assert {"build_parser", "_proxy_parser", "_store_arg"} <= parser
    every_command = [
        i for i in imports_of(CLI) if i.function is None or i.function.split(".")[0] in parser
    ]
    found = [i for i in every_command if not i.internal and i.target in FRAMEWORKS]
    starts = {i.target for i in every_command if i.internal and not i.typing_only}
    for module, reached in closure(starts, at_import_time=True, parents=True).items():
        if _in(module, ("demo",)):
            found += [i for i in every_command if i.target == module]
        found += [i for i in reached if not i.internal and i.target in FRAMEWORKS]
    assert found == [], _report(found)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_modules_imported_at_import_time_form_no_circle() -> None:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for i in _internal():
        if i.at_import_time and i.target != i.source and i.target in graph:
            graph[i.source].add(i.target)
    cycles = _cycles(graph)
    edges = [
        i
        for cycle in cycles
        for member in cycle
        for i in imports_of(member)
        if i.at_import_time and i.target in cycle
    ]
    assert cycles == [], _report(edges)


def _upward(i: Import) -> bool:
    # Re-exports: a package's __init__ gathers names from below it; the package itself
    # (``from retrysafe import IdempotencyConfig``) is the public API, imported from anywhere.
    path = source(i.source)
    if path is not None and path.name == "__init__.py":
        return False
    if i.target == PACKAGE:
        return False
    return LAYERS[folder(i.target)] > LAYERS[folder(i.source)]


def test_no_import_goes_up_a_layer_outside_re_exports() -> None:
    found = [i for i in _internal() if folder(i.source) != folder(i.target) and _upward(i)]
    assert found == [], _report(found)


def test_the_folders_form_no_circle() -> None:
    # Lazy imports count: a circle of folders is a circle of the design, however it is loaded.
    graph: dict[str, set[str]] = {}
    for i in _internal():
        if i.target == PACKAGE:
            continue
        if folder(i.source) not in ("", folder(i.target)):
            graph.setdefault(folder(i.source), set()).add(folder(i.target))
    cycles = _cycles(graph)
    edges = [
        i
        for cycle in cycles
        for i in _internal()
        if folder(i.source) in cycle
        and folder(i.target) in cycle
        and folder(i.source) != folder(i.target)
    ]
    assert cycles == [], _report(edges)
