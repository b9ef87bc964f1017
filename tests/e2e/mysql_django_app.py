"""A Django project on a MySQL/MariaDB database with the Django ORM store in transactional mode,
for the SIGKILL tests: ``python -m tests.e2e.mysql_django_app wsgi|asgi DATABASE PORT``.

Django's MySQL backend runs on PyMySQL (``install_as_MySQLdb``). ``POST /orders`` with
``{"order": ID}`` inserts ID into the ``orders`` table on Django's connection (inside the
request's atomic block), sleeps ``X-Sleep-After`` seconds and answers ``201``. Served by the
standard library's WSGI server or by uvicorn (Django's ASGI handler); prints ``ready``.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any
from urllib.parse import unquote, urlsplit

import pymysql

pymysql.install_as_MySQLdb()

import django  # noqa: E402
from django.conf import settings  # noqa: E402
from django.http import HttpRequest, JsonResponse  # noqa: E402
from django.urls import path  # noqa: E402
from django.views.decorators.csrf import csrf_exempt  # noqa: E402


@csrf_exempt
def orders(request: HttpRequest) -> JsonResponse:
    from django.db import connection

    order = json.loads(request.body)["order"]
    with connection.cursor() as cur:
        cur.execute("INSERT INTO orders (k) VALUES (%s)", [order])
    time.sleep(float(request.headers.get("X-Sleep-After", "0")))
    return JsonResponse({"order": order}, status=201)


urlpatterns = [path("orders", orders)]


def configure(server_url: str, database: str) -> None:
    parts = urlsplit(server_url)
    settings.configure(
        DEBUG=False,
        SECRET_KEY="tests-only",
        ALLOWED_HOSTS=["*"],
        ROOT_URLCONF=__name__,
        USE_TZ=True,
        INSTALLED_APPS=["retrysafe.contrib.django"],
        MIDDLEWARE=["retrysafe.contrib.django.IdempotencyMiddleware"],
        DATABASES={
            "default": {
                "ENGINE": "django.db.backends.mysql",
                "NAME": database,
                "USER": unquote(parts.username or "root"),
                "PASSWORD": unquote(parts.password or ""),
                "HOST": parts.hostname or "127.0.0.1",
                "PORT": str(parts.port or 3306),
            }
        },
        RETRYSAFE={"STORE": "django", "TRANSACTIONAL": True, "LEASE": 2.0},
    )
    django.setup()


def main(argv: list[str]) -> None:
    kind, server_url, database, port = argv
    configure(server_url, database)
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    with connection.cursor() as cur:
        cur.execute("CREATE TABLE IF NOT EXISTS orders (k VARCHAR(200) NOT NULL) ENGINE=InnoDB")
    connection.close()
    if kind == "asgi":
        import uvicorn
        from django.core.asgi import get_asgi_application

        class Announcing(uvicorn.Server):
            async def startup(self, sockets: Any = None) -> None:
                await super().startup(sockets)
                print("ready", flush=True)

        config = uvicorn.Config(
            get_asgi_application(), host="127.0.0.1", port=int(port), log_level="warning"
        )
        Announcing(config).run()
    else:
        from wsgiref.simple_server import WSGIRequestHandler, make_server

        from django.core.wsgi import get_wsgi_application

        class Quiet(WSGIRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

        app = get_wsgi_application()
        with make_server("127.0.0.1", int(port), app, handler_class=Quiet) as server:
            print("ready", flush=True)
            server.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
