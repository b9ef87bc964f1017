"""FastAPI integration: app-wide middleware plus per-route settings that show in OpenAPI.

::

    from fastapi import FastAPI
    from retrysafe.contrib.fastapi import idempotent, install

    app = FastAPI()
    install(app, store="sqlite:///idempotency.db")

    @app.post("/payments")
    @idempotent(required=True)
    async def pay(payment: Payment) -> dict: ...

``@idempotent`` marks the endpoint (the middleware reads the mark); ``install`` adds the pure ASGI
middleware and documents, on every protected operation, the ``Idempotency-Key`` header, the
``400``/``409``/``413``/``422``/``503`` answers with their ``application/problem+json`` schema
(``Retry-After`` on ``409`` and ``503``) and the ``Idempotency-Replayed`` header of its success
responses. An operation with ``@idempotent(enabled=False)`` documents none of it.
"""

from __future__ import annotations

from typing import Annotated, Any

from .._core.config import IdempotencyConfig, front_config, front_store
from .._core.options import ConfigSource
from .._core.problems import PROBLEMS
from .._core.routes import ROUTE_OPTIONS_ATTR, idempotent
from .._core.transaction import transaction
from ..asgi import IdempotencyMiddleware
from ..stores import AsyncStore, Store, resolve_async_store
from ._extra import extra

with extra("fastapi"):
    from fastapi import Depends, FastAPI, Request
    from fastapi.routing import APIRoute

__all__ = [
    "IdempotencyMiddleware",
    "Transaction",
    "idempotent",
    "install",
    "transaction_connection",
]

_KEYWORDS = ConfigSource.keywords("install")


async def transaction_connection(request: Request) -> Any:
    """FastAPI dependency: the connection of the request's idempotent transaction
    (transactional mode); see :func:`retrysafe.transaction`."""
    return await transaction(request)


#: ``conn: Transaction`` in an endpoint's parameters gives it the transaction's connection.
Transaction = Annotated[Any, Depends(transaction_connection)]


def install(
    app: FastAPI,
    *,
    store: str | AsyncStore | Store,
    config: IdempotencyConfig | None = None,
    **options: Any,
) -> None:
    """Protect a FastAPI app and document the header in its OpenAPI schema.

    The store and the settings are checked here, at once (FastAPI builds its middleware stack
    only when it first runs, too late for a clear error).

    Args:
        app: the FastAPI application.
        store: a store URL or instance.
        config: settings, or pass :class:`~retrysafe.IdempotencyConfig` fields as keywords.
        **options: fields of :class:`~retrysafe.IdempotencyConfig`.

    Raises:
        ConfigurationError: a bad store URL, a missing extra, an unknown option or a bad value,
            naming it (``install(ttl=...): must be positive``).
    """
    resolved = front_store(resolve_async_store, store, _KEYWORDS)
    settings = front_config(config, options, resolved, _KEYWORDS)
    # mypy cannot match a constructor with **options against Starlette's ParamSpec factory.
    app.add_middleware(IdempotencyMiddleware, store=resolved, config=settings)  # type: ignore[arg-type]
    original = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = original()
        for route in app.routes:
            if isinstance(route, APIRoute):
                _document(schema, route, settings)
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


_PROBLEM_SCHEMA = "IdempotencyProblem"
_PROBLEM_REF = {"$ref": f"#/components/schemas/{_PROBLEM_SCHEMA}"}
_RETRY_AFTER = {
    "description": "Seconds to wait before retrying with the same Idempotency-Key.",
    "schema": {"type": "integer", "minimum": 0},
}
_REPLAYED = {
    "description": "`true` when this is the stored response of an earlier request with the "
    "same Idempotency-Key (the operation did not run again).",
    "schema": {"type": "string", "enum": ["true"]},
}
#: status -> (description, whether Retry-After is sent)
_ANSWERS: dict[int, tuple[str, bool]] = {
    400: ("Idempotency-Key missing (where required) or malformed.", False),
    409: (
        "A request with this Idempotency-Key is still being processed, or its outcome is unknown.",
        True,
    ),
    413: ("Request body too large to be protected.", False),
    422: ("Idempotency-Key already used with a different request.", False),
    503: ("Idempotency store unavailable; retry with the same key.", True),
}


def _problem_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "description": "RFC 9457 problem details of an idempotency error.",
        "required": ["type", "code", "title", "status"],
        "properties": {
            "type": {"type": "string", "format": "uri-reference"},
            "code": {"type": "string", "enum": sorted(p.code for p in PROBLEMS.values())},
            "title": {"type": "string"},
            "status": {"type": "integer", "enum": sorted({p.status for p in PROBLEMS.values()})},
            "detail": {"type": "string"},
        },
    }


def _document_answers(schema: dict[str, Any], operation: dict[str, Any]) -> None:
    schemas = schema.setdefault("components", {}).setdefault("schemas", {})
    schemas.setdefault(_PROBLEM_SCHEMA, _problem_schema())
    responses = operation.setdefault("responses", {})
    for code, response in responses.items():
        if str(code).startswith("2"):
            response.setdefault("headers", {}).setdefault("Idempotency-Replayed", _REPLAYED)
    for status, (description, retry_after) in _ANSWERS.items():
        response = responses.get(str(status))
        if response is None:
            response = responses[str(status)] = {"description": description}
        elif description not in response.get("description", ""):
            # E.g. FastAPI's own 422 (validation error): both answers are possible.
            response["description"] = f"{response.get('description', '')} Or: {description}"
        content = response.setdefault("content", {})
        content.setdefault("application/problem+json", {"schema": _PROBLEM_REF})
        if retry_after:
            response.setdefault("headers", {}).setdefault("Retry-After", _RETRY_AFTER)


def _document(schema: dict[str, Any], route: APIRoute, settings: IdempotencyConfig) -> None:
    route_options = getattr(route.endpoint, ROUTE_OPTIONS_ATTR, None)
    if route_options is not None and not route_options.enabled:
        return
    required = settings.required
    if route_options is not None and route_options.required is not None:
        required = route_options.required
    path_item = schema.get("paths", {}).get(route.path_format, {})
    for method in route.methods or ():
        if method not in settings.methods:
            continue
        operation = path_item.get(method.lower())
        if operation is None:
            continue
        _document_answers(schema, operation)
        parameters = operation.setdefault("parameters", [])
        if any(p.get("name") == "Idempotency-Key" for p in parameters):
            continue
        parameters.append(
            {
                "name": "Idempotency-Key",
                "in": "header",
                "required": required,
                "description": "One unique key per logical operation; retries reuse it "
                "(draft-ietf-httpapi-idempotency-key-header).",
                "schema": {"type": "string", "minLength": 1, "maxLength": 255},
            }
        )
