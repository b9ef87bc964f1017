"""OrderHub's WSGI application (gunicorn ``retrysafe.demo.django_app.wsgi:application``)."""

from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "retrysafe.demo.django_app.settings")
application = get_wsgi_application()
