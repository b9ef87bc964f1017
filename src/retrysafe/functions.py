"""Idempotent functions: any ``def`` or ``async def`` run once per key, with the guarantees of a
request (leases renewed while it runs, fencing, takeover from a dead caller, the stored result
returned to every duplicate, "outcome unknown" after committed effects, and the result committed
in the same SQL transaction as the function's writes)::

    from retrysafe import idempotent_function

    @idempotent_function(store="sqlite:///app.db", key=lambda order_id, amount: order_id)
    def charge(order_id: str, amount: int) -> dict:
        ...

The public face of the calls wing (:mod:`retrysafe.calls`). Inside the function,
:func:`retrysafe.mark_committed` and :func:`retrysafe.transaction` (``async def``), or
:func:`mark_committed` and :func:`transaction` of this module (``def``), find the running call
without any argument.
"""

from __future__ import annotations

from .calls import IdempotentFunction, idempotent_function, mark_committed, transaction

__all__ = ["IdempotentFunction", "idempotent_function", "mark_committed", "transaction"]
