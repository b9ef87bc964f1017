"""MkDocs hooks: the reference pages generated from the code at build time, and llms.txt.

A page asks for generated content with a marker on a line of its own::

    <!-- generated: config-options -->        every IdempotencyConfig option
    <!-- generated: route-options -->         every @idempotent / RouteOptions option
    <!-- generated: cli -->                   every `retrysafe` command, from its argparse parser
    <!-- generated: problem-index -->         the table of problem types
    <!-- generated: problem-example SLUG -->  a response the code really gives (run at build time)

The build warns (and ``mkdocs build --strict`` fails) when an option has no description, a
command has no help, or a problem type has no page, so none of them can be added unseen.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import re
import socket
import tempfile
from collections.abc import Iterator
from typing import Any

log = logging.getLogger("mkdocs.hooks.reference")

MARK = re.compile(r"^<!--\s*generated:\s*([a-z-]+)(?:\s+(\S+))?\s*-->\s*$", re.MULTILINE)
PROBLEM_PAGES = "reference/problems/{slug}.md"

#: The site's navigation, kept for on_post_build.
_NAV: dict[str, Any] = {}
#: Page src path -> (title, first paragraph), for llms.txt.
_SUMMARIES: dict[str, tuple[str, str]] = {}


# -- options, from the dataclasses and their docstrings ------------------------------------------


def docstring_attributes(cls: type) -> dict[str, str]:
    """The ``Attributes:`` section of a Google-style class docstring, name -> text."""
    doc = cls.__doc__ or ""
    found: dict[str, str] = {}
    section = False
    current = None
    for line in doc.splitlines():
        stripped = line.strip()
        if stripped == "Attributes:":
            section = True
            continue
        if not section:
            continue
        if stripped and not line.startswith(" " * 8) and stripped.endswith(":") and " " not in stripped:
            break  # another section
        match = re.match(r"^ {8}(\w+): (.*)$", line)
        if match:
            current = match.group(1)
            found[current] = match.group(2).strip()
        elif current and line.startswith(" " * 12):
            found[current] += " " + stripped
        elif stripped == "":
            continue
    return found


def rst_to_markdown(text: str) -> str:
    """Docstring markup to Markdown: ``code``, :class:`~x.Y` roles become links or code."""

    def role(match: re.Match[str]) -> str:
        target = match.group(2)
        shown = target.rsplit(".", 1)[-1] if target.startswith("~") else target
        target = target.lstrip("~")
        if target.startswith("retrysafe."):
            return f"[`{shown}`][{target}]"
        return f"`{shown}`"

    text = re.sub(r":(class|func|meth|attr|data|mod):`([^`]+)`", role, text)
    return re.sub(r"``([^`]+)``", r"`\1`", text)


def _type_name(annotation: Any) -> str:
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", repr(annotation))
    return text.replace("|", "\\|")


def _default(field: dataclasses.Field[Any]) -> str:
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    else:
        return "required"
    if isinstance(value, frozenset):
        items = sorted(value, key=str)
        if len(items) > 6:
            return f"{len(items)} values, see below"
        value = "{" + ", ".join(repr(v) for v in items) + "}"
        return f"`{value}`"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{value!r}`"


def options_table(cls: type, page: str) -> str:
    """A Markdown table of a config dataclass's init fields: name, type, default, meaning."""
    described = docstring_attributes(cls)
    rows = ["| option | type | default | meaning |", "|---|---|---|---|"]
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        if not field.init:
            continue
        text = described.get(field.name)
        if not text:
            log.warning(
                "%s: option %r of %s has no description in its docstring's Attributes section",
                page, field.name, cls.__name__,
            )  # fmt: skip
            text = ""
        anchor = f'<a id="{field.name}"></a>'
        rows.append(
            f"| {anchor}`{field.name}` | `{_type_name(field.type)}` | {_default(field)} | "
            f"{rst_to_markdown(text)} |"
        )
    return "\n".join(rows)


def config_options(page: str) -> str:
    from retrysafe import DEFAULT_RELEASE_STATUSES, DEFAULT_REPLAY_HEADER_DENYLIST, IdempotencyConfig

    table = options_table(IdempotencyConfig, page)
    statuses = ", ".join(str(s) for s in sorted(DEFAULT_RELEASE_STATUSES))
    denied = ", ".join(f"`{h}`" for h in sorted(DEFAULT_REPLAY_HEADER_DENYLIST))
    return (
        f"{table}\n\n"
        f"`release_statuses` by default: {statuses} (and every 5xx unless "
        f"`store_server_errors`).\n\n"
        f"`replay_header_denylist` by default: {denied}.\n"
    )


def route_options(page: str) -> str:
    from retrysafe import RouteOptions

    return options_table(RouteOptions, page)


# -- the command line, from its parser -------------------------------------------------------------


@contextlib.contextmanager
def _clean_environment() -> Iterator[None]:
    """The parser reads RETRYSAFE_* defaults from the environment: document the bare defaults."""
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("RETRYSAFE_")}
    try:
        yield
    finally:
        os.environ.update(saved)


def _action_row(action: argparse.Action) -> str | None:
    if isinstance(action, argparse._HelpAction):
        return None
    if action.option_strings:
        name = ", ".join(f"`{s}`" for s in action.option_strings)
    else:
        name = f"`{action.dest}`"
    if action.choices:
        name += " {" + ", ".join(f"`{c}`" for c in action.choices) + "}"
    help_text = (action.help or "").replace("|", "\\|")
    if action.required:
        help_text = "**required.** " + help_text
    elif action.default not in (None, False, argparse.SUPPRESS) and "default" not in help_text:
        help_text += f" (default `{action.default}`)"
    return f"| {name} | {help_text} |"


def cli_reference(page: str) -> str:
    from retrysafe.cli import build_parser

    with _clean_environment():
        parser = build_parser()
    out = [f"```\n{parser.format_usage().strip()}\n```\n", parser.description or "", ""]
    subparsers = next(
        a for a in parser._actions if isinstance(a, argparse._SubParsersAction)
    )
    helps = {choice.dest: choice.help for choice in subparsers._choices_actions}
    for name, sub in subparsers.choices.items():
        summary = helps.get(name)
        if not summary:
            log.warning("%s: the command %r has no help text", page, name)
        out.append(f"## `retrysafe {name}`\n")
        out.append(f"{summary or ''}\n")
        if sub.description:
            out.append(f"{sub.description}\n")
        usage = sub.format_usage().strip().removeprefix("usage: ")
        out.append(f"```\n{usage}\n```\n")
        rows = [r for r in (_action_row(a) for a in sub._actions) if r]
        if rows:
            out.append("| argument | meaning |\n|---|---|\n" + "\n".join(rows) + "\n")
    return "\n".join(out)


def cli_commands() -> list[str]:
    """The names of the `retrysafe` subcommands (for the tests)."""
    from retrysafe.cli import build_parser

    with _clean_environment():
        parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return list(sub.choices)


# -- problem types, with answers the code really gives ---------------------------------------------


def all_problems() -> dict[str, Any]:
    from retrysafe._core.problems import PROBLEMS, PROXY_PROBLEMS

    return {**PROBLEMS, **PROXY_PROBLEMS}


def problem_index(page: str) -> str:
    rows = ["| status | type | `code` | title |", "|---|---|---|---|"]
    for slug, problem in all_problems().items():
        rows.append(
            f"| {problem.status} | [`{slug}`]({slug}.md) | `{problem.code}` | {problem.title} |"
        )
    return "\n".join(rows)


class _Response:
    def __init__(self) -> None:
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.body = b""


async def _call(
    app: Any, path: str, body: bytes, headers: list[tuple[bytes, bytes]]
) -> _Response:
    """One POST through an ASGI app, the way a server would make it."""
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 50000),
        "headers": [(b"host", b"api.example"), (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()), *headers],
    }  # fmt: skip
    sent = False
    response = _Response()

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # never disconnects
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            response.status = message["status"]
            response.headers = list(message.get("headers", []))
        elif message["type"] == "http.response.body":
            response.body += message.get("body", b"")

    with contextlib.suppress(RuntimeError):  # the outcome-unknown handler's own failure
        await app(scope, receive, send)
    return response


async def _orders(scope: Any, receive: Any, send: Any) -> None:
    """An endpoint: creates order 1 (slowly when the test holds it)."""
    gate = scope.get("gate")
    if gate is not None:
        await gate.wait()
    if scope.get("effect_then_fail"):
        import retrysafe

        await retrysafe.mark_committed(scope)  # the payment was captured...
        raise RuntimeError("...and then the process died")
    body = b'{"id":1,"item":"tea","quantity":1}'
    await send({"type": "http.response.start", "status": 201, "headers": [
        (b"content-type", b"application/json"), (b"location", b"/orders/1")]})  # fmt: skip
    await send({"type": "http.response.body", "body": body})


ORDER = b'{"item":"tea","quantity":1}'
KEY = (b"idempotency-key", b'"8e03978e-40d5-43e8-bc93-6894a57f9324"')


async def _middleware_example(slug: str) -> tuple[list[tuple[bytes, bytes]], bytes, _Response]:
    """Make the middleware give ``slug``; returns the request (headers, body) and the answer."""
    from retrysafe.asgi import IdempotencyMiddleware
    from retrysafe.stores import MemoryStore

    options: dict[str, Any] = {}
    store: Any = MemoryStore()
    headers, body = [KEY], ORDER
    if slug == "idempotency-key-missing":
        options["required"] = True
        headers = []
    elif slug == "idempotency-key-invalid":
        headers = [(b"idempotency-key", b'""')]
    elif slug == "idempotency-request-too-large":
        options["max_body_size"] = 16
    elif slug == "idempotency-store-unavailable":
        store = "sqlite:///" + os.path.join(tempfile.gettempdir(), "no-such-dir-rs", "x.db")

    gate = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if slug == "idempotency-request-in-progress":
            scope["gate"] = gate
        if slug == "idempotency-outcome-unknown":
            scope["effect_then_fail"] = True
        await _orders(scope, receive, send)

    middleware = IdempotencyMiddleware(app, store=store, **options)
    if slug == "idempotency-key-reused":
        await _call(middleware, "/orders", ORDER, headers)
        body = b'{"item":"tea","quantity":2}'
    elif slug == "idempotency-outcome-unknown":
        await _call(middleware, "/orders", ORDER, headers)
    elif slug == "idempotency-request-in-progress":
        first = asyncio.ensure_future(_call(middleware, "/orders", ORDER, headers))
        await asyncio.sleep(0.05)
        answer = await _call(middleware, "/orders", body, headers)
        gate.set()
        await first
        return headers, body, answer
    return headers, body, await _call(middleware, "/orders", body, headers)


@contextlib.asynccontextmanager
async def _upstream(kind: str) -> Any:
    """A real backend on loopback that misbehaves: refuses, hangs up, or never answers."""
    if kind == "upstream-unreachable":
        with socket.socket() as sock:  # a port nobody listens on
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        yield f"http://127.0.0.1:{port}"
        return

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        if kind == "upstream-timeout":
            await reader.read()  # holds the request until the proxy gives up and hangs up
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()


async def _proxy_example(slug: str) -> tuple[list[tuple[bytes, bytes]], bytes, _Response]:
    from retrysafe.proxy import ProxySettings, build_app

    async with _upstream(slug) as upstream:
        settings = ProxySettings(
            upstream=upstream, store="memory://", upstream_timeout=0.3, connect_timeout=1.0
        )
        app = build_app(settings)
        answer = await _call(app, "/orders", ORDER, [KEY])
        with contextlib.suppress(Exception):
            await app.proxy.aclose()  # type: ignore[attr-defined]
    return [KEY], ORDER, answer


def problem_answer(slug: str) -> tuple[list[tuple[bytes, bytes]], bytes, _Response]:
    """Run the code until it gives ``slug``: (request headers, request body, response)."""
    quiet = [logging.getLogger(name) for name in ("retrysafe", "retrysafe.proxy", "httpx")]
    levels = [logger.level for logger in quiet]
    for logger in quiet:
        logger.setLevel(logging.CRITICAL + 1)  # the failures staged here are not the build's
    try:
        if slug.startswith("upstream-"):
            return asyncio.run(_proxy_example(slug))
        return asyncio.run(_middleware_example(slug))
    finally:
        for logger, level in zip(quiet, levels, strict=True):
            logger.setLevel(level)


def _pretty(body: bytes, content_type: str) -> str:
    if "json" in content_type:
        with contextlib.suppress(ValueError):
            return json.dumps(json.loads(body), indent=2)
    return body.decode("utf-8", "replace")


def problem_example(slug: str, page: str) -> str:
    if slug not in all_problems():
        log.warning("%s: no problem type %r", page, slug)
        return ""
    headers, body, answer = problem_answer(slug)
    got = dict(answer.headers).get(b"content-type", b"").decode()
    if answer.status != all_problems()[slug].status or slug.encode() not in answer.body:
        log.warning("%s: the example of %r came out as %s %r", page, slug, answer.status, answer.body)
    request = ["POST /orders HTTP/1.1", "Host: api.example", "Content-Type: application/json"]
    request += [f"{n.decode().title()}: {v.decode()}" for n, v in headers]
    lines = [f"HTTP/1.1 {answer.status} {_reason(answer.status)}"]
    lines += [f"{n.decode().title()}: {v.decode()}" for n, v in answer.headers]
    return (
        "The request:\n\n```http\n" + "\n".join(request) + "\n\n" + body.decode() + "\n```\n\n"
        "The answer (produced by running retrysafe while this site was built):\n\n"
        "```http\n" + "\n".join(lines) + "\n\n" + _pretty(answer.body, got) + "\n```\n"
    )


def _reason(status: int) -> str:
    from http import HTTPStatus

    return HTTPStatus(status).phrase


# -- MkDocs events -------------------------------------------------------------------------------


def on_files(files: Any, config: Any) -> Any:
    """Every problem type has its page."""
    for slug in all_problems():
        if files.get_file_from_path(PROBLEM_PAGES.format(slug=slug)) is None:
            log.warning("problem type %r has no page %s", slug, PROBLEM_PAGES.format(slug=slug))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Fill in the generated parts; remember each page's summary for llms.txt."""
    src = page.file.src_uri

    def fill(match: re.Match[str]) -> str:
        kind, argument = match.group(1), match.group(2)
        if kind == "config-options":
            return config_options(src)
        if kind == "route-options":
            return route_options(src)
        if kind == "cli":
            return cli_reference(src)
        if kind == "problem-index":
            return problem_index(src)
        if kind == "problem-example" and argument:
            return problem_example(argument, src)
        log.warning("%s: unknown generated block %r", src, match.group(0))
        return ""

    markdown = MARK.sub(fill, markdown)
    prose = re.sub(r"^(`{3,}|~{3,}).*?^\1\s*$", "", markdown, flags=re.MULTILINE | re.DOTALL)
    prose = re.sub(r"<!--.*?-->", "", prose, flags=re.DOTALL)
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", prose) if p.strip()]
    summary = next(
        (p for p in paragraphs if not p.startswith(("#", "<", "```", "|", "!!!", "-", "---"))), ""
    )
    summary = re.sub(r"\s+", " ", re.sub(r"\[([^\]]+)\]\[[^\]]*\]|\[([^\]]+)\]\([^)]*\)",
                                         lambda m: m.group(1) or m.group(2), summary))  # fmt: skip
    _SUMMARIES[src] = (page.title or src, summary.split(". ")[0].rstrip(".") + ".")
    return markdown


def _nav_sections(nav: Any) -> Iterator[tuple[str, list[Any]]]:
    top: list[Any] = []
    for item in nav.items:
        if item.is_page:
            top.append(item)
        elif item.is_section:
            pages = [p for p in _walk(item)]
            yield item.title, pages
    if top:
        yield "Start", top


def _walk(section: Any) -> Iterator[Any]:
    for child in section.children:
        if child.is_page:
            yield child
        elif child.is_section:
            yield from _walk(child)


def on_post_build(config: Any, **kwargs: Any) -> None:
    """Write llms.txt (https://llmstxt.org) at the site root, from the navigation."""
    nav = _NAV.get("nav")
    if nav is None:
        return
    home = _SUMMARIES.get("index.md", ("", ""))[1]
    out = [f"# {config['site_name']}", "", f"> {config.get('site_description') or home}", ""]
    for title, pages in _nav_sections(nav):
        out.append(f"## {title}\n")
        for page in pages:
            name, summary = _SUMMARIES.get(page.file.src_uri, (page.title, ""))
            out.append(f"- [{page.title or name}]({page.url or './'}): {summary}")
        out.append("")
    with open(os.path.join(config["site_dir"], "llms.txt"), "w", encoding="utf-8") as fh:
        fh.write("\n".join(out))


def on_nav(nav: Any, config: Any, files: Any) -> Any:
    _NAV["nav"] = nav  # on_post_build is not given the navigation
    return nav
