"""Read named SQL statements from the package's ``.sql`` files.

A file holds several statements, each introduced by a ``-- name: NAME`` line.
"""

from __future__ import annotations

import functools
from importlib import resources

__all__ = ["load_queries"]


@functools.cache
def load_queries(filename: str) -> dict[str, str]:
    """Return ``{name: statement}`` for ``retrysafe/stores/sql/<filename>``."""
    text = resources.files("retrysafe.stores").joinpath("sql", filename).read_text("utf-8")
    queries: dict[str, str] = {}
    name: str | None = None
    lines: list[str] = []
    for line in text.splitlines():
        if line.startswith("-- name:"):
            if name is not None:
                queries[name] = "\n".join(lines).strip().rstrip(";")
            name = line.split(":", 1)[1].strip()
            lines = []
        elif name is not None:
            lines.append(line)
    if name is not None:
        queries[name] = "\n".join(lines).strip().rstrip(";")
    return queries
