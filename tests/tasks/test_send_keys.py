"""A business key is checked where the producer makes it (``idempotency_key()`` of each task
queue), at send time: a bad key fails the send, never the task in the worker, where
``acks_late`` would acknowledge the failed message and it would never run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from retrysafe import InvalidKeyError

celery = pytest.importorskip("retrysafe.contrib.celery")
dramatiq = pytest.importorskip("retrysafe.contrib.dramatiq")

HELPERS = [
    pytest.param(celery.idempotency_key, id="celery"),
    pytest.param(dramatiq.idempotency_key, id="dramatiq"),
]


@pytest.mark.parametrize("helper", HELPERS)
@pytest.mark.parametrize(
    ("key", "why"),
    [
        ("", "empty"),
        ("k" * 256, "longer than 255"),
        (None, "str or int"),
        (True, "str or int"),
        (1.5, "str or int"),
    ],
    ids=["empty", "256-chars", "none", "bool", "float"],
)
def test_a_bad_key_fails_the_send(helper: Callable[[Any], Any], key: Any, why: str) -> None:
    with pytest.raises(InvalidKeyError, match=why):
        helper(key)


@pytest.mark.parametrize("helper", HELPERS)
def test_a_good_key_is_sent_as_a_string(helper: Callable[[Any], Any]) -> None:
    assert "k" * 255 in str(helper("k" * 255))
    assert "'42'" in str(helper(42))
