"""The shells stay thin: the policy lives in the flow (DESIGN section 4)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import retrysafe

PACKAGE = Path(retrysafe.__file__).parent
#: Every module of the shells that translate a server interface to the flow.
SHELLS = [
    "asgi.py",
    "wsgi.py",
    "contrib/flask.py",
    "contrib/django/middleware.py",
    "contrib/django/_shell.py",
    "contrib/django/_async_view.py",
    "contrib/django/_sync_view.py",
]
#: The modules that read a request body (the Django shell's reading is in _shell.py).
BODY_READERS = ["asgi.py", "wsgi.py", "contrib/django/_shell.py"]


def _tree(module: str) -> ast.Module:
    return ast.parse((PACKAGE / module).read_text())


def _names(module: str) -> set[str]:
    tree = _tree(module)
    return {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)} | {
        node.id for node in ast.walk(tree) if isinstance(node, ast.Name)
    }


def test_the_asgi_shell_is_at_most_300_lines() -> None:
    lines = (PACKAGE / "asgi.py").read_text().count("\n")
    assert lines <= 300, f"asgi.py has {lines} lines: move policy into the flow"


@pytest.mark.parametrize("shell", SHELLS)
def test_no_shell_reads_the_status_policy_or_touches_the_store(shell: str) -> None:
    # Status policy, fencing and store calls belong to the flow and the runners.
    used = _names(shell)
    for name in ("should_store", "release_statuses", "reserve", "complete", "release", "renew"):
        assert name not in used, f"{shell} uses {name}"


@pytest.mark.parametrize("shell", SHELLS)
def test_no_shell_borrows_private_names_of_another_module(shell: str) -> None:
    # What two shells share is a module of its own with public names (e.g. _body.py).
    for node in ast.walk(_tree(shell)):
        if isinstance(node, ast.ImportFrom) and node.module is not None:  # not `from . import`
            private = [a.name for a in node.names if a.name.startswith("_") and a.name[1] != "_"]
            assert not private, f"{shell} imports {private} from {node.module}"


@pytest.mark.parametrize("shell", BODY_READERS)
def test_a_body_that_ends_early_gets_the_flows_one_answer_on_every_shell(shell: str) -> None:
    # Decided once: the shared readers refuse the body with the flow's client_gone() answer,
    # which every shell sends as it is (Django's shell also for the stream Django itself read).
    used = _names(shell)
    assert {"BodyRefused", "answer"} <= used, f"{shell} decides a cut body itself"
    assert {"BodyRefused", "client_gone"} <= _names("_body.py")
