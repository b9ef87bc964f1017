"""IdempotencyConfig validation, the status policy and per-route overrides."""

from __future__ import annotations

from typing import Any

import pytest

from retrysafe import (
    DEFAULT_RELEASE_STATUSES,
    ConfigurationError,
    IdempotencyConfig,
    RouteOptions,
    idempotent,
)
from retrysafe._core.routes import ROUTE_OPTIONS_ATTR


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
        {"methods": "POST"},
        {"ttl": 0},
        {"ttl": -1.0},
        {"ttl": float("nan")},
        {"lease": 0},
        {"conflict_wait": 0},
        {"lease": 100.0, "ttl": 10.0},
        {"max_body_size": -1},
        {"max_body_size": 1.5},
        {"max_stored_body_size": -1},
        {"store_retry_after": -1},
        {"store_retry_after": "1"},
        {"on_conflict": "queue"},
        {"on_store_error": "ignore"},
        {"release_statuses": frozenset({99})},
        {"release_statuses": frozenset({600})},
        {"replay_header_allowlist": "location"},
        {"replay_header_denylist": "set-cookie"},
        {"scope_resolver": "user"},
    ],
    ids=repr,
)
def test_bad_settings_raise_configuration_error(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError):
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
