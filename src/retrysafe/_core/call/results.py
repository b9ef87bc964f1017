"""A call's outcome as the store keeps it: the typed JSON codec (:func:`to_json` and
:func:`from_json`, the types Python code returns), the result codecs (:class:`JSONCodec` by
default, :class:`PickleCodec` only when asked) and the record envelope::

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
import inspect
import json
import pickle
import sys
import types
import typing
import uuid
from collections.abc import Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

from ..errors import CodecError, ConfigurationError

__all__ = [
    "FAILURE",
    "RESULT",
    "JSONCodec",
    "PickleCodec",
    "ResultCodec",
    "check_resolvable",
    "describe_outcome",
    "envelope",
    "failure_payload",
    "from_json",
    "open_envelope",
    "rebuild_failure",
    "resolve_codec",
    "return_annotation",
    "to_json",
    "type_hints",
]

#: The kinds of stored outcome.
RESULT = 0
FAILURE = 1

_MAGIC = b"RC"
_VERSION = 1
_EMPTY = inspect.Parameter.empty
_SCALARS = frozenset({str, int, float, bool})


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
        hints = type_hints(annotation)
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


def type_hints(owner: Any) -> dict[str, Any]:
    try:
        return typing.get_type_hints(owner)
    except Exception:  # unresolvable names (a class defined inside a function): plain JSON
        return {}


def return_annotation(function: Any, localns: Mapping[str, Any] | None = None) -> Any:
    """``function``'s return annotation, resolved (``Any`` when there is none or it is
    ``None``), in its module and ``localns`` (the namespace it was decorated in: a class defined
    inside a function).

    Raises:
        NameError: the annotation names something that does not exist at run time (a type
            imported under ``TYPE_CHECKING``, a class not yet defined), or a dataclass it
            names has such a field (:func:`check_resolvable`).
    """
    raw = getattr(function, "__annotations__", {}).get("return", _EMPTY)
    if raw is _EMPTY:
        return Any
    owner = inspect.unwrap(function)
    holder: Any = lambda: None  # noqa: E731  (only the return annotation is resolved)
    holder.__annotations__ = {"return": raw}
    try:
        annotation = typing.get_type_hints(
            holder, globalns=getattr(owner, "__globals__", None), localns=dict(localns or {})
        )["return"]
    except Exception as exc:
        raise NameError(f"{raw!r} cannot be resolved ({exc})") from exc
    if annotation is type(None):
        return Any
    check_resolvable(annotation)
    return annotation


def check_resolvable(annotation: Any, seen: set[Any] | None = None) -> None:
    """Check that every dataclass ``annotation`` names (within unions, lists, dicts...) has
    field types that resolve at run time: :func:`from_json` rebuilds their fields by them.

    Raises:
        NameError: one does not (the class and the name are said).
    """
    seen = set() if seen is None else seen
    if annotation in seen or annotation is Any:
        return
    try:
        seen.add(annotation)
    except TypeError:  # an unhashable annotation: nothing of ours to look into
        return
    for arg in typing.get_args(annotation):
        check_resolvable(arg, seen)
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        try:
            hints = typing.get_type_hints(annotation)
        except Exception as exc:
            raise NameError(f"{annotation.__qualname__}: {exc}") from exc
        for hint in hints.values():
            check_resolvable(hint, seen)


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


def envelope(kind: int, codec: str, payload: bytes) -> bytes:
    name = codec.encode("ascii")
    return b"".join((_MAGIC, bytes((_VERSION, kind, len(name))), name, payload))


def describe_outcome(data: bytes) -> str:
    """A stored call outcome in words, without decoding the result (its codec may be pickle):
    for operators (``retrysafe inspect --function``)."""
    try:
        kind, codec, payload = open_envelope(data)
    except CodecError as exc:
        return f"unreadable: {exc}"
    if kind == FAILURE:
        try:
            failure = json.loads(payload)
            return f"final exception: {failure['type']}: {failure['message']}"
        except (ValueError, KeyError, TypeError):
            return "final exception (unreadable)"
    return f"result: {len(payload)} bytes ({codec} codec)"


def open_envelope(data: bytes) -> tuple[int, str, bytes]:
    if type(data) is not bytes:
        data = bytes(data)
    if len(data) < 5 or data[:2] != _MAGIC or data[2] != _VERSION:
        raise CodecError("the stored record is not a call result of a known format")
    end = 5 + data[4]
    if len(data) < end:
        raise CodecError("the stored call result is truncated")
    return data[3], data[5:end].decode("ascii", "replace"), data[end:]


def failure_payload(error: BaseException, base: type[BaseException]) -> bytes:
    """A final exception as JSON: its type, its listed base, its message and (JSON) arguments."""
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
    return json.dumps(payload).encode()


def rebuild_failure(
    payload: bytes, final: Iterable[type[BaseException]], name: str
) -> BaseException:
    """The exception :func:`failure_payload` stored, built from classes already loaded: its own
    type when loaded and a subclass of its listed base, else that base.

    Raises:
        CodecError: the payload cannot be read, or its base is not in ``final`` any more.
    """
    try:
        stored = json.loads(payload)
        type_name, base_name = str(stored["type"]), str(stored["base"])
        message, args = str(stored["message"]), stored.get("args")
    except (ValueError, KeyError, TypeError) as exc:
        raise CodecError(f"the stored exception of {name}() cannot be read") from exc
    bases = {f"{k.__module__}.{k.__qualname__}": k for k in final}
    base = bases.get(base_name)
    if base is None:
        raise CodecError(
            f"{name}() stored a final {type_name} but {base_name} is not in final= any more"
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
    error.add_note(f"retrysafe: the stored outcome of the first {name}() with this key")
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
