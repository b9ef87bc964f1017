"""Fork safety: a store used in a process that then forks (gunicorn ``--preload``, Celery's
prefork pool, ``multiprocessing``) opens its own connections in the child.

A child that kept using its parent's sockets would read the parent's replies (and the parent the
child's), and one that closed them politely would end the parent's sessions. So in the child,
right after ``fork`` (``os.register_at_fork``: nothing to check per operation), every registered
object forgets what it inherited: its connections are kept, unused and unclosed, in
:data:`INHERITED` for the life of the process, and its locks are new (one held by another of the
parent's threads at the fork would never be released in the child). The next operation opens
fresh connections, as redis-py's pool does on its pid check.
"""

from __future__ import annotations

import os
import weakref
from typing import Any, Protocol

__all__ = ["INHERITED", "ForkAware", "neuter_socket", "reset_after_fork"]

#: What children inherited and must neither use nor close (closing a psycopg connection sends
#: the server a goodbye on the parent's session; SQLite says never to touch a connection from
#: before ``fork``). Referenced here so that no finalizer runs on them.
INHERITED: list[Any] = []


class ForkAware(Protocol):
    """An object that drops what it inherited in a forked child."""

    def _after_fork(self) -> None: ...


_registered: weakref.WeakSet[Any] = weakref.WeakSet()


class _Held:
    """Stands in :data:`_registered` for an object that takes no weak reference: an instance of
    a class the compiled build compiled (mypyc's native classes have no ``__weakref__``)."""

    __slots__ = ("__weakref__", "obj")

    def __init__(self, obj: ForkAware) -> None:
        self.obj = obj

    def _after_fork(self) -> None:
        self.obj._after_fork()


def reset_after_fork(obj: ForkAware) -> object:
    """Call ``obj._after_fork()`` in every child forked while ``obj`` is alive.

    Returns:
        What ``obj`` keeps (in an attribute) for as long as it lives: ``None`` when ``obj`` is
        weakly referenced, as a Python class's instance is; else what holds ``obj`` in its
        place (compiled classes), which ``obj`` holds in turn: the two go together, when the
        cyclic garbage collector finds them.
    """
    try:
        _registered.add(obj)
    except TypeError:  # cannot create weak reference
        held = _Held(obj)
        _registered.add(held)
        return held
    return None


def neuter_socket(fd: int) -> None:
    """Point an inherited socket's descriptor at ``/dev/null`` in this process only, so that a
    driver's finalizer (libpq's goodbye message) can no longer reach the parent's session."""
    try:
        null = os.open(os.devnull, os.O_RDWR)
    except OSError:
        return
    try:
        os.dup2(null, fd)
    except OSError:
        pass
    finally:
        os.close(null)


def _in_child() -> None:
    for obj in list(_registered):
        obj._after_fork()


os.register_at_fork(after_in_child=_in_child)
