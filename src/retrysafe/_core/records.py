"""What a store keeps for one scoped key, and the fencing tokens that guard it.

A store keeps one :class:`Record` per scoped key; :class:`Reservation` is what the single atomic
``reserve`` answers. Tokens are unique per process and host; their per-process prefix is the
process's instance id (owner liveness).
"""

from __future__ import annotations

import itertools
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "Record",
    "RecordState",
    "Reservation",
    "instance_id",
    "lease_token",
    "new_owned_token",
    "new_token",
    "other_owner",
    "token_owner",
]

RecordState = Literal["in_progress", "completed"]


class _Tokens:
    """Fencing tokens: a random per-process prefix and a counter.

    Tokens must be unique across every process and host that shares a store, never secret (they
    never leave the server). A random 96-bit prefix per process (renewed after ``fork``) plus a
    counter is that, at a fraction of the cost of reading the OS random source per request.
    """

    def __init__(self) -> None:
        self.reset()
        os.register_at_fork(after_in_child=self.reset)

    def reset(self) -> None:
        # The prefix doubles as the process's instance id (owner liveness): renewed after fork,
        # so a child never passes for its parent.
        self.prefix = secrets.token_hex(12)
        self.counter = itertools.count(1)

    def __call__(self) -> str:
        return f"{self.prefix}{next(self.counter):x}"

    def owned(self) -> str:
        # The dash marks "this owner's liveness can be checked": a token without it (an older
        # version, or a store whose liveness signal is not up) is only ever taken over after
        # its lease, never because its owner looks dead.
        return f"{self.prefix}{_OWNER_MARK}{next(self.counter):x}"


_OWNER_MARK = "-"
_INSTANCE_LENGTH = 24

new_token = _Tokens()
"""Return a fresh reservation token, unique across processes and hosts."""


def new_owned_token() -> str:
    """Return a fresh token that names this process as its owner (see :func:`token_owner`).

    A store hands these out only while its liveness signal for this process is up (PostgreSQL:
    the advisory lock is held; Redis: the heartbeat runs; SQLite: the process is registered).
    """
    return new_token.owned()


def lease_token(owned: bool) -> str:
    """A fresh token: :func:`new_owned_token` when ``owned`` (the store's liveness signal for
    this process is up), else :func:`new_token`."""
    return new_token.owned() if owned else new_token()


def instance_id() -> str:
    """This process's instance id: random, renewed after ``fork``."""
    return new_token.prefix


def token_owner(token: str | None) -> str | None:
    """The instance id a token from :func:`new_owned_token` names, else ``None`` (unknown)."""
    if token is None or len(token) <= _INSTANCE_LENGTH or token[_INSTANCE_LENGTH] != _OWNER_MARK:
        return None
    return token[:_INSTANCE_LENGTH]


def other_owner(token: str | None) -> str | None:
    """The instance id of another process that ``token`` names, whose liveness a store may
    check before taking its record over; ``None`` for a plain token, no token, or a token of
    this process (never judged)."""
    owner = token_owner(token)
    return None if owner == new_token.prefix else owner


@dataclass(frozen=True, slots=True, init=False)
class Record:
    """What a store holds for one scoped key.

    Attributes:
        fingerprint: the fingerprint of the request that reserved the key.
        state: ``"in_progress"`` while the first request runs, ``"completed"`` once stored.
        response: the encoded response (completed records only).
        lease_remaining: seconds left on the lease (in-progress records; 0 when lapsed).
        committed: the running request declared its side effects committed
            (:meth:`AsyncStore.mark_committed`): such a record is never taken over; once its
            lease lapses without completion its outcome is unknown.
    """

    fingerprint: str
    state: RecordState
    response: bytes | None = None
    lease_remaining: float = 0.0
    committed: bool = False

    def __init__(
        self,
        fingerprint: str,
        state: RecordState,
        response: bytes | None = None,
        lease_remaining: float = 0.0,
        committed: bool = False,
    ) -> None:
        # The generated __init__ of a frozen class sets each field through object.__setattr__;
        # each slot's own setter does the same at half the cost (every replay makes a record).
        _set_fingerprint(self, fingerprint)
        _set_state(self, state)
        _set_response(self, response)
        _set_lease_remaining(self, lease_remaining)
        _set_committed(self, committed)


@dataclass(frozen=True, slots=True, init=False)
class Reservation:
    """The result of :meth:`Store.reserve`: either this call won the key, or the existing record.

    Attributes:
        token: the fencing token when this call won the key, else ``None``.
        record: the record that holds the key when this call did not win.
    """

    token: str | None = None
    record: Record | None = None

    def __init__(self, token: str | None = None, record: Record | None = None) -> None:
        # As Record's (every keyed request makes a reservation).
        _set_token(self, token)
        _set_record(self, record)

    @property
    def acquired(self) -> bool:
        """Whether this call won the key and must run the request."""
        return self.token is not None


def _setter(cls: type, name: str) -> Callable[[object, object], None]:
    """The setter of a slot of ``cls`` (a frozen class's ``__setattr__`` refuses every
    assignment; its ``__init__`` sets the fields through these)."""
    setter: Callable[[object, object], None] = vars(cls)[name].__set__
    return setter


_set_fingerprint = _setter(Record, "fingerprint")
_set_state = _setter(Record, "state")
_set_response = _setter(Record, "response")
_set_lease_remaining = _setter(Record, "lease_remaining")
_set_committed = _setter(Record, "committed")
_set_token = _setter(Reservation, "token")
_set_record = _setter(Reservation, "record")
