"""The same bad options on every front, read by the one loader: an unknown option (with "did you
mean"), a value of the wrong type, a bad value, a bad choice. Each front refuses at start-up
(construction, ``init_app``, the middleware's load and the system check, the lifespan start-up,
the proxy's settings, the command's parse) with exactly one ``ConfigurationError`` whose message
names the option as the user wrote it and where: ``IdempotencyMiddleware(ttl=...)``,
``install(ttl=...)``, ``RETRYSAFE_TTL in app.config``, ``settings.RETRYSAFE['TTL']``,
``ttl in proxy.toml``, ``RETRYSAFE_TTL in the environment``, ``--ttl``.

The command-line fronts run as real processes: a front that did not refuse would start serving
and the test would time out instead of passing.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp.web
import pytest
from fastapi import FastAPI
from flask import Flask
from starlette.applications import Starlette
from starlette.middleware import Middleware

import retrysafe.asgi
import retrysafe.contrib.aiohttp
import retrysafe.contrib.grpc
import retrysafe.wsgi
from retrysafe import ConfigurationError
from retrysafe.contrib.fastapi import install
from retrysafe.contrib.flask import Idempotency
from retrysafe.proxy import load_settings

from ..e2e.servers import free_port


@dataclass(frozen=True)
class Case:
    """One bad option: ``name`` given ``value`` (``text``: as a variable or a flag gives it)."""

    name: str
    value: Any
    text: str
    #: What the loader says about it, given the value as given and ``ttl`` as the front writes it.
    problem: Callable[[Any, str], str]


CASES = {
    "unknown": Case("tll", 5, "5", lambda value, ttl: f"unknown option (did you mean {ttl}?)"),
    "wrong-type": Case(
        "ttl",
        [30],
        "soon",
        lambda value, ttl: (
            "must be a number of seconds, got [30]"
            if value == [30]
            else "must be seconds (30, 2.5) or a duration ('30s', '15m', '2h', '1d'), got 'soon'"
        ),
    ),
    "bad-value": Case("ttl", -5, "-5", lambda value, ttl: f"must be positive, got {value!r}"),
    "bad-choice": Case(
        "on_conflict",
        "queue",
        "queue",
        lambda value, ttl: "must be 'reject' or 'wait', got 'queue'",
    ),
}


@dataclass(frozen=True)
class Front:
    """A way to configure retrysafe.

    Attributes:
        key: how an option name is written there (``ttl`` -> ``RETRYSAFE_TTL``).
        where: how a message names a key there.
        start: starts the front with ``{key: value}``; returns the one error message it gave.
        text: options are text there (variables, flags).
        options: the options it takes, when not all (``demo``: ``ttl`` and ``lease``).
    """

    key: Callable[[str], str]
    where: Callable[[str], str]
    start: Callable[[dict[str, Any], Path], str]
    text: bool = False
    options: frozenset[str] | None = None


def _raised(build: Callable[[], object]) -> str:
    with pytest.raises(ConfigurationError) as refused:
        build()
    return str(refused.value)


async def _asgi_app(scope: Any, receive: Any, send: Any) -> None:
    raise AssertionError("never reached: the front must refuse before serving")


def _wsgi_app(environ: Any, start_response: Any) -> list[bytes]:
    raise AssertionError("never reached: the front must refuse before serving")


def _starlette_lifespan(options: dict[str, Any], tmp: Path) -> str:
    """``Middleware(IdempotencyMiddleware, ...)``: Starlette builds the stack in its first
    call, the lifespan scope, which must fail its start-up with the message."""
    app = Starlette(
        middleware=[Middleware(retrysafe.asgi.IdempotencyMiddleware, store="memory://", **options)]
    )
    sent: list[dict[str, Any]] = []
    incoming = [{"type": "lifespan.startup"}]

    async def receive() -> dict[str, Any]:
        if incoming:
            return incoming.pop()
        await asyncio.Event().wait()  # no shutdown: the start-up failed
        raise AssertionError

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
    asyncio.run(asyncio.wait_for(app(scope, receive, send), 10))
    [failed] = sent
    assert failed["type"] == "lifespan.startup.failed"
    prefix = "retrysafe.ConfigurationError: "
    assert failed["message"].startswith(prefix)
    return str(failed["message"]).removeprefix(prefix)


def _flask_config(options: dict[str, Any], tmp: Path) -> str:
    app = Flask("bad")
    app.config.update(options)
    message = _raised(lambda: Idempotency(app, store="memory://"))
    assert "retrysafe" not in app.extensions  # nothing set up
    return message


def _django(options: dict[str, Any], tmp: Path) -> str:
    """The middleware refuses to load (Django's ImproperlyConfigured, caused by the one
    ConfigurationError) and ``manage.py check`` reports the same line as retrysafe.E001."""
    from django.core.exceptions import ImproperlyConfigured
    from django.test import override_settings

    from retrysafe.contrib.django.checks import check_settings
    from retrysafe.contrib.django.middleware import IdempotencyMiddleware

    from . import django_front  # noqa: F401 - configures Django as the contract's Django front

    with override_settings(RETRYSAFE={"STORE": "memory://", **options}):
        with pytest.raises(ImproperlyConfigured) as refused:
            IdempotencyMiddleware(lambda request: None)
        errors = [m.msg for m in check_settings() if m.id == "retrysafe.E001"]
    cause = refused.value.__cause__
    assert isinstance(cause, ConfigurationError)
    assert str(refused.value) == str(cause)
    assert errors == [str(cause)]
    return str(cause)


def _toml(value: Any) -> str:
    return json.dumps(value)  # a TOML literal for a string, a number or a list of numbers


def _proxy_toml(options: dict[str, Any], tmp: Path) -> str:
    path = tmp / "proxy.toml"
    lines = ['upstream = "http://127.0.0.1:9"', 'store = "memory://"']
    lines += [f"{key} = {_toml(value)}" for key, value in options.items()]
    path.write_text("\n".join(lines) + "\n")
    return _raised(lambda: load_settings({}, {}, str(path)))


def _proxy_environment(options: dict[str, Any], tmp: Path) -> str:
    environ = {"RETRYSAFE_UPSTREAM": "http://127.0.0.1:9", "RETRYSAFE_STORE_URL": "memory://"}
    return _raised(lambda: load_settings({}, {**environ, **options}, None))


def _command(args: list[str]) -> str:
    """Run ``retrysafe ...`` as a process: it must exit 2 with one line on stderr."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("RETRYSAFE_")}
    done = subprocess.run(
        [sys.executable, "-m", "retrysafe", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=environ,
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    [line] = done.stderr.splitlines()
    assert line.startswith("retrysafe: "), done.stderr
    return line.removeprefix("retrysafe: ")


def _flags(options: dict[str, Any]) -> list[str]:
    return [part for flag, value in options.items() for part in (flag, value)]


def _proxy_flags(options: dict[str, Any], tmp: Path) -> str:
    listen = f"127.0.0.1:{free_port()}"
    base = ["--upstream", "http://127.0.0.1:9", "--store", "memory://", "--listen", listen]
    return _command(["proxy", *base, *_flags(options)])


def _demo_flags(options: dict[str, Any], tmp: Path) -> str:
    base = ["--port", str(free_port()), "--store", f"sqlite:///{tmp}/demo.db"]
    return _command(["demo", *base, *_flags(options)])


def _same(name: str) -> str:
    return name


def _keywords(owner: str) -> Callable[[str], str]:
    return lambda key: f"{owner}({key}=...)"


def _upper(name: str) -> str:
    return "RETRYSAFE_" + name.upper()


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


FRONTS = {
    "asgi": Front(
        _same,
        _keywords("IdempotencyMiddleware"),
        lambda options, tmp: _raised(
            lambda: retrysafe.asgi.IdempotencyMiddleware(_asgi_app, store="memory://", **options)
        ),
    ),
    "starlette-middleware": Front(_same, _keywords("IdempotencyMiddleware"), _starlette_lifespan),
    "fastapi-install": Front(
        _same,
        _keywords("install"),
        lambda options, tmp: _raised(lambda: install(FastAPI(), store="memory://", **options)),
    ),
    "wsgi": Front(
        _same,
        _keywords("IdempotencyMiddleware"),
        lambda options, tmp: _raised(
            lambda: retrysafe.wsgi.IdempotencyMiddleware(_wsgi_app, store="memory://", **options)
        ),
    ),
    "aiohttp-setup": Front(
        _same,
        _keywords("setup"),
        lambda options, tmp: _raised(
            lambda: retrysafe.contrib.aiohttp.setup(
                aiohttp.web.Application(), store="memory://", **options
            )
        ),
    ),
    "aiohttp-middleware": Front(
        _same,
        _keywords("idempotency_middleware"),
        lambda options, tmp: _raised(
            lambda: retrysafe.contrib.aiohttp.idempotency_middleware(store="memory://", **options)
        ),
    ),
    "grpc-interceptor": Front(
        _same,
        _keywords("IdempotencyInterceptor"),
        lambda options, tmp: _raised(
            lambda: retrysafe.contrib.grpc.IdempotencyInterceptor(store="memory://", **options)
        ),
    ),
    "grpc-aio-interceptor": Front(
        _same,
        _keywords("AsyncIdempotencyInterceptor"),
        lambda options, tmp: _raised(
            lambda: retrysafe.contrib.grpc.AsyncIdempotencyInterceptor(store="memory://", **options)
        ),
    ),
    "flask-config": Front(_upper, lambda key: f"{key} in app.config", _flask_config),
    "flask-keywords": Front(
        _same,
        _keywords("Idempotency"),
        lambda options, tmp: _raised(
            lambda: Idempotency(Flask("bad"), store="memory://", **options)
        ),
    ),
    "django-settings": Front(str.upper, lambda key: f"settings.RETRYSAFE['{key}']", _django),
    "proxy-toml": Front(_same, lambda key: f"{key} in {{tmp}}/proxy.toml", _proxy_toml),
    "proxy-environment": Front(
        _upper, lambda key: f"{key} in the environment", _proxy_environment, text=True
    ),
    "proxy-flags": Front(_flag, _same, _proxy_flags, text=True),
    "demo-flags": Front(
        _flag, _same, _demo_flags, text=True, options=frozenset({"ttl", "lease", "tll"})
    ),
}


def _params() -> list[Any]:
    params = []
    for front_id, front in FRONTS.items():
        for case_id, case in CASES.items():
            if front.options is not None and case.name not in front.options:
                continue  # the demo's only settings are --ttl and --lease
            if front_id == "proxy-environment" and case_id == "unknown":
                continue  # the environment is shared: other RETRYSAFE_* variables are no error
            params.append(pytest.param(front_id, case_id, id=f"{front_id}-{case_id}"))
    return params


@pytest.mark.parametrize(("front_id", "case_id"), _params())
def test_a_bad_option_is_one_configuration_error_naming_it_at_start_up(
    front_id: str, case_id: str, tmp_path: Path
) -> None:
    front, case = FRONTS[front_id], CASES[case_id]
    value = case.text if front.text else case.value
    key = front.key(case.name)
    message = front.start({key: value}, tmp_path)
    where = front.where(key).replace("{tmp}", str(tmp_path))
    assert message == f"{where}: {case.problem(value, front.key('ttl'))}"


def test_every_front_and_every_case_is_exercised() -> None:
    """The matrix leaves out only what a front cannot express (said where it is left out)."""
    assert len(_params()) == len(FRONTS) * len(CASES) - 2
