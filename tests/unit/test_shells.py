"""The shells stay thin: the policy lives in the flow (DESIGN section 4)."""

from __future__ import annotations

import ast
from pathlib import Path

import retrysafe

PACKAGE = Path(retrysafe.__file__).parent


def test_the_asgi_shell_is_at_most_300_lines() -> None:
    lines = (PACKAGE / "asgi.py").read_text().count("\n")
    assert lines <= 300, f"asgi.py has {lines} lines: move policy into _flow.py"


def _names(module: str) -> set[str]:
    tree = ast.parse((PACKAGE / module).read_text())
    return {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)} | {
        node.id for node in ast.walk(tree) if isinstance(node, ast.Name)
    }


def test_no_shell_reads_the_status_policy_or_touches_the_store() -> None:
    # Status policy, fencing and store calls belong to the flow and the runners.
    for shell in ("asgi.py", "wsgi.py"):
        used = _names(shell)
        for name in ("should_store", "release_statuses", "reserve", "complete", "release"):
            assert name not in used, f"{shell} uses {name}"
