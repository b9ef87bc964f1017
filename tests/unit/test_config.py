"""IdempotencyConfig validation, the status policy and per-route overrides."""

from __future__ import annotations

from dataclasses import fields
from typing import Any, get_args, get_type_hints

import pytest

from retrysafe import (
    DEFAULT_RELEASE_STATUSES,
    ConfigurationError,
    IdempotencyConfig,
    RouteOptions,
    idempotent,
)
from retrysafe._core.config import OPTIONS, ROUTE_OPTIONS
from retrysafe._core.options import ConfigSource
from retrysafe._core.routes import ROUTE_OPTIONS_ATTR, RouteKeywords


def test_defaults_match_the_design() -> None:
    config = IdempotencyConfig()
    assert config.methods == frozenset({"POST", "PATCH"})
    assert config.required is False
    assert config.ttl == 24 * 3600
    assert config.lease == 30
    assert config.max_body_size == 1024 * 1024
    assert config.on_conflict == "reject"
    assert config.on_store_error == "fail_closed"
    assert {400, 401, 403, 408, 409, 413, 415, 422, 425, 429} == DEFAULT_RELEASE_STATUSES


def test_config_is_frozen_and_keyword_only() -> None:
    config = IdempotencyConfig()
    with pytest.raises(AttributeError):
        config.ttl = 5  # type: ignore[misc]
    with pytest.raises(TypeError):
        IdempotencyConfig(frozenset({"POST"}))  # type: ignore[misc]


def test_methods_and_header_names_are_normalized() -> None:
    config = IdempotencyConfig(
        methods=frozenset({"post", "Put"}),
        replay_header_denylist=frozenset({"X-Secret"}),
        replay_header_allowlist=frozenset({"Location"}),
    )
    assert config.methods == {"POST", "PUT"}
    assert config.replay_header_denylist == {"x-secret"}
    assert config.replay_header_allowlist == {"location"}


@pytest.mark.parametrize(
    "options",
    [
        {"methods": frozenset()},
        {"methods": ""},
        {"methods": 7},
        {"methods": ["POST", 1]},
        {"ttl": 0},
        {"ttl": -1.0},
        {"ttl": float("nan")},
        {"lease": 0},
        {"conflict_wait": 0},
        {"ttl": 10.0, "lease": 100.0},
        {"max_body_size": -1},
        {"max_body_size": 1.5},
        {"max_stored_body_size": -1},
        {"store_retry_after": -1},
        {"store_retry_after": 1.5},
        {"ttl": "1 fortnight"},
        {"ttl": [30]},
        {"ttl": True},
        {"ttl": float("inf")},
        {"required": "maybe"},
        {"required": 2},
        {"on_conflict": "queue"},
        {"on_store_error": "ignore"},
        {"release_statuses": frozenset({99})},
        {"release_statuses": frozenset({600})},
        {"replay_header_allowlist": 5},
        {"replay_header_denylist": ["set cookie"]},
        {"scope_resolver": "user"},
        {"scope_resolver": "no.such.module:resolve"},
        {"on_event": 5},
        {"problem_type_base": None},
    ],
    ids=repr,
)
def test_bad_settings_raise_configuration_error_naming_the_option(options: dict[str, Any]) -> None:
    """Never a raw TypeError (``'>' not supported``): one ConfigurationError naming it."""
    name = next(reversed(options))  # the lease/ttl pair is blamed on lease
    with pytest.raises(ConfigurationError, match=rf"^IdempotencyConfig\({name}=\.\.\.\): "):
        IdempotencyConfig(**options)


@pytest.mark.parametrize("options", [{"ttl": 0}, {"lease": -1}, {"on_conflict": "queue"}], ids=repr)
def test_bad_route_options_raise_configuration_error(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError):
        RouteOptions(**options)
    with pytest.raises(ConfigurationError):
        idempotent(**options)


@pytest.mark.parametrize("status", [200, 201, 204, 301, 303, 304, 404, 410, 402])
def test_2xx_3xx_and_work_describing_4xx_are_stored(status: int) -> None:
    assert IdempotencyConfig().should_store(status)


@pytest.mark.parametrize("status", sorted(DEFAULT_RELEASE_STATUSES))
def test_request_level_rejections_are_released(status: int) -> None:
    assert not IdempotencyConfig().should_store(status)


@pytest.mark.parametrize("status", [500, 502, 503, 504, 599])
def test_5xx_are_released_unless_store_server_errors(status: int) -> None:
    assert not IdempotencyConfig().should_store(status)
    assert IdempotencyConfig(store_server_errors=True).should_store(status)


def test_custom_release_statuses_replace_the_default_list() -> None:
    config = IdempotencyConfig(release_statuses=frozenset({404}))
    assert not config.should_store(404)
    assert config.should_store(409)
    assert not config.should_store(500)


def test_route_options_override_only_what_they_set() -> None:
    base = IdempotencyConfig(ttl=100.0, lease=5.0, documentation_url="https://d")

    def resolver(scope: object) -> str:
        return "tenant"

    route = RouteOptions(
        required=True,
        ttl=50.0,
        on_conflict="wait",
        canonical_json=True,
        scope_resolver=resolver,
        release_statuses=frozenset({404}),
    )
    merged = base.with_route(route)
    assert merged.required is True
    assert merged.ttl == 50.0
    assert merged.lease == 5.0
    assert merged.on_conflict == "wait"
    assert merged.canonical_json is True
    assert merged.scope_resolver is resolver
    assert not merged.should_store(404)
    assert merged.documentation_url == "https://d"
    assert base.ttl == 100.0 and base.required is False


def test_route_options_that_set_nothing_keep_the_app_config() -> None:
    base = IdempotencyConfig()
    assert base.with_route(None) is base
    assert base.with_route(RouteOptions()) is base
    assert base.with_route(RouteOptions(enabled=False)) is base


def test_route_override_can_turn_required_off() -> None:
    merged = IdempotencyConfig(required=True).with_route(RouteOptions(required=False))
    assert merged.required is False


def test_idempotent_marks_the_endpoint_and_returns_it_unchanged() -> None:
    async def endpoint() -> None: ...

    marked = idempotent(required=True, ttl=60)(endpoint)
    assert marked is endpoint
    options = getattr(endpoint, ROUTE_OPTIONS_ATTR)
    assert options == RouteOptions(required=True, ttl=60)


# -- the one loader: IdempotencyConfig.from_mapping and its coercion table -------------------


def test_the_coercion_table_covers_every_option_and_its_choices_match_the_types() -> None:
    init = [f.name for f in fields(IdempotencyConfig) if f.init]
    assert list(OPTIONS) == init
    assert sorted(ROUTE_OPTIONS) == sorted(f.name for f in fields(RouteOptions))
    assert sorted(RouteKeywords.__annotations__) == sorted(ROUTE_OPTIONS)
    hints = get_type_hints(IdempotencyConfig)
    for name in ("on_conflict", "on_store_error", "detach_handler"):
        for allowed in get_args(hints[name]):
            assert OPTIONS[name](allowed) == allowed
        with pytest.raises(ValueError, match="must be"):
            OPTIONS[name]("nope")


@pytest.mark.parametrize(
    ("name", "raw", "value"),
    [
        ("ttl", 60, 60),
        ("ttl", "60", 60.0),
        ("ttl", " 2.5 ", 2.5),
        ("ttl", "30s", 30.0),
        ("ttl", "15m", 900.0),
        ("ttl", "2h", 7200.0),
        ("ttl", "1d", 86400.0),
        ("ttl", "1 day", 86400.0),
        ("ttl", "3 Hours", 10800.0),
        ("conflict_wait", "500ms", 0.5),
        ("required", "true", True),
        ("required", "Off", False),
        ("required", "1", True),
        ("required", "no", False),
        ("required", 0, False),
        ("methods", "post, put", frozenset({"POST", "PUT"})),
        ("methods", ["patch"], frozenset({"PATCH"})),
        ("release_statuses", "409, 422", frozenset({409, 422})),
        ("release_statuses", ["404"], frozenset({404})),
        ("replay_header_denylist", "X-Secret,Set-Cookie", frozenset({"x-secret", "set-cookie"})),
        (
            "replay_headers",
            "Idempotent-Replayed, X-Replayed",
            ("Idempotent-Replayed", "X-Replayed"),
        ),
        ("max_body_size", "2048", 2048),
        ("on_event", "tests.unit.test_config:sample_hook", None),
        ("scope_resolver", "tests.unit.test_config.sample_hook", None),
        ("documentation_url", None, None),
    ],
)
def test_text_is_read_by_the_one_coercion_table(name: str, raw: Any, value: Any) -> None:
    config = IdempotencyConfig.from_mapping({name: raw})
    expected = sample_hook if name in ("on_event", "scope_resolver") else value
    assert getattr(config, name) == expected


def sample_hook(*args: Any) -> str:
    """Imported by its dotted path in the tests above."""
    return ""


SOURCES = {
    "keywords": (
        ConfigSource.keywords("IdempotencyMiddleware"),
        "ttl",
        "IdempotencyMiddleware(ttl=...)",
    ),
    "toml": ("proxy.toml", "ttl", "ttl in proxy.toml"),
    "flask": (
        ConfigSource(where="{key} in app.config", prefix="RETRYSAFE_", upper=True),
        "RETRYSAFE_TTL",
        "RETRYSAFE_TTL in app.config",
    ),
    "django": (
        ConfigSource(where="settings.RETRYSAFE['{key}']", upper=True),
        "TTL",
        "settings.RETRYSAFE['TTL']",
    ),
    "flags": (ConfigSource(flags=True), "--ttl", "--ttl"),
}


@pytest.mark.parametrize("source", list(SOURCES))
def test_errors_name_the_option_as_written_and_its_source(source: str) -> None:
    where, key, named = SOURCES[source]
    with pytest.raises(ConfigurationError) as bad:
        IdempotencyConfig.from_mapping({key: "-5"}, source=where)
    assert str(bad.value) == f"{named}: must be positive, got '-5'"
    assert bad.value.option == key
    typo = key.replace("ttl", "tll").replace("TTL", "TLL")
    with pytest.raises(ConfigurationError) as unknown:
        IdempotencyConfig.from_mapping({typo: 5}, source=where)
    assert str(unknown.value).endswith(f": unknown option (did you mean {key}?)")
    assert unknown.value.option == typo


def test_an_unknown_option_without_a_close_one_lists_the_options() -> None:
    with pytest.raises(ConfigurationError, match=r"zzz in x: unknown option \(options: methods, "):
        IdempotencyConfig.from_mapping({"zzz": 1}, source="x")


def test_a_short_ttl_brings_the_lease_down_unless_the_lease_is_given() -> None:
    assert IdempotencyConfig.from_mapping({"ttl": "10s"}).lease == 10.0
    assert IdempotencyConfig.from_mapping({"ttl": 100, "lease": 5}).lease == 5
    base = IdempotencyConfig(ttl=600.0, lease=60.0)
    assert IdempotencyConfig.from_mapping({"ttl": 20}, base=base).lease == 20
    assert IdempotencyConfig.from_mapping({"required": True}, base=base).lease == 60.0
    with pytest.raises(ConfigurationError) as bad:
        IdempotencyConfig.from_mapping({"--ttl": "2", "--lease": "30"}, source=SOURCES["flags"][0])
    assert str(bad.value) == "--lease: must not be longer than --ttl (2 s), got 30"
    assert bad.value.option == "--lease"
    with pytest.raises(ConfigurationError, match=r"\(pass lease=10 or less\)"):
        IdempotencyConfig(ttl=10.0)


def test_a_route_that_shortens_ttl_below_the_app_lease_merges_without_error() -> None:
    """The merge runs on a route's first request: it must never fail there."""
    merged = IdempotencyConfig(lease=30.0).with_route(RouteOptions(ttl=5.0))
    assert (merged.ttl, merged.lease) == (5.0, 5.0)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"requird": True},
            r"@idempotent\(requird=...\): unknown option \(did you mean required\?\)",
        ),
        ({"ttl": "1 fortnight"}, r"@idempotent\(ttl=...\): must be seconds"),
        ({"ttl": 10, "lease": 20}, r"@idempotent\(lease=...\): must not be longer than @idem"),
        ({"on_conflict": "queue"}, r"@idempotent\(on_conflict=...\): must be 'reject' or 'wait'"),
        ({"enabled": "maybe"}, r"@idempotent\(enabled=...\): must be true or false"),
    ],
)
def test_idempotent_checks_its_options_where_it_is_applied(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        idempotent(**options)


def test_route_options_read_text_as_the_app_settings_do() -> None:
    options = RouteOptions.from_mapping({"ttl": "1h", "required": "yes", "release_statuses": "404"})
    assert options == RouteOptions(ttl=3600.0, required=True, release_statuses=frozenset({404}))
