"""The one store-URL parser: every backend's URL is split here, and its query options turned into
the store's constructor options by the table the backend declares.

``scheme://[user[:password]@]host[:port][,host[:port]...][/path][?option=value&...]``

The location may name several hosts (a Redis Cluster's seeds, PostgreSQL's multi-host URLs).
A query option the backend declares is converted (``busy_timeout=5`` -> ``5.0``) and passed to the
constructor under its own name; one the backend leaves to its driver (``sslmode``) stays in the
URL the driver gets; any other is a :class:`~retrysafe.ConfigurationError` that names it.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode

from .._core.errors import ConfigurationError

__all__ = [
    "Option",
    "StoreURL",
    "flag",
    "non_negative",
    "positive",
    "split_url",
    "text",
    "whole",
]

#: Converts one query option's text to the constructor's value; raises ``ValueError`` with the
#: reason when the text is not acceptable.
Option = Callable[[str], Any]

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def text(value: str) -> str:
    """A string option, as given."""
    return value


def flag(value: str) -> bool:
    """A boolean option: ``true``/``false`` (also ``1``/``0``, ``yes``/``no``, ``on``/``off``)."""
    lowered = value.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError("use true or false")


def _number(value: str, kind: type[int] | type[float], least: float, strict: bool) -> Any:
    try:
        number = kind(value)
    except ValueError:
        raise ValueError(f"not a {'whole ' if kind is int else ''}number") from None
    if number != number or number in (float("inf"), float("-inf")):
        raise ValueError("not a finite number")
    if number < least or (strict and number == least):
        raise ValueError(f"must be more than {least:g}" if strict else "must not be negative")
    return number


def non_negative(value: str) -> float:
    """A number of seconds (or a size), 0 or more."""
    number: float = _number(value, float, 0, strict=False)
    return number


def positive(value: str) -> float:
    """A number of seconds, more than 0."""
    number: float = _number(value, float, 0, strict=True)
    return number


def whole(value: str) -> int:
    """A whole number, 0 or more."""
    number: int = _number(value, int, 0, strict=False)
    return number


@dataclass(frozen=True, slots=True)
class StoreURL:
    """A store URL, split once.

    Attributes:
        url: the URL as given.
        scheme: its scheme, lower-case (``"django"`` for the bare ``"django"``).
        username: the user of the location, percent-decoded (``None``: none).
        password: the password, percent-decoded (``None``: none).
        location: the raw location between ``//`` and the path (hosts and credentials).
        hosts: ``(host, port)`` per host named (port ``None`` when not given); IPv6 without
            brackets.
        path: what follows the location up to the query, without its first ``/``
            (``sqlite:////abs.db`` -> ``/abs.db``).
        options: the backend's own query options, converted: the constructor's keywords.
        passed: query options left for the driver, in their order.
    """

    url: str
    scheme: str
    username: str | None
    password: str | None
    location: str
    hosts: tuple[tuple[str, int | None], ...]
    path: str
    options: Mapping[str, Any] = field(default_factory=dict)
    passed: tuple[tuple[str, str], ...] = ()

    def driver_url(self, scheme: str | None = None) -> str:
        """The URL without the backend's own options (what a driver such as libpq or redis-py
        is given), optionally under another scheme."""
        rest = f"/{self.path}" if self.path else ""
        query = f"?{urlencode(self.passed)}" if self.passed else ""
        return f"{scheme or self.scheme}://{self.location}{rest}{query}"

    def passed_option(self, name: str) -> str | None:
        """The last value of a query option left for the driver (``None``: not given)."""
        found = None
        for key, value in self.passed:
            if key == name:
                found = value
        return found


def _hosts(location: str, scheme: str) -> tuple[tuple[str, int | None], ...]:
    hosts: list[tuple[str, int | None]] = []
    for node in filter(None, location.rpartition("@")[2].split(",")):
        if node.startswith("["):
            host, _, rest = node[1:].partition("]")
            port = rest[1:] if rest.startswith(":") else ""
        else:
            host, colon, port = node.rpartition(":")
            if not colon:
                host, port = node, ""
        try:
            hosts.append((unquote(host), int(port) if port else None))
        except ValueError:
            raise ConfigurationError(f"{scheme}:// store URL: bad port in {node!r}") from None
    return tuple(hosts)


def split_url(url: str) -> StoreURL:
    """Split a store URL into its parts, with every query option still to be interpreted
    (in :attr:`StoreURL.passed`). A bare name (``"django"``) is a scheme with nothing after it.

    Raises:
        ConfigurationError: the location names a host with a bad port.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        return StoreURL(url, url.lower(), None, None, "", (), "")
    rest = rest.partition("#")[0]
    rest, _, query = rest.partition("?")
    location, slash, path = rest.partition("/")
    credentials, at, _ = location.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = credentials.partition(":")
        username = unquote(user) if user else None
        password = unquote(secret) if colon else None
    return StoreURL(
        url=url,
        scheme=scheme.lower(),
        username=username,
        password=password,
        location=location,
        hosts=_hosts(location, scheme.lower()),
        path=path if slash else "",
        passed=tuple(parse_qsl(query, keep_blank_values=True)),
    )


def interpret(
    url: StoreURL, options: Mapping[str, Option], passed: Iterable[str] | None
) -> StoreURL:
    """Turn the query options of a split URL into the backend's constructor options.

    Args:
        url: from :func:`split_url`.
        options: the backend's own options: name -> converter.
        passed: the options the backend leaves to its driver (``None``: any other option).

    Raises:
        ConfigurationError: an option the backend does not know (named, with the known ones),
            or a value its converter refuses (named, with the reason).
    """
    mine: dict[str, Any] = {}
    left: list[tuple[str, str]] = []
    allowed = None if passed is None else frozenset(passed)
    for name, value in url.passed:
        convert = options.get(name)
        if convert is not None:
            try:
                mine[name] = convert(value)
            except ValueError as exc:
                raise ConfigurationError(
                    f"{url.scheme}:// store URL option {name}={value!r}: {exc}"
                ) from None
        elif allowed is None or name in allowed:
            left.append((name, value))
        else:
            close = difflib.get_close_matches(name, [*options, *(allowed or ())], n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            known = ", ".join(sorted(options)) or "none"
            driver = "; and the driver's own" if allowed else ""
            raise ConfigurationError(
                f"unknown option {name!r} in the {url.scheme}:// store URL "
                f"({hint}known: {known}{driver})"
            )
    return StoreURL(
        url.url,
        url.scheme,
        url.username,
        url.password,
        url.location,
        url.hosts,
        url.path,
        mine,
        tuple(left),
    )
