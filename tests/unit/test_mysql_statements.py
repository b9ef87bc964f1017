"""The MySQL store's URL options and statements, without a server: what a URL sets, what it
refuses, and SQL that stays within what both MySQL 8 and MariaDB 10.11 accept."""

from __future__ import annotations

import re

import pytest

from retrysafe import ConfigurationError
from retrysafe.stores.mysql import MySQLOptions
from retrysafe.stores.mysql._sql import Statements, error_kind


def test_a_url_sets_the_connection_and_the_store_options() -> None:
    options = MySQLOptions.from_url(
        "mariadb://app:p%40ss@db.example:3307/shop?table=shop.idem&max_size=3&pool_timeout=2"
    )
    assert (options.host, options.port, options.user, options.password) == (
        "db.example",
        3307,
        "app",
        "p@ss",
    )
    assert (options.database, options.table, options.max_size) == ("shop", "shop.idem", 3)
    assert options.quoted_table == "`shop`.`idem`" and options.schema_name == "shop"
    kwargs = options.connect_kwargs()
    assert kwargs["autocommit"] is True and kwargs["charset"] == "utf8mb4"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("mysql://root@h/db?tabel=x", "did you mean 'table'"),
        ("mysql://root@h/", "needs a database"),
        ("mysql://root@h/db?table=a;drop", "use NAME or DATABASE.NAME"),
        ("mysql://root@h/db?max_size=0", "max_size must be >= 1"),
        ("mysql://root@a,b/db", "names one host"),
    ],
)
def test_a_bad_url_is_one_configuration_error_naming_it(url: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        MySQLOptions.from_url(url)


def test_statements_use_only_what_mysql_8_and_mariadb_both_accept() -> None:
    statements = Statements(MySQLOptions.from_url("mysql://root@h/db?table=t"))
    for name in ("reserve", "peek", "take_over", "get", "renew", "complete", "release", "purge"):
        sql = statements[name].sql
        assert "RETURNING" not in sql.upper(), name  # MySQL has none
        assert not re.search(r"\bVALUES\s*\(\s*\w+\s*\)", sql), name  # deprecated in MySQL 8
        assert ":=" not in sql and "@" not in sql, name  # no user variables in expressions
        assert sql.count("%s") == len(statements[name].params), name
        assert not re.search(r"(?<![:\w]):[A-Za-z_]", sql), name  # every :name rewritten
    assert statements["reserve"].sql.startswith("INSERT INTO `t`")
    assert not statements["reserve"].returns_rows and statements["peek"].returns_rows


def test_only_errors_that_did_nothing_are_retried_and_lost_connections_are_told_apart() -> None:
    assert error_kind(1213) == error_kind(1205) == "retry"  # deadlock, lock wait timeout
    assert error_kind(2013) == error_kind(2006) == "lost"
    assert error_kind(2003) == error_kind(1040) == "unavailable"
    assert error_kind(1062) == error_kind(None) == "error"
