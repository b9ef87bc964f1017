"""PostgreSQL store: one service across many app instances and hosts.

``AsyncPostgresStore`` runs on asyncpg, ``PostgresStore`` (WSGI, Django, the CLI) on psycopg 3
with ``psycopg_pool``. Both run the same statements (``postgres.sql``) and the same operation
code (``_sql.py``: the options, the statements, the reservation; the other operations and the
store's methods are the SQL stores' own, ``stores/_sql_ops.py`` and ``stores/_sql_async.py``,
shared with MySQL). The async store (``_async.py``) names that facade's dialect and its driver
(``_asyncpg.py``: one statement on a pooled connection, the table, the owner lock, a request's
transaction); the sync store (``_sync.py``) is generated from it and runs over ``_psycopg.py``.
Importing this package registers the ``postgresql://`` and ``postgres://`` schemes without
importing either driver; the classes load on first use.

Choices, and why:

- **Drivers.** Client CPU per operation, measured with ``time.process_time`` on this project's
  2-core machine (server on the same machine, interleaved rounds of 400 calls, medians; new key
  per ``reserve``): pooled ``reserve`` asyncpg 156-161 us, psycopg 3 async 140-147 us (asyncpg
  with its default reset query: 200-208 us); pooled ``get`` 72 vs 68 us; on one bare
  connection ``get`` costs 41.5 us with asyncpg and 52.6 us with psycopg. So asyncpg's protocol
  is the cheaper one and its pool eats the difference (about 30 us per acquire/release, psycopg's
  about 17 us). asyncpg stays the async driver: pooled they tie within the noise, asyncpg notices
  connections the server closed while idle by itself (psycopg finds out on use), and the cheaper
  protocol is there to take with a leaner pool. psycopg is the sync driver (asyncpg has no sync
  API).
- **One placeholder style.** The ``.sql`` file uses ``:name``; it is rewritten once, at load, to
  PostgreSQL's native ``$1, $2...``, which asyncpg takes as is and psycopg takes through its
  ``RawCursor`` (no ``%s`` parsing, so no ``%`` escaping either). Both drivers send the
  byte-identical statement text.
- **Prepared statements.** asyncpg prepares and caches every statement per connection; psycopg
  is asked to prepare the per-request statements on first use (``prepare=True``).
- **No reset query.** asyncpg's pool runs ``SELECT pg_advisory_unlock_all(); CLOSE ALL;
  UNLISTEN *; RESET ALL`` on every release: one more round trip per operation (19% of the
  client CPU in a prototype). The store gives the pool a ``reset`` callback that does nothing;
  asyncpg still rolls back a connection left inside a transaction before calling it. That is
  safe because the store never leaves session state behind: no session ``SET`` (its only
  setting, ``synchronous_commit``, is transaction-local), no ``LISTEN``, no cursors, no session
  advisory locks, every statement its own transaction. psycopg_pool has no reset query by
  default.
- **Owner liveness.** Each store holds, per process, one dedicated connection outside the pool
  (the pooled ones still carry no session lock)
  with a session-level shared advisory lock named by the process's instance id (opened with the
  first reservation, again after ``fork``). Its tokens name that instance only while the lock is
  held. A reservation that meets another process's in-progress record runs one more statement,
  ``take_over``: an exclusive transaction-level try-lock on the owner's lock succeeds only when
  no session holds it, i.e. the owner's connection is gone (the process died: its socket closed,
  the server ended the session at once), and then replaces the record, fenced on its token.
- **The server's clock.** Leases and retention are computed and compared with
  ``clock_timestamp()`` on the server (``timestamptz`` columns, ``make_interval``), so app hosts
  with skewed clocks still agree on who holds a key.
- **Errors.** Refused or lost connections, pool timeouts and server shutdowns become
  :class:`~retrysafe.StoreUnavailableError` (the middleware answers ``503`` + ``Retry-After``);
  other server errors :class:`~retrysafe.StoreError`. A broken connection is dropped by the pool,
  never reused; the next operation opens a fresh one, so the store recovers by itself when the
  server is back. An operation whose connection broke mid-statement is repeated once on a fresh
  connection when that is safe (see the operations' docstrings).
- **Pool hygiene (asyncpg).** A connection on which a statement failed, or whose statement was
  cancelled, is terminated before it goes back, so the pool replaces it and never hands out a
  connection that is mid-operation or dead. And a connection whose backend was terminated while
  it sat idle can be handed out before asyncpg has read the socket's end: its protocol then
  refuses the statement before sending anything ("cannot switch to state ...; another operation
  is in progress"). Nothing reached the server, so the statement goes to another connection
  (``_asyncpg._never_sent``), silently, instead of failing the request.

URL options (``postgresql://user@host/db?table=idem.records&max_size=20``): see
:class:`PostgresOptions`; any other query option must be one of libpq's (``sslmode``...).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._sql_ops import register_sql_package
from ._sql import LIBPQ_OPTIONS, SCHEMES, URL_OPTIONS, PostgresOptions

if TYPE_CHECKING:
    from ._async import AsyncPostgresStore, AsyncPostgresTransaction
    from ._sync import PostgresStore, PostgresTransaction

__all__ = [
    "AsyncPostgresStore",
    "AsyncPostgresTransaction",
    "PostgresOptions",
    "PostgresStore",
    "PostgresTransaction",
]

# The store classes import their driver: loaded on first use, not by the registration.
BACKEND, __getattr__ = register_sql_package(
    __name__, "postgres", "Postgres", SCHEMES, URL_OPTIONS, passed=LIBPQ_OPTIONS
)
