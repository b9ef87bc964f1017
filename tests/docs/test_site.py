"""The documentation site: it builds strictly, and its reference covers every option, command,
problem type and public name, so none can be added without a reference entry."""

from __future__ import annotations

import dataclasses
import html
import importlib
import importlib.util
import json
import logging
import pkgutil
import re
import zlib
from pathlib import Path
from types import ModuleType

import pytest

import retrysafe
from retrysafe import IdempotencyConfig, RouteOptions

from .conftest import ROOT, BuiltSite


def _hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs/hooks/reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hooks = _hooks()

#: The modules users import from; each has a section of the Python API reference.
PUBLIC_MODULES = [
    "retrysafe",
    "retrysafe.asgi",
    "retrysafe.wsgi",
    "retrysafe.functions",
    "retrysafe.consumer",
    "retrysafe.calls",
    "retrysafe.stores",
    "retrysafe.stores.postgres",
    "retrysafe.stores.postgres.pooled",
    "retrysafe.stores.mysql",
    "retrysafe.stores.redis",
    "retrysafe.stores.redis_cluster",
    "retrysafe.client",
    "retrysafe.proxy",
    "retrysafe.ops.stats",
    "retrysafe.ops.records",
    "retrysafe.ops.commands",
    "retrysafe.contrib.fastapi",
    "retrysafe.contrib.flask",
    "retrysafe.contrib.django",
    "retrysafe.contrib.sqlalchemy",
    "retrysafe.contrib.celery",
    "retrysafe.contrib.dramatiq",
    "retrysafe.contrib.aiohttp",
    "retrysafe.contrib.grpc",
    "retrysafe.contrib.rq",
    "retrysafe.contrib.arq",
    "retrysafe.contrib.huey",
    "retrysafe.contrib.taskiq",
    "retrysafe.contrib.prometheus",
    "retrysafe.contrib.otel",
    "retrysafe.testing",
    "retrysafe.testing.pytest_plugin",
]
#: Non-private modules that are not Python API, and where they are documented instead.
NOT_API = {
    "retrysafe.cli": "the command line reference",
    "retrysafe.demo": "the demo, not a library",
    "retrysafe.ops": "a package; its modules ops.stats, ops.records and ops.commands are API",
    "retrysafe.contrib": "a package of integrations",
    "retrysafe.stores.memory": "re-exported by retrysafe.stores",
    "retrysafe.stores.sqlite": "re-exported by retrysafe.stores",
    "retrysafe.proxy.app": "re-exported by retrysafe.proxy",
    "retrysafe.proxy.forward": "re-exported by retrysafe.proxy",
    "retrysafe.proxy.settings": "re-exported by retrysafe.proxy",
    "retrysafe.proxy.sources": "re-exported by retrysafe.proxy",
}


def inventory(site: BuiltSite) -> set[str]:
    """The names mkdocstrings documented (its Sphinx inventory)."""
    raw = (site.path / "objects.inv").read_bytes()
    body = zlib.decompress(raw.split(b"\n", 4)[4]).decode()
    return {line.split(" ", 1)[0] for line in body.splitlines()}


def test_the_site_builds_strictly_with_every_page(built_site: BuiltSite) -> None:
    for page in (ROOT / "docs").rglob("*.md"):
        src = page.relative_to(ROOT / "docs").as_posix()
        if src == "design.md":
            continue  # the maintainers' decision log: not the site
        assert built_site.page(src), src
    assert (built_site.path / "grafana-dashboard.json").exists()


def test_every_config_option_is_described(built_site: BuiltSite) -> None:
    page = built_site.page("reference/configuration.md")
    for cls in (IdempotencyConfig, RouteOptions):
        described = hooks.docstring_attributes(cls)
        for field in dataclasses.fields(cls):
            if not field.init:
                continue
            assert described.get(field.name), f"{cls.__name__}.{field.name} has no description"
            assert f'id="{field.name}"' in page, field.name


def test_an_option_without_a_description_fails_the_build(caplog: pytest.LogCaptureFixture) -> None:
    @dataclasses.dataclass
    class Settings:
        """Settings.

        Attributes:
            ttl: seconds.
        """

        ttl: float = 1.0
        brand_new: bool = False

    with caplog.at_level(logging.WARNING):
        table = hooks.options_table(Settings, "reference/configuration.md")
    assert "`brand_new`" in table
    assert any("brand_new" in r.getMessage() for r in caplog.records)  # strict: a failed build


def test_every_command_is_in_the_cli_reference(built_site: BuiltSite) -> None:
    page = html.unescape(built_site.page("reference/cli.md"))
    commands = hooks.cli_commands()
    assert {"demo", "proxy", "check", "purge", "stats", "inspect", "resolve", "schema"} <= set(
        commands
    )
    for command in commands:
        assert f"retrysafe {command}" in page, command
    for flag in ("--upstream", "--fail-on-unknown", "--authorization", "--dry-run"):
        assert flag in page, flag


def test_every_problem_type_has_a_page_with_a_real_example(built_site: BuiltSite) -> None:
    index = built_site.page("reference/problems/index.md")
    for slug, problem in hooks.all_problems().items():
        page = html.unescape(
            re.sub(r"<[^>]+>", "", built_site.page(f"reference/problems/{slug}.md"))
        )
        assert f"HTTP/1.1 {problem.status}" in page, slug
        assert f'"code": "{problem.code}"' in page, slug
        for heading in ("When it happens", "What the client should do", "What the operator can do"):
            assert heading in page, (slug, heading)
        assert f"{slug}/" in index, slug


def test_a_problem_type_without_a_page_fails_the_build(caplog: pytest.LogCaptureFixture) -> None:
    class Files:
        def get_file_from_path(self, path: str) -> object | None:
            return None if "upstream-timeout" in path else object()

    with caplog.at_level(logging.WARNING):
        hooks.on_files(Files(), {})
    assert [r.getMessage() for r in caplog.records] == [
        "problem type 'upstream-timeout' has no page reference/problems/upstream-timeout.md"
    ]


def test_every_public_name_is_in_the_api_reference(built_site: BuiltSite) -> None:
    documented = inventory(built_site)
    missing = []
    for name in PUBLIC_MODULES:
        module = importlib.import_module(name)
        for member in getattr(module, "__all__", []):
            if member.startswith("pytest_"):
                continue  # pytest's hooks, not API
            parents = [name.rsplit(".", i)[0] for i in range(name.count(".") + 1)]
            home = getattr(getattr(module, member), "__module__", None)  # where it is defined
            if not any(f"{where}.{member}" in documented for where in [*parents, home]):
                missing.append(f"{name}.{member}")
    assert not missing, f"public names missing from the API reference: {missing}"


def test_every_public_module_is_api_or_said_not_to_be() -> None:
    found = {"retrysafe"}
    for info in pkgutil.walk_packages(retrysafe.__path__, "retrysafe."):
        parts = info.name.split(".")
        if any(p.startswith("_") for p in parts[1:]):
            continue  # private, and `python -m` entry points (the command line reference)
        if parts[1] == "demo" or info.name.startswith("retrysafe.contrib.django."):
            continue  # the demo's own modules; Django's app modules (admin, models...)
        found.add(info.name)
    unaccounted = found - set(PUBLIC_MODULES) - set(NOT_API)
    assert not unaccounted, (
        f"new public modules: document them in docs/reference/api.md {unaccounted}"
    )


def test_llms_txt_lists_every_page(built_site: BuiltSite) -> None:
    text = (built_site.path / "llms.txt").read_text()
    assert text.startswith("# retrysafe\n\n> ")
    links = re.findall(r"^- \[[^\]]+\]\(([^)]+)\): \S", text, re.MULTILINE)
    assert "reference/problems/idempotency-request-in-progress/" in links
    assert "guides/testing/" in links
    for link in links:
        assert (built_site.path / link / "index.html").exists() or link == "./", link


def test_pages_speak_to_users_not_about_work_items() -> None:
    for page in (ROOT / "docs").rglob("*.md"):
        if page == ROOT / "docs" / "design.md":
            continue
        text = page.read_text()
        assert not re.search(r"\bissues? \d+|\bwork items?\b|\bthe issue\b", text, re.I), page


def test_the_dashboard_is_valid_json() -> None:
    dashboard = json.loads((ROOT / "docs/grafana-dashboard.json").read_text())
    assert dashboard["panels"]
    assert Path(ROOT / "docs/grafana-dashboard.json").exists()
