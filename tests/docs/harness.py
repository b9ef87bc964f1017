"""Executed documentation: the code blocks of a Markdown file, run as a reader would paste them.

A small harness of our own rather than pytest-examples: pytest-examples runs and lints Python
blocks in-process (print-output checking, ruff/black formatting), while what a reader of this
project's pages does is write a few files into an empty folder, run shell commands, start a
server (uvicorn, gunicorn, ``flask run``, ``manage.py runserver``, ``retrysafe proxy``) and send
it requests. That needs files, processes and ports, which this module handles in a few hundred
lines with no dependency beyond httpx.

Every fenced block in a runnable language (python, sh, bash, shell, console, toml) carries a
marker, an HTML comment on the line just before the fence (invisible once rendered)::

    <!-- docs: skip="why this block cannot run as written" -->
    <!-- docs: project=NAME [file=PATH [append]] [run] [serve probe=/path] [with=SERVICE:PORT] -->

An unmarked block, or a ``skip`` without a reason, is an error: a new block is either run or
says why not. The blocks of one project run, in page order, in a fresh empty folder:

- ``file=PATH``: the block is written to ``PATH`` (``append``: added at the end of the file an
  earlier step made, e.g. the ``settings.py`` of ``django-admin startproject``).
- ``run`` (Python): the block is run as a script (after being written, with ``file=``); it
  must exit 0.
- shell blocks: each command is run (``\\`` continues a line); it must exit 0. ``pip install``
  lines are not run: they are what the project needs installed (:meth:`Project.requirements`),
  which the environment the caller passes provides. With ``serve``, the block's last command is
  the server: it is started, and the four wire checks are sent to ``probe`` (a first keyed
  ``POST``; its replay, marked ``Idempotency-Replayed: true``; the same key with another body,
  ``422`` problem+json; no key on a route that requires one, ``400``). ``expect=/path
  contains=TEXT`` then checks that ``GET /path`` answers 200 with ``TEXT`` in its body.
- ``with=SERVICE:PORT``: before the project's first block, start a service the page relies on
  (say OrderHub on 8000), from the caller's ``services``.

Two rewrites only. The test services' addresses a page names (``redis://127.0.0.1:6379/0``,
``postgresql://postgres@127.0.0.1:5432/test``, ``amqp://guest:guest@127.0.0.1:5672/%2F``, also
with ``localhost``) become the run's own (``RETRYSAFE_TEST_REDIS_URL``, ``_POSTGRES_URL``,
``_AMQP_URL``; :data:`SERVICE_URLS`), so a suite pointed at other services runs the pages there
too. And ports: a server's port and each ``with=`` port are replaced, in every
block and command of the project, by a free port (``127.0.0.1:8000`` becomes
``127.0.0.1:41234``, ``--port 8000`` becomes ``--port 41234``), since a shared machine cannot
promise port 8000; a server command that names no port gets its default port's replacement as a
flag (``uvicorn main:app --port 41234``).
Markers may appear on any block of a project; a project's settings are the union of its blocks'.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from ..conftest import AMQP_URL, POSTGRES_URL, REDIS_URL

__all__ = [
    "Block",
    "DocsError",
    "Project",
    "ProjectRun",
    "Service",
    "free_port",
    "parse_blocks",
    "projects",
    "run_project",
    "services_named",
    "wire_checks",
    "with_test_services",
]

#: Fenced blocks in these languages are runnable: each needs a marker.
RUNNABLE = frozenset({"python", "py", "sh", "bash", "shell", "console", "toml"})
SHELL = frozenset({"sh", "bash", "shell", "console"})
#: Marker keys that take a value, and flags that take none.
VALUE_KEYS = frozenset({"skip", "project", "file", "probe", "with", "expect", "contains", "body"})
FLAGS = frozenset({"append", "run", "serve"})

#: A service the caller starts for a project: ``(port, folder) -> context manager``.
Service = Callable[[int, Path], contextlib.AbstractContextManager[Any]]

_FENCE = re.compile(r"^(`{3,}|~{3,})\s*([\w+-]*)[^\n]*$")
_MARKER = re.compile(r"^<!--\s*docs:(.*?)-->\s*$")
_HOSTPORT = r"(?:127\.0\.0\.1|localhost|0\.0\.0\.0)"


class DocsError(Exception):
    """A page's markup is wrong (an unmarked runnable block, a bad marker)."""


@dataclass
class Block:
    """One fenced code block and its marker."""

    source: Path
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    marker: dict[str, str] = field(default_factory=dict)
    flags: frozenset[str] = frozenset()

    @property
    def where(self) -> str:
        return f"{self.source.name}:{self.line}"

    def commands(self) -> list[str]:
        """The shell commands of a shell block (continuations joined, blank lines dropped)."""
        joined = re.sub(r"[ \t]*\\\n\s*", " ", self.code)
        return [ln.strip() for ln in joined.splitlines() if ln.strip() and not ln.startswith("#")]


def _parse_marker(text: str, where: str) -> tuple[dict[str, str], frozenset[str]]:
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise DocsError(f"{where}: unreadable marker ({exc})") from None
    values: dict[str, str] = {}
    flags: set[str] = set()
    for word in words:
        name, sep, value = word.partition("=")
        if sep and name in VALUE_KEYS:
            values[name] = value
        elif not sep and name in FLAGS:
            flags.add(name)
        else:
            raise DocsError(f"{where}: unknown marker word {word!r}")
    if "skip" in values and not values["skip"].strip():
        raise DocsError(f'{where}: skip needs a reason: skip="why it cannot run as written"')
    if "skip" not in values and "project" not in values:
        raise DocsError(f'{where}: a marker names a project or says skip="why"')
    return values, frozenset(flags)


def parse_blocks(path: Path) -> list[Block]:
    """Every fenced code block of a Markdown file, with its marker.

    Raises:
        DocsError: a runnable block without a marker, or a bad marker.
    """
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        fence, lang = opening.group(1), opening.group(2).lower()
        end = i + 1
        while end < len(lines) and not lines[end].startswith(fence):
            end += 1
        block = Block(path, i + 1, lang, "\n".join(lines[i + 1 : end]) + "\n")
        marker = _MARKER.match(lines[i - 1]) if i > 0 else None
        if marker:
            block.marker, block.flags = _parse_marker(marker.group(1), block.where)
        elif lang in RUNNABLE:
            raise DocsError(
                f"{block.where}: a {lang} block without a marker: put "
                '<!-- docs: project=NAME ... --> or <!-- docs: skip="why" --> before it'
            )
        blocks.append(block)
        i = end + 1
    return blocks


@dataclass
class Project:
    """The blocks of one project, in page order, and the settings they give together."""

    name: str
    blocks: list[Block]

    def setting(self, key: str) -> str | None:
        found = [b.marker[key] for b in self.blocks if key in b.marker]
        return found[-1] if found else None

    def services(self) -> dict[str, int]:
        """``with=NAME:PORT`` of every block: service name -> the port the page names."""
        found: dict[str, int] = {}
        for block in self.blocks:
            if "with" in block.marker:
                name, _, port = block.marker["with"].partition(":")
                found[name] = int(port)
        return found

    def requirements(self) -> list[str]:
        """What the project's ``pip install`` lines install, as requirement strings."""
        found: list[str] = []
        for block in self.blocks:
            if block.lang in SHELL:
                for command in block.commands():
                    words = shlex.split(command, comments=True)
                    if words[:2] == ["pip", "install"]:
                        found += [w for w in words[2:] if not w.startswith("-")]
        return found

    @property
    def serve_block(self) -> Block | None:
        return next((b for b in self.blocks if "serve" in b.flags), None)


def projects(path: Path) -> list[Project]:
    """The projects of a Markdown file (skipped blocks and unmarked non-runnable ones dropped)."""
    by_name: dict[str, Project] = {}
    for block in parse_blocks(path):
        name = block.marker.get("project")
        if name is None:
            continue
        by_name.setdefault(name, Project(name, [])).blocks.append(block)
    return list(by_name.values())


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


#: A server command's program -> (default port, how to name another port).
_SERVERS: dict[str, tuple[int, Callable[[int], str]]] = {
    "uvicorn": (8000, lambda p: f"--port {p}"),
    "gunicorn": (8000, lambda p: f"--bind 127.0.0.1:{p}"),
    "flask": (5000, lambda p: f"--port {p}"),
    "runserver": (8000, lambda p: f"127.0.0.1:{p}"),
    "retrysafe": (8000, lambda p: f"--port {p}"),
}


def _server_port(command: str) -> tuple[int, Callable[[int], str] | None]:
    """The port a server command serves on, and how to add it when the command names none."""
    named = re.search(rf"{_HOSTPORT}:(\d+)|--port[ =](\d+)", command)
    if named:
        return int(named.group(1) or named.group(2)), None
    words = shlex.split(command, comments=True)
    program = "runserver" if "runserver" in words else Path(words[0]).name
    if program not in _SERVERS:
        raise DocsError(f"no known default port for the server command {command!r}")
    default, flag = _SERVERS[program]
    return default, flag


@dataclass
class ProjectRun:
    """What running a project did, for the caller's own checks."""

    folder: Path
    ports: dict[int, int]  # the page's port -> the free port used
    base_url: str | None = None
    outputs: list[str] = field(default_factory=list)

    def url(self, page_port: int) -> str:
        return f"http://127.0.0.1:{self.ports[page_port]}"


#: Set by this test run (pytest, Django's test settings, the run's own virtualenv), never in the
#: fresh shell of a user who pastes a block.
_TEST_RUN_ONLY = (
    "PYTHONPATH",
    "VIRTUAL_ENV",
    "DJANGO_SETTINGS_MODULE",
    "PYTEST_ADDOPTS",
    "PYTEST_PLUGINS",
)


def user_environment() -> dict[str, str]:
    """This process's environment without what only a test run sets."""
    return {k: v for k, v in os.environ.items() if k not in _TEST_RUN_ONLY}


def _env(bin_dir: Path, extra: Mapping[str, str] | None) -> dict[str, str]:
    env = user_environment()
    # Only this virtualenv's programs: another one's (the test run's own) on PATH would hide a
    # program the project's virtualenv lacks.
    others = [p for p in env.get("PATH", "").split(os.pathsep) if p and not _in_venv(Path(p))]
    env["PATH"] = os.pathsep.join([str(bin_dir), *others])
    env["VIRTUAL_ENV"] = str(bin_dir.parent)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def _in_venv(folder: Path) -> bool:
    return (folder.parent / "pyvenv.cfg").exists()


def _run(command: str, folder: Path, env: Mapping[str, str], where: str, timeout: float) -> str:
    result = subprocess.run(
        ["bash", "-c", command],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    if result.returncode != 0:
        raise AssertionError(
            f"{where}: `{command}` exited {result.returncode}\n"
            f"stdout: {result.stdout[-3000:]}\nstderr: {result.stderr[-3000:]}"
        )
    return result.stdout


@contextlib.contextmanager
def _serving(command: str, folder: Path, env: Mapping[str, str], port: int) -> Iterator[Path]:
    """Start a server command in its own process group; stop the whole group afterwards."""
    log_path = folder / f"server-{port}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            ["bash", "-c", f"exec {command}"],
            cwd=folder,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its workers and reloader children share its group
        )
    try:
        _wait_for(port, proc, log_path)
        yield log_path
    finally:
        _stop_group(proc)


def _wait_for(
    port: int, proc: subprocess.Popen[bytes], log_path: Path, timeout: float = 60
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(
                f"the server exited with {proc.returncode}:\n{log_path.read_text()[-4000:]}"
            )
        try:
            httpx.get(f"http://127.0.0.1:{port}/", timeout=2)
            return
        except httpx.TransportError:
            time.sleep(0.1)
    raise AssertionError(f"no answer on port {port} within {timeout} s:\n{log_path.read_text()}")


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
    # Workers or a reloader's child may outlive the leader by a moment: end the group.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


#: The services' addresses as the pages write them -> the test run's (tests/conftest.py).
SERVICE_URLS = {
    f"{scheme}{host}{rest}": url
    for scheme, rest, url in [
        ("redis://", ":6379/0", REDIS_URL),
        ("postgresql://postgres@", ":5432/test", POSTGRES_URL),
        ("amqp://guest:guest@", ":5672/%2F", AMQP_URL),
    ]
    for host in ("127.0.0.1", "localhost")
}
_SERVICE_URL = re.compile("|".join(re.escape(u) + r"(?![\w/])" for u in SERVICE_URLS))


def services_named(text: str) -> set[str]:
    """The test run's service URLs that ``text`` names (as :func:`_remap` writes them)."""
    return {SERVICE_URLS[m[0]] for m in _SERVICE_URL.finditer(text)}


def with_test_services(text: str) -> str:
    """``text`` with the test services' addresses it names replaced by the run's own."""
    return _SERVICE_URL.sub(lambda m: SERVICE_URLS[m[0]], text)


def _remap(text: str, ports: Mapping[int, int]) -> str:
    text = with_test_services(text)
    for page, real in ports.items():
        text = re.sub(rf"\b({_HOSTPORT}):{page}\b", rf"\g<1>:{real}", text)
        text = re.sub(rf"(--port[ =]){page}\b", rf"\g<1>{real}", text)
    return text


def run_project(
    project: Project,
    folder: Path,
    *,
    bin_dir: Path,
    services: Mapping[str, Service] | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 300,
    check: Callable[[ProjectRun], None] | None = None,
) -> ProjectRun:
    """Run one project's blocks in ``folder`` (empty) with ``bin_dir``'s programs first on PATH.

    Args:
        project: the project to run.
        folder: an empty folder: the reader's new project.
        bin_dir: the ``bin`` folder of the virtualenv that has the project's requirements.
        services: what ``with=NAME:PORT`` may start.
        env: extra environment variables for every command.
        timeout: seconds for each command that is not the server.
        check: the caller's own checks, called while the server and the services still run.

    Returns:
        Where it ran and on which ports, for the caller's own checks.

    Raises:
        AssertionError: a block failed, or the server failed a wire check.
        DocsError: the project's markup is wrong.
    """
    environment = _env(bin_dir, env)
    ports = {page: free_port() for page in project.services().values()}
    serve = project.serve_block
    server_command = None
    if serve is not None:
        if serve.lang not in SHELL or not serve.commands():
            raise DocsError(f"{serve.where}: serve marks a shell block whose last line serves")
        server_command = serve.commands()[-1]
        page_port, flag = _server_port(server_command)
        ports.setdefault(page_port, free_port())
        if flag is not None:
            server_command += " " + flag(ports[page_port])
        server_command = _remap(server_command, ports)
    result = ProjectRun(folder, ports)
    with contextlib.ExitStack() as stack:
        for name, page_port in project.services().items():
            if services is None or name not in services:
                raise DocsError(f"project {project.name}: no service {name!r} to start")
            stack.enter_context(services[name](ports[page_port], folder))
        for block in project.blocks:
            code = _remap(block.code, ports)
            if "file" in block.marker:
                target = folder / block.marker["file"]
                target.parent.mkdir(parents=True, exist_ok=True)
                if "append" in block.flags:
                    if not target.exists():
                        raise AssertionError(f"{block.where}: nothing to append to in {target}")
                    code = target.read_text() + "\n" + code
                target.write_text(code)
                if block.lang in {"python", "py"} and "run" in block.flags:
                    result.outputs.append(
                        _run(
                            f"python {block.marker['file']}",
                            folder,
                            environment,
                            block.where,
                            timeout,
                        )
                    )
            elif block.lang in {"python", "py"} and "run" in block.flags:
                script = folder / f"block_{block.line}.py"
                script.write_text(code)
                result.outputs.append(
                    _run(f"python {script.name}", folder, environment, block.where, timeout)
                )
            elif block.lang in SHELL:
                commands = block.commands()
                if block is serve:
                    commands = commands[:-1]
                for command in commands:
                    if shlex.split(command, comments=True)[:2] == ["pip", "install"]:
                        continue  # the environment has what the project needs
                    result.outputs.append(
                        _run(_remap(command, ports), folder, environment, block.where, timeout)
                    )
            else:
                raise DocsError(f"{block.where}: a {block.lang} block needs file= or run")
        if serve is not None and server_command is not None:
            port = ports[_server_port(serve.commands()[-1])[0]]
            result.base_url = f"http://127.0.0.1:{port}"
            log = stack.enter_context(_serving(server_command, folder, environment, port))
            try:
                wire_checks(
                    result.base_url, project.setting("probe") or "/", project.setting("body")
                )
                expect = project.setting("expect")
                if expect is not None:
                    answer = httpx.get(result.base_url + expect, timeout=10)
                    assert answer.status_code == 200, (expect, answer.status_code)
                    wanted = project.setting("contains") or ""
                    assert wanted in answer.text, (wanted, answer.text[-3000:])
            except AssertionError as exc:
                raise AssertionError(
                    f"{serve.where}: {exc}\nserver log:\n{log.read_text()[-4000:]}"
                ) from None
        if check is not None:
            check(result)
    return result


def wire_checks(base_url: str, path: str, body: str | None = None) -> None:
    """The four checks every served snippet must pass.

    1. a first ``POST`` with a new key runs (2xx);
    2. the same request again is the same answer, with ``Idempotency-Replayed: true``;
    3. the same key with another body is ``422`` problem+json (``idempotency-key-reused``);
    4. no key, on a route that requires one, is ``400`` problem+json (``idempotency-key-missing``).

    Args:
        base_url: the server, e.g. ``http://127.0.0.1:8000``.
        path: the route to probe; it must require a key.
        body: the JSON body of the first request (default ``{"amount": 10}``).
    """
    first_body = (body or '{"amount": 10}').encode()
    other_body = b'{"amount": 20, "note": "another request"}'
    json_type = {"Content-Type": "application/json"}
    key = {"Idempotency-Key": f'"docs-{uuid.uuid4().hex}"', **json_type}
    with httpx.Client(base_url=base_url, timeout=30) as client:
        first = client.post(path, content=first_body, headers=key)
        assert 200 <= first.status_code < 300, ("first", first.status_code, first.text[:2000])
        assert first.headers.get("idempotency-replayed") is None, "a first answer is no replay"
        again = client.post(path, content=first_body, headers=key)
        assert again.headers.get("idempotency-replayed") == "true", ("replay", again.headers)
        assert (again.status_code, again.content) == (first.status_code, first.content)
        reused = client.post(path, content=other_body, headers=key)
        _assert_problem(reused, 422, "idempotency-key-reused")
        missing = client.post(path, content=first_body, headers=json_type)
        _assert_problem(missing, 400, "idempotency-key-missing")


def _assert_problem(answer: httpx.Response, status: int, slug: str) -> None:
    assert answer.status_code == status, (slug, answer.status_code, answer.text[:2000])
    assert answer.headers["content-type"].startswith("application/problem+json"), answer.headers
    assert str(answer.json()["type"]).endswith(slug), answer.json()
