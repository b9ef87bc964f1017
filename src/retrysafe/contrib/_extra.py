"""The guard around a contrib module's imports of its optional library."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def extra(name: str) -> Iterator[None]:
    """Turn an ``ImportError`` of the block into one that names the extra to install.

    ``retrysafe.contrib.<name>`` is behind the extra ``<name>``: without it, importing the module
    says ``retrysafe.contrib.<name> needs: pip install 'retrysafe[<name>]'``, chained to the
    original error (which names the missing library).
    """
    try:
        yield
    except ImportError as exc:
        raise ImportError(
            f"retrysafe.contrib.{name} needs: pip install 'retrysafe[{name}]'"
        ) from exc
