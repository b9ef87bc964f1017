"""Idempotent functions on the Django ORM store in same-transaction mode, on real SQLite and
PostgreSQL: the function's ORM writes and its stored result commit together (the atomic block
opens before it runs), an exception rolls them back and frees the key, and the admin's route
column names the call (``call <function>``)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from retrysafe import idempotent_function
from retrysafe.contrib.django.models import IdempotencyRecord
from retrysafe.contrib.django.store import DjangoStore
from retrysafe.demo.django_app.models import Order

from .test_orm_store import alias  # every ORM database (SQLite, PostgreSQL)

__all__ = ["alias"]


def test_orm_writes_and_the_result_commit_together(alias: str) -> None:
    runs: list[str] = []

    @idempotent_function(
        store=DjangoStore(alias), key="item", name="place_order", transactional=True
    )
    def place(item: str, fail: bool = False) -> int:
        runs.append(item)
        order = Order.objects.using(alias).create(owner="job", item=item, quantity=1)
        if fail:
            raise RuntimeError("the warehouse said no")
        return int(order.pk)

    with pytest.raises(RuntimeError):
        place("tea", fail=True)
    assert not Order.objects.using(alias).filter(item="tea").exists()  # rolled back
    place("tea")  # the failed call's key was freed: this one runs
    first = place("cake")
    assert place("cake") == first  # replayed: the stored result, no second order
    assert Order.objects.using(alias).filter(item="cake").count() == 1
    assert Order.objects.using(alias).filter(item="tea").count() == 1
    assert runs == ["tea", "tea", "cake"]
    record = IdempotencyRecord.objects.using(alias).get(id=place.record_id("cake"))
    assert record.route == "call place_order"


@pytest.mark.django_db(transaction=True)
def test_an_async_function_on_the_orm_store() -> None:
    @idempotent_function(store="django://default", key="item", name="aplace", transactional=True)
    async def place(item: str) -> int:
        order = await sync_to_async(Order.objects.create)(owner="job", item=item, quantity=2)
        return int(order.pk)

    async def main() -> tuple[Any, Any]:
        return await place("tea"), await place("tea")

    first, again = asyncio.run(main())
    assert first == again
    assert Order.objects.filter(item="tea").count() == 1
