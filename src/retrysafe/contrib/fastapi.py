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
middleware and documents the ``Idempotency-Key`` header on every protected operation.
"""

from __future__ import annotations

from typing import Annotated, Any

from .._config import IdempotencyConfig
from .._errors import ConfigurationError
from .._routes import ROUTE_OPTIONS_ATTR, idempotent
from .._transaction import transaction
from ..asgi import IdempotencyMiddleware
from ..stores import AsyncStore, Store

try:
    from fastapi import Depends, FastAPI, Request
    from fastapi.routing import APIRoute
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("retrysafe.contrib.fastapi needs: pip install 'retrysafe[fastapi]'") from exc

__all__ = [
    "IdempotencyMiddleware",
    "Transaction",
    "idempotent",
    "install",
    "transaction_connection",
]


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

    Args:
        app: the FastAPI application.
        store: a store URL or instance.
        config: settings, or pass :class:`~retrysafe.IdempotencyConfig` fields as keywords.
        **options: fields of :class:`~retrysafe.IdempotencyConfig`.
    """
    if config is not None and options:
        raise ConfigurationError("pass either config= or keyword options, not both")
    settings = config if config is not None else IdempotencyConfig(**options)
    # mypy cannot match a constructor with **options against Starlette's ParamSpec factory.
    app.add_middleware(IdempotencyMiddleware, store=store, config=settings)  # type: ignore[arg-type]
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
