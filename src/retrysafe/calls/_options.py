"""The options of every call front, declared once.

:class:`CallOptions` holds the :class:`~retrysafe.IdempotencyConfig` fields that mean something
for a call; :class:`HandlerOptions` adds how a handler's records are named, fingerprinted and
stored; :class:`FunctionOptions` adds where the key comes from. Every front unpacks one of them
(``**options: Unpack[FunctionOptions]``): ``idempotent_function``, ``MessageHandler``, Celery's
``idempotent_task``, Dramatiq's ``idempotent=`` option. A new call option is one line in
:class:`CallOptions` (a test checks each against :class:`~retrysafe.IdempotencyConfig`), and a
new front repeats no signature.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, TypedDict

from .._core.call import ResultCodec
from .._core.config import OPTIONS, IdempotencyConfig, config_from
from .._core.errors import ConfigurationError
from .._core.options import ConfigSource, read_options

__all__ = [
    "CALL_OPTIONS",
    "SPEC_OPTIONS",
    "CallOptions",
    "FunctionOptions",
    "HandlerOptions",
    "call_config",
    "split_options",
]


class CallOptions(TypedDict, total=False):
    """The :class:`~retrysafe.IdempotencyConfig` fields that apply to calls, as keywords (read by
    the loader every front uses: ``ttl="1d"`` works, a typo gets "did you mean")."""

    ttl: float | str
    lease: float | str
    on_conflict: Literal["reject", "wait"]
    conflict_wait: float | str
    on_store_error: Literal["fail_closed", "fail_open"]
    transactional: bool
    on_event: Callable[[str, Any], None] | None
    adaptive_retry_after: bool


class HandlerOptions(CallOptions, total=False):
    """:class:`CallOptions` and how one handler's records are named, fingerprinted and stored
    (see :func:`~retrysafe.idempotent_function`)."""

    name: str | None
    fingerprint: Sequence[str] | None
    codec: str | ResultCodec
    final: Iterable[type[BaseException]]
    config: IdempotencyConfig | None


class FunctionOptions(HandlerOptions, total=False):
    """:class:`HandlerOptions` and where a call's key comes from (``key=``)."""

    key: Callable[..., Any] | str | Sequence[str] | None


#: The option names :class:`CallOptions` declares.
CALL_OPTIONS = frozenset(CallOptions.__optional_keys__)

#: The names :class:`FunctionOptions` adds to them (handed to the call's spec, not the config).
SPEC_OPTIONS = frozenset(FunctionOptions.__optional_keys__) - CALL_OPTIONS - {"config"}

#: The loader's coercions of the options that apply to calls.
_CALL_TABLE = {name: OPTIONS[name] for name in CALL_OPTIONS}


def split_options(options: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``options`` as (the spec's: key, name, fingerprint, codec, final; the rest: ``config``
    and the call options, for :func:`call_config`)."""
    spec = {k: v for k, v in options.items() if k in SPEC_OPTIONS}
    rest = {k: v for k, v in options.items() if k not in SPEC_OPTIONS}
    return spec, rest


def call_config(
    config: IdempotencyConfig | None, options: Mapping[str, Any], *, where: str
) -> IdempotencyConfig:
    """The settings of a call front, from ``config=`` or keyword options, read by the loader every
    front uses (:meth:`~retrysafe.IdempotencyConfig.from_mapping`: ``ttl="1d"`` works, a typo
    gets "did you mean").

    Args:
        config: ``config=``, or ``None``.
        options: keyword options (each a field of :class:`~retrysafe.IdempotencyConfig` that
            applies to calls: :class:`CallOptions`).
        where: what is being configured, for the error message (``"idempotent_function"``).

    Raises:
        ConfigurationError: both given, an unknown option or one that applies to HTTP only
            (named), or a bad value.
    """
    if config is not None and options:
        raise ConfigurationError(f"{where}: pass either config= or keyword options, not both")
    if config is not None:
        return config
    source = ConfigSource.keywords(where)
    for name in options:
        if name in OPTIONS and name not in CALL_OPTIONS:
            known = ", ".join(sorted(CALL_OPTIONS))
            raise ConfigurationError(
                f"{source.where.format(key=name)}: {name!r} is an HTTP option that does not "
                f"apply to calls (call options: {known})",
                option=name,
            )
    return config_from(read_options(options, source, _CALL_TABLE))
