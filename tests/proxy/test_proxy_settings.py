"""Where ``retrysafe proxy`` options come from (flag > RETRYSAFE_* > TOML > default), and how bad
ones end: exit status 2 and one line naming the problem, before anything is served."""

from __future__ import annotations

from pathlib import Path

import pytest

from retrysafe import ConfigurationError, IdempotencyConfig
from retrysafe._core.scope import authorization_scope
from retrysafe.cli import main
from retrysafe.proxy import ProxySettings, RoutePolicy, header_scope_resolver, load_settings

BASE = {"upstream": "http://127.0.0.1:9000", "store": "memory://"}


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "proxy.toml"
    path.write_text(text)
    return str(path)


def test_a_flag_beats_the_environment_which_beats_the_file(tmp_path: Path) -> None:
    config = write(
        tmp_path,
        'upstream = "http://file:1"\nstore = "memory://"\nttl = 10.0\nlease = 5.0\n'
        'methods = ["POST"]\n',
    )
    settings = load_settings(
        {"ttl": "30"},
        {"RETRYSAFE_TTL": "20", "RETRYSAFE_LEASE": "2", "RETRYSAFE_UPSTREAM": "http://env:2"},
        config,
    )
    assert settings.config.ttl == 30.0  # flag
    assert settings.config.lease == 2.0  # environment over file
    assert settings.upstream == "http://env:2"
    assert settings.config.methods == frozenset({"POST"})  # file over default
    assert settings.config.max_body_size == 1024 * 1024  # default (IdempotencyConfig's own)


def test_routes_from_the_file_become_per_route_middleware_settings(tmp_path: Path) -> None:
    config = write(
        tmp_path,
        '[[routes]]\npath = "/payments"\nrequired = true\nttl = 600\nmethods = ["post", "put"]\n'
        '[[routes]]\npath = "/webhooks/*"\nenabled = false\n',
    )
    settings = load_settings(BASE, {}, config)
    payments, hooks = settings.routes
    assert payments == RoutePolicy(
        path="/payments", options={"required": True, "ttl": 600, "methods": ["POST", "PUT"]}
    )
    route_config = settings.idempotency_config(payments)
    assert route_config.required and route_config.ttl == 600.0
    assert route_config.methods == frozenset({"POST", "PUT"})
    assert settings.idempotency_config().required is False
    assert hooks.matches("/webhooks/github") and not hooks.matches("/webhook")
    assert payments.matches("/payments") and not payments.matches("/payments/1")
    # Worker processes rebuild the same settings from JSON.
    assert ProxySettings.from_json(settings.to_json()) == settings


def test_environment_booleans_and_lists_are_parsed() -> None:
    env = {"RETRYSAFE_TRUST_FORWARDED": "yes", "RETRYSAFE_METHODS": "post, patch,PUT"}
    settings = load_settings(BASE, env)
    assert settings.trust_forwarded is True
    assert settings.config.methods == frozenset({"POST", "PATCH", "PUT"})
    with pytest.raises(ConfigurationError, match="RETRYSAFE_REQUIRED in the environment: must be"):
        load_settings(BASE, {"RETRYSAFE_REQUIRED": "maybe"})


def test_every_middleware_option_is_read_from_every_source_with_one_default(
    tmp_path: Path,
) -> None:
    """The proxy holds an IdempotencyConfig: an option the proxy never listed (canonical_json,
    replay_headers) is read from TOML, the environment and flags, and an option given nowhere
    has IdempotencyConfig's default."""
    config = write(tmp_path, 'canonical_json = true\nreplay_headers = ["Idempotent-Replayed"]\n')
    settings = load_settings(
        {**BASE, "retention_header": "Idempotency-Key-Expires"},
        {"RETRYSAFE_CONFLICT_WAIT": "2m"},
        config,
    )
    assert settings.config.canonical_json is True
    assert settings.config.replay_headers == ("Idempotent-Replayed",)
    assert settings.config.conflict_wait == 120.0
    assert settings.config.retention_header == "Idempotency-Key-Expires"
    assert settings.config == IdempotencyConfig(
        canonical_json=True,
        replay_headers=("Idempotent-Replayed",),
        conflict_wait=120.0,
        retention_header="Idempotency-Key-Expires",
    )
    middleware = settings.idempotency_config()
    assert middleware.scope_resolver is not None  # principal_header's, not an option


def test_a_route_ttl_shorter_than_the_lease_brings_the_lease_down(tmp_path: Path) -> None:
    config = write(tmp_path, '[[routes]]\npath = "/a"\nttl = "1s"\n')
    settings = load_settings(BASE, {}, config)
    route = settings.idempotency_config(settings.routes[0])
    assert (route.ttl, route.lease) == (1.0, 1.0)
    assert settings.idempotency_config().lease == 30.0


def test_principal_header_scopes_by_its_value_and_is_global_without_it() -> None:
    resolve = header_scope_resolver("X-Api-Key")
    alice = resolve({"headers": [(b"x-api-key", b"alice")]})
    bob = resolve({"headers": [(b"x-api-key", b"bob")]})
    assert alice and bob and alice != bob
    assert resolve({"headers": [(b"authorization", b"alice")]}) == ""


@pytest.mark.parametrize("header", ["X-Api-Key", "Authorization"])
def test_an_api_key_in_the_principal_header_is_compared_exactly(header: str) -> None:
    resolve = header_scope_resolver(header)
    name = header.lower().encode()
    upper = resolve({"headers": [(name, b"KeyAbC-x")]})
    lower = resolve({"headers": [(name, b"keyabc-x")]})
    assert upper and lower and upper != lower
    # `retrysafe resolve --authorization VALUE` finds such a key whatever the header.
    assert upper == authorization_scope(b"KeyAbC-x")


def test_only_the_authorization_scheme_is_case_folded() -> None:
    by_authorization = header_scope_resolver("Authorization")
    assert by_authorization({"headers": [(b"authorization", b"Bearer abc")]}) == (
        by_authorization({"headers": [(b"authorization", b"bearer abc")]})
    )
    by_api_key = header_scope_resolver("X-Api-Key")
    assert by_api_key({"headers": [(b"x-api-key", b"Bearer abc")]}) != (
        by_api_key({"headers": [(b"x-api-key", b"bearer abc")]})
    )


@pytest.mark.parametrize(
    ("args", "config", "message"),
    [
        pytest.param(["--store", "memory://"], None, "--upstream is required", id="no-upstream"),
        pytest.param(
            ["--upstream", "ftp://x", "--store", "memory://"], None, "http:// or https://", id="url"
        ),
        pytest.param([*["--upstream", "http://u:1"]], None, "--store is required", id="no-store"),
        pytest.param(
            ["--upstream", "http://u:1", "--store", "nope://"], None, "unknown store", id="store"
        ),
        pytest.param(
            ["--upstream", "http://u:1", "--store", "memory://", "--listen", "8080"],
            None,
            "HOST:PORT",
            id="listen",
        ),
        pytest.param(
            ["--upstream", "http://u:1", "--store", "memory://", "--ttl", "soon"],
            None,
            "--ttl: must be seconds (30, 2.5) or a duration",
            id="ttl",
        ),
        pytest.param(
            ["--upstream", "http://u:1", "--store", "memory://", "--workers", "2"],
            None,
            "memory:// lives in one process",
            id="memory-workers",
        ),
        pytest.param(
            ["--upstream", "http://u:1", "--store", "memory://", "--log-level", "loud"],
            None,
            "--log-level: must be one of 'critical', 'error'",
            id="log-level",
        ),
        pytest.param([], "upstream = [", "not valid TOML", id="toml"),
        pytest.param(
            [], 'upstrem = "http://u:1"', "unknown option (did you mean upstream?)", id="typo"
        ),
        pytest.param(
            ["--upstream", "http://u:1", "--store", "memory://", "--requird"],
            None,
            "--requird: unknown option (did you mean --required?)",
            id="flag-typo",
        ),
        pytest.param(
            [],
            '[[routes]]\npath = "/a"\nreqired = true',
            "reqired of route '/a' in",
            id="key",
        ),
        pytest.param([], '[[routes]]\npath = "a"', "must start with '/'", id="path"),
        pytest.param(
            [],
            'upstream = "http://u:1"\nstore = "memory://"\n[[routes]]\npath = "/a"\nttl = 1\n'
            "lease = 5",
            "lease of route '/a' in",
            id="route-ttl",
        ),
    ],
)
def test_bad_options_exit_2_with_one_line(
    args: list[str],
    config: str | None,
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for variable in ("RETRYSAFE_STORE_URL", "RETRYSAFE_UPSTREAM", "RETRYSAFE_CONFIG"):
        monkeypatch.delenv(variable, raising=False)
    if config is not None:
        args = [*args, "--config", write(tmp_path, config)]
    assert main(["proxy", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("retrysafe: "), err
    assert message in err


def test_a_missing_config_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = str(tmp_path / "nope.toml")
    assert (
        main(["proxy", *["--upstream", "http://u:1", "--store", "memory://"], "--config", missing])
        == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot read" in err and "nope.toml" in err


def test_a_proxy_process_collects_young_objects_less_often() -> None:
    """The command tunes its own process's collector (never the caller's: checked in a child)."""
    import subprocess
    import sys

    code = (
        "import gc; from retrysafe.proxy.app import GC_THRESHOLD, tune_gc; "
        "before = gc.get_threshold(); tune_gc(); "
        "print(before != GC_THRESHOLD, gc.get_threshold() == GC_THRESHOLD, "
        "gc.get_freeze_count() > 0)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.split() == ["True", "True", "True"]
