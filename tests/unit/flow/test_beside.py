"""What runs beside the handler: lease renewal, ``mark_committed``, the background completion
retry after a store error, and the ``on_event`` hook the runner calls for ``EMIT``."""

from __future__ import annotations

import pytest

from retrysafe import StoreError, StoreUnavailableError
from retrysafe._core.http import notify
from retrysafe._core.operation import (
    CLOCK,
    COMPLETE,
    COMPLETION_RETRY_SECONDS,
    EMIT,
    MARK_COMMITTED,
    RENEW,
    SLEEP,
    TX_COMPLETE,
    TX_LOCKED,
    TX_STATE,
)

from .script import Events, claimed, flow_for, make_request, run

DATA = b"encoded response"

# -- renew ---------------------------------------------------------------------------------------


def test_a_renewed_lease_keeps_renewing() -> None:
    assert run(claimed(events=True).renew(), [(RENEW, None, True)]).value is True


@pytest.mark.parametrize("events", [False, True], ids=["no-hook", "hook"])
def test_a_renewal_the_store_refuses_keeps_going_the_store_may_come_back(events: bool) -> None:
    flow = claimed(events=events)
    assert run(flow.renew(), [(RENEW, None, StoreUnavailableError("down"))]).value is True


@pytest.mark.parametrize("events", [False, True], ids=["no-hook", "hook"])
def test_a_lease_taken_over_stops_renewal_and_reports_it(events: bool) -> None:
    flow = claimed(events=events)
    script: list[tuple[object, ...]] = [(RENEW, None, False)]
    script.append((EMIT, "lease_lost"))
    assert run(flow.renew(), script).value is False


def test_no_renewal_is_written_while_the_own_transaction_holds_the_write_lock() -> None:
    # SQLite: no one else can write the record until the transaction ends, and a renewal
    # would queue behind it (then find the record completed).
    flow = claimed(transactional=True)
    assert run(flow.renew(), [(TX_LOCKED, None, True)]).value is True


def test_a_transaction_that_holds_no_lock_renews_as_usual() -> None:
    flow = claimed(transactional=True)
    assert run(flow.renew(), [(TX_LOCKED, None, False), (RENEW, None, True)]).value is True


@pytest.mark.parametrize("transactional", [False, True], ids=["plain", "transactional"])
def test_a_renewal_that_meets_the_own_completion_stops_without_reporting_a_loss(
    transactional: bool,
) -> None:
    flow = claimed(events=True, transactional=transactional)
    settle = flow.settle_data(DATA) if not transactional else flow.settle_transaction(DATA)
    # The settlement reaches its store call; the renewal runs while that call is under way.
    action = next(settle)
    if transactional:
        assert action[0] == "finalize"
        assert settle.send(None) == (TX_STATE, None)
        assert settle.send((True, False)) == (TX_COMPLETE, DATA)
        script: list[tuple[object, ...]] = [(TX_LOCKED, None, False), (RENEW, None, False)]
    else:
        assert action == (COMPLETE, DATA)
        script = [(RENEW, None, False)]
    assert run(flow.renew(), script).value is False
    assert not flow.lease_lost


# -- mark_committed ------------------------------------------------------------------------------


def test_mark_committed_extends_the_lease_and_never_releases_from_then_on() -> None:
    flow = claimed(lease=12.0)
    assert run(flow.mark_committed(), [(MARK_COMMITTED, 12.0, True)]).value is True
    assert flow.committed


@pytest.mark.parametrize("answer", [False, StoreError("down")], ids=["lease-lost", "store-error"])
def test_mark_committed_counts_even_when_the_store_does_not_confirm(
    answer: object,
) -> None:
    # The effect happened whatever the store says: the flow must not release the key later.
    flow = claimed()
    assert run(flow.mark_committed(), [(MARK_COMMITTED, 30.0, answer)]).value is False
    assert flow.committed


def test_mark_committed_in_a_begun_transaction_is_a_no_op() -> None:
    flow = claimed(transactional=True)
    assert run(flow.mark_committed(), [(TX_STATE, None, (True, False))]).value is True
    assert not flow.committed


def test_mark_committed_before_the_transaction_began_is_recorded_in_the_store() -> None:
    flow = claimed(transactional=True, lease=9.0)
    script = [(TX_STATE, None, (False, False)), (MARK_COMMITTED, 9.0, True)]
    assert run(flow.mark_committed(), script).value is True
    assert flow.committed


# -- complete_later: the deferred completion -----------------------------------------------------


@pytest.mark.parametrize("events", [False, True], ids=["no-hook", "hook"])
def test_a_deferred_completion_retries_with_backoff_until_stored(events: bool) -> None:
    flow = claimed(events=events)
    script: list[tuple[object, ...]] = [
        (CLOCK, None, 1000.0),
        (CLOCK, None, 1000.0),
        (SLEEP, 0.05),
        (COMPLETE, DATA, StoreUnavailableError("down")),
        (CLOCK, None, 1000.1),
        (SLEEP, 0.1),
        (COMPLETE, DATA, StoreError("still down")),
        (CLOCK, None, 1000.3),
        (SLEEP, 0.2),
        (COMPLETE, DATA, True),
    ]
    script.append((EMIT, "completion_recovered"))
    assert run(flow.complete_later(DATA), script).value is None


def test_the_completion_backoff_is_capped_at_two_seconds() -> None:
    flow = claimed()
    script: list[tuple[object, ...]] = [(CLOCK, None, 0.0)]
    for delay in (0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0):
        script += [(CLOCK, None, 1.0), (SLEEP, delay), (COMPLETE, DATA, StoreError("down"))]
    script += [(CLOCK, None, 2.0), (SLEEP, 2.0), (COMPLETE, DATA, True)]
    script.append((EMIT, "completion_recovered"))  # logged even without a hook
    run(flow.complete_later(DATA), script)


@pytest.mark.parametrize("events", [False, True], ids=["no-hook", "hook"])
def test_a_deferred_completion_fenced_out_reports_the_lost_lease(events: bool) -> None:
    flow = claimed(events=events)
    script: list[tuple[object, ...]] = [
        (CLOCK, None, 0.0),
        (CLOCK, None, 0.0),
        (SLEEP, 0.05),
        (COMPLETE, DATA, False),
    ]
    script.append((EMIT, "lease_lost"))
    run(flow.complete_later(DATA), script)


@pytest.mark.parametrize("events", [False, True], ids=["no-hook", "hook"])
def test_a_deferred_completion_gives_up_at_its_deadline(events: bool) -> None:
    flow = claimed(events=events)
    start = 500.0
    script: list[tuple[object, ...]] = [
        (CLOCK, None, start),
        (CLOCK, None, start + 1.0),
        (SLEEP, 0.05),
        (COMPLETE, DATA, StoreError("down")),
        (CLOCK, None, start + COMPLETION_RETRY_SECONDS - 0.01),
        (SLEEP, 0.1),
        (COMPLETE, DATA, StoreError("down")),
        (CLOCK, None, start + COMPLETION_RETRY_SECONDS),
    ]
    script.append((EMIT, "completion_failed"))
    # Giving up neither releases nor declares anything: the lease lapses on its own.
    assert run(flow.complete_later(DATA), script).value is None


def test_a_deferred_completion_does_not_swallow_an_error_that_is_not_the_stores() -> None:
    flow = claimed()
    script = [(CLOCK, None, 0.0), (CLOCK, None, 0.0), (SLEEP, 0.05), (COMPLETE, DATA, KeyError())]
    with pytest.raises(KeyError):
        run(flow.complete_later(DATA), script)


# -- notify: the on_event hook -------------------------------------------------------------------


def test_notify_passes_the_event_and_request_details_to_the_hook() -> None:
    hook = Events()
    request = make_request(method="PATCH", path="/orders/7")
    request.route = "/orders/{id}"
    flow = flow_for(request, hook=hook)
    notify(flow.config, "replayed", request, flow.record_id)
    assert hook.calls == [
        (
            "replayed",
            {
                "record": flow.record_id[:16],
                "path": "/orders/7",
                "method": "PATCH",
                "route": "/orders/{id}",
            },
        )
    ]


def test_a_failing_hook_is_logged_never_raised(caplog: pytest.LogCaptureFixture) -> None:
    def hook(event: str, details: object) -> None:
        raise RuntimeError("metrics backend down")

    flow = flow_for(hook=hook)
    notify(flow.config, "conflict", flow.request, flow.record_id)
    assert "on_event hook failed" in caplog.text
    assert "metrics backend down" in caplog.text


def test_notify_without_a_hook_does_nothing() -> None:
    flow = flow_for()
    notify(flow.config, "conflict", flow.request, flow.record_id)
