"""What the compiled build (mypyc, ``scripts/compile.py``) needs said in the source.

Never compiled itself, and free of mypyc at run time: :func:`mypyc_attr` is mypy_extensions'
decorator to the type checker and to mypyc, which read it from the source, and does nothing
when the code runs (the pure build needs no mypy_extensions).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["mypyc_attr"]

if TYPE_CHECKING:
    from mypy_extensions import mypyc_attr as mypyc_attr
else:

    def mypyc_attr(*attrs: str, **kwattrs: object) -> Any:
        """mypyc's class options (``allow_interpreted_subclasses``, ``native_class``); a no-op
        here."""
        return lambda cls: cls
