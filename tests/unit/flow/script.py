"""A scripted driver for the sans-I/O flow: the world, played from a list.

A phase of :class:`retrysafe._core.http.Flow` is a generator that yields ``(op, argument)`` actions
and returns a verdict. :func:`run` plays the runner's part (``_async/runner.py``): for each
action it checks that it is the next one the test expects, then sends back the scripted result,
or throws the scripted exception into the generator, as the runner does when performing an
action raises. No server, no store, no event loop.

A script is a list of steps, each ``(op, argument)`` (the result sent back is ``None``) or
``(op, argument, result)``. ``argument`` is compared with ``==`` unless it is :data:`ANY`; a
``result`` that is an exception instance is thrown in rather than sent.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

from retrysafe import IdempotencyConfig, Request
from retrysafe._core.http import Flow
from retrysafe._core.operation import BEGIN, EMIT, EXECUTE, RESERVE, Action
from retrysafe.stores import Record, Reservation

__all__ = [
    "ANY",
    "FP_OTHER",
    "Events",
    "Run",
    "claimed",
    "completed",
    "flow_for",
    "in_progress",
    "make_request",
    "run",
    "won",
]


class _Any:
    def __eq__(self, other: object) -> bool:
        return True

    def __hash__(self) -> int:
        return 0

    def __repr__(self) -> str:
        return "ANY"


#: Matches any argument of a scripted action.
ANY: Any = _Any()

#: A fingerprint no request in these tests has.
FP_OTHER = "0" * 64


@dataclass
class Run:
    """What a phase did: its verdict and every action it yielded, in order."""

    value: Any
    actions: list[Action] = field(default_factory=list)


def run(steps: Generator[Action, Any, Any] | None, script: Sequence[tuple[Any, ...]]) -> Run:
    """Drive ``steps`` through ``script``; fail on any action the script does not expect.

    Returns:
        The phase's return value and the actions it yielded.

    Raises:
        AssertionError: an unexpected action, an action after the script ended, or a phase that
            ended (returned or raised) before the script did.
        BaseException: whatever the phase itself raised, once the script is used up.
    """
    done = Run(None)
    if steps is None:
        assert not script, f"the phase has no steps, the script expected {list(script)}"
        return done
    position = 0
    reply: tuple[bool, Any] = (False, None)  # (throw?, value); the first resume is next()
    started = False
    while True:
        try:
            if not started:
                started = True
                action = next(steps)
            elif reply[0]:
                action = steps.throw(reply[1])
            else:
                action = steps.send(reply[1])
        except StopIteration as stop:
            _used_up(script, position, f"returned {stop.value!r}")
            done.value = stop.value
            return done
        except BaseException as exc:
            _used_up(script, position, f"raised {exc!r}")
            raise
        done.actions.append(action)
        if position >= len(script):
            steps.close()
            raise AssertionError(
                f"unexpected action {action!r} after the script ended; so far: {done.actions}"
            )
        step = script[position]
        position += 1
        expected = (step[0], step[1])
        if action[0] == EMIT and isinstance(action[1], tuple) and isinstance(step[1], str):
            # An event with details (error, phase): the script names the event only.
            action = (EMIT, action[1][0])
        if tuple(action) != expected:
            steps.close()
            raise AssertionError(
                f"step {position}: expected {expected!r}, the flow yielded {action!r}; "
                f"so far: {done.actions}"
            )
        result = step[2] if len(step) > 2 else None
        reply = (isinstance(result, BaseException), result)


def _used_up(script: Sequence[tuple[Any, ...]], position: int, how: str) -> None:
    if position < len(script):
        raise AssertionError(
            f"the phase {how} with steps left in the script: {list(script[position:])}"
        )


class Events:
    """An ``on_event`` hook that records what it is called with."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, event: str, details: Any) -> None:
        self.calls.append((event, dict(details)))


def make_request(
    *,
    method: str = "POST",
    path: str = "/orders",
    query: bytes = b"",
    keys: list[bytes] | None = None,
    content_length: int = -1,
    content_type: bytes = b"application/json",
    authorization: bytes = b"",
    user: Any = None,
    headers: Sequence[tuple[bytes, bytes]] = (),
) -> Request:
    """A neutral request head, as a shell builds it."""
    return Request(
        method,
        path,
        query,
        [b"k-1"] if keys is None else keys,
        content_length,
        content_type,
        authorization,
        user,
        headers,
    )


def flow_for(
    request: Request | None = None,
    *,
    key: str = "k-1",
    body: bytes = b'{"sku":"A1"}',
    events: bool = False,
    hook: Callable[[str, Any], None] | None = None,
    **options: Any,
) -> Flow:
    """A :class:`Flow` over ``IdempotencyConfig(**options)``; ``events=True`` sets a hook (the
    flow yields ``EMIT`` actions only when one is set)."""
    if events and hook is None:
        hook = Events()
    config = IdempotencyConfig(on_event=hook, **options)
    return Flow(config, request or make_request(), key, body)


def won(token: str = "tok-1") -> Reservation:
    """This request won the key."""
    return Reservation(token=token)


def in_progress(
    flow: Flow, lease_remaining: float = 12.5, *, committed: bool = False, same: bool = True
) -> Reservation:
    """Another request holds the key and is still running."""
    fp = flow.fingerprint if same else FP_OTHER
    record = Record(fp, "in_progress", lease_remaining=lease_remaining, committed=committed)
    return Reservation(record=record)


def completed(flow: Flow, response: bytes, *, same: bool = True) -> Reservation:
    """The key holds a completed record."""
    fp = flow.fingerprint if same else FP_OTHER
    return Reservation(record=Record(fp, "completed", response))


def claimed(request: Request | None = None, **options: Any) -> Flow:
    """A flow that has won its key (token ``tok-1``), as the handler starts."""
    flow = flow_for(request, **options)
    script: list[tuple[Any, ...]] = [(RESERVE, None, won())]
    if flow.config.transactional:
        script.append((BEGIN, None))
    if flow.config.on_event is not None:
        script.append((EMIT, "executed"))
    assert run(flow.claim(), script).value == EXECUTE
    return flow
