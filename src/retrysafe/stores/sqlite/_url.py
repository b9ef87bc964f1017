"""``sqlite:///path.db?busy_timeout=5``: the file and the options of a SQLite store URL."""

from __future__ import annotations

from ..._core.errors import ConfigurationError
from .._url import StoreURL, non_negative, split_url

__all__ = ["URL_OPTIONS", "busy_timeout_option", "parse_sqlite_url", "sqlite_path"]

#: The query options of a ``sqlite:///`` URL: constructor keyword -> converter.
URL_OPTIONS = {"busy_timeout": non_negative}


def sqlite_path(url: StoreURL) -> str:
    """The file of a ``sqlite:///relative.db`` / ``sqlite:////abs.db`` URL.

    Raises:
        ConfigurationError: not a sqlite URL, a host given, or no path.
    """
    if url.scheme != "sqlite" or url.location:
        raise ConfigurationError(f"not a sqlite:/// URL: {url.url!r} (sqlite:///file.db)")
    if not url.path:
        raise ConfigurationError("sqlite URL has no path (sqlite:///file.db)")
    return url.path


def parse_sqlite_url(url: str) -> tuple[str, dict[str, str]]:
    """Split ``sqlite:///relative.db`` / ``sqlite:////abs.db`` into (path, raw query options),
    for code that keeps its own tables beside the store's (the demo).

    Raises:
        ConfigurationError: not a sqlite URL or no path.
    """
    split = split_url(url)
    return sqlite_path(split), dict(split.passed)


def busy_timeout_option(options: dict[str, str]) -> float | None:
    """The ``busy_timeout`` option of :func:`parse_sqlite_url`'s options in seconds
    (``None`` when absent).

    Raises:
        ConfigurationError: not a number of seconds (>= 0).
    """
    raw = options.get("busy_timeout")
    if raw is None:
        return None
    try:
        return non_negative(raw)
    except ValueError as exc:
        raise ConfigurationError(f"sqlite URL option busy_timeout={raw!r}: {exc}") from None
