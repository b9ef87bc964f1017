"""The ``retrysafe`` command needs no framework until a subcommand serves one: with every
optional library hidden, ``--help``, ``--version`` and each subcommand's help work, and a
subcommand that needs a missing extra says which one to install, in one line.

Fast in-repo twins of the install matrix (``test_matrix.py``), which proves the same in real
virtualenvs that have only one extra each."""

from __future__ import annotations

import subprocess
import sys

import pytest

from retrysafe import __version__

#: Every library an extra brings: hidden from the child interpreter (``sys.modules[name] =
#: None`` makes ``import name`` raise ImportError, as when it is not installed).
OPTIONAL = [
    "starlette",
    "fastapi",
    "flask",
    "werkzeug",
    "django",
    "rest_framework",
    "uvicorn",
    "gunicorn",
    "httpx",
    "requests",
    "redis",
    "hiredis",
    "asyncpg",
    "psycopg",
    "psycopg_pool",
    "pymysql",
    "asyncmy",
    "sqlalchemy",
    "prometheus_client",
    "opentelemetry",
]

SUBCOMMANDS = ["demo", "proxy", "request", "check", "purge", "stats", "inspect", "resolve"]


def bare(*argv: str) -> subprocess.CompletedProcess[str]:
    """Run ``retrysafe *argv`` in a child interpreter that cannot import any optional library."""
    code = (
        "import sys\n"
        f"for name in {OPTIONAL!r}: sys.modules[name] = None\n"
        "from retrysafe.cli import main\n"
        f"sys.exit(main({list(argv)!r}))\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_help_needs_no_optional_library() -> None:
    result = bare("--help")
    assert result.returncode == 0, result.stderr
    assert "usage: retrysafe" in result.stdout
    for command in SUBCOMMANDS:
        assert command in result.stdout


@pytest.mark.parametrize("command", [*SUBCOMMANDS, "schema"])
def test_each_subcommand_help_needs_no_optional_library(command: str) -> None:
    result = bare(command, "--help")
    assert result.returncode == 0, result.stderr
    assert f"usage: retrysafe {command}" in result.stdout


def test_version_is_the_package_version() -> None:
    result = bare("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"retrysafe {__version__} (pure Python)"


def test_a_store_command_on_the_core_store_needs_no_optional_library(tmp_path: object) -> None:
    result = bare("check", "--store", f"sqlite:///{tmp_path}/s.db")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok: sqlite store reachable")


@pytest.mark.parametrize(
    ("argv", "extra"),
    [
        (["demo", "--port", "1"], "demo"),
        (["demo", "--port", "1", "--framework", "flask"], "demo"),
        (["proxy", "--upstream", "http://127.0.0.1:9", "--store", "memory://"], "proxy"),
        (["request", "POST", "http://127.0.0.1:9/x"], "httpx"),
        (["check", "--store", "redis://127.0.0.1:6379/0"], "redis"),
        (["stats", "--store", "postgresql://postgres@127.0.0.1:5432/test"], "postgres"),
        (["stats", "--store", "mysql://root@127.0.0.1:3306/test"], "mysql"),
    ],
    ids=["demo", "demo-flask", "proxy", "request", "redis-store", "postgres-store", "mysql-store"],
)
def test_a_missing_extra_is_one_line_naming_what_to_install(argv: list[str], extra: str) -> None:
    result = bare(*argv)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert f"pip install 'retrysafe[{extra}]'" in result.stderr


def test_the_demo_framework_choices_are_the_demo_servers() -> None:
    from retrysafe.cli import DEMO_FRAMEWORKS
    from retrysafe.demo.serve import SERVERS

    assert list(DEMO_FRAMEWORKS) == list(SERVERS)
