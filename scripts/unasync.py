#!/usr/bin/env python3
"""Generate the sync runner from the async one (the idea of httpcore's ``scripts/unasync.py``).

    python scripts/unasync.py          # rewrite src/retrysafe/_sync/runner.py
    python scripts/unasync.py --check  # exit 1 if it is stale or a rewrite rule matched nothing

Each rule is a regular expression applied to the whole source in order; a rule that matches
nothing is an error, so a rename in the async source cannot silently leave the twin behind. The
result is formatted with ruff (line breaks may change once ``await`` is gone).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FILES = [("src/retrysafe/_async/runner.py", "src/retrysafe/_sync/runner.py")]

RULES: list[tuple[str, str]] = [
    (
        r'^"""The async runner: performs a keyed operation\'s actions against an async store\.',
        '"""The sync runner: performs a keyed operation\'s actions against a sync store.',
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
    (r"Callable\[\.\.\., Awaitable\[Any\]\]", "Callable[..., Any]"),
    (r"-> Awaitable\[(.+)\]:", r"-> \1:"),
    (r"\bAsyncLeaseKeeper\b", "LeaseKeeper"),
    (r"\bAsyncRunner\b", "Runner"),
    (r"\bAsyncExchange\b", "Exchange"),
    (r"\bAsyncOperationRun\b", "OperationRun"),
    (r"\bAsyncCallRun\b", "CallRun"),
    (r"\bAsyncStore\b", "Store"),
    (r"\bAsyncTransaction\b", "Transaction"),
    (r"\basync def\b", "def"),
    (r"\bawait ", ""),
]

HEADER = "# Generated from {source} by scripts/unasync.py: do not edit.\n"


def _ruff() -> str:
    local = Path(sys.executable).parent / "ruff"
    found = str(local) if local.exists() else shutil.which("ruff")
    if found is None:
        sys.exit("unasync: ruff not found (pip install ruff)")
    return found


def generate(source: str, text: str, unused: set[str]) -> str:
    for pattern, replacement in RULES:
        text, count = re.subn(pattern, replacement, text, flags=re.MULTILINE)
        if count:
            unused.discard(pattern)
    text = HEADER.format(source=source) + text
    formatted = subprocess.run(
        [_ruff(), "format", "--stdin-filename", "runner.py", "-"],
        input=text,
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    )
    return formatted.stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail instead of writing")
    args = parser.parse_args()
    unused = {pattern for pattern, _ in RULES}
    stale = []
    for source, target in FILES:
        wanted = generate(source, (ROOT / source).read_text(), unused)
        path = ROOT / target
        if path.exists() and path.read_text() == wanted:
            continue
        if args.check:
            stale.append(target)
        else:
            path.write_text(wanted)
            print(f"unasync: wrote {target}")
    if unused:
        print("unasync: rules that matched nothing:", *sorted(unused), sep="\n  ", file=sys.stderr)
        return 1
    if stale:
        print(
            f"unasync: stale, run `python scripts/unasync.py`: {', '.join(stale)}", file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
