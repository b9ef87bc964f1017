"""A call's identity, sans-I/O: the key and the fingerprint from the call's arguments, and
:class:`CallSpec`, built once per decorated function and validated at decoration."""

from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ..errors import ArgumentError, CodecError, ConfigurationError, InvalidKeyError
from ..keys import MAX_KEY_LENGTH, record_id
from .results import (
    FAILURE,
    RESULT,
    PickleCodec,
    ResultCodec,
    envelope,
    failure_payload,
    open_envelope,
    rebuild_failure,
    resolve_codec,
    return_annotation,
    to_json,
)

__all__ = [
    "CALL_METHOD",
    "KEY_ARGUMENT",
    "CallSpec",
    "call_fingerprint",
    "call_record_id",
    "check_key",
]

#: What stands for the HTTP method in a call's record id: call records never meet requests'.
CALL_METHOD = "CALL"

#: The keyword a caller passes the key with at call time (taken off the call unless the
#: function itself has a parameter of that name).
KEY_ARGUMENT = "idempotency_key"


# -- keys and fingerprints ------------------------------------------------------------------------


def call_record_id(name: str, key: str) -> str:
    """The store address of a call's key: a hash of (function name, key), apart from every HTTP
    request's (the CLI's ``--function`` computes the same)."""
    return record_id("", CALL_METHOD, name, key)


def check_key(key: object, name: str) -> str:
    """A call's key as a string: ``str`` or ``int``, 1-255 characters.

    Raises:
        InvalidKeyError: anything else (what is wrong, never the key itself).
    """
    if isinstance(key, int) and not isinstance(key, bool):
        key = str(key)
    if not isinstance(key, str):
        raise InvalidKeyError(
            f"the idempotency key of {name}() must be a str or int, got {type(key).__name__}"
        )
    if not key:
        raise InvalidKeyError(f"the idempotency key of {name}() is empty")
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidKeyError(
            f"the idempotency key of {name}() is longer than {MAX_KEY_LENGTH} characters"
        )
    return key


def call_fingerprint(name: str, arguments: Mapping[str, Any]) -> str:
    """What makes two calls with one key "the same call": a hash of the function name and the
    arguments (canonical JSON: argument order and dict key order do not matter).

    Raises:
        TypeError: an argument is not JSON (see :func:`to_json`).
    """
    canonical = json.dumps(
        {k: to_json(v) for k, v in arguments.items()},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256(b"CALL\x00" + f"{name}\x00{canonical}".encode()).hexdigest()


#: ``self`` and ``cls`` name the object a method is called on: never part of a fingerprint.
_RECEIVERS = frozenset({"self", "cls"})


class CallSpec:
    """How one decorated function's calls are keyed, fingerprinted and stored: everything
    validated once, at decoration.

    Args:
        function: the function.
        name: what its keys are scoped by (default: its qualified name).
        key: a callable over the arguments (called like the function), a parameter name, or
            several; ``None``: the key comes at call time (``idempotency_key=``).
        fingerprint: the parameter names the fingerprint covers (default: every argument but
            ``self``/``cls`` and the key argument).
        codec: ``"json"``, ``"pickle"`` or a :class:`ResultCodec`.
        final: exception types that are outcomes: stored, and raised again to every duplicate.

    Raises:
        ConfigurationError: a bad option, named (e.g. a ``key`` naming no parameter).
    """

    __slots__ = (
        "_annotation",
        "_localns",
        "codec",
        "final",
        "fingerprint_names",
        "function",
        "key",
        "key_names",
        "name",
        "signature",
        "takes_key",
    )

    def __init__(
        self,
        function: Callable[..., Any],
        *,
        name: str | None = None,
        key: Callable[..., Any] | str | Sequence[str] | None = None,
        fingerprint: Sequence[str] | None = None,
        codec: str | ResultCodec = "json",
        final: Iterable[type[BaseException]] = (),
        localns: Mapping[str, Any] | None = None,
    ) -> None:
        if not callable(function):
            raise ConfigurationError(f"not a function: {function!r}")
        if inspect.isgeneratorfunction(function) or inspect.isasyncgenfunction(function):
            raise ConfigurationError(
                f"{getattr(function, '__qualname__', function)}: a generator function cannot be "
                "idempotent (its values are made after the call returns, so there is no result "
                "to store); return a list instead"
            )
        self.function = function
        qualname = getattr(function, "__qualname__", None) or getattr(function, "__name__", "")
        if name is None:
            name = qualname
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f"name must be a non-empty string, got {name!r}")
        self.name = name
        try:
            self.signature = inspect.signature(function)
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(f"{name}: cannot read its signature ({exc})") from exc
        parameters = self.signature.parameters
        #: The function takes the key itself (a parameter named ``idempotency_key``).
        self.takes_key = KEY_ARGUMENT in parameters
        self.key: Callable[..., Any] | None = None
        self.key_names: tuple[str, ...] = ()
        if callable(key):
            self.key = key
        elif key is not None:
            names = (key,) if isinstance(key, str) else tuple(key)
            self._check_names("key", names)
            if not names:
                raise ConfigurationError("key must name at least one parameter")
            self.key_names = names
        if fingerprint is None:
            self.fingerprint_names = tuple(
                p for p in parameters if p not in _RECEIVERS and p != KEY_ARGUMENT
            )
        else:
            if isinstance(fingerprint, str):
                fingerprint = (fingerprint,)
            names = tuple(fingerprint)
            self._check_names("fingerprint", names)
            self.fingerprint_names = names
        self.codec = resolve_codec(codec)
        finals: tuple[Any, ...] = (final,) if isinstance(final, type) else tuple(final)
        for kind in finals:
            if not (isinstance(kind, type) and issubclass(kind, BaseException)):
                raise ConfigurationError(f"final must list exception types, got {kind!r}")
        self.final: tuple[type[BaseException], ...] = finals
        # The return annotation: resolved now when it can be (a class defined later in the
        # module is resolved at the first call, before the function runs).
        self._annotation: Any = None
        self._localns = localns
        self._resolve(at_call=False)

    def _resolve(self, *, at_call: bool) -> None:
        if isinstance(self.codec, PickleCodec):  # pickle keeps the type itself
            self._annotation, self._localns = Any, None
            return
        try:
            self._annotation = return_annotation(self.function, self._localns)
        except NameError as exc:
            if not at_call:
                return
            raise ConfigurationError(
                f"{self.name}(): its return annotation cannot be resolved at run time: {exc}. A "
                "replay would hand back raw JSON instead of that type: import the type at run "
                "time (not under TYPE_CHECKING) and define the classes it names where the "
                "function's module sees them, or pass codec='pickle'"
            ) from exc
        self._localns = None

    def _check_names(self, option: str, names: Sequence[str]) -> None:
        parameters = self.signature.parameters
        for item in names:
            if not isinstance(item, str) or item not in parameters:
                known = ", ".join(parameters) or "none"
                raise ConfigurationError(
                    f"{option}={item!r}: {self.name}() has no such parameter (it has: {known})"
                )

    def prepare(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[str, str, dict[str, Any]]:
        """Key, fingerprint and the keyword arguments to call the function with, for one call.

        Raises:
            InvalidKeyError: no key (none configured and none passed), or a malformed one.
            TypeError: the arguments do not fit the signature.
            ArgumentError: an argument the fingerprint covers is not JSON (named).
            ConfigurationError: the return annotation cannot be resolved (named; nothing ran).
        """
        if self._annotation is None:
            self._resolve(at_call=True)
        given: object = None
        if KEY_ARGUMENT in kwargs and not self.takes_key:
            kwargs = dict(kwargs)
            given = kwargs.pop(KEY_ARGUMENT)
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        arguments = bound.arguments
        if given is None and self.takes_key:
            given = arguments.get(KEY_ARGUMENT)
        if given is not None:
            key = check_key(given, self.name)
        elif self.key is not None:
            key = check_key(self.key(*args, **kwargs), self.name)
        elif self.key_names:
            key = check_key(_key_of([arguments[n] for n in self.key_names]), self.name)
        else:
            raise InvalidKeyError(
                f"no idempotency key for {self.name}(): pass {KEY_ARGUMENT}=... or set key= on "
                "the decorator"
            )
        covered = {n: arguments[n] for n in self.fingerprint_names if n in arguments}
        try:
            fingerprint = call_fingerprint(self.name, covered)
        except TypeError as exc:
            bad = next((n for n, v in covered.items() if not _jsonable(v)), "?")
            raise ArgumentError(
                f"{self.name}(): argument {bad!r} cannot be fingerprinted ({exc}); leave it out "
                "with fingerprint=[...] naming the arguments that identify the call",
                argument=bad,
            ) from exc
        return key, fingerprint, kwargs

    # -- outcomes ---------------------------------------------------------------------------

    def annotation(self) -> Any:
        """The function's return annotation, resolved (``Any`` when there is none).

        Raises:
            ConfigurationError: it cannot be resolved at run time (named).
        """
        if self._annotation is None:
            self._resolve(at_call=True)
        return self._annotation

    def encode_result(self, value: Any) -> bytes:
        """The envelope of a result.

        Raises:
            CodecError: the codec cannot encode it (the type and the ``codec`` option named).
        """
        try:
            payload = self.codec.encode(value)
        except (TypeError, ValueError) as exc:
            raise CodecError(
                f"the result of {self.name}() cannot be stored with the {self.codec.name} codec "
                f"({exc}); return JSON data, a dataclass or a Pydantic model, or pass "
                "codec='pickle'"
            ) from exc
        return envelope(RESULT, self.codec.name, payload)

    def final_base(self, error: BaseException) -> type[BaseException] | None:
        """The listed final type ``error`` is an instance of, else ``None``."""
        for kind in self.final:
            if isinstance(error, kind):
                return kind
        return None

    def encode_failure(self, error: BaseException, base: type[BaseException]) -> bytes:
        """The envelope of a final exception: its type, message and (JSON) arguments."""
        return envelope(FAILURE, "json", failure_payload(error, base))

    def decode(self, data: bytes) -> Any:
        """The stored result; or the stored final exception, raised.

        Raises:
            CodecError: the record cannot be read, or was written by another codec.
        """
        kind, codec, payload = open_envelope(data)
        if kind == FAILURE:
            raise rebuild_failure(payload, self.final, self.name)
        if kind != RESULT:
            raise CodecError(f"unknown kind {kind} of stored call outcome")
        if codec != self.codec.name:
            raise CodecError(
                f"the result of {self.name}() was stored by the {codec} codec; this function "
                f"reads {self.codec.name}"
            )
        try:
            return self.codec.decode(payload, self.annotation())
        except CodecError:
            raise
        except Exception as exc:
            raise CodecError(f"the stored result of {self.name}() cannot be read: {exc}") from exc


def _key_of(values: list[Any]) -> object:
    """The key named arguments make: one string or int as it is, else their JSON."""
    if len(values) == 1 and isinstance(values[0], str | int):
        return values[0]
    data = to_json(values[0] if len(values) == 1 else values)
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _jsonable(value: Any) -> bool:
    try:
        to_json(value)
    except TypeError:
        return False
    return True
