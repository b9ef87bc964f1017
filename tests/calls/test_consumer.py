"""``MessageHandler`` on every store: each delivery of a message gets what to tell the broker."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from retrysafe import ConfigurationError, functions
from retrysafe.consumer import Delivery, MessageHandler

from .conftest import StoreURL


def test_deliveries_of_one_message_run_it_once(store: StoreURL) -> None:
    effects: list[bytes] = []

    def handle(body: bytes) -> int:
        effects.append(body)
        return len(effects)

    handler = MessageHandler(handle, store=store.url)
    try:
        first = handler.process("m-1", b'{"order": 1}')
        again = handler.process("m-1", b'{"order": 1}')
        reused = handler.process("m-1", b'{"order": 2}')
    finally:
        handler.close()
    assert first == Delivery("executed", 1) and first.ack
    assert again == Delivery("replayed", 1) and again.ack
    assert reused.status == "key_reused" and reused.dead_letter and not reused.ack
    assert effects == [b'{"order": 1}']


def test_a_copy_that_arrives_while_the_first_runs_is_retried_later(store: StoreURL) -> None:
    started, release = threading.Event(), threading.Event()

    def handle(body: bytes) -> str:
        started.set()
        release.wait(30)
        return "done"

    handler = MessageHandler(handle, store=store.url, lease=20.0)
    outcomes: list[Delivery] = []
    first = threading.Thread(target=lambda: outcomes.append(handler.process("m-1", b"x")))
    first.start()
    try:
        assert started.wait(30)
        second = handler.process("m-1", b"x")
    finally:
        release.set()
        first.join(30)
        handler.close()
    assert second.status == "in_progress" and second.retry and second.retry_after
    assert outcomes == [Delivery("executed", "done")]


def test_committed_effects_of_a_failed_handler_are_dead_lettered(store: StoreURL) -> None:
    def handle(body: bytes) -> None:
        functions.mark_committed()
        raise ConnectionError("lost the answer")

    handler = MessageHandler(handle, store=store.url)
    try:
        with pytest.raises(ConnectionError):  # the handler's own error: nack, deliver again
            handler.process("m-1", b"x")
        again = handler.process("m-1", b"x")
    finally:
        handler.close()
    assert again.status == "outcome_unknown" and again.dead_letter


async def test_an_async_handler(store: StoreURL) -> None:
    effects: list[Any] = []

    async def handle(body: bytes) -> int:
        await asyncio.sleep(0)
        effects.append(body)
        return 7

    handler = MessageHandler(handle, store=store.url)
    try:
        assert await handler.aprocess("m-1", b"x") == Delivery("executed", 7)
        assert await handler.aprocess("m-1", b"x") == Delivery("replayed", 7)
        with pytest.raises(ConfigurationError, match="aprocess"):
            handler.process("m-2", b"x")
    finally:
        await handler.aclose()
    assert effects == [b"x"]
