# Generated from src/retrysafe/stores/mysql/_async.py by scripts/unasync.py: do not edit.
"""The sync MySQL store: the SQL stores' facade (``stores/_sql_sync.py``) over the PyMySQL
driver (``_pymysql.py``) and MySQL's dialect (``_sql.py``: options, statements, the
reservation).

This file is generated from ``_async.py`` by ``scripts/unasync.py``
(``make lint`` checks that it is up to date): edit that file, then run the script.
"""

from __future__ import annotations

from .._sql_sync import SQLStore, SQLTransaction
from ._pymysql import PyMySQLDriver
from ._sql import DIALECT, MySQLOptions, Statements

__all__ = ["MySQLStore", "MySQLTransaction"]


class MySQLTransaction(SQLTransaction):
    """A request's MySQL transaction (transactional mode), from :meth:`MySQLStore.begin`:
    a pooled PyMySQL connection with a transaction begun (the pool's are in autocommit)."""


class MySQLStore(SQLStore):
    """Keeps records in a MySQL or MariaDB table, through pooled PyMySQL connections (opened on
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
    driver_class = PyMySQLDriver
    transaction_class = MySQLTransaction
    options: MySQLOptions
    statements: Statements
