"""Where the proxy's options come from: flags, then ``RETRYSAFE_*`` variables, then TOML.

Every source is read by the one loader (:func:`~retrysafe._core.options.read_options`, the
coercions of :class:`~retrysafe.IdempotencyConfig`), so a bad value names its option as written
where it was found: ``--ttl``, ``RETRYSAFE_TTL in the environment``, ``ttl in proxy.toml``.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .._core.config import IdempotencyConfig, config_from
from .._core.errors import ConfigurationError
from .._core.options import Coerce, ConfigSource, Setting, boolean, read_options, text
from .settings import CONFIG_OPTIONS, PROXY_OPTIONS, ProxySettings, RoutePolicy

__all__ = ["ENVIRONMENT", "FLAGS", "OPTIONS", "default", "load_settings", "variable"]

#: Every option of ``retrysafe proxy``: its own, then the middleware's. Flags are
#: ``--option-name``, variables ``RETRYSAFE_OPTION_NAME`` (the store: ``RETRYSAFE_STORE_URL``).
OPTIONS: dict[str, Coerce] = {**PROXY_OPTIONS, **CONFIG_OPTIONS}

FLAGS = ConfigSource(flags=True)
ENVIRONMENT = ConfigSource(where="{key} in the environment", prefix="RETRYSAFE_", upper=True)
_STORE_VARIABLE = "RETRYSAFE_STORE_URL"
_REQUIRED = ("upstream", "store")
_ROUTE_OPTIONS: dict[str, Coerce] = {"path": text, "enabled": boolean, **CONFIG_OPTIONS}


def variable(name: str) -> str:
    """The environment variable of an option."""
    return _STORE_VARIABLE if name == "store" else ENVIRONMENT.key(name)


def default(name: str) -> Any:
    """The default of an option (``...``: required)."""
    if name in _REQUIRED:
        return ...
    for found in dataclasses.fields(ProxySettings):
        if found.name == name:
            return found.default
    return getattr(_CONFIG_DEFAULTS, name)


_CONFIG_DEFAULTS = IdempotencyConfig()


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
        ConfigurationError: an unreadable file, an unknown or bad option, a missing one; the
            message names the option as written and where.
    """
    from_file: dict[str, Setting] = {}
    raw_routes: list[Any] = []
    if config_path:
        values = _read_toml(config_path)
        raw_routes = values.pop("routes", [])
        if not isinstance(raw_routes, list):
            raise ConfigurationError(f"{config_path}: routes must be [[routes]] tables")
        from_file = read_options(values, config_path, OPTIONS)
    # Only the proxy's variables (the environment holds others, RETRYSAFE_CONFIG among them).
    variables = {
        variable(name): environ[variable(name)] for name in OPTIONS if environ.get(variable(name))
    }
    store_variable = variables.pop(_STORE_VARIABLE, None)
    from_environment = read_options(variables, ENVIRONMENT, OPTIONS)
    if store_variable is not None:
        at = ENVIRONMENT.at(_STORE_VARIABLE)
        from_environment["store"] = Setting(store_variable, _STORE_VARIABLE, at)
    given = {FLAGS.key(name): value for name, value in flags.items() if value is not None}
    merged = {**from_file, **from_environment, **read_options(given, FLAGS, OPTIONS)}
    config = config_from({n: s for n, s in merged.items() if n in CONFIG_OPTIONS})
    routes = tuple(_route(raw, config_path or "", config) for raw in raw_routes)
    for name in _REQUIRED:
        if name not in merged:
            raise ConfigurationError(f"{FLAGS.key(name)} is required (or set {variable(name)})")
    own = {name: setting.value for name, setting in merged.items() if name in PROXY_OPTIONS}
    return ProxySettings(**own, config=config, routes=routes)


def _read_toml(path: str) -> dict[str, Any]:
    try:
        return tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigurationError(f"cannot read {path}: {exc.strerror}") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"{path} is not valid TOML: {exc}") from exc


def _route(raw: Any, config_path: str, base: IdempotencyConfig) -> RoutePolicy:
    """One ``[[routes]]`` table, its options checked over the proxy-wide ones, here, where
    messages can name the file and the route."""
    if not isinstance(raw, dict):
        raise ConfigurationError(f"{config_path}: each [[routes]] entry must be a table")
    if "path" not in raw:
        raise ConfigurationError(f"{config_path}: a [[routes]] table needs a path")
    source = ConfigSource(where=f"{{key}} of route {raw['path']!r} in {config_path}")
    read = read_options(raw, source, _ROUTE_OPTIONS)
    path = read.pop("path").value
    enabled = read.pop("enabled").value if "enabled" in read else True
    config_from(read, base)  # e.g. a lease longer than the route's ttl, named here
    return RoutePolicy(
        path=path, enabled=enabled, options={name: s.value for name, s in read.items()}
    )
