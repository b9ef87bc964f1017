"""Where the proxy's options come from: flags, then ``RETRYSAFE_*`` variables, then TOML."""

from __future__ import annotations

import tomllib
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from .._core.errors import ConfigurationError
from .settings import ProxySettings, RoutePolicy, _convert, _route

Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]


#: option -> (kind, environment variable, default; ``...``: required). Flags are ``--option-name``.
OPTIONS: dict[str, tuple[str, str, Any]] = {
    "listen": ("str", "RETRYSAFE_LISTEN", "127.0.0.1:8080"),
    "upstream": ("str", "RETRYSAFE_UPSTREAM", ...),
    "store": ("str", "RETRYSAFE_STORE_URL", ...),
    "workers": ("int", "RETRYSAFE_WORKERS", 1),
    "log_level": ("str", "RETRYSAFE_LOG_LEVEL", "info"),
    "methods": ("methods", "RETRYSAFE_METHODS", frozenset({"POST", "PATCH"})),
    "required": ("bool", "RETRYSAFE_REQUIRED", False),
    "ttl": ("float", "RETRYSAFE_TTL", 24 * 3600.0),
    "lease": ("float", "RETRYSAFE_LEASE", 30.0),
    "max_body_size": ("int", "RETRYSAFE_MAX_BODY_SIZE", 1024 * 1024),
    "max_stored_body_size": ("int", "RETRYSAFE_MAX_STORED_BODY_SIZE", 1024 * 1024),
    "on_conflict": ("str", "RETRYSAFE_ON_CONFLICT", "reject"),
    "store_server_errors": ("bool", "RETRYSAFE_STORE_SERVER_ERRORS", False),
    "on_ambiguous": ("str", "RETRYSAFE_ON_AMBIGUOUS", "unknown"),
    "principal_header": ("str", "RETRYSAFE_PRINCIPAL_HEADER", "authorization"),
    "trust_forwarded": ("bool", "RETRYSAFE_TRUST_FORWARDED", False),
    "connect_timeout": ("float", "RETRYSAFE_CONNECT_TIMEOUT", 5.0),
    "upstream_timeout": ("float", "RETRYSAFE_UPSTREAM_TIMEOUT", 60.0),
    "max_connections": ("int", "RETRYSAFE_MAX_CONNECTIONS", 100),
}


def load_settings(
    flags: Mapping[str, Any],
    environ: Mapping[str, str],
    config_path: str | None = None,
) -> ProxySettings:
    """Merge the sources of every option: a flag wins over ``RETRYSAFE_*``, which wins over
    the config file, which wins over the default.

    Args:
        flags: option -> value from the command line (``None``: not given).
        environ: the environment (the caller passes ``os.environ``).
        config_path: a TOML file with top-level options and ``[[routes]]`` tables.

    Returns:
        Validated settings.

    Raises:
        ConfigurationError: an unreadable file, an unknown or bad option, a missing one.
    """
    file_values: dict[str, Any] = {}
    routes: tuple[RoutePolicy, ...] = ()
    if config_path:
        try:
            file_values = tomllib.loads(Path(config_path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigurationError(f"cannot read {config_path}: {exc.strerror}") from exc
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigurationError(f"{config_path} is not valid TOML: {exc}") from exc
        raw_routes = file_values.pop("routes", [])
        if not isinstance(raw_routes, list):
            raise ConfigurationError(f"{config_path}: routes must be [[routes]] tables")
        routes = tuple(_route(r, config_path) for r in raw_routes)
        unknown = set(file_values) - set(OPTIONS)
        if unknown:
            raise ConfigurationError(f"{config_path}: unknown option {sorted(unknown)[0]!r}")
    values: dict[str, Any] = {}
    for name, (kind, variable, default) in OPTIONS.items():
        if flags.get(name) is not None:
            values[name] = _convert(name, kind, flags[name], f"--{name.replace('_', '-')}")
        elif environ.get(variable):
            values[name] = _convert(name, kind, environ[variable], variable)
        elif name in file_values:
            values[name] = _convert(name, kind, file_values[name], config_path or "")
        elif default is ...:
            flag = f"--{name.replace('_', '-')}"
            raise ConfigurationError(f"{flag} is required (or set {variable})")
        else:
            values[name] = default
    return ProxySettings(**values, routes=routes)
