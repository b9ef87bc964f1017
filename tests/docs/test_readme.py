"""Every runnable block of the README runs as pasted into a fresh folder (tests/docs/harness.py):
each front's snippet under the server it names, probed with the four wire checks."""

from __future__ import annotations

import re
import shlex
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from .harness import Project, ProjectRun, parse_blocks, projects, run_project
from .services import SERVICES, require_services

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PROJECTS = projects(README)


def orders(run: ProjectRun) -> list[dict[str, object]]:
    listing: list[dict[str, object]] = httpx.get(run.url(8000) + "/orders", timeout=10).json()[
        "orders"
    ]
    return listing


def check_try(run: ProjectRun) -> None:
    first, second = run.outputs
    assert "idempotency-replayed" not in first.lower()
    assert "idempotency-replayed: true" in second.lower()
    assert first.split("\n\n", 1)[1] == second.split("\n\n", 1)[1]  # the same body
    assert [o["item"] for o in orders(run)] == ["tea"]


def check_httpx(run: ProjectRun) -> None:
    transport_out, cli_out = run.outputs
    assert re.search(r"RetryInfo\(key='[^']+', attempts=1, replayed=False, ", transport_out)
    assert "status: 201" in cli_out and "replayed: false" in cli_out
    assert [o["item"] for o in orders(run)] == ["tea", "tea"]  # one order per run, no more


def check_requests(run: ProjectRun) -> None:
    assert [o["item"] for o in orders(run)] == ["tea"]


def check_command(run: ProjectRun) -> None:
    help_out, check_out, stats_out, purge_out = run.outputs
    assert "usage: retrysafe" in help_out
    assert check_out.startswith("ok: sqlite store reachable")
    assert "completed: 0" in stats_out
    assert purge_out.startswith("purged 0 expired records")


CHECKS: dict[str, Callable[[ProjectRun], None]] = {
    "try": check_try,
    "httpx": check_httpx,
    "requests": check_requests,
    "command": check_command,
}

#: What each front's project must be, so a snippet cannot silently stop being served or probed.
SERVED = {"fastapi", "asgi", "flask", "django", "wsgi", "proxy", "prometheus", "otel"}


def test_every_runnable_block_is_run_or_says_why_not() -> None:
    blocks = parse_blocks(README)  # raises on an unmarked runnable block
    runnable = [b for b in blocks if b.lang in {"python", "sh", "toml"}]
    assert runnable and all(b.marker for b in runnable)
    assert {p.name for p in PROJECTS if p.serve_block is not None} == SERVED
    assert {"httpx", "requests", "try", "command"} <= {p.name for p in PROJECTS}


def test_every_install_line_names_real_extras() -> None:
    extras = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    )
    for block in parse_blocks(README):
        for command in block.commands() if block.lang == "sh" else []:
            for word in shlex.split(command, comments=True):
                named = re.fullmatch(r"retrysafe\[([\w,-]+)\]", word)
                if named:
                    assert set(named.group(1).split(",")) <= extras, (block.where, word)


def test_the_readme_is_a_landing_page_that_speaks_to_users() -> None:
    text = README.read_text()
    assert len(text.splitlines()) < 460
    assert "- [Try it](#try-it) · [Install](#install)" in text  # a table of contents
    assert not re.search(r"\bissues?\b|work items?|targets? (is|are) missed", text, re.I)
    for link in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if not link.startswith("http"):
            assert (ROOT / link).exists(), link


def test_the_first_screen_says_why_how_to_start_and_what_the_quotes_are() -> None:
    first = "\n".join(README.read_text().splitlines()[:45])  # a screen and a half
    why = first.split("\n\n", 2)[1]  # the opening paragraph: the problem a reader has
    assert "retries" in why and "charged twice" in why
    assert "make demo" in first and "make test" in first
    assert "RFC 8941" in first and "bare token" in first


def test_the_readme_says_what_the_test_suite_needs() -> None:
    import tests.conftest

    development = README.read_text().split("\n## Development\n", 1)[1]
    assert "database `test`" in development and "Redis database 0" in development
    source = Path(tests.conftest.__file__).read_text()
    for variable in re.findall(r"RETRYSAFE_TEST_(\w+)_URL", source):
        assert f"_{variable}_URL`" in development, variable


def test_the_readme_links_the_sites_pages() -> None:
    """Links into docs/ name pages the site builds (relative, so they work on GitHub too), or the
    maintainers' decision log; never a long form beside the site."""
    nav = (ROOT / "mkdocs.yml").read_text()
    links = re.findall(r"\]\((docs/[^)#]+)(?:#[^)]*)?\)", README.read_text())
    assert len(links) >= 10, links
    for link in links:
        if link == "docs/design.md":
            continue
        assert link.endswith(".md") and link.removeprefix("docs/") in nav, link


@pytest.mark.parametrize("project", PROJECTS, ids=[p.name for p in PROJECTS])
def test_the_readme_project_runs_as_pasted(
    project: Project, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    require_services(request, project)
    folder = tmp_path / project.name
    folder.mkdir()
    bin_dir = Path(sys.executable).parent
    run_project(project, folder, bin_dir=bin_dir, services=SERVICES, check=CHECKS.get(project.name))
