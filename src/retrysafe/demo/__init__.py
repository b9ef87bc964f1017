"""OrderHub: the demo orders-and-payments API (DESIGN section 5). Needs ``retrysafe[demo]``."""

from __future__ import annotations

from .app import create_app

__all__ = ["create_app"]
