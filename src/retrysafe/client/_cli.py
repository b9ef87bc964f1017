"""``python -m retrysafe.client METHOD URL [--json ...]``: one request with the retry policy, for
scripts and support engineers. Prints status, replay flag, key and attempts, then the body.

Exit status: 0 for a 1xx-3xx answer, 1 for 4xx/5xx, 2 for bad arguments, 3 when no answer came
(retries exhausted, outcome unknown, key reused, connection failure): one ``error:`` line.
``add_request_arguments`` and ``run_request`` let another command line mount it as a subcommand.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from .._core.errors import IdempotencyError
from ._errors import ClientError, OutcomeUnknownError
from ._journal import SQLiteJournal
from ._policy import RetryPolicy, retry_info

__all__ = ["add_request_arguments", "main", "run_request"]

DEFAULT_JOURNAL = "retrysafe-operations.db"


def add_request_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the request command's arguments to ``parser``."""
    parser.add_argument("method", type=str.upper, help="HTTP method (POST, PATCH, GET...)")
    parser.add_argument("url", help="the URL")
    body = parser.add_mutually_exclusive_group()
    body.add_argument("--json", dest="json_body", help="a JSON body (sent as application/json)")
    body.add_argument("--data", help="a raw body, sent as given")
    parser.add_argument(
        "-H",
        "--header",
        action="append",
        default=[],
        metavar="'NAME: VALUE'",
        help="an extra request header (repeatable)",
    )
    parser.add_argument("--key", help="the Idempotency-Key to use (default: a new UUIDv4)")
    parser.add_argument(
        "--operation", help="an operation id: its key is kept in --journal and reused on rerun"
    )
    parser.add_argument(
        "--journal", default=DEFAULT_JOURNAL, help=f"journal file (default ./{DEFAULT_JOURNAL})"
    )
    parser.add_argument("--max-attempts", type=int, default=5, help="most attempts (default 5)")
    parser.add_argument(
        "--deadline", type=float, default=30.0, help="seconds for all attempts (default 30)"
    )
    parser.add_argument(
        "--timeout", type=float, default=10.0, help="seconds per attempt (default 10)"
    )


def _fail(message: str, code: int) -> int:
    print(f"error: {message}", file=sys.stderr)
    return code


def run_request(args: argparse.Namespace) -> int:
    """Send the request described by parsed ``args``; returns the exit status."""
    try:
        import httpx

        from ._httpx import RetryingTransport
    except ImportError:
        return _fail("the request command needs httpx: pip install 'retrysafe[httpx]'", 2)
    headers: dict[str, str] = {}
    for line in args.header:
        name, sep, value = line.partition(":")
        if not sep or not name.strip():
            return _fail(f"a header must look like 'Name: value', got {line!r}", 2)
        headers[name.strip()] = value.strip()
    content: bytes | None = None
    if args.json_body is not None:
        try:
            json.loads(args.json_body)
        except ValueError as exc:
            return _fail(f"--json is not valid JSON ({exc})", 2)
        content = args.json_body.encode()
        headers.setdefault("Content-Type", "application/json")
    elif args.data is not None:
        content = args.data.encode()
    if args.key is not None and args.operation is not None:
        return _fail("give --key or --operation, not both", 2)
    if args.key is not None:
        escaped = args.key.replace("\\", "\\\\").replace('"', '\\"')
        headers["Idempotency-Key"] = f'"{escaped}"'  # an RFC 8941 sf-string
    try:
        policy = RetryPolicy(max_attempts=args.max_attempts, deadline=args.deadline)
        transport = RetryingTransport(policy=policy)
        with httpx.Client(transport=transport, timeout=args.timeout) as client:
            if args.operation is not None:
                journal = SQLiteJournal(args.journal)
                try:
                    with journal.operation(args.operation):
                        response = client.request(
                            args.method, args.url, content=content, headers=headers
                        )
                finally:
                    journal.close()
            else:
                response = client.request(args.method, args.url, content=content, headers=headers)
    except OutcomeUnknownError as exc:
        return _fail(f"outcome unknown for key {exc.key} after {exc.attempts} attempt(s)", 3)
    except ClientError as exc:
        return _fail(f"{exc} (key {exc.key}, {exc.attempts} attempt(s))", 3)
    except IdempotencyError as exc:
        return _fail(str(exc), 2)
    except httpx.HTTPError as exc:
        return _fail(f"{type(exc).__name__}: {exc}", 3)
    except ValueError as exc:  # an invalid header value
        return _fail(str(exc), 2)
    info = retry_info(response)
    _emit(
        f"status: {response.status_code}\n"
        f"replayed: {'true' if info is not None and info.replayed else 'false'}\n"
        f"key: {info.key if info is not None and info.key is not None else '-'}\n"
        f"attempts: {info.attempts if info is not None else 1}\n"
        f"\n{response.text}\n"
    )
    return 0 if response.status_code < 400 else 1


def _emit(text: str) -> None:
    """Write the answer to stdout. A reader that stops early (``| head``) is not a failure of
    the request: the rest is dropped, and stdout is pointed at the null device so that the
    interpreter's last flush does not report the closed pipe either."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``python -m retrysafe.client``; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m retrysafe.client",
        description="Send one HTTP request with retrysafe's retry policy.",
    )
    add_request_arguments(parser)
    return run_request(parser.parse_args(argv))
