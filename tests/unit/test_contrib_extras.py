"""A contrib module imported without its optional library fails with one ``ImportError`` that
names the extra to install, chained to the original error (which names the library)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

#: contrib module (and its extra) -> the library it cannot work without.
LIBRARIES = {
    "aiohttp": "aiohttp",
    "arq": "arq",
    "celery": "celery",
    "dramatiq": "dramatiq",
    "fastapi": "fastapi",
    "flask": "flask",
    "grpc": "grpc",
    "huey": "huey",
    "otel": "opentelemetry",
    "prometheus": "prometheus_client",
    "rq": "rq",
    "sqlalchemy": "sqlalchemy",
    "taskiq": "taskiq",
}


@pytest.mark.parametrize(("module", "library"), LIBRARIES.items(), ids=list(LIBRARIES))
def test_the_import_error_names_the_module_s_own_extra(module: str, library: str) -> None:
    code = f"""
        import sys
        sys.modules[{library!r}] = None  # import {library} now raises ImportError
        try:
            import retrysafe.contrib.{module}
        except ImportError as exc:
            print(type(exc).__name__, exc, sep=": ")
            print(type(exc.__cause__).__name__, exc.__cause__.name.split(".")[0], sep=": ")
        else:
            raise SystemExit("imported without its library")
    """
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"ImportError: retrysafe.contrib.{module} needs: pip install 'retrysafe[{module}]'",
        f"ModuleNotFoundError: {library}",
    ]
