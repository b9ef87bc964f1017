"""The async PostgreSQL store: the SQL stores' facade (``stores/_sql_async.py``) over the asyncpg
driver (``_asyncpg.py``) and PostgreSQL's dialect (``_sql.py``: options, statements, the
reservation).

The sync twin, ``_sync.py`` (psycopg), is generated from this file by ``scripts/unasync.py``
(``make lint`` checks that it is up to date): edit this file, then run the script.
"""

from __future__ import annotations

from .._sql_async import AsyncSQLStore, AsyncSQLTransaction
from ._asyncpg import AsyncpgDriver
from ._sql import DIALECT, PostgresOptions, Statements

__all__ = ["AsyncPostgresStore", "AsyncPostgresTransaction"]


class AsyncPostgresTransaction(AsyncSQLTransaction):
    """A request's PostgreSQL transaction (transactional mode), from
    :meth:`AsyncPostgresStore.begin`: a pooled asyncpg connection in a transaction."""


class AsyncPostgresStore(AsyncSQLStore):
    """Keeps records in a PostgreSQL table, through a pool of asyncpg connections (opened on
    first use, when ``auto_create`` also creates the table if it is missing).

    Args:
        url: ``postgresql://user:password@host:port/db?option=value``; the options are
            :class:`~retrysafe.stores.postgres.PostgresOptions`' and libpq's (``sslmode``...).
        **options: the same options as keywords (they win over the URL's).

    Raises:
        ConfigurationError: an unknown option, or an option with a bad value.
    """

    kind = "postgres"
    dialect = DIALECT
    driver_class = AsyncpgDriver
    transaction_class = AsyncPostgresTransaction
    options: PostgresOptions
    statements: Statements
