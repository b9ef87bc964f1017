"""The docs harness's own rules: a runnable block is run or says why not, markers are strict,
and the only rewrites of a page's text are its ports and the test services' addresses."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import POSTGRES_URL, REDIS_URL
from .harness import DocsError, _remap, _server_port, parse_blocks, projects, user_environment


def page(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "page.md"
    path.write_text(text)
    return path


def test_an_unmarked_runnable_block_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(DocsError, match=r"page.md:3: a python block without a marker"):
        parse_blocks(page(tmp_path, "# Title\n\n```python\nprint(1)\n```\n"))


def test_a_block_in_another_language_needs_no_marker(tmp_path: Path) -> None:
    (block,) = parse_blocks(page(tmp_path, "```text\nanything\n```\n"))
    assert block.lang == "text" and not block.marker


@pytest.mark.parametrize(
    ("marker", "message"),
    [
        ('skip=""', "skip needs a reason"),
        ("serve", "names a project or says skip"),
        ("project=a bogus", "unknown marker word 'bogus'"),
        ('project=a file="x', "unreadable marker"),
    ],
)
def test_a_bad_marker_is_an_error(tmp_path: Path, marker: str, message: str) -> None:
    with pytest.raises(DocsError, match=message):
        parse_blocks(page(tmp_path, f"<!-- docs: {marker} -->\n```sh\ntrue\n```\n"))


def test_blocks_of_a_project_keep_page_order_and_their_requirements(tmp_path: Path) -> None:
    text = (
        "<!-- docs: project=p file=main.py -->\n```python\napp = 1\n```\n"
        '<!-- docs: skip="needs a cloud" -->\n```sh\ncloud deploy\n```\n'
        "<!-- docs: project=p serve probe=/x -->\n```sh\n"
        "pip install 'retrysafe[flask]' gunicorn  # and a server\n"
        "gunicorn \\\n    main:app\n```\n"
    )
    (project,) = projects(page(tmp_path, text))
    assert [b.line for b in project.blocks] == [2, 10]
    assert project.requirements() == ["retrysafe[flask]", "gunicorn"]
    assert project.serve_block is project.blocks[1]
    assert project.blocks[1].commands()[-1] == "gunicorn main:app"
    assert project.setting("probe") == "/x"


@pytest.mark.parametrize(
    ("command", "port", "flag"),
    [
        ("uvicorn main:app", 8000, "--port 5"),
        ("gunicorn --workers 2 main:app", 8000, "--bind 127.0.0.1:5"),
        ("flask --app main run", 5000, "--port 5"),
        ("python manage.py runserver", 8000, "127.0.0.1:5"),
        ("retrysafe proxy --listen 0.0.0.0:8080 --upstream http://127.0.0.1:9000", 8080, None),
        ("uvicorn main:app --port 9001", 9001, None),
    ],
)
def test_a_servers_port_is_found_or_its_default_added(
    command: str, port: int, flag: str | None
) -> None:
    found, add = _server_port(command)
    assert found == port
    assert (add(5) if add else None) == flag


def test_only_the_named_ports_are_rewritten() -> None:
    text = "curl localhost:8000/x http://127.0.0.1:9000 redis://127.0.0.1:6380/0 :80001"
    assert _remap(text, {8000: 41000, 9000: 42000}) == (
        "curl localhost:41000/x http://127.0.0.1:42000 redis://127.0.0.1:6380/0 :80001"
    )


def test_the_test_services_addresses_become_the_runs_own() -> None:
    text = (
        'Redis("redis://localhost:6379/0?prefix=p:") postgresql://postgres@localhost:5432/test '
        "redis://localhost:6379/01 postgresql://postgres@127.0.0.1:5432/tests"
    )
    assert _remap(text, {}) == (
        f'Redis("{REDIS_URL}?prefix=p:") {POSTGRES_URL} '
        "redis://localhost:6379/01 postgresql://postgres@127.0.0.1:5432/tests"
    )


def test_the_environment_points_the_pages_at_other_services() -> None:
    env = {
        **user_environment(),
        "RETRYSAFE_TEST_REDIS_URL": "redis://127.0.0.1:6379/7",
        "RETRYSAFE_TEST_POSTGRES_URL": "postgresql://app@127.0.0.1:5433/ci",
    }
    code = (
        "from tests.docs.harness import with_test_services as w; "
        "print(w('redis://127.0.0.1:6379/0 postgresql://postgres@127.0.0.1:5432/test'))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.split() == ["redis://127.0.0.1:6379/7", "postgresql://app@127.0.0.1:5433/ci"]
