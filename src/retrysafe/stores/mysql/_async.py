"""The async MySQL store: the SQL stores' facade (``stores/_sql_async.py``) over the asyncmy
driver (``_asyncmy.py``) and MySQL's dialect (``_sql.py``: options, statements, the
reservation).

The sync twin, ``_sync.py`` (PyMySQL), is generated from this file by ``scripts/unasync.py``
(``make lint`` checks that it is up to date): edit this file, then run the script.
"""

from __future__ import annotations

from .._sql_async import AsyncSQLStore, AsyncSQLTransaction
from ._asyncmy import AsyncmyDriver
from ._sql import DIALECT, MySQLOptions, Statements

__all__ = ["AsyncMySQLStore", "AsyncMySQLTransaction"]


class AsyncMySQLTransaction(AsyncSQLTransaction):
    """A request's MySQL transaction (transactional mode), from :meth:`AsyncMySQLStore.begin`:
    a pooled asyncmy connection with a transaction begun (the pool's are in autocommit)."""


class AsyncMySQLStore(AsyncSQLStore):
    """Keeps records in a MySQL or MariaDB table, through pooled asyncmy connections (opened on
    first use, when ``auto_create`` also creates the table if it is missing).

    Args:
        url: ``mysql://user:password@host:port/database?option=value`` (``mariadb://`` too);
            see :class:`~retrysafe.stores.mysql.MySQLOptions` for the options.
        **options: the same options as keywords (they win over the URL's).

    Raises:
        ConfigurationError: an unknown option, or an option with a bad value.
    """

    kind = "mysql"
    dialect = DIALECT
    driver_class = AsyncmyDriver
    transaction_class = AsyncMySQLTransaction
    options: MySQLOptions
    statements: Statements
