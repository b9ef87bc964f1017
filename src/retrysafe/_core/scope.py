"""Who a request acts for: the scope part of a record id (DESIGN section 3.6)."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .request import Request

__all__ = ["authorization_scope", "credential_scope", "default_principal", "user_scope"]


def authorization_scope(authorization: bytes | str | None) -> str:
    """Scope from an ``Authorization`` header value: a hash of it, or global when absent.

    The value is normalized only as RFC 9110 section 11.4 allows, so that equal credentials give
    one scope: the auth scheme is case-insensitive, and the run of spaces between the scheme and
    the credentials is one separator. The credentials are compared byte for byte. A value with
    no space (a bare token: an API key sent without a scheme) is compared exactly too: it may be
    a secret whose case matters, and two values that differ must never share records.
    """
    if not authorization:
        return ""
    raw = authorization.encode("latin-1") if isinstance(authorization, str) else authorization
    scheme, _, credentials = raw.strip(b" \t").partition(b" ")
    normalized = scheme.lower() + b" " + credentials.lstrip(b" ") if credentials else scheme
    return "auth:" + hashlib.sha256(normalized).hexdigest()


def credential_scope(value: bytes | str | None) -> str:
    """Scope from the value of a header that carries a credential (an API key): a hash of the
    value exactly as sent, or global when absent.

    For a value without spaces this is :func:`authorization_scope` of the same value, so
    ``retrysafe resolve --authorization '<value>'`` finds such a key.
    """
    if not value:
        return ""
    raw = value.encode("latin-1") if isinstance(value, str) else value
    return "auth:" + hashlib.sha256(raw).hexdigest()


def user_scope(user: Any) -> str | None:
    """Scope from a framework user: a Starlette ``BaseUser`` or Django ``User`` object (when
    authenticated), or a plain name (WSGI ``REMOTE_USER``)."""
    if user is None:
        return None
    if isinstance(user, str):
        return f"user:{user}" if user else None
    if not getattr(user, "is_authenticated", False):
        return None
    for attr in ("identity", "pk", "id", "username", "display_name"):
        try:
            value = getattr(user, attr, None)
        except NotImplementedError:  # starlette.authentication.BaseUser.identity
            continue
        if value is not None and value != "":
            return f"user:{value}"
    return None


def default_principal(request: Request) -> str:
    """The framework's authenticated user, else a hash of ``Authorization``, else global."""
    return user_scope(request.user) or authorization_scope(request.authorization)
