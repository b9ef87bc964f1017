"""The Django middleware is a shell like the ASGI and WSGI ones: it translates, the flow decides
(DESIGN section 4)."""

from __future__ import annotations

import ast
from pathlib import Path

import retrysafe.contrib.django.middleware as middleware


def test_the_django_shell_reads_no_status_policy_and_never_touches_the_store() -> None:
    tree = ast.parse(Path(middleware.__file__).read_text())
    used = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    used |= {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    for name in ("should_store", "release_statuses", "reserve", "complete", "release", "renew"):
        assert name not in used, f"the Django middleware uses {name}"
