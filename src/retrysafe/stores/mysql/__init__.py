"""MySQL and MariaDB store: one service across many app instances and hosts.

``AsyncMySQLStore`` runs on asyncmy, ``MySQLStore`` (WSGI, Django, the CLI) on PyMySQL. Both run
the same statements (``mysql.sql``) and the same operation code (``_sql.py``: the options, the
statements, the reservation; the other operations and the store's methods are the SQL stores'
own, ``stores/_sql_ops.py`` and ``stores/_sql_async.py``, shared with PostgreSQL). The async
store (``_async.py``) names that facade's dialect and its driver (``_asyncmy.py``: a pool, one
statement on a pooled connection, the table, a request's transaction); the sync store
(``_sync.py``) and its driver (``_pymysql.py``) are generated from them. Importing this package
registers the ``mysql://`` and ``mariadb://`` schemes without importing either driver.

Choices, and why:

- **Drivers.** Client CPU per statement, measured with ``time.process_time`` on this project's
  2-core machine (MariaDB 10.11 on the same machine, 5 interleaved rounds of 400 statements,
  medians): a primary-key ``SELECT`` costs PyMySQL 48.6 us, mysqlclient 20.9 us, asyncmy
  55.0 us, aiomysql 92.8 us; an ``INSERT ... ON DUPLICATE KEY UPDATE`` with a 300-byte blob
  85.6, 60.6, 116.2 and 117.5 us. asyncmy is the async driver: cheaper than aiomysql, and
  aiomysql 0.3.2 cannot send a ``bytes`` parameter with the current PyMySQL (1.2: ``TypeError``
  in its escaping), which every completion does. PyMySQL is the sync driver: mysqlclient costs
  about 25 us less per statement but ships no Linux wheels (it builds against the MySQL client
  headers with a C compiler), and PyMySQL is pure Python, installs anywhere and is what
  SQLAlchemy's ``mysql+pymysql`` and asyncmy's API follow. Every statement is one round trip
  (text protocol, parameters escaped on the client, connections in autocommit).
- **Round trips.** ``reserve`` of a new key: 1 (``INSERT ... ON DUPLICATE KEY UPDATE``, which
  also takes over an expired or lapsed record). A duplicate: 2 (that insert changes nothing,
  then the record is read). ``get``, ``renew``, ``complete``, ``release``: 1.
- **No lost update under REPEATABLE READ.** The reservation's conflict branch is evaluated under
  the row's exclusive lock on its latest committed version (InnoDB's locking read), not on the
  transaction's snapshot; completions, renewals and releases are ``UPDATE``/``DELETE`` fenced on
  the token, which also read the latest version. A deadlock between racing inserts (error 1213)
  or a lock wait timeout (1205) rolls the statement back, and it runs again.
- **Owner liveness.** Each process holds ``GET_LOCK('retrysafe:<instance id>', 0)`` on one
  PyMySQL connection of its own (``_owner.py``: named locks are exclusive, so all the stores of a
  process share it). The server frees a named lock when its session ends, so when the process
  dies the reservation that meets its in-progress record sees ``IS_FREE_LOCK`` = 1 in the same
  read and takes the record over at once, fenced on its token; a committed record of a dead
  owner is "outcome unknown" at once.
- **The server's clock.** Leases and retention are seconds since the epoch computed on the
  server from ``UTC_TIMESTAMP(6)`` (``DOUBLE`` columns), whatever the session's time zone.
- **MySQL 8 and MariaDB.** No ``RETURNING``, no ``VALUES()`` in ``ON DUPLICATE KEY UPDATE``, no
  user variables in expressions; the ``ON DUPLICATE KEY UPDATE`` gives the same result whether
  assignments run left to right or at once (MariaDB's ``SIMULTANEOUS_ASSIGNMENT``).
- **Errors.** Refused or lost connections, a full pool and server shutdowns become
  :class:`~retrysafe.StoreUnavailableError` (the middleware answers ``503`` + ``Retry-After``);
  other server errors :class:`~retrysafe.StoreError`. A connection on which a statement failed
  or was cancelled is closed, never reused; idle connections the server closed are noticed
  (a zero-timeout poll) and replaced, so the store recovers by itself when the server is back.

URL options (``mysql://user:password@host:3306/db?table=idem_records&max_size=20``): see
:class:`MySQLOptions`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._sql_ops import register_sql_package
from ._sql import SCHEMES, URL_OPTIONS, MySQLOptions

if TYPE_CHECKING:
    from ._async import AsyncMySQLStore, AsyncMySQLTransaction
    from ._sync import MySQLStore, MySQLTransaction

__all__ = [
    "AsyncMySQLStore",
    "AsyncMySQLTransaction",
    "MySQLOptions",
    "MySQLStore",
    "MySQLTransaction",
]

# The store classes import their driver: loaded on first use, not by the registration.
BACKEND, __getattr__ = register_sql_package(__name__, "mysql", "MySQL", SCHEMES, URL_OPTIONS)
