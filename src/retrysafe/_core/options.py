"""Reading settings from any source: one coercion per kind of option, one way to name a key.

Every front (keyword arguments, ``app.config``, ``settings.RETRYSAFE``, TOML, ``RETRYSAFE_*``
variables, command-line flags) hands its raw values to :func:`read_options` with a
:class:`ConfigSource` that says how a key is written there; the result is checked, typed values
and, for each, the key as the user wrote it, so that every error names the setting and its
source in one line::

    --ttl: must be positive, got '-5'
    RETRYSAFE_TLL in app.config: unknown option (did you mean RETRYSAFE_TTL?)
    settings.RETRYSAFE['METHODS']: must be a list (or a comma-separated string), got 7

A coercion takes a value and returns it in its option's type (the same value when it already is
one) or raises :class:`ValueError` with what is wrong; text is parsed where its meaning is plain
(``"30s"``, ``"true"``, ``"POST, PATCH"``, ``"pkg.module:function"``), so TOML, variables and flags
need no converters of their own.
"""

from __future__ import annotations

import difflib
import importlib
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from .errors import ConfigurationError

__all__ = [
    "Coerce",
    "ConfigSource",
    "Setting",
    "boolean",
    "choice",
    "count",
    "function",
    "header_list",
    "header_name",
    "header_set",
    "method_set",
    "optional",
    "read_options",
    "seconds",
    "status_set",
    "suggestion",
    "text",
]

#: Turns a raw value into its option's type, or raises ValueError saying what is wrong.
Coerce = Callable[[Any], Any]

#: An HTTP field name (RFC 9110 token).
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")

_TRUE = frozenset({"true", "1", "yes", "on"})
_FALSE = frozenset({"false", "0", "no", "off"})

_SECONDS_PER_UNIT = {
    "": 1.0,
    "ms": 0.001,
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1.0),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60.0),
    **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), 3600.0),
    **dict.fromkeys(("d", "day", "days"), 86400.0),
}
_DURATION = re.compile(r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*([a-zA-Z]*)")


def seconds(value: Any) -> Any:
    """A positive, finite number of seconds: a number, or text such as ``"30"``, ``"2.5"``,
    ``"30s"``, ``"15m"``, ``"2h"``, ``"1d"``, ``"1 day"``."""
    number = value
    if isinstance(value, str):
        match = _DURATION.fullmatch(value.strip())
        unit = _SECONDS_PER_UNIT.get(match[2].lower()) if match else None
        if match is None or unit is None:
            raise ValueError(
                f"must be seconds (30, 2.5) or a duration ('30s', '15m', '2h', '1d'), got {value!r}"
            )
        number = float(match[1]) * unit
    elif isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"must be a number of seconds, got {value!r}")
    if not number > 0 or math.isinf(number):
        raise ValueError(f"must be positive, got {value!r}")
    return number


def boolean(value: Any) -> bool:
    """``True``/``False``, or ``1``/``0`` and text ``true/false/1/0/yes/no/on/off``."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        word = value.strip().lower()
        if word in _TRUE or word in _FALSE:
            return word in _TRUE
    raise ValueError(f"must be true or false, got {value!r}")


def count(value: Any) -> int:
    """A whole number, zero or more (text of digits too)."""
    number = value
    if isinstance(value, str) and re.fullmatch(r"\s*[-+]?\d+\s*", value):
        number = int(value)
    elif isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"must be a whole number, got {value!r}")
    if number < 0:
        raise ValueError(f"must not be negative, got {value!r}")
    return int(number)


def text(value: Any) -> str:
    """A string."""
    if not isinstance(value, str):
        raise ValueError(f"must be a string, got {value!r}")
    return value


def choice(*choices: str) -> Coerce:
    """One of ``choices`` (the values of the option's ``Literal`` type)."""
    quoted = [repr(c) for c in choices]
    listed = " or ".join(quoted) if len(quoted) <= 2 else "one of " + ", ".join(quoted)

    def coerce(value: Any) -> str:
        if not isinstance(value, str) or value not in choices:
            raise ValueError(f"must be {listed}, got {value!r}")
        return value

    return coerce


def optional(coerce: Coerce) -> Coerce:
    """``None``, or what ``coerce`` accepts."""

    def maybe(value: Any) -> Any:
        return None if value is None else coerce(value)

    return maybe


def _items(value: Any) -> list[Any]:
    if isinstance(value, str):  # from a variable, a flag or a .env file: "POST, PATCH"
        return [part.strip() for part in value.split(",") if part.strip()]
    if isinstance(value, list | tuple | set | frozenset):
        return list(value)
    raise ValueError(f"must be a list (or a comma-separated string), got {value!r}")


def _field_name(item: Any) -> str:
    if not isinstance(item, str) or not _TOKEN.fullmatch(item):
        raise ValueError(f"not an HTTP header name: {item!r}")
    return item


def header_name(value: Any) -> str:
    """An HTTP header name (an RFC 9110 token), as given."""
    return _field_name(value)


def header_set(value: Any) -> frozenset[str]:
    """HTTP header names, lower-cased: a list or a comma-separated string."""
    return frozenset(_field_name(item).lower() for item in _items(value))


def header_list(value: Any) -> tuple[str, ...]:
    """HTTP header names in order, as given: a list or a comma-separated string."""
    return tuple(_field_name(item) for item in _items(value))


def method_set(value: Any) -> frozenset[str]:
    """At least one HTTP method, upper-cased: a list or a comma-separated string."""
    methods = frozenset(_field_name(item).upper() for item in _items(value))
    if not methods:
        raise ValueError("must name at least one HTTP method")
    return methods


def status_set(value: Any) -> frozenset[int]:
    """HTTP status codes (100-599): a list or a comma-separated string."""
    statuses = set()
    for item in _items(value):
        status = item
        if isinstance(item, str) and item.strip().isdigit():
            status = int(item)
        if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599:
            raise ValueError(f"must be HTTP status codes (100-599), got {item!r}")
        statuses.add(status)
    return frozenset(statuses)


def function(value: Any) -> Any:
    """A callable, or its dotted path (``"pkg.module:name"`` or ``"pkg.module.name"``),
    imported."""
    if isinstance(value, str):
        path = value.strip()
        module_name, colon, attribute = path.partition(":")
        if not colon:
            module_name, _, attribute = path.rpartition(".")
        if not module_name or not attribute:
            raise ValueError(
                f"must be a function or its dotted path ('pkg.module:name'), got {value!r}"
            )
        try:
            found: Any = importlib.import_module(module_name)
            for part in attribute.split("."):
                found = getattr(found, part)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"cannot import {value!r} ({exc})") from None
        value = found
    if not callable(value):
        raise ValueError(
            f"must be a function or its dotted path ('pkg.module:name'), got {value!r}"
        )
    return value


@dataclass(frozen=True, slots=True)
class ConfigSource:
    """Where settings are read from, and how an option's key is written there (so that an error
    names it as the user wrote it).

    Attributes:
        where: how a message names one key of this source; ``{key}`` is the key as written
            (``"{key} in app.config"``, ``"settings.RETRYSAFE['{key}']"``).
        prefix: what every key starts with (``"RETRYSAFE_"``).
        upper: keys are option names in upper case (read in any case).
        flags: keys are command-line flags (``--max-body-size``).
    """

    where: str = "{key}"
    prefix: str = ""
    upper: bool = False
    flags: bool = False

    @classmethod
    def keywords(cls, owner: str) -> ConfigSource:
        """Keyword arguments of ``owner`` (``IdempotencyMiddleware(ttl=...)``)."""
        return cls(where=owner + "({key}=...)")

    @classmethod
    def named(cls, source: str | ConfigSource) -> ConfigSource:
        """``source`` itself, or a source whose keys are option names, named ``{key} in
        <source>`` (or by ``source`` itself when it holds ``{key}``)."""
        if isinstance(source, ConfigSource):
            return source
        return cls(where=source if "{key}" in source else "{key} in " + source)

    def key(self, name: str) -> str:
        """How the option ``name`` is written at this source."""
        key = self.prefix + (name.upper() if self.upper else name)
        return "--" + key.replace("_", "-") if self.flags else key

    def name(self, key: str) -> str:
        """The option name ``key`` stands for ("" when it is not a key of this source)."""
        if self.flags:
            if not key.startswith("--"):
                return ""
            key = key[2:].replace("-", "_")
        if self.upper:
            key = key.upper()
        if not key.startswith(self.prefix):
            return ""
        name = key[len(self.prefix) :]
        return name.lower() if self.upper else name

    def at(self, key: str) -> str:
        """How a message names ``key`` (as written) at this source."""
        return self.where.replace("{key}", key)

    def error(self, key: str, problem: str) -> ConfigurationError:
        """The error of a bad value of ``key``: ``<where>: <problem>``."""
        return ConfigurationError(f"{self.at(key)}: {problem}", option=key)

    def unknown(self, key: str, names: Iterable[str]) -> ConfigurationError:
        """The error of a key that names no option (with the closest one, if any)."""
        keys = [self.key(name) for name in names]
        hint = suggestion(key.upper() if self.upper else key, keys)
        return self.error(key, "unknown option" + (hint or f" (options: {', '.join(keys)})"))


def suggestion(word: str, candidates: Iterable[str]) -> str:
    """``" (did you mean X?)"`` with the candidate closest to ``word``, or ``""``."""
    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


class Setting(NamedTuple):
    """One option read from a source.

    Attributes:
        value: the checked value, in the option's type.
        key: the key as written at the source (``"RETRYSAFE_TTL"``).
        at: how messages name it (``"RETRYSAFE_TTL in app.config"``).
    """

    value: Any
    key: str
    at: str


def read_options(
    mapping: Mapping[str, Any], source: str | ConfigSource, table: Mapping[str, Coerce]
) -> dict[str, Setting]:
    """Check and convert every key of ``mapping`` by the coercion of its option in ``table``.

    Args:
        mapping: key (as written at the source) -> raw value.
        source: where the mapping comes from (a plain string: its keys are option names).
        table: option name -> coercion.

    Returns:
        Option name -> :class:`Setting`.

    Raises:
        ConfigurationError: a key that names no option (with "did you mean"), or a value its
            option does not accept; the message names the key as written and its source.
    """
    where = ConfigSource.named(source)
    found: dict[str, Setting] = {}
    for raw_key, raw in mapping.items():
        key = str(raw_key)
        name = where.name(key)
        coerce = table.get(name) if name else None
        if coerce is None:
            raise where.unknown(key, table)
        try:
            value = coerce(raw)
        except ValueError as exc:
            raise where.error(key, str(exc)) from None
        found[name] = Setting(value, key, where.at(key))
    return found
