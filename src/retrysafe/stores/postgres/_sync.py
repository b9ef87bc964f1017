# Generated from src/retrysafe/stores/postgres/_async.py by scripts/unasync.py: do not edit.
"""The sync PostgreSQL store: the SQL stores' facade (``stores/_sql_sync.py``) over the psycopg
driver (``_psycopg.py``) and PostgreSQL's dialect (``_sql.py``: options, statements, the
reservation).

This file is generated from ``_async.py`` by ``scripts/unasync.py``
(``make lint`` checks that it is up to date): edit that file, then run the script.
"""

from __future__ import annotations

from .._sql_sync import SQLStore, SQLTransaction
from ._psycopg import PsycopgDriver
from ._sql import DIALECT, PostgresOptions, Statements

__all__ = ["PostgresStore", "PostgresTransaction"]


class PostgresTransaction(SQLTransaction):
    """A request's PostgreSQL transaction (transactional mode), from
    :meth:`PostgresStore.begin`: a pooled psycopg connection in a transaction."""


class PostgresStore(SQLStore):
    """Keeps records in a PostgreSQL table, through a pool of psycopg connections (opened on
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
    driver_class = PsycopgDriver
    transaction_class = PostgresTransaction
    options: PostgresOptions
    statements: Statements
