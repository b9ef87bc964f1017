"""The call layer of the keyed operation, sans-I/O: :class:`Call`, the
:class:`~retrysafe._core.operation.Operation` whose verdicts are "run it", the stored result, or
an exception: :class:`~retrysafe.KeyReusedError`, :class:`~retrysafe.InProgressError`,
:class:`~retrysafe.OutcomeUnknownError`, a store error."""

from __future__ import annotations

import logging
from collections.abc import Generator
from typing import Any

from ..config import IdempotencyConfig
from ..errors import (
    CodecError,
    InProgressError,
    KeyReusedError,
    OutcomeUnknownError,
    StoreError,
    StoreUnavailableError,
)
from ..operation import EMIT, FINALIZE, Action, Operation, Steps, retry_after
from .spec import CALL_METHOD, CallSpec, call_record_id

__all__ = ["REPLAYED", "Call"]

#: Verdict of :meth:`Call.claim`: the stored result is in :attr:`Call.value`.
REPLAYED = "replayed"

logger = logging.getLogger("retrysafe")


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
            raise exc  # by name (see Operation.settle_transaction)
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
            CodecError: the codec cannot encode the value. The function ran, so its effect
                happened: the key is never freed for a second run but kept as outcome unknown
                (duplicates get :class:`OutcomeUnknownError` until an operator resolves it). In
                transactional mode the writes roll back with the record instead, and the key is
                freed: nothing of the run remains.
            StoreError: the transaction could not commit (its writes rolled back; retry).
            InProgressError: the lease was taken over before the commit (writes rolled back).
        """
        try:
            data = self.spec.encode_result(value)
        except CodecError as exc:
            if not self.in_tx:
                self.committed = True  # the effect happened: outcome unknown, never a rerun
            yield from self.abandon()
            raise exc  # by name (see Operation.settle_transaction)
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
