"""SQLAlchemy sessions inside idempotent functions (same-transaction mode) on SQLite and
PostgreSQL, def and async def: the ORM writes commit with the stored result, or roll back with
an exception."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy import String, select
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from retrysafe import idempotent_function
from retrysafe.contrib.sqlalchemy import async_session, call_session, session

from .conftest import StoreURL
from .faces import FACES, Face
from .test_transactional import Effects


def _model(table: str) -> Any:
    schema, _, name = table.rpartition(".")

    class Base(DeclarativeBase):  # one per table: the tests' tables never meet
        pass

    class Effect(Base):
        __tablename__ = name
        __table_args__ = {"schema": schema or None, "extend_existing": True}
        k: Mapped[str] = mapped_column(String, primary_key=True)

    return Effect


@pytest.fixture(params=FACES)
def face(request: pytest.FixtureRequest) -> Face:
    return Face(request.param)


async def test_orm_writes_commit_with_the_result_or_roll_back(
    sql_store: StoreURL, face: Face
) -> None:
    effects = Effects(sql_store)
    Effect = _model(effects.table)
    sqlite = sql_store.id == "sqlite"
    if face.is_async:

        async def write(k: str, fail: bool) -> str:
            db = await (session() if sqlite else async_session())
            db.add(Effect(k=k))
            if fail:
                if not sqlite:
                    await db.flush()  # the row is written, then rolled back
                else:
                    db.flush()
                raise ValueError("no")
            return k

        target: Any = write
    else:

        def write_sync(k: str, fail: bool) -> str:
            db = call_session()
            db.add(Effect(k=k))
            if fail:
                db.flush()
                raise ValueError("no")
            found = db.execute(select(Effect).where(Effect.k == k)).scalar_one()
            return str(found.k)

        target = write_sync
    fn = idempotent_function(target, store=sql_store.url, key="k", transactional=True)
    k = uuid.uuid4().hex
    try:
        with pytest.raises(ValueError):
            await face.call(fn, k, True)
        assert effects.count(k) == 0
        assert await face.call(fn, k, False) == k
        assert await face.call(fn, k, False) == k
    finally:
        await face.close(fn)
    assert effects.count(k) == 1
