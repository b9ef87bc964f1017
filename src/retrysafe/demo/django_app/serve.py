"""Serving OrderHub on Django: migrate, then gunicorn with several worker processes."""

from __future__ import annotations

import argparse
import os
from typing import Any

__all__ = ["WORKERS", "serve_django"]

#: Worker processes (``RETRYSAFE_DEMO_WORKERS``); each runs 4 threads.
WORKERS = int(os.environ.get("RETRYSAFE_DEMO_WORKERS", "3"))


def serve_django(args: argparse.Namespace) -> None:
    """OrderHub on Django, served by gunicorn (``RETRYSAFE_DEMO_WORKERS`` processes, default 3)."""
    from gunicorn.app.base import BaseApplication

    os.environ["RETRYSAFE_DEMO_STORE"] = args.store
    if args.db:
        os.environ["RETRYSAFE_DEMO_DB"] = args.db
    os.environ["RETRYSAFE_DEMO_TTL"] = str(args.ttl)
    os.environ["RETRYSAFE_DEMO_LEASE"] = str(args.lease)
    os.environ["DJANGO_SETTINGS_MODULE"] = "retrysafe.demo.django_app.settings"

    import django
    from django.core.management import call_command

    django.setup()
    # The record table and OrderHub's tables come from migrations (once, before the fork).
    call_command("migrate", verbosity=0, interactive=False)
    from django.db import connections

    connections.close_all()  # the workers must not share the parent's connection

    class Server(BaseApplication):
        def load_config(self) -> None:
            options: dict[str, Any] = {
                "bind": f"{args.host}:{args.port}",
                "workers": WORKERS,
                "worker_class": "gthread",
                "threads": 4,
                "loglevel": args.log_level,
                "graceful_timeout": 5,
                "timeout": 120,
                # One control socket per user by default: two demo servers would share it.
                "control_socket_disable": True,
            }
            for name, value in options.items():
                self.cfg.set(name, value)

        def load(self) -> Any:
            from .wsgi import application

            return application

    Server().run()
