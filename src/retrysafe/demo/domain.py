"""OrderHub's domain: everything of its HTTP contract (DESIGN section 5) that no framework needs.

Every framework's OrderHub (``app.py`` Starlette, ``fastapi_app.py``, ``flask_app.py``,
``django_app``) translates a request into these calls and their results into a response, and
nothing else: what an order and a payment are and how their bodies are checked
(:data:`KINDS`, :func:`parse_record`), the problem answers (:class:`Problem`), who the demo user
is (:func:`owner`), the knobs (:class:`Knobs`), where the data lives by default
(:func:`default_db_url`, :func:`same_database`) and the page (:func:`page`). The data layer and
the one write path are ``_async_hub.py`` (+ its generated sync twin ``_sync_hub.py``).

This module imports no framework (so ``retrysafe demo --help`` needs none).
"""

from __future__ import annotations

import functools
import html
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from .._core.errors import StoreUnavailableError

__all__ = [
    "DEFAULT_STORE",
    "KINDS",
    "MAX_DELAY_MS",
    "MAX_NUMBER",
    "ORDERS",
    "PAYMENTS",
    "DatabaseUnavailable",
    "DemoFailure",
    "Kind",
    "Knobs",
    "Problem",
    "check_number",
    "check_text",
    "default_db_url",
    "describe_data",
    "location",
    "owner",
    "page",
    "parse_limit",
    "parse_record",
    "problem_of",
    "same_database",
    "shown_url",
]

#: The store of ``retrysafe demo`` without ``--store`` (relative to the working directory).
DEFAULT_STORE = "sqlite:///./retrysafe-demo.db"

#: The longest ``?delay_ms=`` / ``?delay_after_ms=`` accepted (10 minutes).
MAX_DELAY_MS = 600_000

#: The largest quantity or amount (and record id) a JSON client reads exactly (2**53 - 1).
MAX_NUMBER = 2**53 - 1

#: Seconds a client is told to wait (``Retry-After``) when the database was busy.
_RETRY_AFTER = 1


@dataclass(frozen=True, slots=True)
class Kind:
    """Orders or payments.

    Attributes:
        name: the collection (``"orders"``): the path, the table, the listing's member.
        title: the singular, capitalised for problem titles (``"Order"``).
        fields: each field a client sends and its type (``{"item": str, "quantity": int}``).
        key_required: whether ``POST`` needs an ``Idempotency-Key``.
    """

    name: str
    title: str
    fields: Mapping[str, type]
    key_required: bool

    @property
    def columns(self) -> tuple[str, ...]:
        """Every member of a stored record, in the order of the JSON answer."""
        return ("id", "owner", *self.fields, "created_at")


ORDERS = Kind("orders", "Order", {"item": str, "quantity": int}, key_required=False)
PAYMENTS = Kind("payments", "Payment", {"amount": int, "currency": str}, key_required=True)
KINDS: dict[str, Kind] = {kind.name: kind for kind in (ORDERS, PAYMENTS)}


class Problem(Exception):
    """An answer OrderHub gives as RFC 9457 ``application/problem+json``.

    Each app turns it into its framework's response with one exception handler
    (:meth:`body`, :attr:`status`, :meth:`headers`).

    Attributes:
        status: the HTTP status.
        slug: the last part of the problem ``type`` (``urn:orderhub:problem:<slug>``).
        title: a short, fixed summary.
        detail: what went wrong this time.
        retry_after: seconds for ``Retry-After`` (``None``: no such header).
    """

    def __init__(
        self,
        status: int,
        title: str,
        detail: str,
        *,
        slug: str = "invalid-request",
        retry_after: int | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.slug = slug
        self.title = title
        self.detail = detail
        self.retry_after = retry_after

    def body(self) -> bytes:
        """The problem+json body."""
        problem = {
            "type": f"urn:orderhub:problem:{self.slug}",
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
        }
        return json.dumps(problem).encode()

    def headers(self) -> dict[str, str]:
        """The headers beside ``Content-Type: application/problem+json``."""
        return {} if self.retry_after is None else {"Retry-After": str(self.retry_after)}

    @classmethod
    def not_json(cls) -> Problem:
        """A body that is not JSON (``400``)."""
        return cls(400, "Body is not JSON", "Send a JSON object.")

    @classmethod
    def invalid(cls, kind: Kind, detail: str) -> Problem:
        """A JSON body that is not a valid order or payment (``422``)."""
        return cls(422, f"Invalid {kind.title.lower()}", detail)

    @classmethod
    def bad_query(cls, name: str, detail: str) -> Problem:
        """A query parameter (``limit`` or a knob) that cannot be read (``400``)."""
        return cls(400, f"Bad {name}", detail)

    @classmethod
    def not_found(cls, kind: Kind) -> Problem:
        """No record with that id (``404``)."""
        return cls(404, "Not found", f"No such {kind.title.lower()}.", slug="not-found")


class DemoFailure(Exception):
    """Raised by a handler asked to fail (``?fail=1``) before it wrote anything."""


class DatabaseUnavailable(StoreUnavailableError):
    """OrderHub's own database stayed busy (SQLite's single writer, past the wait's bound) or
    could not be reached; nothing was written. Answered ``503`` + ``Retry-After``."""


def problem_of(exc: Exception) -> Problem:
    """The answer to an exception an OrderHub handler raised on purpose or from its database.

    Args:
        exc: a :class:`Problem`, :class:`DemoFailure` or :class:`DatabaseUnavailable`.
    """
    if isinstance(exc, Problem):
        return exc
    if isinstance(exc, DatabaseUnavailable):
        # Nothing was written, so retrying is safe; with a key the retry is even exact.
        return Problem(
            503,
            "Database busy",
            f"The order database could not take the write; retry later. ({exc})",
            slug="database-unavailable",
            retry_after=_RETRY_AFTER,
        )
    return Problem(500, "Handler failed", str(exc), slug="handler-failed")


def check_text(value: str) -> str:
    """A non-empty text field that both databases store as sent.

    Raises:
        ValueError: empty, a NUL character (PostgreSQL refuses it) or a lone surrogate (not
            UTF-8).
    """
    if not value:
        raise ValueError("must not be empty")
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    try:
        value.encode()
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode (no lone surrogates)") from None
    return value


def check_number(value: int) -> int:
    """A quantity or an amount: a whole number from 1 to :data:`MAX_NUMBER`.

    Raises:
        ValueError: out of that range.
    """
    if not 1 <= value <= MAX_NUMBER:
        raise ValueError(f"must be from 1 to {MAX_NUMBER}")
    return value


_CHECKS: dict[type, Callable[[Any], Any]] = {str: check_text, int: check_number}


def parse_record(kind: Kind, body: bytes) -> dict[str, Any]:
    """The fields of an order or payment from a JSON body (other members are ignored).

    Raises:
        Problem: ``400`` not JSON; ``422`` not an object, or a field missing, of another JSON
            type (``true`` is not a number, ``1.0`` not a whole one) or out of range.
    """
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        raise Problem.not_json() from None
    if not isinstance(data, dict):
        raise Problem.invalid(kind, "The body must be a JSON object.")
    values: dict[str, Any] = {}
    for name, typ in kind.fields.items():
        value = data.get(name)
        if not isinstance(value, typ) or isinstance(value, bool):
            raise Problem.invalid(
                kind, f"{name!r} must be {'a string' if typ is str else 'an integer'}."
            )
        try:
            values[name] = _CHECKS[typ](value)
        except ValueError as exc:
            raise Problem.invalid(kind, f"{name!r} {exc}.") from None
    return values


def owner(authorization: str | None) -> str:
    """The demo user: ``<name>`` of ``Authorization: Bearer <name>``, else ``"anonymous"``."""
    scheme, _, name = (authorization or "").partition(" ")
    return name.strip() if scheme.lower() == "bearer" and name.strip() else "anonymous"


def _whole(name: str, raw: str, top: int) -> int:
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if not 0 <= value <= top:
        raise Problem.bad_query(name, f"{name} must be a whole number from 0 to {top}.")
    return value


_TRUE = {"1", "true", "yes", "on", "t", "y"}
_FALSE = {"0", "false", "no", "off", "f", "n"}


@dataclass(frozen=True, slots=True)
class Knobs:
    """The demo knobs of a ``POST``: ``?delay_ms=N`` (sleep before writing: a slow payment
    provider), ``?delay_after_ms=N`` (sleep after writing, before answering: the window in
    which a crash separates the effect from its record), ``?fail=1`` (raise, writing nothing).

    Attributes:
        delay: seconds before the write.
        delay_after: seconds after the write.
        fail: raise :class:`DemoFailure` instead of writing.
    """

    delay: float = 0.0
    delay_after: float = 0.0
    fail: bool = False

    @classmethod
    def from_query(cls, get: Callable[[str], str | None]) -> Knobs:
        """Read the knobs from a query string's ``get``.

        Raises:
            Problem: ``400``, a delay that is not a whole number of ms from 0 to
                :data:`MAX_DELAY_MS`, or a ``fail`` that is not a boolean (``1``, ``true``...).
        """
        delays = []
        for name in ("delay_ms", "delay_after_ms"):
            raw = get(name)
            delays.append(0 if raw is None else _whole(name, raw, MAX_DELAY_MS) / 1000)
        fail = (get("fail") or "0").lower()
        if fail not in _TRUE | _FALSE:
            raise Problem.bad_query("fail", "fail must be 1 or 0.")
        return cls(delays[0], delays[1], fail in _TRUE)

    def fail_if_asked(self, kind: Kind) -> None:
        """Raise :class:`DemoFailure` when ``?fail=1`` asked for it."""
        if self.fail:
            raise DemoFailure(f"the {kind.name} handler failed on purpose (?fail=1)")


def parse_limit(raw: str | None) -> int | None:
    """``?limit=N`` of a listing: only the newest N (``None``: all).

    Raises:
        Problem: ``400``, not a whole number from 0 up.
    """
    return None if raw is None else _whole("limit", raw, 2**63 - 1)


def location(kind: Kind, record: Mapping[str, Any]) -> str:
    """The ``Location`` of a created record."""
    return f"/{kind.name}/{record['id']}"


def _sql_base(url: str) -> str | None:
    """The database a SQL URL names, without its options (``None``: not SQL)."""
    base = url.split("?", 1)[0]
    if base.startswith("sqlite:///"):
        return "sqlite:///" + os.path.abspath(base[len("sqlite:///") :])
    for scheme in ("postgresql://", "postgres://"):
        if base.startswith(scheme):
            return "postgresql://" + base[len(scheme) :]
    for scheme in ("mysql://", "mariadb://"):
        if base.startswith(scheme):
            return "mysql://" + base[len(scheme) :]
    return None


def default_db_url(store_url: str) -> str:
    """Where orders and payments live without ``--db``: the store's own database when the store
    is SQL (so they commit with the idempotency records; its URL options, such as SQLite's
    ``busy_timeout``, hold for both), else ``sqlite:///./orderhub.db``."""
    return store_url if _sql_base(store_url) is not None else "sqlite:///./orderhub.db"


def same_database(store_url: str, db_url: str) -> bool:
    """Whether the orders live in the store's own SQL database (so transactional mode applies)."""
    base = _sql_base(store_url)
    return base is not None and base == _sql_base(db_url)


def _shown(url: str) -> str:
    """A URL as the page shows it: SQLite as an absolute path, passwords hidden."""
    if url.startswith("sqlite:///"):
        return os.path.abspath(url.split("?", 1)[0][len("sqlite:///") :])
    parts = urlsplit(url)
    if parts.password is not None:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
        parts = parts._replace(netloc=netloc)
    return urlunsplit(parts._replace(query=""))


def shown_url(url: str) -> str:
    """A URL as the page shows it (its password hidden); a SQLite URL as its absolute path."""
    return _shown(url)


def describe_data(store_url: str, db_url: str) -> str:
    """One sentence (HTML) on where this OrderHub keeps its data, for the page's footer."""
    store, db = html.escape(_shown(store_url)), html.escape(_shown(db_url))
    if same_database(store_url, db_url):
        where = f"Records and orders: <code>{store}</code> (one database, one transaction)."
    else:
        where = f"Records: <code>{store}</code>; orders: <code>{db}</code>."
    return (
        f"{where} <code>make demo</code> starts every run in a new, empty folder under /tmp; "
        "<code>retrysafe demo</code> keeps using these until you delete them."
    )


@functools.cache
def _page_template() -> str:
    return resources.files("retrysafe.demo").joinpath("static", "index.html").read_text()


def page(store_url: str, db_url: str) -> bytes:
    """The page at ``/`` (HTML), its footer naming where the data lives."""
    return (
        _page_template().replace("<!--orderhub:data-->", describe_data(store_url, db_url)).encode()
    )
