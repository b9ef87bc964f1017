"""What ``retrysafe --help`` and each command's ``--help`` tell a user: the usage says what is
optional (``--store`` is, with ``$RETRYSAFE_STORE_URL``), every command says what it does and
every option what it is for; and building the parser loads neither the demo nor a framework."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from retrysafe.cli import build_parser, main

STORE_COMMANDS = ["purge", "check", "inspect", "resolve", "schema", "stats"]
#: The commands that had no description of their own (only a one-line help in the list).
DESCRIBED = ["demo", "purge", "check", "inspect", "resolve", "schema", "stats", "request"]


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


@pytest.fixture
def commands(monkeypatch: pytest.MonkeyPatch) -> dict[str, argparse.ArgumentParser]:
    monkeypatch.delenv("RETRYSAFE_STORE_URL", raising=False)
    return _commands(build_parser())


@pytest.mark.parametrize("name", STORE_COMMANDS)
def test_the_usage_shows_store_as_optional_without_the_variable(
    name: str, commands: dict[str, argparse.ArgumentParser]
) -> None:
    usage = commands[name].format_usage()
    assert "[--store STORE]" in usage, usage


def test_a_command_without_store_or_variable_names_both(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("RETRYSAFE_STORE_URL", raising=False)
    assert main(["purge"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "--store" in err and "RETRYSAFE_STORE_URL" in err


def test_the_variable_gives_the_store(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RETRYSAFE_STORE_URL", f"sqlite:///{tmp_path}/env.db")
    assert main(["stats", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["completed"] == 0


@pytest.mark.parametrize("name", DESCRIBED)
def test_every_command_has_a_description(
    name: str, commands: dict[str, argparse.ArgumentParser]
) -> None:
    description = commands[name].description or ""
    assert len(description.split()) >= 12, description


def test_every_option_of_every_command_says_what_it_does(
    commands: dict[str, argparse.ArgumentParser],
) -> None:
    silent = {
        f"{name} {action.dest}"
        for name, command in commands.items()
        for action in command._actions
        if not isinstance(action, argparse._HelpAction) and not (action.help or "").strip()
    }
    assert silent == set()


def test_no_proxy_option_only_points_at_the_config_class(
    commands: dict[str, argparse.ArgumentParser],
) -> None:
    pointers = [
        action.option_strings[0]
        for action in commands["proxy"]._actions
        if "see IdempotencyConfig" in (action.help or "")
    ]
    assert pointers == []


def test_schema_apply_says_what_apply_does(commands: dict[str, argparse.ArgumentParser]) -> None:
    action = next(a for a in commands["schema"]._actions if a.dest == "action")
    assert action.choices == ["apply"]
    assert "create" in (action.help or "")


def test_building_the_parser_imports_neither_the_demo_nor_a_framework() -> None:
    code = (
        "import sys, json\n"
        "from retrysafe.cli import build_parser\n"
        "build_parser().parse_args(['purge', '--store', 'memory://'])\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    loaded = set(json.loads(done.stdout))
    demo = sorted(m for m in loaded if m == "retrysafe.demo" or m.startswith("retrysafe.demo."))
    frameworks = {"starlette", "fastapi", "flask", "django", "uvicorn", "gunicorn", "celery"}
    assert demo == []
    assert sorted(loaded & frameworks) == []
