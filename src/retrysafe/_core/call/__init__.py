"""The call protocol, sans-I/O (DESIGN section 6): a function call made safe to repeat, split by
job as the HTTP side is.

- :mod:`.spec`: the key and the fingerprint from a call's arguments, and :class:`CallSpec` (one
  per decorated function, validated at decoration);
- :mod:`.results`: the typed JSON codec, the result codecs and the record envelope;
- :mod:`.layer`: :class:`Call`, the keyed operation whose verdicts are "run it", the stored
  result, or an exception.

Which options a call takes, and how they are read, is the calls wing's
(:mod:`retrysafe.calls`): the core only reads an :class:`~retrysafe.IdempotencyConfig`.
"""

from __future__ import annotations

from .layer import REPLAYED, Call
from .results import (
    JSONCodec,
    PickleCodec,
    ResultCodec,
    describe_outcome,
    from_json,
    resolve_codec,
    to_json,
)
from .spec import (
    CALL_METHOD,
    KEY_ARGUMENT,
    CallSpec,
    call_fingerprint,
    call_record_id,
    check_key,
)

__all__ = [
    "CALL_METHOD",
    "KEY_ARGUMENT",
    "REPLAYED",
    "Call",
    "CallSpec",
    "JSONCodec",
    "PickleCodec",
    "ResultCodec",
    "call_fingerprint",
    "call_record_id",
    "check_key",
    "describe_outcome",
    "from_json",
    "resolve_codec",
    "to_json",
]
