"""Instructions per request of the in-process cases, counted by valgrind (steady on a busy machine).

Wall-clock CPU figures move by 20-40% between runs on a shared machine; instruction counts repeat
to within about 1%, so they are the guide for work on the hot path. Each case of
``bench/inprocess.py`` runs under ``valgrind --tool=callgrind`` twice, with ``--low`` and
``--high`` requests; the difference over ``high - low`` is the count per request (start-up and
warm-up cancel out; building each request's scope or environ is included, as in the bare
case)::

    python bench/instructions.py                      # the default cases
    python bench/instructions.py --case "asgi memory, new key" --case "asgi bare endpoint"

Needs valgrind (Debian's package; not installed at run time). About 20-40 s per case.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

BENCH = Path(__file__).resolve().parent
DEFAULT_CASES = (
    "asgi bare endpoint",
    "asgi memory, new key",
    "asgi memory, replay",
    "asgi memory, no key",
    "asgi lean prototype, new key",
    "wsgi bare endpoint",
    "wsgi memory, new key",
    "wsgi memory, replay",
    "wsgi lean prototype, new key",
)


def collected(case: str, requests: int) -> int:
    """Instructions valgrind counted for one run of ``case`` with ``requests`` requests."""
    run = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            sys.executable,
            str(BENCH / "inprocess.py"),
            "--only",
            case,
            "--requests",
            str(requests),
            "--repeat",
            "1",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    found = re.search(r"Collected : (\d+)", run.stderr)
    if run.returncode != 0 or found is None:
        raise SystemExit(f"{case}: valgrind run failed: {run.stderr.strip()[-300:]}")
    return int(found.group(1))


def per_request(case: str, low: int, high: int) -> float:
    return (collected(case, high) - collected(case, low)) / (high - low)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", help="a case of bench/inprocess.py (repeatable)")
    parser.add_argument("--low", type=int, default=1000)
    parser.add_argument("--high", type=int, default=3000)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (apt-get install valgrind)", file=sys.stderr)
        return 2
    cases = args.case or list(DEFAULT_CASES)
    with ThreadPoolExecutor(args.jobs) as pool:
        counts = list(pool.map(lambda case: per_request(case, args.low, args.high), cases))
    width = max(map(len, cases))
    for case, count in zip(cases, counts, strict=True):
        print(f"{case:<{width}}  {count / 1000:7.1f}k instructions/request")
    return 0


if __name__ == "__main__":
    sys.exit(main())
