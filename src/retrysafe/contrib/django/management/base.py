"""What the retrysafe management commands share: the store from ``settings.RETRYSAFE``, the
operator commands of :mod:`retrysafe.ops.commands` (those of the ``retrysafe`` command and of
``flask retrysafe``) and the record id of a key: a request's (``--path``, ``--method``, its
principal from ``--user``, ``--authorization`` or ``--scope``) or an idempotent function's call
(``--function``), named as ``retrysafe inspect`` names it."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...._core.errors import IdempotencyError
from ...._core.scope import authorization_scope
from ....ops import commands as ops
from ....ops.records import target_record_id
from ....stores import Store
from ..conf import load_settings

__all__ = ["KeyCommand", "StoreCommand"]


class StoreCommand(BaseCommand):
    """A command on the store of ``settings.RETRYSAFE`` (or ``--store``)."""

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--store", help="a store URL (default: settings.RETRYSAFE['STORE'])")

    def store_setting(self, options: dict[str, Any]) -> Any:
        """The store as given: ``--store``, else ``settings.RETRYSAFE["STORE"]`` (a URL or a
        store)."""
        return options["store"] or load_settings().store

    def store(self, options: dict[str, Any]) -> Store:
        """The store to work on."""
        from ..middleware import sync_store

        try:
            return sync_store(self.store_setting(options))
        except IdempotencyError as exc:
            raise CommandError(str(exc)) from exc

    def kind(self, options: dict[str, Any]) -> str:
        """What the output calls the store: its URL's scheme (``django``, ``sqlite``...), or
        its class for a store object."""
        given = self.store_setting(options)
        return ops.store_kind(given) if isinstance(given, str) else type(given).__name__

    def handle(self, *args: Any, **options: Any) -> None:
        store = self.store(options)
        try:
            report = self.run(store, options)
        except (IdempotencyError, ops.OperatorError) as exc:
            raise CommandError(str(exc)) from exc
        finally:
            store.close()
        if report.code:  # Django's way to say it: the text on stderr, exit status 1
            raise CommandError(report.text)
        self.stdout.write(report.text)

    def run(self, store: Store, options: dict[str, Any]) -> ops.Report:
        """The command's work: one of :mod:`retrysafe.ops.commands`."""
        raise NotImplementedError


class KeyCommand(StoreCommand):
    """A command on the record of one key."""

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument(
            "--key",
            required=True,
            help="the Idempotency-Key header's value as sent: '\"k1\"' (an sf-string) or k1",
        )
        parser.add_argument("--method", default="POST", help="the request's method (default POST)")
        target = parser.add_mutually_exclusive_group(required=True)
        target.add_argument("--path", help="the request path, e.g. /orders")
        target.add_argument(
            "--function", help="the name an idempotent function's keys are scoped by"
        )
        scope = parser.add_mutually_exclusive_group()
        scope.add_argument("--user", help="the user (primary key or username) the key is for")
        scope.add_argument("--authorization", help="the Authorization header it was sent with")
        scope.add_argument("--scope", default="", help="a raw scope (default: global)")

    def record_id(self, options: dict[str, Any]) -> str:
        """The record id of the key named by the options."""
        return target_record_id(
            options["key"],
            path=options["path"],
            function=options["function"],
            method=options["method"],
            scope=self.scope(options),
        )

    def scope(self, options: dict[str, Any]) -> str:
        """The principal part of the record id, as the middleware computes it."""
        if options["authorization"]:
            return authorization_scope(options["authorization"])
        if options["user"]:
            from django.contrib.auth import get_user_model

            model = get_user_model()
            value = options["user"]
            user = model.objects.filter(**{model.USERNAME_FIELD: value}).first()
            if user is None and value.isdigit():
                user = model.objects.filter(pk=int(value)).first()
            if user is None:
                raise CommandError(f"no user {value!r}")
            return f"user:{user.pk}"
        scope: str = options["scope"]
        return scope
