#!/usr/bin/env python3
"""Generate the sync twins from their async sources (the idea of httpcore's ``scripts/unasync.py``).

    python scripts/unasync.py          # rewrite every generated file
    python scripts/unasync.py --check  # exit 1 if one is stale or a rewrite rule matched nothing

Each generated file has its own rules: regular expressions applied to the whole source in order,
after the rules every file shares (``async def`` -> ``def``, ``await`` dropped...). A file's own
rule that matches nothing in that file is an error, and so is a shared rule that matches nothing
in any file, so a rename in an async source cannot silently leave its twin behind. The result has
its imports sorted and is formatted with ruff (imports renamed, line breaks once ``await`` is
gone).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

Rules = list[tuple[str, str]]


def _pointer(twin: str, source: str, driver: str = "") -> tuple[str, str]:
    """The rule that turns an async source's paragraph naming its twin ("The sync twin,
    ``twin`` (driver), is generated from this file by ... then run the script.", wrapped
    anywhere) into the twin's paragraph naming its source."""
    note = f" ({driver})" if driver else ""
    words = (
        f"The sync twin, ``{twin}``{note}, is generated from this file by ``scripts/unasync.py`` "
        "(``make lint`` checks that it is up to date): edit this file, then run the script."
    )
    return (
        r"\s+".join(re.escape(word) for word in words.split()),
        f"This file is generated from ``{source}`` by ``scripts/unasync.py``\n(``make lint`` "
        "checks that it is up to date): edit that file, then run the script.",
    )


#: Applied to every file, after its own rules.
SHARED: Rules = [
    (r"\basync def\b", "def"),
    (r"\basync with\b", "with"),
    (r"\basync for\b", "for"),
    (r"\bawait ", ""),
    (r"\bimport asyncio\b", "import threading"),
    (r"\basyncio\.Lock\(\)", "threading.Lock()"),
    (r"\baclose\b", "close"),
    (r"\b_core\.drive import\b", "_core.drive_sync import"),
]


@dataclass(frozen=True)
class Twin:
    """One generated file: its async source, its path, and its own rewrite rules."""

    source: str
    target: str
    rules: Rules


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
]


def _client_rules(module: str, *rules: tuple[str, str]) -> Rules:
    """Rules of a module of the client's ``_async/``: its docstring's pointer, ``rules``, then
    the ``Awaitable`` annotations that every one of them has (``async``/``await`` and ``aclose``
    are the shared rules)."""
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
        r"from \.\. import mark_committed, transaction",
        "from ..wsgi import mark_committed, transaction",
    ),
    (r"scope: the request's ASGI scope", "scope: the request's WSGI environ"),
    (r"\bopen_async_driver\b", "open_driver"),
    (r"\bAsyncOrderHub\b", "OrderHub"),
]
#: The sync face of an instrumented store (metrics and spans on WSGI, Flask and Django).
INSTRUMENT_RULES: Rules = [
    (
        r'^"""The async face of an instrumented store: wraps an async store',
        '"""The sync face of an instrumented store: wraps a synchronous store',
    ),
    (
        r"The sync face, ``_instrument_sync\.py``, is generated from this file by",
        "This file is generated from ``_instrument_async.py`` by",
    ),
    (
        r"\(``make lint`` checks it is up to date\): edit this file, then run the script\.",
        "(``make lint`` checks it): edit that file, then run the script.",
    ),
    (
        r"The synchronous face, for WSGI, Flask and Django \(the store resolvers ask for "
        r"it\):\n(\s*)the same observer over the synchronous face",
        r"The async face, for ASGI (the store resolvers ask for it): the same observer\n\1"
        "over the async face",
    ),
    (r"has no synchronous face", "has no async face"),
    (r"the async store to wrap", "the synchronous store to wrap"),
    (r"Wrap an async store so that", "Wrap a synchronous store so that"),
    (r"\b_instrument_sync import wrap\b", "_instrument_async import wrap"),
    (r"\bas_sync\b", "as_async"),
    (r"\bsync_face\b", "async_face"),
    (r"\bInstrumented(Store|SQLStore|Transaction)\b", r"SyncInstrumented\1"),
    (r"\bAsyncStore\b", "Store"),
    (r"\bAsyncTransaction\b", "Transaction"),
]
TWINS = [
    Twin(
        "src/retrysafe/_core/drive.py",
        "src/retrysafe/_core/drive_sync.py",
        [
            (
                r"This is the async source; ``drive_sync\.py`` is generated from it by "
                r"``scripts/unasync\.py``\. An\n``async def`` needs no event loop import, so the "
                r"loop belongs to the core\.",
                "This file is generated from ``drive.py`` by ``scripts/unasync.py``: edit that "
                "file, then run\nthe script.",
            ),
            (r"\bAwaitable, Generator\b", "Generator"),
            (r"-> Awaitable\[Any\]:", "-> Any:"),
            (
                r"\n\n\s*A plain method that returns an awaitable \(not an ``async def``\) saves "
                r"a coroutine per\n\s*action where the awaitable is ready-made \(the runners hand "
                r"back the store's own call\n\s*for their two hot actions\)\.",
                "",
            ),
        ],
    ),
    Twin(
        "src/retrysafe/_async/runner.py",
        "src/retrysafe/_sync/runner.py",
        [
            (
                r'^"""The async runner: performs a keyed operation\'s actions against an async '
                r"store\.",
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
            (r"\bAwaitable, Callable\b", "Callable"),
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
            (r" \(no coroutine of ours per action on the hot\n\s*path\)", ""),
        ],
    ),
    Twin(
        "src/retrysafe/stores/_sql_async.py",
        "src/retrysafe/stores/_sql_sync.py",
        [
            (
                r'^"""The async face of the server SQL stores',
                '"""The sync face of the server SQL stores',
            ),
            (
                r"\(``postgres/_asyncpg\.py``, ``mysql/_asyncmy\.py``\)",
                "(``postgres/_psycopg.py``, ``mysql/_pymysql.py``)",
            ),
            _pointer("_sql_sync.py", "_sql_async.py"),
            (r"\bAsyncSQL(Driver|Store|Transaction)\b", r"SQL\1"),
            (r"\bAsync(Postgres|MySQL)Store\b", r"\1Store"),
            (r"\bAsyncStore\b", "Store"),
            (r" \(asyncpg\n\s*waits up to 10 s for them, then terminates them\)", ""),
            (
                r"``asyncpg\.Connection``, ``asyncmy\.Connection``",
                "``psycopg.Connection``, ``pymysql.Connection``",
            ),
        ],
    ),
    *(
        Twin(
            f"src/retrysafe/stores/{package}/_async.py",
            f"src/retrysafe/stores/{package}/_sync.py",
            [
                (r'^"""The async (\w+) store:', r'"""The sync \1 store:'),
                _pointer("_sync.py", "_async.py", sync),
                (rf"\bAsync({dialect}Store|{dialect}Transaction|SQLStore|SQLTransaction)\b", r"\1"),
                (rf"\b{driver}\b", f"{sync_driver}"),
                (rf"\b_{module}\b", f"_{sync_module}"),
                (rf"\b{module}\b", sync),
                (r"\b_sql_async\b", "_sql_sync"),
            ],
        )
        for package, dialect, driver, module, sync_driver, sync_module, sync in (
            (
                "postgres",
                "Postgres",
                "AsyncpgDriver",
                "asyncpg",
                "PsycopgDriver",
                "psycopg",
                "psycopg",
            ),
            ("mysql", "MySQL", "AsyncmyDriver", "asyncmy", "PyMySQLDriver", "pymysql", "PyMySQL"),
        )
    ),
    Twin(
        "src/retrysafe/stores/mysql/_asyncmy.py",
        "src/retrysafe/stores/mysql/_pymysql.py",
        [
            _pointer("_pymysql.py", "_asyncmy.py", "PyMySQL, whose API asyncmy follows"),
            (r"connections per event loop and process,", "connections per process (thread-safe),"),
            (r"^import asyncmy$", "import pymysql"),
            (r"\basyncmy\.errors\.InterfaceError\b", "pymysql.err.InterfaceError"),
            (r"\basyncmy\.connect\(", "pymysql.connect("),
            (
                r"\(asyncmy's transport state\)\.\"\"\"\n    try:\n.*\n"
                r"    except Exception:\n        return True",
                '(a zero-timeout poll of its socket)."""\n    return _owner.session_ended(conn)',
            ),
            (
                r"Connections of one event loop in one process:",
                "Connections of one process, shared by its threads:",
            ),
            (r"\n +self\.loop = asyncio\.get_running_loop\(\)", ""),
            (r"\basyncio\.Semaphore\(", "threading.BoundedSemaphore("),
            (r"connect_kwargs\(\)", "connect_kwargs(timeouts=True)"),
            (
                r"try:\n +async with asyncio\.timeout\(self\.options\.pool_timeout\):\n +await "
                r"self\.slots\.acquire\(\)\n +except TimeoutError:",
                "if not self.slots.acquire(timeout=self.options.pool_timeout):",
            ),
            (r"if discard or self\.closed or _broken\(conn\):", "if discard or self.closed:"),
            (
                r"try:\n +await asyncio\.wait_for\(conn\.ensure_closed\(\), 1\.0\)\n +except "
                r"Exception:\n +_close\(conn\)",
                "_close(conn)",
            ),
            (r"pooled per event loop and process", "pooled per process"),
            (
                r"(self\._schema_done = not self\.options\.auto_create)",
                r"\1\n        self._lock = threading.Lock()",
            ),
            # The pool look-up: one pool per process, shared by its threads, so a fresh one is
            # made under a lock (checked again inside) and published once its table is there.
            (r"\n +and pool\.loop is asyncio\.get_running_loop\(\)", ""),
            (
                r"(?s)\n        if (\(.*?\)):\n            return pool\n"
                r"        # First use.*?here\.\n"
                r"        pool = self\._pool = (_Pool\(self\.options\))\n"
                r"        if not self\._schema_done:\n +(await self\._ensure_schema\(.*?\))\n"
                r" +self\._schema_done = True\n        return pool",
                "\n        if \\1:\n            return pool\n        with self._lock:\n"
                "            pool = self._pool\n            if \\1:\n                return pool\n"
                "            # First use or a forked child: a fresh pool. A parent's connections "
                "are dropped,\n            # never closed (closing would end the parent's "
                "sessions).\n            pool = \\2\n            if not self._schema_done:\n"
                "                \\3\n                self._schema_done = True\n"
                "            self._pool = pool\n        return pool",
            ),
            (
                r"pool = await self\._current\(\)\n        what = ",
                "pool = self._pool\n"
                "        if pool is None or pool.pid != os.getpid() or pool.closed:\n"
                "            pool = self._current()\n        what = ",
            ),
            (
                r"; its one connect and statement run\n +in a worker thread, once per "
                r"process\.\"\"\"\n +return await asyncio\.to_thread\(_owner\.hold, ",
                '."""\n        return _owner.hold(',
            ),
            (
                r"this loop's pool\.\"\"\"\n +pool, self\._pool = self\._pool, None\n(.*)\n"
                r" +if pool\.loop is asyncio\.get_running_loop\(\):\n +await pool\.aclose\(\)\n"
                r" +else:\n +pool\.closed = True",
                'the pool."""\n        with self._lock:\n'
                "            pool, self._pool = self._pool, None\n\\1\n            pool.close()",
            ),
            (r"if _broken\(tx\.conn\):\n", "if tx.conn._sock is None:\n"),
            (r"\bAsyncMySQLStore\b", "MySQLStore"),
            (r"\bAsyncmyDriver\b", "PyMySQLDriver"),
            (r"\basyncmy\b", "PyMySQL"),
        ],
    ),
    Twin(
        "src/retrysafe/stores/sqlite/_async_tx.py",
        "src/retrysafe/stores/sqlite/_sync_tx.py",
        [
            (r"transaction on the async face", "transaction on the sync face"),
            (
                r"The sync twin, ``_sync_tx\.py``, is generated from this file by "
                r"``scripts/unasync\.py``\n\(``make lint`` checks that it is up to date\): edit "
                r"this file, then run the script\.",
                "This file is generated from ``_async_tx.py`` by ``scripts/unasync.py``\n"
                "(``make lint`` checks that it is up to date): edit that file, then run the "
                "script.",
            ),
            (r"\bAsyncSQLiteTransaction\b", "SQLiteTransaction"),
            (r"\bAsyncSQLiteStore\b", "SQLiteStore"),
            (r"\b_async_store\b", "_store"),
            (r"\bself\._store\.sync\b", "self._store"),
        ],
    ),
    Twin(
        "src/retrysafe/stores/redis/_client.py",
        "src/retrysafe/stores/redis/_client_sync.py",
        [
            (
                r"The sync twin, ``_client_sync\.py`` \(redis-py's sync clients\), is generated "
                r"from this file by\n``scripts/unasync\.py`` \(``make lint`` checks that it is up "
                r"to date\): edit this file, then run the\nscript\.",
                "This file is generated from ``_client.py`` by ``scripts/unasync.py`` (``make "
                "lint`` checks\nthat it is up to date): edit that file, then run the script.",
            ),
            (r"redis-py asyncio client", "redis-py sync client"),
            (r"``redis\.asyncio\.Redis``", "``redis.Redis``"),
            (r"\bpipeline_async\b", "pipeline_sync"),
        ],
    ),
    Twin(
        "src/retrysafe/stores/redis/_async.py",
        "src/retrysafe/stores/redis/_sync.py",
        [
            (r'^"""The async Redis stores', '"""The sync Redis stores'),
            (
                r"\(``_lean\.py`` for a URL, ``_client\.py`` for a redis-py client\)",
                "(``_client_sync.py``, over redis-py's client)",
            ),
            (
                r"The sync twin, ``_sync\.py``, is generated from this file by "
                r"``scripts/unasync\.py`` \(``make lint``\nchecks that it is up to date\): edit "
                r"this file, then run the script\.",
                "This file is generated from ``_async.py`` by ``scripts/unasync.py`` (``make "
                "lint`` checks\nthat it is up to date): edit that file, then run the script.",
            ),
            (r"\bAsyncRedisStore\b", "RedisStore"),
            (r"\bAsyncRedisClusterStore\b", "RedisClusterStore"),
            (r"\bconnect_async\b", "connect_sync"),
            (r"\bconnect_cluster_async\b", "connect_cluster_sync"),
            (r"\bAsyncStore\b", "Store"),
            (r"; asynchronous \(ASGI\)", "; synchronous (WSGI, Django, scripts)"),
            (r"the store opens its own connection", "the store creates its own redis-py client"),
            (
                r"redis-py asyncio client you own \(``redis\.asyncio\.Redis``",
                "redis-py client you own (``redis.Redis``",
            ),
            (r"``redis\.asyncio\.RedisCluster``", "``redis.cluster.RedisCluster``"),
        ],
    ),
    Twin(
        "src/retrysafe/contrib/django/_async_view.py",
        "src/retrysafe/contrib/django/_sync_view.py",
        DJANGO_VIEW_RULES,
    ),
    Twin(
        "src/retrysafe/client/_async/retry.py",
        "src/retrysafe/client/_sync/retry.py",
        CLIENT_RETRY_RULES,
    ),
    Twin(
        "src/retrysafe/client/_async/transport.py",
        "src/retrysafe/client/_sync/transport.py",
        CLIENT_TRANSPORT_RULES,
    ),
    Twin("src/retrysafe/demo/_async_hub.py", "src/retrysafe/demo/_sync_hub.py", DEMO_HUB_RULES),
    Twin(
        "src/retrysafe/contrib/_instrument_async.py",
        "src/retrysafe/contrib/_instrument_sync.py",
        INSTRUMENT_RULES,
    ),
]

HEADER = "# Generated from {source} by scripts/unasync.py: do not edit.\n"


def _ruff() -> str:
    local = Path(sys.executable).parent / "ruff"
    found = str(local) if local.exists() else shutil.which("ruff")
    if found is None:
        sys.exit("unasync: ruff not found (pip install ruff)")
    return found


def _ruff_run(args: list[str], text: str) -> str:
    done = subprocess.run(
        [_ruff(), *args, "-"], input=text, capture_output=True, text=True, cwd=ROOT, check=False
    )
    if done.returncode != 0:
        sys.exit(f"unasync: ruff {args[0]} failed:\n{done.stderr}")
    return done.stdout


def generate(twin: Twin, text: str, used: set[str]) -> tuple[str, list[str]]:
    """The generated text of ``twin`` and its own rules that matched nothing.

    ``used`` collects the shared rules that matched.
    """
    unused = []
    for pattern, replacement in twin.rules:
        text, count = re.subn(pattern, replacement, text, flags=re.MULTILINE)
        if not count:
            unused.append(pattern)
    for pattern, replacement in SHARED:
        text, count = re.subn(pattern, replacement, text, flags=re.MULTILINE)
        if count:
            used.add(pattern)
    text = HEADER.format(source=twin.source) + text
    name = ["--stdin-filename", twin.target]
    text = _ruff_run(["check", "--select", "I", "--fix", "--quiet", *name], text)
    return _ruff_run(["format", *name], text), unused


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail instead of writing")
    args = parser.parse_args()
    used: set[str] = set()
    unused: list[str] = []
    stale = []
    for twin in TWINS:
        wanted, unused_here = generate(twin, (ROOT / twin.source).read_text(), used)
        unused += [f"{twin.target}: {pattern}" for pattern in unused_here]
        path = ROOT / twin.target
        if path.exists() and path.read_text() == wanted:
            continue
        if args.check:
            stale.append(twin.target)
        else:
            path.write_text(wanted)
            print(f"unasync: wrote {twin.target}")
    unused += [f"(shared) {pattern}" for pattern, _ in SHARED if pattern not in used]
    if unused:
        print("unasync: rules that matched nothing:", *unused, sep="\n  ", file=sys.stderr)
        return 1
    if stale:
        print(
            f"unasync: stale, run `python scripts/unasync.py`: {', '.join(stale)}", file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
