#!/usr/bin/env python3
"""Generate sync twins from their async sources (the idea of httpcore's ``scripts/unasync.py``).

    python scripts/unasync.py          # rewrite every target of FILES
    python scripts/unasync.py --check  # exit 1 if it is stale or a rewrite rule matched nothing

Each file has its own rules: regular expressions applied to the whole source in order; a rule
that matches nothing is an error, so a rename in the async source cannot silently leave the twin
behind. The result is formatted with ruff (line breaks may change once ``await`` is gone).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
Rules = list[tuple[str, str]]

RUNNER_RULES: Rules = [
    (
        r'^"""The async runner: performs the request flow\'s actions against an async store\.',
        '"""The sync runner: performs the request flow\'s actions against a sync store.',
    ),
    (
        r"The sync twin, ``_sync/runner\.py``, is generated from this file by",
        "This file is generated from ``_async/runner.py`` by",
    ),
    (
        r"up to date\): edit this file, then run the script\.",
        "up to date): edit that file, then run the script.",
    ),
    (r"\bAwaitable, Callable, Generator\b", "Callable, Generator"),
    (r"Callable\[\[bool\], Awaitable\[None\]\]", "Callable[[bool], None]"),
    (r"-> Awaitable\[(.+)\]:", r"-> \1:"),
    (r"\bAsyncLeaseKeeper\b", "LeaseKeeper"),
    (r"\bAsyncRunner\b", "Runner"),
    (r"\bAsyncExchange\b", "Exchange"),
    (r"\bAsyncStore\b", "Store"),
    (r"\bAsyncTransaction\b", "Transaction"),
    (r"\basync def\b", "def"),
    (r"\bawait ", ""),
]

DJANGO_VIEW_RULES: Rules = [
    (r"view on an ASGI stack: claim", "view on a WSGI stack: claim"),
    (
        r"The sync twin for a WSGI stack is generated from this file",
        "This file is generated from ``_async_view.py``",
    ),
    (r"up to date\): edit this file, then run", "up to date): edit that file, then run"),
    (r"\bAwaitable, Callable\b", "Callable"),
    (r"Callable\[\[HttpRequest\], Awaitable\[Any\]\]", "Callable[[HttpRequest], Any]"),
    (r"\._async\.runner\b", "._sync.runner"),
    (r"\bAsync(Exchange|Runner|DjangoTransaction)\b", r"\1"),
    (r"\ba(capture_response|request_user)\b", r"\1"),  # the hand-written pairs of _shell.py
    (r"\basync def\b", "def"),
    (r"\bawait ", ""),
]


def _client_rules(module: str, *rules: tuple[str, str]) -> Rules:
    """Rules of a module of the client's ``_async/``: its docstring's pointer, ``rules``, then
    the ``Awaitable`` annotations, ``aclose`` and ``async``/``await`` that every one of them has."""
    return [
        (
            rf"The sync twin, ``_sync/{module}\.py``, is generated from this file by",
            f"This file is generated from ``_async/{module}.py`` by",
        ),
        (
            r"\(``make lint`` checks it is up to date\): edit this file,",
            "(``make lint`` checks it): edit that file,",
        ),
        *rules,
        (r"\bAwaitable, ", ""),
        (r"Awaitable\[(\w+)\]", r"\1"),
        (r"\baclose\b", "close"),
        (r"\basync def\b", "def"),
        (r"\bawait ", ""),
    ]


#: The retry loop, shared by the sync httpx transport and the requests adapter.
CLIENT_RETRY_RULES = _client_rules(
    "retry",
    (r'^"""The async retry loop:', '"""The sync retry loop:'),
    (r"^import asyncio\n", ""),
    (r"\bAsyncAnswer\b", "Answer"),
    (
        r"(\n +)# A durable \(fsynced\) write: off the event loop\.\n +"
        r"await asyncio\.to_thread\(call\.operation\.finish, status\)",
        r"\1call.operation.finish(status)",
    ),
)

#: The httpx transport.
CLIENT_TRANSPORT_RULES = _client_rules(
    "transport",
    (r'^"""The async httpx transport', '"""The sync httpx transport'),
    (r"^import asyncio$", "import time"),
    (r"\basyncio\.sleep\b", "time.sleep"),
    (r"\bAsyncRetryingTransport\b", "RetryingTransport"),
    (r"\bhttpx\.Async(BaseTransport|HTTPTransport|Client)\b", r"httpx.\1"),
    (r"\bhandle_async_request\b", "handle_request"),
    (r"\baread\b", "read"),
)

#: OrderHub's data layer (the Flask OrderHub's face of the Starlette/FastAPI one).
DEMO_HUB_RULES: Rules = [
    (
        r"for the async apps \(Starlette, FastAPI\)\.$",
        "for the WSGI app (Flask).",
    ),
    (
        r"The sync twin, ``_sync_hub\.py`` \(Flask\), is generated from this file by",
        "This file is generated from ``_async_hub.py`` by",
    ),
    (
        r"up to date\): edit this file, then run the script\.",
        "up to date): edit that file, then run the script.",
    ),
    (r"^import asyncio$", "import time"),
    (r"\basyncio\.sleep\(", "time.sleep("),
    (
        r"from \.\._core\.transaction import mark_committed, transaction",
        "from ..wsgi import mark_committed, transaction",
    ),
    (r"scope: the request's ASGI scope", "scope: the request's WSGI environ"),
    (r"\bopen_async_driver\b", "open_driver"),
    (r"\bAsyncOrderHub\b", "OrderHub"),
    (r"\baclose\b", "close"),
    (r"\basync def\b", "def"),
    (r"\bawait ", ""),
]
FILES: list[tuple[str, str, Rules]] = [
    ("src/retrysafe/_async/runner.py", "src/retrysafe/_sync/runner.py", RUNNER_RULES),
    (
        "src/retrysafe/contrib/django/_async_view.py",
        "src/retrysafe/contrib/django/_sync_view.py",
        DJANGO_VIEW_RULES,
    ),
    (
        "src/retrysafe/client/_async/retry.py",
        "src/retrysafe/client/_sync/retry.py",
        CLIENT_RETRY_RULES,
    ),
    (
        "src/retrysafe/client/_async/transport.py",
        "src/retrysafe/client/_sync/transport.py",
        CLIENT_TRANSPORT_RULES,
    ),
    ("src/retrysafe/demo/_async_hub.py", "src/retrysafe/demo/_sync_hub.py", DEMO_HUB_RULES),
]

HEADER = "# Generated from {source} by scripts/unasync.py: do not edit.\n"


def _ruff() -> str:
    local = Path(sys.executable).parent / "ruff"
    found = str(local) if local.exists() else shutil.which("ruff")
    if found is None:
        sys.exit("unasync: ruff not found (pip install ruff)")
    return found


def generate(
    source: str, target: str, text: str, rules: Rules, unused: set[tuple[str, str]]
) -> str:
    for pattern, replacement in rules:
        text, count = re.subn(pattern, replacement, text, flags=re.MULTILINE)
        if count:
            unused.discard((source, pattern))
    text = HEADER.format(source=source) + text
    # Imports sorted again (``_async`` and ``_sync`` sort differently), then formatted.
    for command in (["check", "--select", "I", "--fix-only", "--quiet"], ["format"]):
        text = subprocess.run(
            [_ruff(), *command, "--stdin-filename", target, "-"],
            input=text,
            capture_output=True,
            text=True,
            cwd=ROOT,
            check=True,
        ).stdout
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail instead of writing")
    args = parser.parse_args()
    unused = {(source, pattern) for source, _, rules in FILES for pattern, _ in rules}
    stale = []
    for source, target, rules in FILES:
        wanted = generate(source, target, (ROOT / source).read_text(), rules, unused)
        path = ROOT / target
        if path.exists() and path.read_text() == wanted:
            continue
        if args.check:
            stale.append(target)
        else:
            path.write_text(wanted)
            print(f"unasync: wrote {target}")
    if unused:
        unmatched = [f"{source}: {pattern}" for source, pattern in sorted(unused)]
        print("unasync: rules that matched nothing:", *unmatched, sep="\n  ", file=sys.stderr)
        return 1
    if stale:
        print(
            f"unasync: stale, run `python scripts/unasync.py`: {', '.join(stale)}", file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
