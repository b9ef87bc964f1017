"""Every problem detail the flow writes is a sentence: a capital letter first, a full stop last
(an invalid key's reason included: "The key is empty.")."""

from __future__ import annotations

import json

import pytest

from retrysafe import IdempotencyConfig
from retrysafe._core.http import Answer, admit, too_large

from .script import make_request


@pytest.mark.parametrize(
    "keys",
    [[b""], [b'""'], [b"a b"], [b"x" * 256], [b"a", b"b"], [b"\xff"], [b'"open']],
    ids=["empty", "empty-sf-string", "space", "too-long", "two-fields", "not-ascii", "unclosed"],
)
def test_an_invalid_key_detail_is_a_sentence(keys: list[bytes]) -> None:
    answer = admit(make_request(keys=keys), IdempotencyConfig())
    assert isinstance(answer, Answer)
    detail = str(json.loads(answer.body)["detail"])
    assert detail[0].isupper() and detail.endswith("."), detail


def test_the_empty_key_detail_reads_as_documented() -> None:
    answer = admit(make_request(keys=[b""]), IdempotencyConfig())
    assert isinstance(answer, Answer)
    assert json.loads(answer.body)["detail"] == "The key is empty."


def test_the_other_admission_details_are_sentences_too() -> None:
    config = IdempotencyConfig(required=True, max_body_size=10)
    for answer in (admit(make_request(keys=[]), config), too_large(config)):
        assert isinstance(answer, Answer)
        detail = str(json.loads(answer.body)["detail"])
        assert detail[0].isupper() and detail.endswith("."), detail
