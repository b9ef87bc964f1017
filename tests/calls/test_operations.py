"""Operating call records: the ``retrysafe`` command (inspect, resolve, stats, purge) finds them
by function name and key, logs say ``kind=call function=...``, and Prometheus counts them under
``call <function>``."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from retrysafe import OutcomeUnknownError, functions, idempotent_function
from retrysafe.cli import main
from retrysafe.contrib.prometheus import PrometheusMetrics


class Declined(Exception):
    pass


def test_inspect_resolve_stats_and_purge_cover_call_records(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    url = f"sqlite:///{tmp_path}/calls.db"
    runs: list[str] = []

    @idempotent_function(store=url, key="order_id", name="charge", final=[Declined])
    def charge(order_id: str) -> dict[str, str]:
        runs.append(order_id)
        if order_id == "declined":
            raise Declined("card declined")
        if order_id == "lost":
            functions.mark_committed()
            raise ConnectionError("the provider's answer was lost")
        return {"charged": order_id}

    charge("paid")
    with pytest.raises(Declined):
        charge("declined")
    with caplog.at_level(logging.ERROR, logger="retrysafe"), pytest.raises(ConnectionError):
        charge("lost")
    logged = [r for r in caplog.records if getattr(r, "retrysafe", {}).get("event")]
    assert any(
        "kind=call function=charge" in r.getMessage() and "result never stored" in r.getMessage()
        for r in logged
    )
    assert all("lost" not in json.dumps(r.retrysafe) for r in logged)  # never the key

    def cli(*args: str) -> tuple[int, str]:
        code = main([args[0], "--store", url, *args[1:]])
        return code, capsys.readouterr().out

    code, out = cli("inspect", "--function", "charge", "--key", "paid")
    assert code == 0 and "completed" in out and "kind: call, function: charge" in out
    assert "result: 18 bytes (json codec)" in out  # {"charged":"paid"}
    code, out = cli("inspect", "--function", "charge", "--key", "declined")
    assert f"final exception: {__name__}.Declined: card declined" in out
    code, out = cli("inspect", "--function", "charge", "--key", "lost")
    assert code == 0 and "OUTCOME UNKNOWN" in out
    # a call's record has no scope: a scope given with --function is refused, never ignored
    code = main(["inspect", "--store", url, "--function", "charge", "--key", "paid",
                 "--scope", "tenant-a"])  # fmt: skip
    assert code == 2 and "has no scope" in capsys.readouterr().err
    code, out = cli("stats", "--json")
    stats = json.loads(out)
    assert (stats["completed"], stats["outcome_unknown"]) == (2, 1)

    with pytest.raises(OutcomeUnknownError):
        charge("lost")
    code, out = cli("resolve", "--function", "charge", "--key", "lost")
    assert code == 0 and "next call with this key runs" in out
    with pytest.raises(ConnectionError):
        charge("lost")
    assert runs.count("lost") == 2  # run again only after the operator resolved it

    @idempotent_function(store=url, key="n", name="short", ttl=0.5, lease=0.5)
    def short(n: int) -> int:
        return n

    short(1)
    time.sleep(0.6)
    code, out = cli("purge")
    assert code == 0 and "purged 1 expired records" in out
    charge.close()
    short.close()


def test_prometheus_counts_calls_by_function(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry=registry)

    async def main_() -> None:
        @idempotent_function(**metrics.wire(f"sqlite:///{tmp_path}/m.db"), key="n", name="refund")
        async def refund(n: int) -> int:
            return n

        await refund(1)
        await refund(1)
        await refund.aclose()

    asyncio.run(main_())

    def count(outcome: str) -> float | None:
        return registry.get_sample_value(
            "retrysafe_requests_total",
            {"outcome": outcome, "route": "call refund", "store": "sqlite"},
        )

    assert count("executed") == 1.0
    assert count("replayed") == 1.0
