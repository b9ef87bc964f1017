"""The docs harness's own rules: a runnable block is run or says why not, markers are strict,
and the only rewrite of a page's text is its ports."""

from __future__ import annotations

from pathlib import Path

import pytest

from .harness import DocsError, _remap, _server_port, parse_blocks, projects


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
    text = "curl localhost:8000/x http://127.0.0.1:9000 redis://127.0.0.1:6379/0 :80001"
    assert _remap(text, {8000: 41000, 9000: 42000}) == (
        "curl localhost:41000/x http://127.0.0.1:42000 redis://127.0.0.1:6379/0 :80001"
    )
