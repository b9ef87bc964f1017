"""Typed verdicts against real OrderHub processes: a server killed after the effect but before
the answer was stored ends in OutcomeUnknownError carrying the key (never a second order), and
an operation's key goes on the wire and into the journal for every library."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import requests

from retrysafe.client import (
    AsyncRetryingTransport,
    OutcomeUnknownError,
    RetryingAdapter,
    RetryingTransport,
    RetryPolicy,
    SQLiteJournal,
    retry_info,
)

from ..conftest import RUN_ID
from ..e2e.servers import DemoServer
from .conftest import orders_by_item
from .faultproxy import FaultProxy

pytestmark = pytest.mark.e2e


def patient_policy(events: list[tuple[str, dict[str, object]]] | None = None) -> RetryPolicy:
    return RetryPolicy(
        max_attempts=200,
        deadline=30,
        backoff_initial=0.05,
        backoff_max=0.25,
        rng=random.Random(3),
        on_event=(lambda e, d: events.append((e, d))) if events is not None else None,
    )


def test_server_killed_after_the_effect_ends_in_outcome_unknown_with_the_key(
    tmp_path: Path,
) -> None:
    # Orders and idempotency records in two files: not transactional, so the demo marks the
    # key committed after writing the order (the Redis-like case).
    store, db = f"sqlite:///{tmp_path}/store.db", f"sqlite:///{tmp_path}/orders.db"
    server = DemoServer(store, db=db, lease=1.0, log_dir=tmp_path / "logs").start()
    item = f"{RUN_ID}-unknown"
    outcome: list[BaseException | httpx.Response] = []
    events: list[tuple[str, dict[str, object]]] = []

    def send() -> None:
        transport = RetryingTransport(policy=patient_policy(events))
        with httpx.Client(transport=transport, timeout=10) as client:
            try:
                outcome.append(
                    client.post(
                        server.url + "/orders?delay_after_ms=5000",
                        json={"item": item, "quantity": 1},
                    )
                )
            except BaseException as exc:
                outcome.append(exc)

    sender = threading.Thread(target=send)
    sender.start()
    restarted: DemoServer | None = None
    try:
        deadline = time.monotonic() + 10
        while orders_by_item(server, item)[item] == 0:
            assert time.monotonic() < deadline, server.log_text()
            time.sleep(0.05)
        server.kill()  # the order exists; its answer was never stored
        restarted = DemoServer(store, db=db, lease=1.0, log_dir=tmp_path / "logs")
        restarted.port = server.port
        restarted.start()
        sender.join(timeout=40)
        assert not sender.is_alive()
        orders = orders_by_item(restarted, item)
    finally:
        server.stop()
        if restarted is not None:
            restarted.stop()
        sender.join(timeout=40)
    (error,) = outcome
    assert isinstance(error, OutcomeUnknownError), error
    attempts = [d for e, d in events if e == "attempt"]
    assert error.key is not None and error.attempts == len(attempts) >= 2
    reasons = {d["reason"] for e, d in events if e == "retry"}
    assert "lost" in reasons  # the kill cut the first attempt
    assert events[-1][0] == "give_up" and events[-1][1]["reason"] == "outcome_unknown"
    assert orders == {item: 1}


@pytest.fixture
def dropping_proxy(orderhub: DemoServer) -> Iterator[FaultProxy]:
    """Every key's first answer is lost after the server made the order."""
    proxy = FaultProxy(orderhub.port, lambda n: ["drop"])
    proxy.start()
    yield proxy
    proxy.stop()


@pytest.fixture
def resetting_proxy(orderhub: DemoServer) -> Iterator[FaultProxy]:
    """Every key's first attempt is reset before it reaches the server."""
    proxy = FaultProxy(orderhub.port, lambda n: ["reset"])
    proxy.start()
    yield proxy
    proxy.stop()


@pytest.mark.parametrize("library", ["httpx", "httpx-async", "requests"])
def test_an_operation_key_is_sent_and_its_answer_journaled(
    library: str, orderhub: DemoServer, dropping_proxy: FaultProxy, tmp_path: Path
) -> None:
    journal = SQLiteJournal(tmp_path / "ops.db")
    item = f"{RUN_ID}-op-{library}"
    url, body = dropping_proxy.url + "/orders", {"item": item, "quantity": 2}
    policy = patient_policy()
    with journal.operation(f"order-{library}") as op:
        if library == "httpx":
            with httpx.Client(transport=RetryingTransport(policy=policy)) as client:
                response = client.post(url, json=body)
        elif library == "requests":
            with requests.Session() as session:
                session.mount("http://", RetryingAdapter(policy))
                response = session.post(url, json=body)
        else:

            async def run() -> httpx.Response:
                transport = AsyncRetryingTransport(policy=policy)
                async with httpx.AsyncClient(transport=transport) as client:
                    return await client.post(url, json=body)

            response = asyncio.run(run())
    info = retry_info(response)
    assert info is not None
    assert (info.key, info.operation_id, info.attempts, info.replayed) == (
        op.key,
        f"order-{library}",
        2,
        True,
    )
    assert dropping_proxy.seen == {op.header_value: 2}
    entry = journal.get(op.id)
    assert entry is not None and entry.status == 201 and entry.finished_at is not None
    assert orders_by_item(orderhub, item) == {item: 1}
    journal.close()


@pytest.mark.parametrize("library", ["httpx", "requests"])
def test_a_streamed_body_is_sent_once(
    library: str, orderhub: DemoServer, resetting_proxy: FaultProxy
) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"item": "never", '
        yield b'"quantity": 1}'

    url = resetting_proxy.url + "/orders"
    if library == "httpx":
        with (
            httpx.Client(
                transport=RetryingTransport(policy=patient_policy()), timeout=10
            ) as client,
            pytest.raises(httpx.TransportError),
        ):
            client.post(url, content=chunks())
    else:
        with requests.Session() as session:
            session.mount("http://", RetryingAdapter(patient_policy()))
            with pytest.raises(requests.ConnectionError):
                session.post(url, data=chunks(), timeout=10)
    # Reset before it reached the server, with a key: a bytes body would have been resent.
    assert list(resetting_proxy.seen.values()) == [1]
    assert resetting_proxy.forwarded == {}
