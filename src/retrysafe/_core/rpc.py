"""The RPC layer of the keyed operation, sans-I/O: a unary gRPC call as an operation (DESIGN
section 7). It names no gRPC type: status codes travel by name (``"OK"``, ``"ABORTED"``), so
the core imports no framework; the gRPC shells (:mod:`retrysafe.contrib.grpc`) translate.

- :func:`admit_rpc`: the ``idempotency-key`` metadata entry: none (pass, or
  ``INVALID_ARGUMENT`` where required), malformed, or on a streaming method (refused: only a
  unary-unary call has one request and one outcome to store).
- :class:`RpcFlow`: one call from its claim to its settlement. The record is addressed by the
  principal and the key alone, so the same key sent to another method is a reused key
  (``INVALID_ARGUMENT``), never a second operation; the fingerprint is the method and the
  request's bytes. The stored outcome is the status code, its details, the trailing metadata
  and the serialized response.
- The status policy (:data:`DEFAULT_RELEASE_CODES`) mirrors HTTP's: outcomes of executed work
  are stored (``OK``, ``NOT_FOUND``, ``ALREADY_EXISTS``, ``FAILED_PRECONDITION``,
  ``OUT_OF_RANGE``); server-side failures and rejections that mean nothing ran release the key
  (as 5xx and 400/401/403/408/409/429 do), so the client may retry with the same key.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Sequence
from typing import Any

from .codec import decode, encode
from .config import IdempotencyConfig
from .errors import CodecError, InvalidKeyError, StoreError
from .fingerprint import fingerprint
from .keys import parse_key, record_id
from .operation import EMIT, Action, Operation, Steps, retry_after
from .scope import authorization_scope

__all__ = [
    "CODES",
    "DEFAULT_RELEASE_CODES",
    "KEY",
    "REPLAYED",
    "RpcAnswer",
    "RpcFlow",
    "admit_rpc",
    "metadata_principal",
]

logger = logging.getLogger("retrysafe")

#: The metadata entry that carries the key, and the one that marks a replay (lower case, as
#: gRPC requires of metadata keys).
KEY = "idempotency-key"
REPLAYED = "idempotency-replayed"
#: gRPC's server pushback trailer: its retry policy waits this long before the next attempt.
PUSHBACK = "grpc-retry-pushback-ms"

#: Status codes by number (the wire's), as gRPC defines them.
CODES = (
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
)

#: Codes whose call is not stored (the key is freed): server-side failures and rejections that
#: mean nothing ran. Every other code is an outcome of executed work, stored and replayed.
DEFAULT_RELEASE_CODES = frozenset(
    {
        "CANCELLED",
        "UNKNOWN",  # what gRPC answers for a handler's unexpected exception: a 500
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "ABORTED",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    }
)

Metadata = Sequence[tuple[str, str | bytes]]
#: The principal of a call given its invocation metadata.
PrincipalResolver = Callable[[Metadata], str]


class RpcAnswer:
    """An outcome the flow gives instead of running the handler: a status code (by name), its
    details, trailing metadata, and for ``OK`` the serialized response.

    Attributes:
        code: the status code's name (``"OK"``, ``"ABORTED"``...).
        details: the status details.
        response: the serialized response (``OK`` only), else ``None``.
        trailing: trailing metadata pairs.
        event: the event to report for an admission answer (shells emit it), else ``None``.
    """

    __slots__ = ("code", "details", "event", "response", "trailing")

    def __init__(
        self,
        code: str,
        details: str,
        response: bytes | None = None,
        trailing: list[tuple[str, str | bytes]] | None = None,
        event: str | None = None,
    ) -> None:
        self.code = code
        self.details = details
        self.response = response
        self.trailing = trailing or []
        self.event = event

    def __repr__(self) -> str:
        return f"<RpcAnswer {self.code}>"


def metadata_principal(name: str) -> PrincipalResolver:
    """A principal resolver: a hash of the value of metadata entry ``name`` (as the HTTP fronts
    hash ``Authorization``), global when absent."""
    wanted = name.lower()

    def principal(metadata: Metadata) -> str:
        for key, value in metadata:
            if key == wanted:
                return authorization_scope(value)
        return ""

    return principal


def admit_rpc(metadata: Metadata, *, unary: bool, required: bool) -> str | RpcAnswer | None:
    """Admission of a call, from its invocation metadata.

    Args:
        metadata: the call's invocation metadata.
        unary: the method is unary-unary.
        required: a call of this method must carry a key.

    Returns:
        ``None``: no key where it is optional, run unprotected; an :class:`RpcAnswer` to end
        the call with at once (nothing runs); else the parsed key.
    """
    keys = [
        v if isinstance(v, bytes) else v.encode("latin-1", "replace")
        for k, v in metadata
        if k == KEY
    ]
    if not keys:
        if required:
            return RpcAnswer(
                "INVALID_ARGUMENT",
                "This method requires idempotency-key metadata.",
                event="missing_key",
            )
        return None
    if not unary:
        return RpcAnswer(
            "INVALID_ARGUMENT",
            "idempotency-key metadata is supported on unary-unary methods only (a streaming "
            "call has no single request and outcome to store); nothing ran.",
            event="invalid_key",
        )
    try:
        return parse_key(keys)
    except InvalidKeyError as exc:
        detail = "Invalid idempotency-key metadata: " + exc.reason.replace("header", "entry") + "."
        return RpcAnswer("INVALID_ARGUMENT", detail, event="invalid_key")


def _wire_pairs(trailing: Metadata) -> list[tuple[bytes, bytes]]:
    return [
        (k.encode("ascii"), v if isinstance(v, bytes) else v.encode("utf-8")) for k, v in trailing
    ]


class RpcFlow(Operation[RpcAnswer]):
    """One keyed unary call from its reservation to its settlement.

    Args:
        config: the settings.
        method: the full method name (``/pkg.Service/Method``).
        key: the parsed key (from :func:`admit_rpc`).
        request: the request message as it came over the wire.
        principal: who the call acts for ("" global).
        release_codes: the codes that free the key instead of being stored.
    """

    __slots__ = ("method", "release_codes")

    def __init__(
        self,
        config: IdempotencyConfig,
        method: str,
        key: str,
        request: bytes,
        principal: str,
        release_codes: frozenset[str] = DEFAULT_RELEASE_CODES,
    ) -> None:
        Operation.__init__(
            self,
            config,
            record_id(principal, "RPC", "", key),
            fingerprint("RPC", method, b"", request),
        )
        self.method = method
        self.release_codes = release_codes

    # -- the operation's hooks: RPC answers --------------------------------------------------

    def details(self) -> dict[str, Any]:
        """The method (as ``route``: metrics label calls by it) and the hashed record prefix."""
        return {"record": self.record_id[:16] or None, "method": "RPC", "route": self.method}

    def kind(self) -> tuple[str, str]:
        """Calls are timed per method."""
        return ("RPC", self.method)

    def replay(self, data: bytes) -> Generator[Action, Any, RpcAnswer]:
        """The stored outcome, marked ``idempotency-replayed: true``."""
        try:
            _, pairs, body, _ = decode(data)
        except CodecError as exc:
            return (
                yield from self.unavailable(
                    "The stored outcome cannot be read.", error=exc, phase="replay"
                )
            )
        if self.config.on_event is not None:
            yield EMIT, "replayed"
        code = "UNKNOWN"
        details = ""
        trailing: list[tuple[str, str | bytes]] = []
        for name, value in pairs:
            text = name.decode("ascii")
            if text == ":details":
                details = value.decode("utf-8")
            elif text == ":code":
                code = value.decode("ascii")
            else:
                trailing.append((text, value if text.endswith("-bin") else value.decode("utf-8")))
        trailing.append((REPLAYED, "true"))
        return RpcAnswer(code, details, body if code == "OK" else None, trailing)

    def reused(self) -> RpcAnswer:
        """``INVALID_ARGUMENT``: the key was used with another method, request or caller."""
        return RpcAnswer(
            "INVALID_ARGUMENT",
            "This idempotency-key was used with a different request (method or request "
            "message); nothing ran.",
        )

    def unknown(self) -> RpcAnswer:
        """``FAILED_PRECONDITION``: the first call's effects committed, its outcome was lost."""
        return RpcAnswer(
            "FAILED_PRECONDITION",
            "The first call with this idempotency-key committed its effects but its outcome was "
            "never stored. It will not run again; an operator must resolve the key "
            "(retrysafe resolve).",
        )

    def in_progress(self, seconds: int) -> RpcAnswer:
        """``ABORTED`` with ``retry-after`` and gRPC's pushback trailer."""
        return RpcAnswer(
            "ABORTED",
            f"The first call with this idempotency-key is still running; retry in {seconds} s.",
            trailing=[("retry-after", str(seconds)), (PUSHBACK, str(seconds * 1000))],
        )

    def fenced(self) -> RpcAnswer:
        """``ABORTED``: the lease was taken over and the call's writes were rolled back."""
        seconds = retry_after(self.config.lease)
        return RpcAnswer(
            "ABORTED",
            "The lease of this call was taken over; its writes were rolled back. Retry later.",
            trailing=[("retry-after", str(seconds)), (PUSHBACK, str(seconds * 1000))],
        )

    def unavailable(self, detail: str, **extra: object) -> Generator[Action, Any, RpcAnswer]:
        """``UNAVAILABLE`` with ``retry-after``: the store failed (gRPC clients retry it)."""
        yield from self._emit("store_error", **extra)
        seconds = self.config.store_retry_after
        return RpcAnswer(
            "UNAVAILABLE",
            detail,
            trailing=[("retry-after", str(seconds)), (PUSHBACK, str(seconds * 1000))],
        )

    # -- settlement ----------------------------------------------------------------------------

    def stored(
        self, code: str, details: str, response: bytes | None, trailing: Metadata
    ) -> bytes | None:
        """The encoded outcome when the code is stored, else ``None`` (the key is freed)."""
        if code in self.release_codes:
            return None
        pairs = _wire_pairs(trailing)
        if details:
            pairs.append((b":details", details.encode("utf-8")))
        pairs.append((b":code", code.encode("ascii")))
        body = response if code == "OK" and response is not None else b""
        # The response codec's own record (what the store's tools read); the status field is an
        # HTTP status, so the code travels as a pseudo-header.
        return encode(200, pairs, body, lower=False)

    def settle(
        self, code: str, details: str, response: bytes | None, trailing: Metadata
    ) -> Generator[Action, Any, RpcAnswer | None]:
        """The handler finished with ``code`` (and, for ``OK``, its serialized ``response``).

        Returns:
            ``None``: end the call as the handler did; else the answer to end it with instead
            (transactional mode: the commit failed or was fenced out).
        """
        data = self.stored(code, details, response, trailing)
        if self.in_tx:
            return (yield from self.settle_transaction(data))
        yield from self.settle_data(data)
        return None

    def failed(self, error: BaseException) -> Generator[Action, Any, RpcAnswer | None]:
        """The handler raised without setting a status: the key is freed.

        Returns:
            An answer to end the call with instead of the error (a store failure:
            ``UNAVAILABLE``), or ``None``: let the error pass (gRPC answers ``UNKNOWN``).
        """
        yield from self.abandon()
        if isinstance(error, StoreError):
            return (
                yield from self.unavailable(
                    "The idempotency store cannot be reached; retry later.",
                    error=error,
                    phase="handler",
                )
            )
        return None

    def incomplete(self) -> Steps:
        """Nothing to settle (the call was cancelled): free the key."""
        yield from self.abandon()
