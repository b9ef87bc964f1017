"""The management commands (purge, inspect, resolve) and the read-only admin."""

from __future__ import annotations

import io
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from retrysafe._core.keys import record_id
from retrysafe.contrib.django.models import IdempotencyRecord
from retrysafe.contrib.django.store import DjangoStore
from retrysafe.stores._registry import schemes

from ..e2e.servers import free_port
from . import views
from .conftest import Api

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]


def _run(name: str, *args: str) -> str:
    out = io.StringIO()
    call_command(name, *args, stdout=out)
    return out.getvalue()


@pytest.fixture(autouse=True)
def _django_store(settings: Any) -> None:
    settings.RETRYSAFE = {"STORE": "django"}


@pytest.fixture
def api() -> Api:
    return Api("django")


def test_inspect_shows_a_completed_record_and_resolve_frees_it(api: Api) -> None:
    api.post("/orders", key="k", headers={"Authorization": "Bearer alice"})
    key_args = ("--key", "k", "--path", "/orders", "--authorization", "Bearer alice")
    shown = _run("retrysafe_inspect", *key_args)
    assert ": completed" in shown and "status: 201" in shown
    with pytest.raises(CommandError, match="use --force"):
        _run("retrysafe_resolve", *key_args)
    assert "deleted" in _run("retrysafe_resolve", *key_args, "--force")
    with pytest.raises(CommandError, match="none"):
        _run("retrysafe_inspect", *key_args)
    api.post("/orders", key="k", headers={"Authorization": "Bearer alice"})
    assert views.CALLS["orders"] == 2  # resolved: the key ran again


def test_outcome_unknown_is_shown_and_resolved_without_force() -> None:
    store = DjangoStore()
    rid = record_id("", "POST", "/orders", "lost")
    token = store.reserve(rid, "fp", lease=30, ttl=60).token
    assert token is not None and store.mark_committed(rid, token, lease=0.0)
    assert "OUTCOME UNKNOWN" in _run("retrysafe_inspect", "--key", "lost", "--path", "/orders")
    assert "deleted" in _run("retrysafe_resolve", "--key", "lost", "--path", "/orders")
    assert store.get(rid) is None


def test_inspect_by_user() -> None:
    alice = User.objects.create_user("alice")
    client = Api("django")
    client.client.force_login(alice)
    client.post("/orders", key="k")
    assert ": completed" in _run("retrysafe_inspect", "--key", "k", "--path", "/orders",
                                 "--user", "alice")  # fmt: skip
    with pytest.raises(CommandError, match="no user 'nobody'"):
        _run("retrysafe_inspect", "--key", "k", "--path", "/orders", "--user", "nobody")


def test_the_key_is_named_as_the_client_sent_the_header() -> None:
    Api("django").post("/orders", key="k1")
    # '"k1"' is the header's value as an sf-string, exactly as the README's curl sends it
    assert ": completed" in _run("retrysafe_inspect", "--key", '"k1"', "--path", "/orders")
    assert ": completed" in _run("retrysafe_inspect", "--key", "k1", "--path", "/orders")


def test_inspect_and_resolve_a_function_call_on_the_django_store() -> None:
    from retrysafe import functions, idempotent_function

    runs: list[str] = []

    @idempotent_function(store="django", key="order_id", name="charge")
    def charge(order_id: str) -> dict[str, str]:
        runs.append(order_id)
        if order_id == "lost":
            functions.mark_committed()
            raise ConnectionError("the provider's answer was lost")
        return {"charged": order_id}

    charge("paid")
    with pytest.raises(ConnectionError):
        charge("lost")
    shown = _run("retrysafe_inspect", "--function", "charge", "--key", "paid")
    assert ": completed" in shown and "kind: call, function: charge" in shown
    assert "OUTCOME UNKNOWN" in _run("retrysafe_inspect", "--function", "charge", "--key", "lost")
    with pytest.raises(CommandError, match="has no scope"):
        _run("retrysafe_inspect", "--function", "charge", "--key", "paid", "--scope", "t")
    assert "next call with this key" in _run("retrysafe_resolve", "--function", "charge",
                                             "--key", "lost")  # fmt: skip
    with pytest.raises(ConnectionError):
        charge("lost")
    assert runs == ["paid", "lost", "lost"]


def test_purge_deletes_expired_records_only() -> None:
    past = DjangoStore(clock=lambda: time.time() - 7200)  # written two hours ago
    past.reserve("old", "fp", lease=1, ttl=1)
    past.reserve("older", "fp", lease=30, ttl=3600)
    store = DjangoStore()
    store.reserve("fresh", "fp", lease=30, ttl=3600)
    assert "purged 2 expired records" in _run("retrysafe_purge")
    assert store.get("fresh") is not None
    assert "purged 0 expired records" in _run("retrysafe_purge")


def test_check_tries_the_settings_store_and_fails_on_one_it_cannot_reach() -> None:
    """``retrysafe_check`` (as ``retrysafe check`` and ``flask retrysafe check``): a probe key
    reserved and released on the store of ``settings.RETRYSAFE``; an unreachable store is a
    ``CommandError``."""
    assert _run("retrysafe_check").startswith("ok: django store reachable")
    assert not IdempotencyRecord.objects.exists()  # the probe key was released
    dead = f"redis://127.0.0.1:{free_port()}/0"
    with pytest.raises(CommandError, match="onnect"):
        _run("retrysafe_check", "--store", dead)


def test_a_bad_store_fails_with_one_clear_line_and_exit_status_1(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "django", "retrysafe_purge", "--store", "ftp://x"],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
        env={"DJANGO_SETTINGS_MODULE": "tests.django.settings", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert result.returncode == 1
    known = ", ".join(f"{scheme}://" for scheme in schemes())
    assert result.stderr.strip().splitlines() == [
        f"CommandError: unknown store URL scheme in 'ftp': use {known}"
    ]
    assert "sqlite://" in known and "redis://" in known


def test_admin_lists_records_read_only_and_never_the_key(api: Api) -> None:
    api.post("/orders", '{"secret": "body"}', key="raw-key-value")
    admin_user = User.objects.create_superuser("admin", "a@example.com", "pw")
    browser = Client()
    browser.force_login(admin_user)
    listing = browser.get("/admin/retrysafe/idempotencyrecord/")
    assert listing.status_code == 200
    page = listing.content.decode()
    assert "POST /orders" in page and "completed" in page and "201" in page
    assert "raw-key-value" not in page and "secret" not in page
    rid = record_id("", "POST", "/orders", "raw-key-value")
    detail = browser.get(f"/admin/retrysafe/idempotencyrecord/{rid}/change/")
    assert detail.status_code == 200
    assert "raw-key-value" not in detail.content.decode()
    assert browser.get("/admin/retrysafe/idempotencyrecord/add/").status_code == 403
    deleted = browser.post(f"/admin/retrysafe/idempotencyrecord/{rid}/delete/", {"post": "yes"})
    assert deleted.status_code == 403
    assert DjangoStore().get(rid) is not None
