"""The testing tools' own tests: each front is used the way a user's test suite would use it.

Django shares the one settings module of the whole suite (``tests.django.settings``); each Django
test overrides ``ROOT_URLCONF`` and ``RETRYSAFE`` with pytest-django's ``settings`` fixture.
"""

from __future__ import annotations

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.django.settings")

import django

django.setup()
