"""The call options are declared once (:class:`retrysafe.calls.CallOptions`) and every call front
takes exactly them: each is an :class:`~retrysafe.IdempotencyConfig` field whose type the
declaration accepts, each front's signature unpacks the declaration, and each front refuses an
HTTP-only option by name."""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from typing import Any

import pytest

import retrysafe
from retrysafe import IdempotencyConfig
from retrysafe.calls import CALL_OPTIONS, CallOptions, FunctionOptions, HandlerOptions
from retrysafe.consumer import MessageHandler


def _members(annotation: Any) -> set[Any]:
    """The types a (union) annotation admits, ``Literal`` values as themselves."""
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        return set().union(*(_members(a) for a in typing.get_args(annotation)))
    if origin is typing.Literal:
        return set(typing.get_args(annotation))
    return {origin or annotation}


def test_each_call_option_is_a_config_field_whose_type_it_accepts() -> None:
    fields = typing.get_type_hints(IdempotencyConfig)
    declared = typing.get_type_hints(CallOptions)
    assert set(declared) == CALL_OPTIONS
    public = {f.name for f in dataclasses.fields(IdempotencyConfig) if f.init}
    for name, annotation in declared.items():
        assert name in public, f"{name} is not an IdempotencyConfig field"
        accepted, config_type = _members(annotation), _members(fields[name])
        assert config_type <= accepted, f"{name}: {accepted} does not accept {config_type}"


def test_the_front_options_extend_the_call_options() -> None:
    assert set(HandlerOptions.__optional_keys__) > CALL_OPTIONS
    assert set(HandlerOptions.__optional_keys__) | {"key"} == set(FunctionOptions.__optional_keys__)


def _unpacked(function: Any) -> Any:
    kwargs = [p for p in inspect.signature(function).parameters.values() if p.kind is p.VAR_KEYWORD]
    assert len(kwargs) == 1, function
    return kwargs[0].annotation


def test_every_call_front_unpacks_the_declaration() -> None:
    """A new option is one line in ``CallOptions``: no front lists the options itself."""
    celery = pytest.importorskip("retrysafe.contrib.celery")
    dramatiq = pytest.importorskip("retrysafe.contrib.dramatiq")
    assert _unpacked(retrysafe.idempotent_function) == "Unpack[FunctionOptions]"
    assert _unpacked(celery.idempotent_task) == "Unpack[FunctionOptions]"
    assert _unpacked(MessageHandler.__init__) == "Unpack[HandlerOptions]"
    assert _unpacked(dramatiq.Idempotency.__init__) == "Unpack[CallOptions]"


def test_an_http_only_option_is_named_on_every_call_front(tmp_path: Any) -> None:
    celery = pytest.importorskip("retrysafe.contrib.celery")

    def charge(order_id: str) -> str:
        return order_id

    fronts = [
        lambda: retrysafe.idempotent_function(charge, store="memory://", required=True),
        lambda: MessageHandler(charge, store="memory://", required=True),
        lambda: celery.idempotent_task(charge, store="memory://", required=True),
    ]
    for front in fronts:
        with pytest.raises(retrysafe.ConfigurationError, match="'required' is an HTTP option"):
            front()
