"""Stores across ``fork`` and across event loops: what gunicorn ``--preload``, Celery's prefork
pool, ``multiprocessing`` and scripts that call ``asyncio.run`` twice do to a store object.

A parent uses the store, then forks four children that use the same object at once: each
reserves and completes fresh keys (a child reading another's replies would see a reused key or a
foreign response) and all race for one shared key (one winner). Each child closes its store at
the end, as a worker does; the parent's store still works afterwards (a child that closed or
reset the parent's connections would break it). The memory store is per process: each child
has its own copy, so each wins the shared key in its copy and the parent sees none of it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import uuid
import warnings
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from retrysafe.stores import async_store_from_url, store_from_url

from ..conftest import RUN_ID

CHILDREN = 4
KEYS = 8
LEASE = 30.0
TTL = 600.0

KINDS = [
    "memory",
    "sqlite",
    "sqlite-async",
    "postgres",
    "postgres-async",
    "redis",
    "redis-async",
    "redis-cluster",
    "redis-cluster-async",
]


@pytest.fixture
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    kind = request.param.removesuffix("-async")
    if kind == "memory":
        yield "memory://"
    elif kind == "sqlite":
        yield f"sqlite:///{tmp_path}/fork.db"
    elif kind == "postgres":
        from .backend_postgres import fresh_table_url

        yield fresh_table_url(request, max_size="4")
    elif kind == "redis":
        from .backend_redis import delete_prefixed, unique_prefix, with_prefix

        base: str = request.getfixturevalue("redis_url")
        prefix = unique_prefix("fork")
        yield with_prefix(base, prefix)
        delete_prefixed(base, prefix)
    else:
        procs = request.getfixturevalue("redis_cluster")
        yield f"redis+cluster://{procs.seeds}?prefix=rs-fork-{RUN_ID}-{uuid.uuid4().hex[:8]}:"


#: Work on a store written once for both faces: a generator that yields (method, args, kwargs)
#: and is sent back what the store returned.
Work = Generator[tuple[str, tuple[Any, ...], dict[str, Any]], Any, Any]


class Face:
    """One store object, driven the same way on either face: each piece of work on the async
    face runs in an ``asyncio.run`` of its own (a new event loop every time)."""

    def __init__(self, url: str, is_async: bool) -> None:
        self.is_async = is_async
        self.store: Any = async_store_from_url(url) if is_async else store_from_url(url)

    def run(self, work: Work) -> Any:
        """Run ``work`` to its end and return what it returns."""
        if self.is_async:
            return asyncio.run(self._arun(work))
        answer: Any = None
        try:
            while True:
                name, args, kwargs = work.send(answer)
                answer = getattr(self.store, name)(*args, **kwargs)
        except StopIteration as stop:
            return stop.value

    async def _arun(self, work: Work) -> Any:
        answer: Any = None
        try:
            while True:
                name, args, kwargs = work.send(answer)
                answer = await getattr(self.store, name)(*args, **kwargs)
        except StopIteration as stop:
            return stop.value

    def close(self) -> None:
        if self.is_async:
            asyncio.run(self.store.aclose())
        else:
            self.store.close()


def call(name: str, *args: Any, **kwargs: Any) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    return name, args, kwargs


def use(tag: str, *, shared: str = "shared") -> Work:
    """Reserve and complete fresh keys (each must be won and read back with its own response),
    then race for ``shared``. Returns ``{"won": bool, "bad": [problems]}``."""
    bad: list[str] = []
    for i in range(KEYS):
        key, body = f"{tag}-{i}", f"{tag}-{i}".encode()
        got = yield call("reserve", key, f"fp-{key}", lease=LEASE, ttl=TTL)
        if not got.acquired:
            bad.append(f"{key}: fresh key not won: {got.record}")
            continue
        if not (yield call("complete", key, got.token, body, ttl=TTL)):
            bad.append(f"{key}: completion fenced out")
        record = yield call("get", key)
        if record is None or record.response != body:
            bad.append(f"{key}: read back {record}")
        again = yield call("reserve", key, f"fp-{key}", lease=LEASE, ttl=TTL)
        if again.record is None or again.record.response != body:
            bad.append(f"{key}: replay got {again}")
    got = yield call("reserve", shared, "fp-shared", lease=LEASE, ttl=TTL)
    if got.acquired and not (yield call("complete", shared, got.token, tag.encode(), ttl=TTL)):
        bad.append("shared: completion fenced out")
    return {"won": got.acquired, "bad": bad}


def check(tags: list[str], *, shared: str = "shared") -> Work:
    """What the parent reads afterwards: each child's keys with their own responses, and the
    shared key's winner. Returns ``{"bad": [...], "shared": winner's tag or None}``."""
    bad: list[str] = []
    for tag in tags:
        for i in range(KEYS):
            record = yield call("get", f"{tag}-{i}")
            if record is None or record.response != f"{tag}-{i}".encode():
                bad.append(f"{tag}-{i}: parent reads {record}")
    record = yield call("get", shared)
    winner = None if record is None or record.response is None else record.response.decode()
    return {"bad": bad, "shared": winner}


def fork_children(face: Face, tmp_path: Path, tags: list[str]) -> list[dict[str, Any]]:
    """Fork one child per tag; they start together, run :func:`use`, close the store and exit.
    Returns their reports (a child that does not finish within 60 s is killed: a hang)."""
    go_read, go_write = os.pipe()
    pids = []
    for tag in tags:
        with warnings.catch_warnings():
            # Python 3.12+ warns about fork() in a multi-threaded process (a store's heartbeat
            # or pool threads): what gunicorn --preload and Celery's prefork pool do anyway.
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports through its file
            code = 1
            try:
                os.close(go_write)
                os.read(go_read, 1)
                try:
                    report = face.run(use(tag))
                except BaseException as exc:  # reported to the parent
                    report = {"won": False, "bad": [f"raised {type(exc).__name__}: {exc}"]}
                face.close()
                (tmp_path / f"{tag}.json").write_text(json.dumps(report))
                code = 0
            finally:
                os._exit(code)
        pids.append(pid)
    os.close(go_read)
    os.write(go_write, b"g" * len(tags))
    os.close(go_write)
    deadline = time.monotonic() + 60
    hung = []
    for pid in pids:
        while True:
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                hung.append(pid)
                break
            time.sleep(0.02)
    assert not hung, f"{len(hung)} children hung"
    reports = []
    for tag in tags:
        path = tmp_path / f"{tag}.json"
        assert path.exists(), f"child {tag} died without a report"
        reports.append(json.loads(path.read_text()))
    return reports


@pytest.mark.parametrize("store_url", KINDS, indirect=True)
@pytest.mark.timeout(180)
def test_forked_children_open_their_own_connections(
    store_url: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A parent that used the store forks four children that use it at once: fresh keys are
    each their own, one child wins the shared key, nothing hangs, and the parent's store still
    works after the children closed theirs."""
    kind = request.node.callspec.id
    face = Face(store_url, kind.endswith("-async"))
    try:
        first = face.run(use("parent", shared="parent-shared"))
        assert first == {"won": True, "bad": []}
        tags = [f"child{n}" for n in range(CHILDREN)]
        reports = fork_children(face, tmp_path, tags)
        assert [r["bad"] for r in reports] == [[]] * CHILDREN
        winners = [tag for tag, report in zip(tags, reports, strict=True) if report["won"]]
        if kind == "memory":
            # One copy per process: each child won the key in its own copy, and the parent
            # sees none of the children's records.
            assert winners == tags
            after = face.run(check(["parent"]))
            assert after == {"bad": [], "shared": None}
        else:
            assert len(winners) == 1
            after = face.run(check(["parent", *tags]))
            assert after == {"bad": [], "shared": winners[0]}
    finally:
        face.close()


@pytest.mark.parametrize("store_url", KINDS, indirect=True)
def test_one_store_object_serves_several_event_loops(
    store_url: str, request: pytest.FixtureRequest
) -> None:
    """``asyncio.run`` twice (and a third time), each doing calls on one store object that is
    not closed in between (the sync face is the control)."""
    kind = request.node.callspec.id
    face = Face(store_url, kind.endswith("-async"))
    try:
        assert face.run(use("loop1", shared="s")) == {"won": True, "bad": []}
        assert face.run(use("loop2", shared="s")) == {"won": False, "bad": []}
        assert face.run(check(["loop1", "loop2"], shared="s")) == {"bad": [], "shared": "loop1"}
    finally:
        face.close()


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_a_forked_child_never_touches_its_parents_sqlite_connections(
    tmp_path: Path, is_async: bool
) -> None:
    """SQLite's rule (never carry a connection across ``fork``): the child's statements and
    transactions run on connections it opened itself, whatever the parent had open."""
    face = Face(f"sqlite:///{tmp_path}/fork.db", is_async)
    sync = face.store.sync if is_async else face.store
    assert face.run(use("parent", shared="s")) == {"won": True, "bad": []}
    if is_async:
        # A transaction's connection goes back to the async face's idle list.
        async def transact() -> None:
            tx = face.store.begin()
            await tx.connection()
            await tx.close()

        asyncio.run(transact())
    parents = {id(conn) for conn in sync._connections}
    assert parents
    read, write = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        try:
            ok = face.run(use("child", shared="s"))["bad"] == []
            tx = sync.begin()
            ok = ok and id(tx.connection()) not in parents
            tx.close()
            ok = ok and {id(conn) for conn in sync._connections}.isdisjoint(parents)
            ok = ok and not (is_async and face.store._idle)
            os.write(write, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(write)
    answer = os.read(read, 1)
    os.waitpid(pid, 0)
    os.close(read)
    assert answer == b"1"
    assert face.run(check(["parent", "child"], shared="s")) == {"bad": [], "shared": "parent"}
    face.close()
