"""The gRPC client interceptors on real channels to a real server: each logical call gets one
key, kept across gRPC's own retries (a channel retryPolicy) and the interceptor's resends, and
across the caller's own retries inside ``call_key()``; inside ``journal.operation(...)`` the key
survives the client process (a second process with the same journal and id gets the replay)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import grpc.aio
import pytest

from retrysafe import ConfigurationError
from retrysafe.client import SQLiteJournal
from retrysafe.contrib.grpc import (
    AsyncIdempotencyKeyInterceptor,
    IdempotencyKeyInterceptor,
    call_key,
)

from .harness import Server
from .service import CREATE, SEEN_KEYS, dumps

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    made = Server("sync", f"sqlite:///{tmp_path}/idempotency.db", tmp_path / "effects.db")
    SEEN_KEYS.clear()
    yield made
    made.close()


def _stub(channel: grpc.Channel) -> grpc.UnaryUnaryMultiCallable:
    return channel.unary_unary(CREATE, request_serializer=dumps, response_deserializer=None)


def _intercepted(server: Server, **options: object) -> grpc.Channel:
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    return grpc.intercept_channel(channel, IdempotencyKeyInterceptor(**options))  # type: ignore[arg-type]


def test_each_call_gets_a_key_of_its_own(server: Server) -> None:
    stub = _stub(_intercepted(server))
    stub({"item": "book"})
    stub({"item": "book"})
    assert len(set(SEEN_KEYS)) == 2 and server.effects.count() == 2


def test_inside_call_key_the_callers_own_retries_share_one_key(server: Server) -> None:
    stub = _stub(_intercepted(server))
    with call_key() as key:
        first, _ = stub.with_call({"item": "book"})
        again, replay = stub.with_call({"item": "book"})
    assert [key] == SEEN_KEYS and again == first
    assert dict(replay.trailing_metadata())["idempotency-replayed"] == "true"
    assert server.effects.count() == 1


def test_a_key_the_caller_set_is_kept(server: Server) -> None:
    stub = _stub(_intercepted(server))
    stub({"item": "book"}, metadata=(("idempotency-key", "mine"),))
    assert SEEN_KEYS == ["mine"]


def test_the_interceptor_resends_after_unavailable_with_the_same_key(server: Server) -> None:
    stub = _stub(_intercepted(server, retries=2))
    body = stub({"item": "pen", "fail_first_with": "UNAVAILABLE"})
    assert json.loads(body)["item"] == "pen"
    assert len(SEEN_KEYS) == 2 and SEEN_KEYS[0] == SEEN_KEYS[1]
    assert server.effects.count() == 1


def test_without_resends_the_first_outcome_is_returned(server: Server) -> None:
    stub = _stub(_intercepted(server, retries=0))
    with pytest.raises(grpc.RpcError) as failed:
        stub({"item": "cup", "fail_first_with": "UNAVAILABLE"})
    assert failed.value.code() is grpc.StatusCode.UNAVAILABLE and len(SEEN_KEYS) == 1


def test_grpc_built_in_retries_resend_the_same_key(server: Server) -> None:
    config = {
        "methodConfig": [
            {
                "name": [{"service": "shop.Orders"}],
                "retryPolicy": {
                    "maxAttempts": 3,
                    "initialBackoff": "0.05s",
                    "maxBackoff": "0.2s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ]
    }
    options = [("grpc.service_config", json.dumps(config)), ("grpc.enable_retries", 1)]
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}", options=options)
    stub = _stub(grpc.intercept_channel(channel, IdempotencyKeyInterceptor(retries=0)))  # type: ignore[arg-type]
    stub({"item": "mug", "fail_first_with": "UNAVAILABLE"})
    assert len(SEEN_KEYS) == 2 and SEEN_KEYS[0] == SEEN_KEYS[1]  # gRPC resent, same key
    assert server.effects.count() == 1


def test_the_aio_interceptor_keys_and_resends_the_same_way(server: Server) -> None:
    async def main() -> bytes:
        interceptor = AsyncIdempotencyKeyInterceptor(retries=2)
        async with grpc.aio.insecure_channel(
            f"127.0.0.1:{server.port}", interceptors=[interceptor]
        ) as channel:
            stub = channel.unary_unary(CREATE, request_serializer=dumps)
            with call_key("shared"):
                first: bytes = await stub({"item": "lamp", "fail_first_with": "UNAVAILABLE"})
                again: bytes = await stub({"item": "lamp", "fail_first_with": "UNAVAILABLE"})
            assert again == first
            return first

    body = asyncio.run(main())
    assert json.loads(body)["item"] == "lamp"
    assert SEEN_KEYS == ["shared"] * 2  # the failed attempt and its resend; the repeat replays
    assert server.effects.count() == 1


CLIENT = """
import sys, grpc
from retrysafe.client import SQLiteJournal
from retrysafe.contrib.grpc import IdempotencyKeyInterceptor
from tests.rpc.service import CREATE, dumps
port, journal_path = sys.argv[1], sys.argv[2]
channel = grpc.intercept_channel(
    grpc.insecure_channel(f"127.0.0.1:{port}"), IdempotencyKeyInterceptor()
)
stub = channel.unary_unary(CREATE, request_serializer=dumps)
journal = SQLiteJournal(journal_path)
with journal.operation("checkout-42"):
    body, state = stub.with_call({"item": "desk"})
print(dict(state.trailing_metadata()).get("idempotency-replayed", "false"), body.decode())
"""


def test_a_journal_operation_keeps_its_key_across_client_processes(
    server: Server, tmp_path: Path
) -> None:
    journal = tmp_path / "journal.db"
    runs = [
        subprocess.run(
            [sys.executable, "-c", CLIENT, str(server.port), str(journal)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout.split(" ", 1)
        for _ in range(2)
    ]
    assert [replayed for replayed, _ in runs] == ["false", "true"]
    assert runs[0][1] == runs[1][1]
    assert len(set(SEEN_KEYS)) == 1 and server.effects.count() == 1
    entry = SQLiteJournal(journal).get("checkout-42")
    assert entry is not None and entry.key == SEEN_KEYS[0]


def test_a_bad_client_option_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match=r"IdempotencyKeyInterceptor\(retries=...\)"):
        IdempotencyKeyInterceptor(retries=-1)
