"""OrderHub on FastAPI: ``retrysafe demo --framework fastapi`` (DESIGN section 5).

A FastAPI app in FastAPI's own idiom: pydantic request and response models, dependencies for
the data layer, the demo user and the knobs, :func:`retrysafe.contrib.fastapi.install` and
``@idempotent``. So ``/docs`` and ``/openapi.json`` show the whole API: every operation, its
models, the ``Idempotency-Key`` header (required on ``POST /payments``), the bearer user, the
knobs, ``Location``, and every problem answer with its ``application/problem+json`` schema and
``Retry-After``.

The contract is the other OrderHubs' with FastAPI's validation: a query or path parameter that
does not validate (``?limit=x``, ``/orders/x``) is a ``422`` problem here, and a body is read as
JSON only under a JSON ``Content-Type``.
"""

from __future__ import annotations

from typing import Annotated, Any, Unpack

from fastapi import Depends, FastAPI, Query, Request, Response, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException

from .. import __version__
from ..contrib.fastapi import idempotent, install
from . import domain
from ._async_hub import AsyncOrderHub
from .app import (
    add_worker,
    charge_new_payment,
    metrics,
    orderhub_setup,
    problem_response,
    reset_charges,
)

__all__ = [
    "Order",
    "OrderIn",
    "OrderList",
    "Payment",
    "PaymentIn",
    "PaymentList",
    "ProblemDetails",
    "create_app",
]

Text = Annotated[str, Field(min_length=1), AfterValidator(domain.check_text)]
Number = Annotated[int, Field(ge=1, le=domain.MAX_NUMBER)]


class OrderIn(BaseModel):
    """An order to place."""

    model_config = ConfigDict(strict=True)  # 1.0 is not a quantity, "1" not a number

    item: Text
    quantity: Number


class PaymentIn(BaseModel):
    """A payment to make."""

    model_config = ConfigDict(strict=True)

    amount: Number
    currency: Text


Stamp = Annotated[str, Field(description="UTC, ISO 8601 with milliseconds.")]


class _Record(BaseModel):
    """What an order and a payment begin with (their own fields, then ``created_at``, follow:
    the order of every OrderHub's JSON)."""

    id: int
    owner: str = Field(description="The demo user who sent it.")


class Order(_Record):
    """A placed order."""

    item: str
    quantity: int
    created_at: Stamp


class Payment(_Record):
    """A payment made."""

    amount: int
    currency: str
    created_at: Stamp


class OrderList(BaseModel):
    """Orders, newest first."""

    count: int = Field(description="How many orders there are (all of them, whatever limit).")
    orders: list[Order]


class PaymentList(BaseModel):
    """Payments, newest first."""

    count: int = Field(description="How many payments there are (all of them, whatever limit).")
    payments: list[Payment]


class ProblemDetails(BaseModel):
    """An RFC 9457 problem: OrderHub's own (``urn:orderhub:problem:...``) or the idempotency
    middleware's (``urn:retrysafe:problem:...``, with ``code``)."""

    type: str
    title: str
    status: int
    detail: str | None = None
    code: str | None = None


_PROBLEM_CONTENT = {
    "application/problem+json": {"schema": {"$ref": "#/components/schemas/ProblemDetails"}}
}
_RETRY_AFTER = {
    "Retry-After": {
        "description": "Seconds to wait before retrying.",
        "schema": {"type": "integer", "minimum": 0},
    }
}


def _problems(**answers: str) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` of problem answers: ``s400="why"``..."""
    documented: dict[int | str, dict[str, Any]] = {}
    for name, description in answers.items():
        status = int(name[1:])
        documented[status] = {"description": description, "content": _PROBLEM_CONTENT}
        if status == 503:
            documented[status]["headers"] = _RETRY_AFTER
    return documented


def _post(model: type[BaseModel], what: str) -> dict[str, Any]:
    """The settings of a ``POST`` route: ``201`` (``Location``) and its problem answers."""
    location_header = {
        "Location": {"description": f"The {what}'s URL.", "schema": {"type": "string"}},
    }
    responses = {
        201: {"description": f"The {what} was created.", "headers": location_header},
        **_problems(
            s400="The body is not JSON, or the Idempotency-Key is "
            "missing (where required) or malformed.",
            s422=f"The body is not a valid {what}, a knob is out of range, or the "
            "Idempotency-Key was already used with another request.",
            s500="The handler failed (`?fail=1`); nothing was written, the key is released.",
            s503="The database stayed busy or is unreachable, or the idempotency store is; "
            "nothing was written, retry later.",
        ),
    }
    return {
        "methods": ["POST"],
        "status_code": 201,
        "response_model": model,
        "responses": responses,
    }


_LIST_PROBLEMS = _problems(s422="`limit` is not a whole number from 0 up.")
_DETAIL_PROBLEMS = _problems(s404="No record with that id.", s422="The id is not a whole number.")


def get_hub(request: Request) -> AsyncOrderHub:
    """Dependency: the data layer."""
    hub: AsyncOrderHub = request.app.state.orderhub
    return hub


_bearer = HTTPBearer(
    auto_error=False,
    description="`Authorization: Bearer <name>` names the demo user (anonymous without it); "
    "Idempotency-Keys are scoped per user.",
)


def get_owner(
    request: Request, _: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)]
) -> str:
    """Dependency: the demo user."""
    return domain.owner(request.headers.get("authorization"))


def get_knobs(
    delay_ms: Annotated[
        int,
        Query(ge=0, le=domain.MAX_DELAY_MS, description="Sleep this long before writing (ms)."),
    ] = 0,
    delay_after_ms: Annotated[
        int,
        Query(
            ge=0,
            le=domain.MAX_DELAY_MS,
            description="Sleep this long after writing, before answering (ms): the window in "
            "which a crash separates the effect from its record.",
        ),
    ] = 0,
    fail: Annotated[bool, Query(description="Fail (500) without writing anything.")] = False,
) -> domain.Knobs:
    """Dependency: the demo knobs."""
    return domain.Knobs(delay_ms / 1000, delay_after_ms / 1000, fail)


Hub = Annotated[AsyncOrderHub, Depends(get_hub)]
Owner = Annotated[str, Depends(get_owner)]
DemoKnobs = Annotated[domain.Knobs, Depends(get_knobs)]
Limit = Annotated[int | None, Query(ge=0, description="Only the newest N.")]


async def index(request: Request) -> HTMLResponse:
    """The page."""
    return HTMLResponse(request.app.state.page)


async def create_order(
    order: OrderIn, request: Request, response: Response, hub: Hub, who: Owner, knobs: DemoKnobs
) -> dict[str, Any]:
    """Place an order. With an `Idempotency-Key` a retry gets the first answer again."""
    record = await hub.create(domain.ORDERS, order.model_dump(), who, knobs, request.scope)
    response.headers["Location"] = domain.location(domain.ORDERS, record)
    return record


@idempotent(required=True)
async def create_payment(
    payment: PaymentIn,
    request: Request,
    response: Response,
    hub: Hub,
    who: Owner,
    knobs: DemoKnobs,
) -> dict[str, Any]:
    """Make a payment. The `Idempotency-Key` is required: a payment is never made twice."""
    record = await hub.create(domain.PAYMENTS, payment.model_dump(), who, knobs, request.scope)
    response.headers["Location"] = domain.location(domain.PAYMENTS, record)
    await charge_new_payment(request, record)
    return record


async def list_orders(hub: Hub, limit: Limit = None) -> dict[str, Any]:
    """Every order, newest first."""
    count, records = await hub.list(domain.ORDERS, limit)
    return {"count": count, "orders": records}


async def list_payments(hub: Hub, limit: Limit = None) -> dict[str, Any]:
    """Every payment, newest first."""
    count, records = await hub.list(domain.PAYMENTS, limit)
    return {"count": count, "payments": records}


async def get_order(record_id: int, hub: Hub) -> dict[str, Any]:
    """One order."""
    record = await hub.get(domain.ORDERS, record_id)
    if record is None:
        raise domain.Problem.not_found(domain.ORDERS)
    return record


async def get_payment(record_id: int, hub: Hub) -> dict[str, Any]:
    """One payment."""
    record = await hub.get(domain.PAYMENTS, record_id)
    if record is None:
        raise domain.Problem.not_found(domain.PAYMENTS)
    return record


async def reset(request: Request, hub: Hub) -> None:
    """Delete every order and payment, and every charge (the page's "Reset demo"; idempotency
    records stay)."""
    await hub.reset()
    await reset_charges(request)


async def _domain_error(request: Request, exc: Exception) -> Response:
    return problem_response(domain.problem_of(exc))


async def _validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    if any(error["type"] == "json_invalid" for error in errors):
        return problem_response(domain.Problem.not_json())
    where = errors[0]["loc"][0] if errors else "body"
    detail = "; ".join(
        f"{'.'.join(str(part) for part in error['loc'][1:]) or where}: {error['msg']}"
        for error in errors
    )
    if where == "body":
        kind = domain.KINDS.get(request.url.path.strip("/").split("/")[0], domain.ORDERS)
        if "json" not in request.headers.get("content-type", ""):
            # FastAPI reads a body as JSON only under a JSON Content-Type (curl -d sends a form).
            detail = "Send the body as JSON, with Content-Type: application/json."
        return problem_response(domain.Problem.invalid(kind, detail))
    return problem_response(domain.Problem(422, f"Invalid {where} parameter", detail))


async def _http_error(request: Request, exc: Exception) -> Response:
    # FastAPI's own answers (an unknown path, a method not allowed, an unreadable body).
    assert isinstance(exc, HTTPException)
    title = str(exc.detail) or "HTTP error"
    return problem_response(domain.Problem(exc.status_code, title, title), exc.headers)


def create_app(**options: Unpack[domain.OrderHubOptions]) -> FastAPI:
    """Build OrderHub on FastAPI (the arguments of :func:`retrysafe.demo.app.create_app`).

    Returns:
        The FastAPI app.
    """
    settings = domain.Settings(**options)
    worker = settings.worker
    setup = orderhub_setup(settings)

    app = FastAPI(
        title="OrderHub",
        version=__version__,
        summary="The retrysafe demo: orders and payments that are safe to retry.",
        lifespan=setup.lifespan,
        exception_handlers={
            domain.Problem: _domain_error,
            domain.DemoFailure: _domain_error,
            domain.DatabaseUnavailable: _domain_error,
            RequestValidationError: _validation_error,
            HTTPException: _http_error,
        },
    )
    # Routes on the app itself, not an included APIRouter: FastAPI 0.165 keeps an included
    # router's routes out of ``app.routes``, where the middleware finds ``@idempotent`` marks.
    add = app.add_api_route
    add("/", index, include_in_schema=False)
    add("/orders", create_order, **_post(Order, "order"))
    add("/payments", create_payment, **_post(Payment, "payment"))
    add("/orders", list_orders, response_model=OrderList, responses=_LIST_PROBLEMS)
    add("/payments", list_payments, response_model=PaymentList, responses=_LIST_PROBLEMS)
    add("/orders/{record_id}", get_order, response_model=Order, responses=_DETAIL_PROBLEMS)
    add("/payments/{record_id}", get_payment, response_model=Payment, responses=_DETAIL_PROBLEMS)
    add(
        "/reset",
        reset,
        methods=["POST"],
        status_code=204,
        response_class=Response,
        responses=_problems(s503="The database stayed busy or is unreachable."),
    )
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if not app.openapi_schema:
            schema = generate()
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            components["ProblemDetails"] = ProblemDetails.model_json_schema()
        return app.openapi_schema or {}

    app.openapi = openapi  # type: ignore[method-assign]
    if setup.metrics:
        app.add_route("/metrics", metrics, methods=["GET"], include_in_schema=False)
    install(app, store=setup.store, config=setup.config)
    app.state.orderhub = setup.hub
    add_worker(app, worker, setup.hub.url, setup.page)
    return app
