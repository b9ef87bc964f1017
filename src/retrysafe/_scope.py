"""Who a request acts for: the scope part of a record id (DESIGN section 3.6)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

__all__ = ["asgi_default_scope", "authorization_scope"]


def authorization_scope(authorization: bytes | str | None) -> str:
    """Scope from an ``Authorization`` header value: its hash, or global when absent."""
    if not authorization:
        return ""
    raw = authorization.encode("latin-1") if isinstance(authorization, str) else authorization
    return "auth:" + hashlib.sha256(raw).hexdigest()


def user_scope(user: Any) -> str | None:
    """Scope from a framework user object (Starlette ``BaseUser``, Django ``User``), if known."""
    if user is None or not getattr(user, "is_authenticated", False):
        return None
    for attr in ("identity", "pk", "id", "username", "display_name"):
        try:
            value = getattr(user, attr, None)
        except NotImplementedError:  # starlette.authentication.BaseUser.identity
            continue
        if value is not None and value != "":
            return f"user:{value}"
    return None


def asgi_default_scope(scope: Mapping[str, Any]) -> str:
    """The authenticated ``scope["user"]``, else a hash of ``Authorization``, else global."""
    found = user_scope(scope.get("user"))
    if found is not None:
        return found
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            return authorization_scope(value)
    return ""
