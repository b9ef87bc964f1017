"""Every runnable code block of the documentation site runs as pasted into a fresh folder, with the
same harness as the README (tests/docs/harness.py): each server a page names is started and
probed with the four wire checks; scripts and shell commands must succeed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from .harness import Project, parse_blocks, projects, run_project
from .services import SERVICES

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
#: Not a page of the site: the maintainers' decision log.
NOT_SITE = {DOCS / "design.md"}
PAGES = sorted(p for p in DOCS.rglob("*.md") if p not in NOT_SITE)
PROJECTS = [(page, project) for page in PAGES for project in projects(page)]


def test_every_runnable_block_is_run_or_says_why_not() -> None:
    for page in PAGES:
        parse_blocks(page)  # raises on a runnable block without a marker


def test_each_front_has_a_served_first_endpoint() -> None:
    served = {
        (page.relative_to(DOCS).as_posix(), project.name)
        for page, project in PROJECTS
        if project.serve_block is not None
    }
    for page, name in [
        ("getting-started/fastapi.md", "fastapi"),
        ("getting-started/asgi.md", "asgi"),
        ("getting-started/flask.md", "flask"),
        ("getting-started/django.md", "django"),
        ("getting-started/django.md", "drf"),
        ("getting-started/wsgi.md", "wsgi"),
        ("getting-started/aiohttp.md", "aiohttp"),
    ]:
        assert (page, name) in served, (page, name)


@pytest.mark.parametrize(
    ("page", "project"),
    PROJECTS,
    ids=[f"{page.relative_to(DOCS).with_suffix('').as_posix()}:{p.name}" for page, p in PROJECTS],
)
def test_the_page_runs_as_pasted(page: Path, project: Project, tmp_path: Path) -> None:
    # The reader's shell has no settings of this test suite: run_project gives every command
    # the harness's user_environment().
    folder = tmp_path / project.name
    folder.mkdir()
    run_project(project, folder, bin_dir=Path(sys.executable).parent, services=SERVICES)
