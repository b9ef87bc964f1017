"""Owner liveness for both faces of the MySQL store (hand-written: one session per process).

Each process holds one named lock, ``GET_LOCK('retrysafe:<instance id>', 0)``, on one PyMySQL
connection of its own per server; the server frees it the moment that session ends, so a
process that died (its socket closed) is seen by ``IS_FREE_LOCK`` at once. Named locks are
exclusive, so every store of a process (sync and async faces alike) shares the one session: a
second session asking for the lock would be refused. A blocking socket serves the async face
too: after the one ``GET_LOCK`` it never reads or writes, and liveness is a zero-timeout poll
of the socket (readable means the server ended the session).
"""

from __future__ import annotations

import logging
import select
import threading
import time
from typing import Any

import pymysql

from ..._core.records import instance_id
from ._sql import MySQLOptions, Statements, owner_lock_query

__all__ = ["held", "hold", "session_ended"]

logger = logging.getLogger("retrysafe.stores.mysql")

_lock = threading.Lock()
#: server -> (instance id, connection) of this process's owner session.
_sessions: dict[tuple[Any, ...], tuple[str, Any]] = {}
_retry_at: dict[tuple[tuple[Any, ...], str], float] = {}
# A session inherited over fork is kept, never closed: closing it would end the parent's
# session, and with it the parent's lock.
_inherited: list[Any] = []


def _server(options: MySQLOptions) -> tuple[Any, ...]:
    return (options.host, options.port, options.unix_socket)


def session_ended(conn: Any) -> bool:
    """Whether an idle PyMySQL connection is dead: closed, or readable (an idle connection has
    nothing to read unless the server ended its session: an error packet, then EOF)."""
    sock = getattr(conn, "_sock", None)
    if sock is None:
        return True
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def held(options: MySQLOptions) -> bool:
    """Whether this process's owner lock is held on a session the server has not ended."""
    entry = _sessions.get(_server(options))
    return entry is not None and entry[0] == instance_id() and not session_ended(entry[1])


def hold(options: MySQLOptions, statements: Statements) -> bool:
    """Take this process's owner lock on ``options``' server (once per process; again after
    its session was lost, at most every few seconds). ``False``: not held, so this process's
    tokens do not name it (its keys wait for the lease instead)."""
    server = _server(options)
    with _lock:
        if held(options):
            return True
        instance = instance_id()
        entry = _sessions.pop(server, None)
        if entry is not None:
            if entry[0] == instance:
                try:
                    entry[1].close()
                except Exception as exc:  # already closed by the server
                    logger.debug("dropping the old owner session: %s", exc)
            else:
                _inherited.append(entry[1])
        if time.monotonic() < _retry_at.get((server, instance), 0.0):
            return False
        _retry_at[(server, instance)] = time.monotonic() + 5.0
        kwargs = options.connect_kwargs()
        try:
            conn = pymysql.connect(**kwargs)
        except (pymysql.MySQLError, OSError) as exc:
            logger.warning("owner liveness off for now (connect failed): %s", exc)
            return False
        try:
            query = owner_lock_query(statements, instance)
            with conn.cursor() as cur:
                cur.execute(query.statement.sql, query.args)
                got = cur.fetchall()
        except (pymysql.MySQLError, OSError) as exc:
            logger.warning("owner liveness off for now (lock failed): %s", exc)
            conn.close()
            return False
        if not got or got[0][0] != 1:
            logger.warning("owner liveness off: the lock of instance %s is taken", instance)
            conn.close()
            return False
        _sessions[server] = (instance, conn)
        return True
