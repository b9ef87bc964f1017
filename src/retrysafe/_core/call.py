"""The call layer of the keyed operation, sans-I/O: a function call made safe to repeat (DESIGN
section 6).

What is a call's own lives here: the key and the fingerprint from the call's arguments
(:class:`CallSpec`, built once per decorated function and validated at decoration), the result's
encoding (:class:`JSONCodec` by default, :class:`PickleCodec` only when asked), the exceptions
that are final outcomes, and :class:`Call`, the :class:`~retrysafe._core.operation.Operation`
whose verdicts are "run it", the stored result, or an exception: :class:`KeyReusedError`,
:class:`InProgressError`, :class:`OutcomeUnknownError`, a store error.

A stored outcome is an envelope::

    b"RC" | version (1 byte) | kind (1 byte: 0 result, 1 final exception)
    | codec name length (1 byte) | codec name | payload

The codec's name is kept so that a record written by one codec is never read by another (a JSON
store is never unpickled). A final exception is kept as JSON: its type's name, its message and its
arguments when they are JSON; a duplicate gets an exception of the same type with the same
message, built only from classes already loaded and listed as final (nothing is imported from what
a store holds).
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import decimal
import enum
import hashlib
import inspect
import json
import logging
import pickle
import sys
import types
import typing
import uuid
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from .config import OPTIONS, IdempotencyConfig, config_from
from .errors import (
    CodecError,
    ConfigurationError,
    InProgressError,
    InvalidKeyError,
    KeyReusedError,
    OutcomeUnknownError,
    StoreError,
    StoreUnavailableError,
)
from .keys import MAX_KEY_LENGTH, record_id
from .operation import EMIT, FINALIZE, Action, Operation, Steps, retry_after
from .options import ConfigSource, read_options

__all__ = [
    "CALL_METHOD",
    "CALL_OPTIONS",
    "KEY_ARGUMENT",
    "REPLAYED",
    "Call",
    "CallSpec",
    "JSONCodec",
    "PickleCodec",
    "ResultCodec",
    "call_config",
    "call_fingerprint",
    "call_record_id",
    "check_key",
    "describe_outcome",
    "from_json",
    "resolve_codec",
    "to_json",
]

#: Verdict of :meth:`Call.claim`: the stored result is in :attr:`Call.value`.
REPLAYED = "replayed"

#: What stands for the HTTP method in a call's record id: call records never meet requests'.
CALL_METHOD = "CALL"

#: The keyword a caller passes the key with at call time (taken off the call unless the
#: function itself has a parameter of that name).
KEY_ARGUMENT = "idempotency_key"

#: The :class:`~retrysafe.IdempotencyConfig` fields that mean something for a call; the others
#: are HTTP's (methods, body limits, status policy, replay headers...).
CALL_OPTIONS = frozenset(
    {
        "ttl",
        "lease",
        "on_conflict",
        "conflict_wait",
        "on_store_error",
        "transactional",
        "on_event",
        "adaptive_retry_after",
    }
)

logger = logging.getLogger("retrysafe")

#: The loader's coercions of the options that apply to calls.
_CALL_TABLE = {name: OPTIONS[name] for name in CALL_OPTIONS}

_MAGIC = b"RC"
_VERSION = 1
_RESULT = 0
_FAILURE = 1
_EMPTY = inspect.Parameter.empty
_SCALARS = frozenset({str, int, float, bool})


def call_config(
    config: IdempotencyConfig | None, options: Mapping[str, Any], *, where: str
) -> IdempotencyConfig:
    """The settings of a call front, from ``config=`` or keyword options, read by the loader every
    front uses (:meth:`~retrysafe.IdempotencyConfig.from_mapping`: ``ttl="1d"`` works, a typo
    gets "did you mean").

    Args:
        config: ``config=``, or ``None``.
        options: keyword options (each a field of :class:`~retrysafe.IdempotencyConfig` that
            applies to calls: :data:`CALL_OPTIONS`).
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


# -- JSON with the types Python code returns -----------------------------------------------------


def to_json(value: Any) -> Any:
    """``value`` as JSON data: dataclasses and Pydantic models as objects, tuples and sets as
    arrays, enums as their values, dates and times as ISO 8601, UUIDs and decimals as strings,
    bytes as base64.

    Raises:
        TypeError: a value of another type (named).
    """
    if value is None or isinstance(value, str | int | float):
        return value
    if isinstance(value, list | tuple):
        return [to_json(item) for item in value]
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if isinstance(k, enum.Enum):
                k = k.value
            if not isinstance(k, str | int | float | bool) and k is not None:
                raise TypeError(f"a dict key of type {type(k).__name__} is not JSON")
            out[k if isinstance(k, str) else json.dumps(k)] = to_json(v)
        return out
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    dump = getattr(value, "model_dump", None)  # a Pydantic (v2) model, without importing it
    if dump is not None and callable(dump) and not isinstance(value, type):
        return dump(mode="json")
    if isinstance(value, enum.Enum):
        return to_json(value.value)
    if isinstance(value, set | frozenset):
        items = [to_json(item) for item in value]
        try:
            return sorted(items)
        except TypeError:
            return sorted(items, key=lambda item: json.dumps(item, sort_keys=True))
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, uuid.UUID | decimal.Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    raise TypeError(f"a value of type {type(value).__name__} is not JSON")


def from_json(annotation: Any, data: Any) -> Any:
    """Rebuild a value of type ``annotation`` from what :func:`to_json` made of it (the inverse
    for the types it names, within lists, tuples, sets, dicts and optional values); data of any
    other annotation is returned as JSON gave it."""
    if data is None or annotation is Any or annotation is _EMPTY or annotation is None:
        return data
    if type(data) is annotation and annotation in _SCALARS:
        return data  # the leaves of most results: nothing to rebuild
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return from_json(typing.get_args(annotation)[0], data)
    if origin is typing.Union or origin is types.UnionType:
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        return from_json(members[0], data) if len(members) == 1 else data
    if origin is not None:
        args = typing.get_args(annotation)
        if origin is tuple and isinstance(data, list):
            if len(args) == 2 and args[1] is Ellipsis:
                return tuple(from_json(args[0], item) for item in data)
            if args and len(args) == len(data):
                return tuple(from_json(a, item) for a, item in zip(args, data, strict=True))
            return tuple(data)
        if origin in (list, set, frozenset) and isinstance(data, list):
            item_type = args[0] if args else Any
            return origin(from_json(item_type, item) for item in data)
        if origin is dict and isinstance(data, dict):
            key_type, value_type = args if len(args) == 2 else (Any, Any)
            return {from_json(key_type, k): from_json(value_type, v) for k, v in data.items()}
        return data
    if not isinstance(annotation, type):
        return data
    if dataclasses.is_dataclass(annotation) and isinstance(data, dict):
        hints = _hints(annotation)
        values = {
            f.name: from_json(hints.get(f.name, Any), data[f.name])
            for f in dataclasses.fields(annotation)
            if f.init and f.name in data
        }
        return annotation(**values)
    validate = getattr(annotation, "model_validate", None)  # a Pydantic (v2) model class
    if validate is not None and callable(validate):
        return validate(data)
    if issubclass(annotation, enum.Enum):
        return annotation(data)
    if annotation is datetime.datetime and isinstance(data, str):
        return datetime.datetime.fromisoformat(data)
    if annotation is datetime.date and isinstance(data, str):
        return datetime.date.fromisoformat(data)
    if annotation is datetime.time and isinstance(data, str):
        return datetime.time.fromisoformat(data)
    if annotation in (uuid.UUID, decimal.Decimal) and isinstance(data, str):
        return annotation(data)
    if annotation is bytes and isinstance(data, str):
        return base64.b64decode(data)
    if annotation in (tuple, set, frozenset) and isinstance(data, list):
        return annotation(data)
    if annotation in (int, float) and isinstance(data, str):
        return annotation(data)  # a dict key JSON turned into a string
    return data


def _hints(owner: Any) -> dict[str, Any]:
    try:
        return typing.get_type_hints(owner)
    except Exception:  # unresolvable names (a class defined inside a function): plain JSON
        return {}


# -- result codecs --------------------------------------------------------------------------------


@runtime_checkable
class ResultCodec(Protocol):
    """Turns a call's result into bytes for the store, and back.

    Attributes:
        name: kept with every record, so that a record is only ever read by the codec that
            wrote it (at most 255 ASCII characters).
    """

    name: str

    def encode(self, value: Any) -> bytes:
        """The bytes to store for ``value``.

        Raises:
            TypeError: the value cannot be encoded (it is named in the error).
        """
        ...

    def decode(self, data: bytes, annotation: Any) -> Any:
        """The value ``data`` holds; ``annotation`` is the function's return annotation."""
        ...


class JSONCodec:
    """JSON (the default): results are stored as readable, portable data, and come back as the
    return annotation says (dataclasses, Pydantic models, tuples, dates... see :func:`to_json`).
    """

    name = "json"

    def encode(self, value: Any) -> bytes:
        """See :meth:`ResultCodec.encode`."""
        return json.dumps(to_json(value), separators=(",", ":"), ensure_ascii=False).encode()

    def decode(self, data: bytes, annotation: Any) -> Any:
        """See :meth:`ResultCodec.decode`."""
        return from_json(annotation, json.loads(data))


class PickleCodec:
    """Pickle, for results JSON cannot hold. Only when asked for (``codec="pickle"``): reading a
    pickle runs code, so everyone who can write to the store can run code in the caller."""

    name = "pickle"

    def encode(self, value: Any) -> bytes:
        """See :meth:`ResultCodec.encode`."""
        try:
            return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except (pickle.PicklingError, AttributeError) as exc:
            raise TypeError(str(exc)) from exc

    def decode(self, data: bytes, annotation: Any) -> Any:
        """See :meth:`ResultCodec.decode`."""
        return pickle.loads(data)


def resolve_codec(codec: str | ResultCodec) -> ResultCodec:
    """``"json"``, ``"pickle"`` or a :class:`ResultCodec` instance.

    Raises:
        ConfigurationError: anything else (the option ``codec`` is named).
    """
    if codec == "json":
        return JSONCodec()
    if codec == "pickle":
        return PickleCodec()
    if isinstance(codec, str) or not isinstance(codec, ResultCodec):
        raise ConfigurationError(
            f"codec must be 'json', 'pickle' or an object with name, encode and decode, "
            f"got {codec!r}"
        )
    name = codec.name
    if not isinstance(name, str) or not name.isascii() or not 0 < len(name) < 256:
        raise ConfigurationError(f"codec.name must be 1-255 ASCII characters, got {name!r}")
    return codec


def _envelope(kind: int, codec: str, payload: bytes) -> bytes:
    name = codec.encode("ascii")
    return b"".join((_MAGIC, bytes((_VERSION, kind, len(name))), name, payload))


def describe_outcome(data: bytes) -> str:
    """A stored call outcome in words, without decoding the result (its codec may be pickle):
    for operators (``retrysafe inspect --function``)."""
    try:
        kind, codec, payload = _open(data)
    except CodecError as exc:
        return f"unreadable: {exc}"
    if kind == _FAILURE:
        try:
            failure = json.loads(payload)
            return f"final exception: {failure['type']}: {failure['message']}"
        except (ValueError, KeyError, TypeError):
            return "final exception (unreadable)"
    return f"result: {len(payload)} bytes ({codec} codec)"


def _open(data: bytes) -> tuple[int, str, bytes]:
    if type(data) is not bytes:
        data = bytes(data)
    if len(data) < 5 or data[:2] != _MAGIC or data[2] != _VERSION:
        raise CodecError("the stored record is not a call result of a known format")
    end = 5 + data[4]
    if len(data) < end:
        raise CodecError("the stored call result is truncated")
    return data[3], data[5:end].decode("ascii", "replace"), data[end:]


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
    ) -> None:
        if not callable(function):
            raise ConfigurationError(f"not a function: {function!r}")
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
        self._annotation: Any = None  # the return annotation, resolved on first use

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
            ConfigurationError: an argument the fingerprint covers is not JSON (named).
        """
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
            raise ConfigurationError(
                f"{self.name}(): argument {bad!r} cannot be fingerprinted ({exc}); leave it out "
                "with fingerprint=[...] naming the arguments that identify the call"
            ) from exc
        return key, fingerprint, kwargs

    # -- outcomes ---------------------------------------------------------------------------

    def annotation(self) -> Any:
        """The function's return annotation, resolved (``Any`` when there is none)."""
        if self._annotation is None:
            hints = _hints(self.function)
            self._annotation = hints.get("return", Any)
            if self._annotation is type(None):
                self._annotation = Any
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
        return _envelope(_RESULT, self.codec.name, payload)

    def final_base(self, error: BaseException) -> type[BaseException] | None:
        """The listed final type ``error`` is an instance of, else ``None``."""
        for kind in self.final:
            if isinstance(error, kind):
                return kind
        return None

    def encode_failure(self, error: BaseException, base: type[BaseException]) -> bytes:
        """The envelope of a final exception: its type, message and (JSON) arguments."""
        kind = type(error)
        try:
            args: Any = to_json(list(error.args))
        except TypeError:
            args = None
        payload = {
            "type": f"{kind.__module__}.{kind.__qualname__}",
            "base": f"{base.__module__}.{base.__qualname__}",
            "message": str(error),
            "args": args,
        }
        return _envelope(_FAILURE, "json", json.dumps(payload).encode())

    def decode(self, data: bytes) -> Any:
        """The stored result; or the stored final exception, raised.

        Raises:
            CodecError: the record cannot be read, or was written by another codec.
        """
        kind, codec, payload = _open(data)
        if kind == _FAILURE:
            raise self._rebuild(payload)
        if kind != _RESULT:
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

    def _rebuild(self, payload: bytes) -> BaseException:
        try:
            stored = json.loads(payload)
            type_name, base_name = str(stored["type"]), str(stored["base"])
            message, args = str(stored["message"]), stored.get("args")
        except (ValueError, KeyError, TypeError) as exc:
            raise CodecError(f"the stored exception of {self.name}() cannot be read") from exc
        bases = {f"{k.__module__}.{k.__qualname__}": k for k in self.final}
        base = bases.get(base_name)
        if base is None:
            raise CodecError(
                f"{self.name}() stored a final {type_name} but {base_name} is not in final= "
                "any more"
            )
        kind = _loaded_class(type_name)
        if kind is None or not issubclass(kind, base):
            kind = base
        error: BaseException
        try:
            error = kind(*args) if isinstance(args, list) else kind(message)
        except Exception:
            error = kind.__new__(kind)
            error.args = (message,)
        if str(error) != message:
            error = kind.__new__(kind)
            error.args = (message,)
        error.add_note(f"retrysafe: the stored outcome of the first {self.name}() with this key")
        return error


def _loaded_class(qualified: str) -> type[BaseException] | None:
    """The class a stored type name names, among modules already imported (never imports)."""
    parts = qualified.split(".")
    for cut in range(len(parts) - 1, 0, -1):  # module names have dots too: longest first
        found: Any = sys.modules.get(".".join(parts[:cut]))
        for attr in parts[cut:]:
            found = getattr(found, attr, None)
        if isinstance(found, type) and issubclass(found, BaseException):
            return found
    return None


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


class Call(Operation[str]):
    """One keyed call from its reservation to its settlement.

    Args:
        config: the call's settings (:func:`call_config`).
        spec: how the function's calls are keyed and stored.
        key: this call's key.
        fingerprint: this call's fingerprint (:meth:`CallSpec.prepare`, or
            :func:`call_fingerprint` over what identifies a message).
    """

    __slots__ = ("replayed", "spec", "value")

    def __init__(
        self, config: IdempotencyConfig, spec: CallSpec, key: str, fingerprint: str
    ) -> None:
        Operation.__init__(self, config, call_record_id(spec.name, key), fingerprint)
        self.spec = spec
        #: The stored result, after :meth:`claim` returned :data:`REPLAYED`.
        self.value: Any = None
        #: The outcome came from the store (the function did not run for this call).
        self.replayed = False

    # -- the operation's hooks: results and exceptions -----------------------------------------

    def details(self) -> dict[str, Any]:
        """The kind (``call``), the function's name and the hashed record prefix."""
        return {"record": self.record_id[:16], "kind": "call", "function": self.spec.name}

    def kind(self) -> tuple[str, str]:
        """Calls are timed per function."""
        return (CALL_METHOD, self.spec.name)

    def replay(self, data: bytes) -> Generator[Action, Any, str]:
        """The stored result (in :attr:`value`), or the stored final exception, raised."""
        self.replayed = True
        if self.config.on_event is not None:
            yield EMIT, "replayed"
        try:
            self.value = self.spec.decode(data)
        except CodecError as exc:
            yield from self._emit("store_error", error=exc, phase="replay")
            raise
        return REPLAYED

    def reused(self) -> str:
        """Raises :class:`KeyReusedError`."""
        raise KeyReusedError(
            f"the idempotency key of {self.spec.name}() was used before with different "
            "arguments; nothing ran",
            function=self.spec.name,
            record=self.record_id[:16],
        )

    def unknown(self) -> str:
        """Raises :class:`OutcomeUnknownError`."""
        raise OutcomeUnknownError(
            f"the first {self.spec.name}() with this key committed its effects but its result "
            "was never stored; it will not run again until an operator resolves the key "
            f"(retrysafe resolve --function {self.spec.name} --key ...)",
            function=self.spec.name,
            record=self.record_id[:16],
        )

    def in_progress(self, seconds: int) -> str:
        """Raises :class:`InProgressError` carrying ``retry_after``."""
        raise InProgressError(
            f"the first {self.spec.name}() with this key is still running; retry in {seconds} s",
            retry_after=seconds,
            function=self.spec.name,
            record=self.record_id[:16],
        )

    def fenced(self) -> str:
        """Raises :class:`InProgressError`: another caller took the key over; this call's
        writes were rolled back."""
        raise InProgressError(
            f"the lease of this {self.spec.name}() was taken over by another caller; its writes "
            "were rolled back",
            retry_after=retry_after(self.config.lease),
            function=self.spec.name,
            record=self.record_id[:16],
        )

    def unavailable(self, detail: str, **extra: object) -> Generator[Action, Any, str]:
        """Raises the store's error (or :class:`StoreUnavailableError` with ``detail``)."""
        yield from self._emit("store_error", **extra)
        error = extra.get("error")
        if isinstance(error, StoreError):
            raise error
        cause = error if isinstance(error, BaseException) else None
        raise StoreUnavailableError(detail) from cause

    # -- settlement ------------------------------------------------------------------------

    def settle(self, value: Any) -> Steps:
        """The function returned ``value``: store it (fenced; in transactional mode committed
        with the function's writes).

        Raises:
            CodecError: the codec cannot encode the value (the key is freed, or kept as outcome
                unknown after committed effects; in transactional mode the writes roll back).
            StoreError: the transaction could not commit (its writes rolled back; retry).
            InProgressError: the lease was taken over before the commit (writes rolled back).
        """
        try:
            data = self.spec.encode_result(value)
        except CodecError:
            yield from self.abandon()
            raise
        if self.in_tx:
            yield from self.settle_transaction(data)
        else:
            yield from self.settle_data(data)

    def failed(self, error: BaseException) -> Steps:
        """The function raised ``error`` (the caller re-raises it): a final exception is stored
        as the outcome (the function's writes roll back first); any other frees the key (or,
        after committed effects, keeps it as outcome unknown)."""
        base = self.spec.final_base(error)
        if base is None:
            yield from self.abandon()
            return
        data = self.spec.encode_failure(error, base)
        if self.in_tx:
            try:
                yield FINALIZE, False
            except Exception:  # the writes roll back either way; the outcome stands
                logger.exception("a finalizer of %s failed", self.record_id[:12])
            yield from self._rollback_and_close()
        yield from self.settle_data(data)
