"""`make bench`: retrysafe side by side with the bare endpoint and its nearest peers.

What it does, in order:

1. Makes sure there is a load generator: ``wrk`` (installed with apt when missing and running
   as root), else the in-repo raw-socket client ``bench/loadgen.py``.
2. Creates (once) the peers' virtualenv ``bench/.venv-bench-peers`` with the peers installed
   from PyPI at pinned versions, next to the same Starlette/uvicorn/uvloop/httptools/redis
   versions as the main venv (peer code is installed, never vendored).
3. Starts each app of ``bench/apps.py`` under uvicorn (1 worker, uvloop, httptools) in its own
   process pinned to core 0: the bare endpoint; retrysafe with each store (memory, SQLite in a
   temp dir, Redis under a unique prefix, PostgreSQL in a scratch schema); the lean prototype
   (``bench/lean.py``: what the store and the server allow) on each store; the peers on Redis.
   A store whose module or service is missing is skipped, and the table says so.
4. For each round (``--repeat``) and scenario (new key per request, replay of one stored key,
   no key), runs the load generator pinned to core 1 for ``--duration`` seconds against each
   app, interleaved with the bare endpoint: ``bare X1 X2 bare X3 X4 ... bare``. Each app's ratio
   is its req/s over the mean of the two bare runs around it. Around each run it reads the
   server's CPU time (``/proc/<pid>/stat``, utime+stime) and the store server's (redis-server,
   postgres), so CPU per request is reported next to req/s (steadier than req/s on a shared
   machine), and the "client-CPU-only ratio": bare CPU/request over the app process's
   CPU/request, i.e. the throughput ratio once the store server has a core of its own.
5. Drives both middlewares and the lean prototype in-process (``bench/inprocess.py``: CPU per
   request, no server), runs the micro-benchmarks
   (``pytest bench/test_micro.py --benchmark-only``), and measures the Prometheus hook's cost
   per keyed request in-process (``executed`` + ``settled`` through the middleware's own
   emit), in single-process and multiprocess mode, and what ``?replicas=1`` costs a new key on
   a Redis master with one replica of its own (``bench/replicas.py``).
6. Measures ``retrysafe proxy`` in front of the bare endpoint (``bench/sidecar.py``): direct,
   nginx from Debian's package as a plain reverse proxy, the proxy with no key, a new key and
   replays on memory, SQLite and Redis, at 1, 32 and 128 connections, with the proxy's and the
   backend's CPU per request (``--no-proxy`` skips it, ``--proxy-only`` runs only it).
7. Writes ``bench/results/bench-<stamp>.json`` and ``.md`` (date, machine, commit) and prints
   the Markdown table. Removes every Redis key and PostgreSQL schema it created.

Examples::

    make bench
    make bench BENCH_ARGS="--duration 10 --repeat 3"
    .venv/bin/python bench/run.py --stores memory,sqlite --no-peers --no-micro --duration 3
    .venv/bin/python bench/run.py --profile py-spy --stores redis --scenarios new --no-peers
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
RESULTS = BENCH / "results"
PEERS_VENV = BENCH / ".venv-bench-peers"
SERVER_CPU = 0
#: The apps of this project (the rest are peers): ASGI under uvicorn, WSGI under gunicorn.
OWN_APPS = ("bare", "retrysafe", "lean", "wsgi-bare", "wsgi-retrysafe", "wsgi-lean")
BARE_APPS = ("bare", "wsgi-bare")
CLIENT_CPU = 1
SCENARIOS = ("new", "replay", "nokey")
SCENARIO_TITLES = {
    "new": "new key per request",
    "replay": "replay of one stored key",
    "nokey": "no key (pass-through)",
}
STORES = ("memory", "sqlite", "redis", "postgres", "mysql")

# Peers from PyPI, pinned (the versions measured); each one runs on Redis.
PEERS: dict[str, str] = {
    "idemkit": "idemkit[redis]==1.0.2",
    "fastapi-idempotency-key": "fastapi-idempotency-key==0.1.1",
    # Its redis extra pins redis<5 and fastapi 0.70 (2022); its code runs on today's
    # redis.asyncio, and it imports fastapi.responses, so fastapi is installed beside it.
    "asgi-idempotency-header": "asgi-idempotency-header==0.2.0",
}
# Installed in the peers' venv at the main venv's versions, so every server runs the same stack.
SHARED_STACK = ("starlette", "uvicorn", "uvloop", "httptools", "redis", "hiredis", "fastapi")

# Issue 12 targets: minimum ratio to the bare endpoint, per scenario and store.
TARGETS: dict[str, dict[str, float]] = {
    "new": {"memory": 0.85, "sqlite": 0.45, "redis": 0.65, "postgres": 0.28},
    "replay": {"memory": 1.5, "sqlite": 1.0, "redis": 1.5, "postgres": 0.6},
    "nokey": {"memory": 0.98, "sqlite": 0.98, "redis": 0.98, "postgres": 0.98},
}
CLIENT_CPU_TARGET = 0.4  # postgres, new key: the client-CPU-only ratio


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- machine facts -------------------------------------------------------------------------------


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return out + ("+dirty" if dirty else "")


def version_of(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


# -- CPU accounting --------------------------------------------------------------------------------

CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid: int) -> float | None:
    """CPU seconds (user + system) a process has used, or None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def server_cpu(pid: int) -> float | None:
    """CPU seconds of a server process and its live children (gunicorn's worker)."""
    total = proc_cpu(pid)
    if total is None:
        return None
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        children = []
    return total + sum(proc_cpu(int(child)) or 0.0 for child in children)


def pids_named(prefix: str) -> list[int]:
    """Pids whose command name starts with ``prefix`` (read only; never signalled)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if (entry / "comm").read_text().strip().startswith(prefix):
                found.append(int(entry.name))
    return found


def cpu_snapshot(pids: list[int]) -> dict[int, float]:
    snapshot = {}
    for pid in pids:
        value = proc_cpu(pid)
        if value is not None:
            snapshot[pid] = value
    return snapshot


def cpu_delta(before: dict[int, float], after: dict[int, float]) -> float:
    # Only processes alive at both ends: a store's connections are opened during the warm-up,
    # so this keeps short-lived processes of other users of a shared server out of the sum.
    return sum(after[pid] - before[pid] for pid in before.keys() & after.keys())


# -- HTTP probe (raw socket) -----------------------------------------------------------------------


def http_post(
    port: int, key: str | None, timeout: float = 5.0, body: bytes = b'{"item":"book","quantity":2}'
) -> tuple[int, dict[str, str]]:
    """One ``POST /orders``; return the status and lower-cased headers."""
    head = [
        "POST /orders HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        "Connection: close",
    ]
    if key is not None:
        head.append(f"Idempotency-Key: {key}")
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall("\r\n".join(head).encode() + b"\r\n\r\n" + body)
        data = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    head_bytes = data.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    status = int(head_bytes[0].split()[1])
    headers = {}
    for line in head_bytes[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers


def is_replay(headers: dict[str, str]) -> bool:
    return any("replayed" in name and value == "true" for name, value in headers.items())


# -- servers -------------------------------------------------------------------------------------


@dataclass
class AppSpec:
    label: str  # row label, e.g. "retrysafe/redis"
    app: str  # bench/apps.py --app
    store_kind: str  # memory / sqlite / redis / postgres / "" for bare
    python: str
    store: str = ""
    prefix: str = ""
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    replay_key: str = ""
    checks: dict[str, str] = field(default_factory=dict)

    @property
    def is_peer(self) -> bool:
        return self.app not in OWN_APPS

    @property
    def bare_label(self) -> str:
        """The bare endpoint this app is measured against (ASGI or WSGI)."""
        return "wsgi bare" if self.app.startswith("wsgi-") else "bare"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def start_server(spec: AppSpec, pin: bool, profile_dir: Path | None) -> None:
    spec.port = free_port()
    cmd = [spec.python, str(BENCH / "apps.py"), "--app", spec.app, "--port", str(spec.port)]
    if spec.store:
        cmd += ["--store", spec.store]
    if spec.prefix:
        cmd += ["--prefix", spec.prefix]
    if pin:
        cmd += ["--cpu", str(SERVER_CPU)]
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src") if spec.app in OWN_APPS else ""
    if profile_dir is not None and spec.app == "retrysafe":
        env["BENCH_PROFILE"] = str(profile_dir / f"{spec.label.replace('/', '-')}.prof")
    spec.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL)
    wait_ready(spec, 20)


def wait_ready(spec: AppSpec, seconds: float) -> None:
    """Wait until the server answers a plain ``POST /orders`` with ``201``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert spec.proc is not None
        if spec.proc.poll() is not None:
            raise RuntimeError(f"{spec.label} exited with {spec.proc.returncode} at start")
        try:
            status, _ = http_post(spec.port, None, timeout=1.0)
        except OSError:
            time.sleep(0.1)
            continue
        if status != 201:
            raise RuntimeError(f"{spec.label} answered {status} to a plain POST /orders")
        return
    raise RuntimeError(f"{spec.label} did not start in {seconds:g} s")


def stop_server(spec: AppSpec) -> None:
    if spec.proc is None or spec.proc.poll() is not None:
        return
    spec.proc.send_signal(signal.SIGINT)  # uvicorn shuts down cleanly (and cProfile dumps)
    try:
        spec.proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        spec.proc.kill()
        spec.proc.wait()


def check_semantics(spec: AppSpec, nonce: str) -> None:
    """Probe what each scenario really does on this app; the table shows surprises."""
    if spec.app in BARE_APPS:
        spec.replay_key = f"{nonce}-replay-bare"
        spec.checks = {s: "ok" for s in SCENARIOS}
        return
    key = f"{nonce}-probe-{uuid.uuid4().hex[:8]}"
    first, _ = http_post(spec.port, key)
    second, headers = http_post(spec.port, key)
    spec.checks["new"] = "ok" if first == 201 else f"first request got {first}"
    spec.replay_key = f"{nonce}-replay-{uuid.uuid4().hex[:8]}"
    status, _ = http_post(spec.port, spec.replay_key)
    if status != 201:
        spec.checks["replay"] = f"storing the replay key got {status}"
    elif second == 201 and is_replay(headers):
        spec.checks["replay"] = "ok" if "location" in headers else "replay drops Location"
    elif second == 201:
        spec.checks["replay"] = "a repeat ran the handler again (no replay header)"
    else:
        spec.checks["replay"] = f"a repeat of a completed key got {second}, not a replay"
    # Same key, different body: the contract says 422 and nothing runs.
    mismatch, headers = http_post(spec.port, key, body=b'{"item":"pen","quantity":9}')
    if mismatch == 201 and is_replay(headers):
        spec.checks["mismatch"] = "a different body with a used key gets the old response"
    elif mismatch == 201:
        spec.checks["mismatch"] = "a different body with a used key runs again"
    elif mismatch != 422:
        spec.checks["mismatch"] = f"a different body with a used key got {mismatch}"
    status, headers = http_post(spec.port, None)
    spec.checks["nokey"] = "ok" if status == 201 and not is_replay(headers) else f"got {status}"


# -- load generator ------------------------------------------------------------------------------


def ensure_wrk(allow_install: bool) -> str | None:
    found = shutil.which("wrk")
    if found or not allow_install:
        return found
    if os.geteuid() == 0 and shutil.which("apt-get"):
        log("wrk is missing: apt-get install wrk")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        for cmd in (["apt-get", "install", "-y", "-q", "wrk"], ["apt-get", "update", "-q"]):
            subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, check=False)
            found = shutil.which("wrk")
            if found:
                return found
        subprocess.run(
            ["apt-get", "install", "-y", "-q", "wrk"],
            env=env,
            stdout=subprocess.DEVNULL,
            check=False,
        )
    return shutil.which("wrk")


def _pin_client() -> None:
    os.sched_setaffinity(0, {CLIENT_CPU})


def load(
    client: str | None,
    spec: AppSpec,
    mode: str,
    nonce: str,
    duration: float,
    connections: int,
    pin: bool,
) -> dict[str, Any]:
    key_nonce = spec.replay_key if mode == "replay" else nonce
    if client:
        cmd = [
            client,
            "-t1",
            f"-c{connections}",
            f"-d{max(1, round(duration))}s",
            "--timeout",
            "5s",
            "-s",
            str(BENCH / "wrk.lua"),
            f"http://127.0.0.1:{spec.port}/orders",
            "--",
            mode,
            key_nonce,
        ]
    else:
        cmd = [
            sys.executable,
            str(BENCH / "loadgen.py"),
            "--port",
            str(spec.port),
            "--mode",
            mode,
            "--nonce",
            key_nonce,
            "--duration",
            str(duration),
            "--connections",
            str(connections),
        ]
    out = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        preexec_fn=_pin_client if pin else None,
        timeout=duration + 60,
        check=False,
    )
    for line in out.stdout.splitlines():
        if line.startswith("BENCH_JSON "):
            result: dict[str, Any] = json.loads(line[len("BENCH_JSON ") :])
            return result
    raise RuntimeError(f"load generator failed on {spec.label}: {out.stdout}\n{out.stderr}")


# -- stores and peers ----------------------------------------------------------------------------


def module_available(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:
        return False


def redis_client(url: str) -> Any:
    import redis

    return redis.Redis.from_url(url, socket_connect_timeout=2)


def redis_reachable(url: str) -> str | None:
    if not module_available("redis"):
        return "redis-py is not installed"
    try:
        redis_client(url).ping()
    except Exception as exc:
        return f"Redis at {url} unreachable ({exc.__class__.__name__})"
    return None


def redis_cleanup(url: str, prefixes: list[str]) -> int:
    client = redis_client(url)
    deleted = 0
    for prefix in prefixes:
        batch = []
        for key in client.scan_iter(match=prefix + "*", count=1000):
            batch.append(key)
            if len(batch) >= 1000:
                deleted += client.delete(*batch)
                batch.clear()
        if batch:
            deleted += client.delete(*batch)
    return deleted


def postgres_connect(url: str) -> Any:
    import psycopg

    return psycopg.connect(url, autocommit=True, connect_timeout=3)


def postgres_reachable(url: str) -> str | None:
    if not module_available("psycopg"):
        return "psycopg is not installed"
    try:
        with postgres_connect(url) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:
        return f"PostgreSQL at {url} unreachable ({exc.__class__.__name__})"
    return None


def mysql_connect(url: str) -> Any:
    from urllib.parse import unquote, urlsplit

    import pymysql

    parts = urlsplit(url)
    return pymysql.connect(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 3306,
        user=unquote(parts.username or "root"),
        password=unquote(parts.password or ""),
        database=parts.path.strip("/"),
        autocommit=True,
        connect_timeout=3,
    )


def mysql_reachable(url: str) -> str | None:
    if not module_available("pymysql"):
        return "pymysql is not installed"
    try:
        with mysql_connect(url) as conn, conn.cursor() as cur:
            cur.execute("SELECT 1")
    except Exception as exc:
        return f"MySQL at {url} unreachable ({exc.__class__.__name__})"
    return None


def postgres_store_url(base: str, schema: str, app_name: str) -> str:
    """The store URL of the scratch schema's table, with an application_name to find it."""
    sep = "&" if "?" in base else "?"
    return f"{base}{sep}table={schema}.records&application_name={app_name}"


def postgres_pids(url: str, app_name: str) -> list[int]:
    """Backends of our store, plus the server's WAL writer, checkpointer and bgwriter."""
    with postgres_connect(url) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s "
            "OR backend_type IN ('walwriter', 'checkpointer', 'background writer')",
            (app_name,),
        ).fetchall()
    return [row[0] for row in rows]


def ensure_peers_venv(reinstall: bool) -> tuple[str | None, dict[str, str]]:
    """Create/refresh bench/.venv-bench-peers; return its python and the install problems."""
    python = PEERS_VENV / "bin" / "python"
    stack = []
    for package in SHARED_STACK:
        version = version_of(package)
        stack.append(f"{package}=={version}" if version else package)
    wanted = "\n".join([*PEERS.values(), *stack])
    stamp = PEERS_VENV / ".bench-requirements"
    problems: dict[str, str] = {}
    if reinstall or not python.exists() or not stamp.exists() or stamp.read_text() != wanted:
        log(f"creating {PEERS_VENV.relative_to(ROOT)} (peers from PyPI)")
        shutil.rmtree(PEERS_VENV, ignore_errors=True)
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", str(PEERS_VENV)], check=True)
        pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        result = subprocess.run([*pip, *stack], capture_output=True, text=True, check=False)
        if result.returncode != 0:
            return None, {"all": f"could not install the shared stack: {result.stderr[-500:]}"}
        for name, requirement in PEERS.items():
            result = subprocess.run(
                [*pip, requirement, *stack], capture_output=True, text=True, check=False
            )
            if result.returncode != 0:
                problems[name] = "pip install failed: " + result.stderr.strip()[-300:]
        stamp.write_text(wanted)
        (PEERS_VENV / ".bench-problems.json").write_text(json.dumps(problems))
    else:
        with contextlib.suppress(OSError, ValueError):
            problems = json.loads((PEERS_VENV / ".bench-problems.json").read_text())
    return str(python), problems


def peer_versions(python: str) -> dict[str, str]:
    code = (
        "import importlib.metadata as m, json, sys\n"
        "out = {}\n"
        "for p in sys.argv[1:]:\n"
        "    try: out[p] = m.version(p)\n"
        "    except m.PackageNotFoundError: pass\n"
        "print(json.dumps(out))\n"
    )
    names = [*PEERS, *SHARED_STACK]
    result = subprocess.run(
        [python, "-c", code, *names], capture_output=True, text=True, check=False
    )
    try:
        versions: dict[str, str] = json.loads(result.stdout)
    except ValueError:
        return {}
    return versions


# -- statistics and report -----------------------------------------------------------------------


def median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def summarize(runs: list[dict[str, Any]], specs: list[AppSpec]) -> list[dict[str, Any]]:
    rows = []
    for scenario in SCENARIOS:
        for spec in specs:
            mine = [r for r in runs if r["scenario"] == scenario and r["label"] == spec.label]
            if not mine:
                continue
            rps = median([r["rps"] for r in mine])
            cpu = median([r["cpu_us_per_req"] for r in mine])
            store_cpu = median([r["store_cpu_us_per_req"] for r in mine])
            bare_cpu = median([r["bare_cpu_us_per_req"] for r in mine])
            ratio = median([r["ratio"] for r in mine])
            row: dict[str, Any] = {
                "scenario": scenario,
                "label": spec.label,
                "store": spec.store_kind,
                "peer": spec.is_peer,
                "runs": len(mine),
                "rps": rps,
                "rps_all": [round(r["rps"]) for r in mine],
                "ratio": ratio,
                "ratio_all": [round(r["ratio"], 3) for r in mine if r["ratio"] is not None],
                "p50_ms": median([r["p50_us"] / 1000 for r in mine]),
                "p99_ms": median([r["p99_us"] / 1000 for r in mine]),
                "cpu_us_per_req": cpu,
                "server_util": median([r["server_util"] for r in mine]),
                "store_cpu_us_per_req": store_cpu,
                "client_cpu_ratio": (bare_cpu / cpu) if bare_cpu and cpu else None,
                "total_cpu_ratio": (
                    bare_cpu / (cpu + (store_cpu or 0.0)) if bare_cpu and cpu else None
                ),
                "non2xx": sum(r["errors_status"] for r in mine),
                "socket_errors": sum(
                    r["errors_connect"] + r["errors_read"] + r["errors_write"] + r["errors_timeout"]
                    for r in mine
                ),
                "check": spec.checks.get(scenario, ""),
            }
            target = None
            if spec.app in ("retrysafe", "wsgi-retrysafe"):
                target = TARGETS[scenario].get(spec.store_kind)
            row["target"] = target
            row["met"] = None if target is None or ratio is None else ratio >= target
            rows.append(row)
    bare_of = {spec.label: spec.bare_label for spec in specs}
    for row in rows:  # issue 12: p99 under load within 1.5x of the bare endpoint's
        bare = next(
            (
                r
                for r in rows
                if r["label"] == bare_of.get(row["label"]) and r["scenario"] == row["scenario"]
            ),
            None,
        )
        row["p99_x"] = (
            row["p99_ms"] / bare["p99_ms"] if bare and bare["p99_ms"] and row["p99_ms"] else None
        )
    return rows


def versus_peers(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """retrysafe/redis throughput over each peer's, per scenario (issue 6: >= 1.5x idemkit)."""
    out = []
    for scenario in SCENARIOS:
        ours = next(
            (r for r in rows if r["scenario"] == scenario and r["label"] == "retrysafe/redis"),
            None,
        )
        if ours is None or ours["rps"] is None:
            continue
        for row in rows:
            if row["scenario"] == scenario and row["peer"] and row["rps"]:
                out.append(
                    {
                        "scenario": scenario,
                        "peer": row["label"],
                        "throughput_x": ours["rps"] / row["rps"],
                        "ratio_x": (ours["ratio"] / row["ratio"]) if row["ratio"] else None,
                        "cpu_x": (
                            row["cpu_us_per_req"] / ours["cpu_us_per_req"]
                            if ours["cpu_us_per_req"] and row["cpu_us_per_req"]
                            else None
                        ),
                    }
                )
    return out


def versus_lean(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """retrysafe against the lean prototype on the same store, per scenario."""
    out = []
    for ours in rows:
        if "retrysafe/" not in ours["label"]:
            continue
        lean_label = ours["label"].replace("retrysafe/", "lean/")
        lean = next(
            (r for r in rows if r["scenario"] == ours["scenario"] and r["label"] == lean_label),
            None,
        )
        if lean is None or not lean["ratio"] or ours["ratio"] is None:
            continue
        out.append(
            {
                "scenario": ours["scenario"],
                "store": ours["label"].replace("retrysafe/", ""),
                "ratio": ours["ratio"],
                "lean_ratio": lean["ratio"],
                "cpu_extra_us": (
                    ours["cpu_us_per_req"] - lean["cpu_us_per_req"]
                    if ours["cpu_us_per_req"] and lean["cpu_us_per_req"]
                    else None
                ),
            }
        )
    return out


def markdown(report: dict[str, Any]) -> str:
    meta = report["meta"]
    lines = [
        f"# retrysafe benchmark, {meta['date']}",
        "",
        f"- machine: {meta['nproc']} cores, {meta['cpu_model']}; Python {meta['python']}",
        f"- commit: {meta['commit']}",
        f"- machine load during the runs (1-min load average, median): "
        f"{fmt(meta.get('loadavg_median'), '.1f')} on {meta['nproc']} cores "
        "(above ~2.5 other work shared the cores: read CPU us/req rather than req/s)",
        f"- load: {meta['client']}, {meta['connections']} connections, "
        f"{meta['duration']} s per run, {meta['repeat']} rounds; server pinned to core "
        f"{SERVER_CPU}, load generator to core {CLIENT_CPU}; uvicorn 1 worker, uvloop, httptools",
        f"- stack: {', '.join(f'{k} {v}' for k, v in meta['versions'].items())}",
    ]
    if report.get("metrics_hook_us"):
        cost = report["metrics_hook_us"]
        lines.append(
            f"- Prometheus hook per keyed request (in-process, executed + settled): "
            f"{cost['single_process']:.2f} us, {cost['multiprocess']:.2f} us in multiprocess "
            f"mode; timing one store call: {cost['single_process_store_call']:.2f} us, "
            f"{cost['multiprocess_store_call']:.2f} us"
        )
    if report.get("inprocess_us"):
        figures = report["inprocess_us"]
        lines += ["", "## in-process CPU per request (no server, no network)", ""]
        lines += ["| case | us/request |", "|---|---|"]
        lines += [f"| {name} | {value:.1f} |" for name, value in figures.items()]
        lines.append("")
    if meta.get("peer_versions"):
        lines.append(
            "- peers (bench/.venv-bench-peers): "
            + ", ".join(f"{k} {v}" for k, v in meta["peer_versions"].items() if k in PEERS)
        )
    lines += [
        "",
        "ratio = req/s over the bare endpoint measured around it in the same round (median of "
        "rounds); CPU = server process CPU per request (utime+stime); store CPU = redis-server or "
        "postgres processes per request; client-CPU ratio = bare CPU/req over the app's "
        "CPU/req (the throughput ratio if the store server had its own core); server busy = "
        "server CPU time over wall time (well under 100%: the server waited on the store, or "
        "was preempted by other work on its core; req/s is then noisy, CPU/req is not).",
        "",
    ]
    for scenario in SCENARIOS:
        rows = [r for r in report["rows"] if r["scenario"] == scenario]
        if not rows:
            continue
        lines += [
            f"## {SCENARIO_TITLES[scenario]}",
            "",
            "| app / store | req/s | ratio | target | p50 ms | p99 ms | p99 / bare | server busy "
            "| CPU us/req | store CPU us/req | client-CPU ratio | non-2xx | note |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for r in rows:
            target = ""
            if r["target"] is not None:
                target = f">= {r['target']:.2f} {'met' if r['met'] else 'MISSED'}"
            note = "" if r["check"] in ("ok", "") else r["check"]
            if r["socket_errors"]:
                note = (note + "; " if note else "") + f"{r['socket_errors']} socket errors"
            lines.append(
                f"| {r['label']} | {fmt(r['rps'], ',.0f')} | {fmt(r['ratio'], '.2f')} "
                f"| {target} | {fmt(r['p50_ms'], '.2f')} | {fmt(r['p99_ms'], '.2f')} "
                f"| {fmt(r.get('p99_x'), '.2f')} "
                f"| {fmt(r['server_util'] * 100 if r['server_util'] else None, '.0f')}% "
                f"| {fmt(r['cpu_us_per_req'], '.0f')} | {fmt(r['store_cpu_us_per_req'], '.0f')} "
                f"| {fmt(r['client_cpu_ratio'], '.2f')} | {r['non2xx']} | {note} |"
            )
        lines.append("")
    if report.get("sidecar"):
        import sidecar

        lines += sidecar.markdown(report["sidecar"])
    if report["versus_peers"]:
        lines += [
            "## retrysafe/redis against the peers (same Redis, same endpoint)",
            "",
            "| scenario | peer | retrysafe req/s over peer req/s | ratio over ratio "
            "| peer CPU/req over retrysafe CPU/req |",
            "|---|---|---:|---:|---:|",
        ]
        for v in report["versus_peers"]:
            lines.append(
                f"| {v['scenario']} | {v['peer']} | {v['throughput_x']:.2f}x "
                f"| {fmt(v['ratio_x'], '.2f')}x | {fmt(v['cpu_x'], '.2f')}x |"
            )
        lines.append("")
    if report.get("versus_lean"):
        lines += [
            "## retrysafe against the lean prototype (bench/lean.py, same store)",
            "",
            "| scenario | store | retrysafe ratio | lean ratio | retrysafe CPU/req over lean |",
            "|---|---|---:|---:|---:|",
        ]
        for v in report["versus_lean"]:
            lines.append(
                f"| {v['scenario']} | {v['store']} | {v['ratio']:.2f} | {v['lean_ratio']:.2f} "
                f"| {fmt(v['cpu_extra_us'], '+.0f')} us |"
            )
        lines.append("")
    notes = report.get("semantics", {})
    if notes:
        lines += ["## what the probes found (same key, repeat / different body)", ""]
        lines += [f"- {label}: {'; '.join(found)}" for label, found in notes.items()]
        lines.append("")
    if report["skipped"]:
        lines += ["## skipped", ""]
        lines += [f"- {name}: {why}" for name, why in report["skipped"].items()]
        lines.append("")
    if report.get("calls_us"):
        lines += [
            "## idempotent_function: a keyed call over the bare call (bench/calls.py)",
            "",
            "One caller, wall-clock us per call (best of 3 rounds); the function returns a small "
            "dict. New key: the first call with its key (reserve, run, store the result); "
            "replay: a duplicate (the stored result, decoded).",
            "",
            "| store | face | bare us | new key us | replay us | overhead us |",
            "|---|---|---:|---:|---:|---:|",
        ]
        for name, found in report["calls_us"].items():
            store, _, face = name.partition(" ")
            lines.append(
                f"| {store} | {face} | {found['bare']:.2f} | {found['new key']:.1f} "
                f"| {found['replay']:.1f} | {found['overhead']:.1f} |"
            )
        lines.append("")
    if report.get("replicas_us"):
        import replicas

        lines += replicas.markdown(report["replicas_us"], 32)
    if report.get("grpc_us"):
        lines += [
            "## gRPC: a unary call through the interceptor over the bare call (bench/rpc.py)",
            "",
            "A real server on loopback, one caller, CPU us per call of the process holding "
            "client and server (best of 3 rounds, bare, new key and replay interleaved). "
            "New key: the first call with its key; replay: a repeat (the stored response, "
            "nothing runs).",
            "",
            "| store | server | bare us | new key us | replay us | overhead us |",
            "|---|---|---:|---:|---:|---:|",
        ]
        for name, found in report["grpc_us"].items():
            store, _, face = name.partition(" ")
            lines.append(
                f"| {store} | {face} | {found['bare']:.1f} | {found['new key']:.1f} "
                f"| {found['replay']:.1f} | {found['overhead']:.1f} |"
            )
        lines.append("")
    if report.get("tasks_ms"):
        lines += [
            "## Celery: a keyed task over the bare task (bench/tasks.py)",
            "",
            "One `celery worker --pool solo` on the Redis broker serves both tasks; rounds of 200 "
            "tasks of each kind, interleaved, timed from the first send to the last result "
            "(Redis result backend); ms per task, best of 3 rounds.",
            "",
            "| broker, store | bare ms/task | keyed ms/task | overhead ms/task |",
            "|---|---:|---:|---:|",
        ]
        for name, found in report["tasks_ms"].items():
            lines.append(
                f"| {name} | {found['bare']:.2f} | {found['keyed']:.2f} | {found['overhead']:.2f} |"
            )
        lines.append("")
    if report.get("micro"):
        lines += [
            "## micro-benchmarks (pytest-benchmark, median)",
            "",
            "Async store operations are timed through `loop.run_until_complete`; the last column "
            "subtracts `test_loop_overhead` (the same call around an empty coroutine).",
            "",
            "| benchmark | median us | ops/s | store op net of loop us |",
            "|---|---:|---:|---:|",
        ]
        overhead = next(
            (m["median_us"] for m in report["micro"] if m["name"] == "test_loop_overhead"), 0.0
        )
        for m in report["micro"]:
            net = m["median_us"] - overhead if m["name"].startswith("test_store_") else None
            lines.append(
                f"| {m['name']} | {m['median_us']:.2f} | {m['ops']:,.0f} | {fmt(net, '.1f')} |"
            )
        lines.append("")
    return "\n".join(lines)


def run_micro(stamp: str, stores: list[str], env_urls: dict[str, str]) -> list[dict[str, Any]]:
    out_json = RESULTS / f"micro-{stamp}.json"
    env = dict(os.environ)
    env["BENCH_STORES"] = ",".join(stores)
    env.update(env_urls)
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        str(BENCH / "test_micro.py"),
        "--benchmark-only",
        "--benchmark-min-time=0.05",
        "--benchmark-max-time=0.5",
        "--benchmark-min-rounds=20",
        "--benchmark-columns=median,ops,rounds",
        "--benchmark-sort=name",
        f"--benchmark-json={out_json}",
        "-q",
        "-p",
        "no:cacheprovider",
    ]
    log("micro-benchmarks: " + " ".join(cmd[2:4]))
    result = subprocess.run(cmd, cwd=ROOT, env=env, check=False)
    if result.returncode != 0 or not out_json.exists():
        log(f"micro-benchmarks failed (exit {result.returncode})")
        return []
    data = json.loads(out_json.read_text())
    return [
        {
            "name": b["name"],
            "median_us": b["stats"]["median"] * 1e6,
            "ops": b["stats"]["ops"],
        }
        for b in data["benchmarks"]
    ]


# The Prometheus hook per keyed request: the middleware's _emit of "executed" and "settled" (the
# two events of every new key), with the hook minus without it. In a child process, since
# prometheus_client picks its multiprocess value class at import time.
_HOOK_COST = """
import sys, time
from prometheus_client import CollectorRegistry
from retrysafe import IdempotencyConfig
from retrysafe._core.http import notify
from retrysafe._core.request import Request
from retrysafe.contrib.prometheus import PrometheusMetrics

metrics = PrometheusMetrics(registry=CollectorRegistry())
hook = metrics.event_hook("memory")
observe = metrics.instrument("memory://")._observe
request = Request("POST", "/orders", b"", [b"k"], -1, b"", b"", None, [])
record = "0123456789abcdef0123"

def per_request(on_event, n=50_000):
    # What the runner does for the two events of every executed request (the flow yields them
    # only when a hook is set, so without one they cost nothing at all).
    config = IdempotencyConfig(on_event=on_event)
    best = float("inf")
    for _ in range(7):
        start = time.perf_counter()
        for _ in range(n):
            notify(config, "executed", request, record)
            notify(config, "settled", request, record)
        best = min(best, (time.perf_counter() - start) / n)
    return best

def per_store_call(n=50_000):
    best = float("inf")
    for _ in range(7):
        start = time.perf_counter()
        for _ in range(n):
            with observe("reserve"):
                pass
        best = min(best, (time.perf_counter() - start) / n)
    return best

print((per_request(hook) - per_request(None)) * 1e6, per_store_call() * 1e6)
"""


def inprocess_figures() -> dict[str, float] | None:
    """CPU microseconds per request of the middlewares driven in-process (bench/inprocess.py),
    in a process of their own so the load runs cannot disturb them."""
    result = subprocess.run(
        [sys.executable, str(BENCH / "inprocess.py"), "--json", "/dev/stdout"],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        log(f"in-process figures failed: {result.stderr.strip()[-300:]}")
        return None
    figures: dict[str, float] = json.loads(result.stdout[result.stdout.index("{") :])
    for name, value in figures.items():
        log(f"in-process {name}: {value:.1f} us/request")
    return figures


def call_figures(env_urls: dict[str, str]) -> dict[str, dict[str, float]] | None:
    """Microseconds per call of ``idempotent_function`` over the bare call, on each available
    store, def and async def (bench/calls.py), in a process of its own."""
    options = []
    if "BENCH_POSTGRES_URL" in env_urls:
        options += ["--postgres-url", env_urls["BENCH_POSTGRES_URL"]]
    if "BENCH_REDIS_URL" in env_urls:
        options += ["--redis-url", env_urls["BENCH_REDIS_URL"]]
    figures = _json_figures("calls.py", options, "call")
    for name, found in (figures or {}).items():
        log(f"call {name}: {found['overhead']:.1f} us over the bare call ({found})")
    return figures


def _json_figures(script: str, options: list[str], what: str) -> dict[str, Any] | None:
    """Run ``bench/<script> --json /dev/stdout`` in a process of its own; its figures, or
    ``None`` (logged) when it failed."""
    command = [sys.executable, str(BENCH / script), "--json", "/dev/stdout", *options]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        log(f"{what} figures failed: {result.stderr.strip()[-300:]}")
        return None
    figures: dict[str, Any] = json.loads(result.stdout[result.stdout.index("{") :])
    return figures


def replica_figures() -> dict[str, dict[str, float]] | None:
    """A new key on Redis with ``?replicas=1`` beside the default, on a master with one replica
    of the benchmark's own (bench/replicas.py), in a process of its own (None without
    redis-server on PATH)."""
    if shutil.which("redis-server") is None or not module_available("redis"):
        return None
    figures = _json_figures("replicas.py", [], "replica")
    for replicas, found in (figures or {}).items():
        log(f"redis replicas={replicas}: {found}")
    return figures


def rpc_figures() -> dict[str, dict[str, float]] | None:
    """Microseconds per unary gRPC call through the interceptors over the bare call, on the
    local stores, sync and aio (bench/rpc.py), in a process of its own."""
    command = [sys.executable, str(BENCH / "rpc.py"), "--json", "/dev/stdout"]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        log(f"gRPC figures failed: {result.stderr.strip()[-300:]}")
        return None
    figures: dict[str, dict[str, float]] = json.loads(result.stdout[result.stdout.index("{") :])
    for name, found in figures.items():
        log(f"gRPC {name}: {found['overhead']:.1f} us over the bare call ({found})")
    return figures


def task_figures(env_urls: dict[str, str]) -> dict[str, dict[str, float]] | None:
    """Milliseconds per task of a keyed Celery task and the bare one, same worker and Redis
    broker, on each available store (bench/tasks.py), in a process of its own (None without
    the celery extra or a Redis server)."""
    if not module_available("celery") or "BENCH_REDIS_URL" not in env_urls:
        return None
    command = [sys.executable, str(BENCH / "tasks.py"), "--json", "/dev/stdout"]
    command += ["--redis-url", env_urls["BENCH_REDIS_URL"], "--tasks", "200"]
    stores = ["sqlite", "redis"]
    if "BENCH_POSTGRES_URL" in env_urls:
        command += ["--postgres-url", env_urls["BENCH_POSTGRES_URL"]]
        stores.append("postgres")
    command += ["--stores", ",".join(stores)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        log(f"task figures failed: {result.stderr.strip()[-300:]}")
        return None
    figures: dict[str, dict[str, float]] = json.loads(result.stdout[result.stdout.index("{") :])
    for name, found in figures.items():
        log(f"task {name}: {found['overhead']:.2f} ms over the bare task ({found})")
    return figures


def metrics_hook_cost() -> dict[str, float] | None:
    """Microseconds the Prometheus hook adds per keyed request, and its timing of one store
    call, in one process and in multiprocess mode (None without the extra)."""
    if not module_available("prometheus_client"):
        return None
    found: dict[str, float] = {}
    for mode in ("single_process", "multiprocess"):
        env = dict(os.environ)
        env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        with tempfile.TemporaryDirectory() as tmp:
            if mode == "multiprocess":
                env["PROMETHEUS_MULTIPROC_DIR"] = tmp
            result = subprocess.run(
                [sys.executable, "-c", _HOOK_COST], env=env, capture_output=True, text=True
            )
        if result.returncode != 0:
            log(f"metrics hook measurement failed: {result.stderr.strip()[-300:]}")
            return None
        hook, store_call = (float(v) for v in result.stdout.split())
        found[mode] = round(hook, 3)
        found[mode + "_store_call"] = round(store_call, 3)
    log(f"metrics hook per keyed request: {found}")
    return found


# -- main ----------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per run")
    parser.add_argument("--repeat", type=int, default=2, help="rounds (A B A B ...)")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds of warm-up per app")
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--stores", default=",".join(STORES))
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--no-peers", action="store_true", help="skip the peers")
    parser.add_argument(
        "--no-lean", action="store_true", help="skip the lean-prototype baseline (bench/lean.py)"
    )
    parser.add_argument("--no-wsgi", action="store_true", help="skip the WSGI shell under gunicorn")
    parser.add_argument("--peers", default=",".join(PEERS), help="which peers")
    parser.add_argument("--reinstall-peers", action="store_true")
    parser.add_argument("--no-micro", action="store_true", help="skip the micro-benchmarks")
    parser.add_argument("--micro-only", action="store_true")
    parser.add_argument("--no-proxy", action="store_true", help="skip the sidecar proxy runs")
    parser.add_argument("--proxy-only", action="store_true", help="run only the sidecar proxy")
    parser.add_argument("--client", choices=("auto", "wrk", "python"), default="auto")
    parser.add_argument("--no-pin", action="store_true", help="do not pin to cores 0 and 1")
    parser.add_argument(
        "--profile",
        choices=("none", "cprofile", "py-spy"),
        default="none",
        help="profile the retrysafe servers (files under bench/results/)",
    )
    parser.add_argument(
        "--redis-url", default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
    )
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get("BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"),
    )
    parser.add_argument(
        "--mysql-url", default=os.environ.get("BENCH_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")
    )
    return parser.parse_args(argv)


def measure_sidecar(args: argparse.Namespace, client: str | None) -> dict[str, Any]:
    """The sidecar proxy's runs (``bench/sidecar.py``)."""
    import sidecar

    redis_url = None if redis_reachable(args.redis_url) else args.redis_url
    return sidecar.run_sidecar(
        client,
        duration=args.duration,
        repeat=args.repeat,
        warmup=args.warmup,
        redis_url=redis_url,
    )


def proxy_only(args: argparse.Namespace, client: str | None, started: Any, stamp: str) -> int:
    """``--proxy-only``: the sidecar's runs and report, nothing else."""
    import sidecar

    report = measure_sidecar(args, client)
    meta = (
        f"# retrysafe proxy benchmark, {started.strftime('%Y-%m-%d %H:%M UTC')}\n\n"
        f"- machine: {os.cpu_count()} cores, {cpu_model()}; Python {platform.python_version()}\n"
        f"- commit: {git_commit()}; load: wrk -t1, {args.duration} s per run, "
        f"{args.repeat} rounds\n\n"
    )
    md = meta + "\n".join(sidecar.markdown(report))
    (RESULTS / f"bench-proxy-{stamp}.json").write_text(json.dumps(report, indent=2))
    (RESULTS / f"bench-proxy-{stamp}.md").write_text(md)
    print(md)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    RESULTS.mkdir(parents=True, exist_ok=True)
    started = dt.datetime.now(dt.UTC)
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    nonce = f"bench{uuid.uuid4().hex[:10]}"
    stores = [s for s in args.stores.split(",") if s]
    scenarios = [s for s in args.scenarios.split(",") if s]
    pin = not args.no_pin and (os.cpu_count() or 1) >= 2
    skipped: dict[str, str] = {}
    redis_prefixes: list[str] = []
    pg_schema = f"bench_{nonce}"
    pg_created = False
    env_urls: dict[str, str] = {}

    # Stores: module present? service reachable?
    available: list[str] = []
    for store in stores:
        if store in ("redis", "postgres", "mysql") and not module_available(
            f"retrysafe.stores.{store}"
        ):
            skipped[f"retrysafe/{store}"] = f"module retrysafe.stores.{store} is not there yet"
            continue
        if store == "redis":
            problem = redis_reachable(args.redis_url)
            if problem:
                skipped["retrysafe/redis"] = problem
                continue
            env_urls["BENCH_REDIS_URL"] = args.redis_url
        if store == "postgres":
            problem = postgres_reachable(args.postgres_url)
            if problem:
                skipped["retrysafe/postgres"] = problem
                continue
            env_urls["BENCH_POSTGRES_URL"] = args.postgres_url
        if store == "mysql":
            problem = mysql_reachable(args.mysql_url)
            if problem:
                skipped["retrysafe/mysql"] = problem
                continue
        available.append(store)

    micro: list[dict[str, Any]] = []
    if args.micro_only:
        micro = run_micro(stamp, available, env_urls)
        for m in micro:
            print(f"{m['name']:60s} {m['median_us']:10.2f} us")
        metrics_hook_cost()
        inprocess_figures()
        call_figures(env_urls)
        return 0

    client: str | None = None
    if args.client in ("auto", "wrk"):
        client = ensure_wrk(allow_install=True)
        if client is None and args.client == "wrk":
            log("wrk is not available")
            return 2
    client_name = "wrk 4 (-t1)" if client else "bench/loadgen.py (asyncio raw sockets)"
    log(f"load generator: {client_name}")
    if args.proxy_only:
        return proxy_only(args, client, started, stamp)

    tmpdir = Path(tempfile.mkdtemp(prefix="retrysafe-bench-"))
    profile_dir = RESULTS / f"profile-{stamp}" if args.profile == "cprofile" else None
    if profile_dir:
        profile_dir.mkdir(parents=True, exist_ok=True)
    main_python = sys.executable
    specs: list[AppSpec] = [AppSpec("bare", "bare", "", main_python)]
    for store in available:
        url = {"memory": "memory://", "sqlite": f"sqlite:///{tmpdir}/bench.db"}.get(store, "")
        if store == "redis":
            prefix = f"{nonce}:retrysafe:"
            redis_prefixes.append(prefix)
            sep = "&" if "?" in args.redis_url else "?"
            url = f"{args.redis_url}{sep}prefix={prefix}"
        if store == "postgres":
            with postgres_connect(args.postgres_url) as conn:
                conn.execute(f'CREATE SCHEMA "{pg_schema}"')
            pg_created = True
            url = postgres_store_url(args.postgres_url, pg_schema, pg_schema)
        if store == "mysql":
            sep = "&" if "?" in args.mysql_url else "?"
            url = f"{args.mysql_url}{sep}table={nonce}_records"
        specs.append(AppSpec(f"retrysafe/{store}", "retrysafe", store, main_python, url))
        if not args.no_lean and store != "mysql":  # the lean prototype has no MySQL backend
            lean_url = {"sqlite": f"sqlite:///{tmpdir}/lean.db"}.get(store, url)
            if store == "redis":
                redis_prefixes.append(f"{nonce}:lean:")
                lean_url = f"{args.redis_url}{sep}prefix={nonce}:lean:"
            specs.append(AppSpec(f"lean/{store}", "lean", store, main_python, lean_url))

    peer_meta: dict[str, str] = {}
    wanted_peers = [] if args.no_peers else [p for p in args.peers.split(",") if p]
    if wanted_peers:
        problem = redis_reachable(args.redis_url)
        if problem:
            for peer in wanted_peers:
                skipped[f"{peer}/redis"] = problem
        else:
            peers_python, problems = ensure_peers_venv(args.reinstall_peers)
            if peers_python is None:
                for peer in wanted_peers:
                    skipped[f"{peer}/redis"] = problems.get("all", "peers venv failed")
            else:
                peer_meta = peer_versions(peers_python)
                for peer in wanted_peers:
                    if peer in problems:
                        skipped[f"{peer}/redis"] = problems[peer]
                        continue
                    prefix = f"{nonce}:{peer}:"
                    redis_prefixes.append(prefix)
                    specs.append(
                        AppSpec(
                            f"{peer}/redis", peer, "redis", peers_python, args.redis_url, prefix
                        )
                    )

    if not args.no_wsgi:
        # The WSGI shell under gunicorn, against a bare WSGI app, on every store retrysafe runs on.
        specs.append(AppSpec("wsgi bare", "wsgi-bare", "", main_python))
        for asgi_spec in [spec for spec in specs if spec.app == "retrysafe"]:
            url = asgi_spec.store
            if asgi_spec.store_kind == "sqlite":
                url = f"sqlite:///{tmpdir}/bench-wsgi.db"
            elif asgi_spec.store_kind == "mysql":
                url = url.replace(f"table={nonce}_records", f"table={nonce}_wsgi")
            elif asgi_spec.store_kind == "redis":
                redis_prefixes.append(f"{nonce}:wsgi:")
                url = url.replace(f"prefix={nonce}:retrysafe:", f"prefix={nonce}:wsgi:")
            specs.append(
                AppSpec(
                    f"wsgi {asgi_spec.label}", "wsgi-retrysafe", asgi_spec.store_kind,
                    main_python, url,
                )
            )  # fmt: skip
        if not args.no_lean and "memory" in available:
            specs.append(AppSpec("wsgi lean/memory", "wsgi-lean", "memory", main_python))

    runs: list[dict[str, Any]] = []
    started_specs: list[AppSpec] = []
    pyspy_procs: list[subprocess.Popen[bytes]] = []
    try:
        for spec in list(specs):
            log(f"starting {spec.label}")
            try:
                start_server(spec, pin, profile_dir)
            except RuntimeError as exc:
                skipped[spec.label] = str(exc)
                specs.remove(spec)
                stop_server(spec)
                continue
            started_specs.append(spec)
            check_semantics(spec, nonce)
            if any(v != "ok" for v in spec.checks.values()):
                log(f"{spec.label}: {spec.checks}")
        # Each shell's apps run against its own bare endpoint: (bare, the apps measured on it).
        groups = [
            (bare, [spec for spec in specs if spec.bare_label == bare.label and spec is not bare])
            for bare in specs
            if bare.app in BARE_APPS
        ]
        others = [spec for spec in specs if spec.app not in BARE_APPS]

        # Warm-up: every app, every scenario (opens store connections, fills caches).
        for spec in specs:
            for mode in scenarios:
                load(client, spec, mode, f"{nonce}w", args.warmup, args.connections, pin)

        if args.profile == "py-spy":
            pyspy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
            for spec in others:
                if spec.app != "retrysafe" or not Path(pyspy).exists():
                    continue
                svg = RESULTS / f"pyspy-{stamp}-{spec.label.replace('/', '-')}.txt"
                pyspy_procs.append(
                    subprocess.Popen(
                        [
                            pyspy,
                            "record",
                            "--pid",
                            str(spec.proc.pid if spec.proc else 0),
                            "--format",
                            "raw",
                            "--output",
                            str(svg),
                            "--rate",
                            "200",
                            "--nonblocking",
                        ],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                )

        redis_pids = pids_named("redis-server")
        pg_pids = (
            postgres_pids(args.postgres_url, pg_schema) if pg_created else pids_named("postgres")
        )
        mysql_pids = pids_named("mariadbd") + pids_named("mysqld")
        for round_no in range(args.repeat):
            for scenario in scenarios:
                for bare, group in groups:
                    # bare X1 X2 bare X3 X4 ... bare; rotate so no app always runs first.
                    rotated = (
                        group[round_no % max(1, len(group)) :]
                        + group[: round_no % max(1, len(group))]
                    )
                    sequence: list[AppSpec] = [bare]
                    for i, spec in enumerate(rotated):
                        sequence.append(spec)
                        if i % 2 == 1 or i == len(rotated) - 1:
                            sequence.append(bare)
                    round_runs: list[dict[str, Any]] = []
                    for spec in sequence:
                        store_pids = {
                            "redis": redis_pids,
                            "postgres": pg_pids,
                            "mysql": mysql_pids,
                        }.get(spec.store_kind, [])
                        assert spec.proc is not None
                        load_before = os.getloadavg()[0]
                        before = server_cpu(spec.proc.pid) or 0.0
                        store_before = cpu_snapshot(store_pids)
                        run_nonce = f"{nonce}r{round_no}{scenario}{len(runs)}"
                        result = load(
                            client, spec, scenario, run_nonce, args.duration, args.connections, pin
                        )
                        after = server_cpu(spec.proc.pid) or 0.0
                        store_after = cpu_snapshot(store_pids)
                        requests = max(1, result["requests"])
                        result.update(
                            label=spec.label,
                            scenario=scenario,
                            round=round_no,
                            rps=result["requests"] / (result["duration_us"] / 1e6),
                            cpu_us_per_req=(after - before) * 1e6 / requests,
                            server_util=(after - before) / (result["duration_us"] / 1e6),
                            loadavg=max(load_before, os.getloadavg()[0]),
                            store_cpu_us_per_req=(
                                cpu_delta(store_before, store_after) * 1e6 / requests
                                if store_pids
                                else None
                            ),
                        )
                        round_runs.append(result)
                        log(
                            f"round {round_no + 1}/{args.repeat} {scenario:6s} {spec.label:32s} "
                            f"{result['rps']:9,.0f} req/s  p99 {result['p99_us'] / 1000:6.2f} ms  "
                            f"cpu {result['cpu_us_per_req']:6.0f} us/req"
                            + (
                                f"  non-2xx {result['errors_status']}"
                                if result["errors_status"]
                                else ""
                            )
                        )
                    # Each app against the mean of the bare runs just before and after it.
                    for i, result in enumerate(round_runs):
                        if result["label"] == bare.label:
                            continue
                        prev_bare = next(
                            r for r in reversed(round_runs[:i]) if r["label"] == bare.label
                        )
                        next_bare = next(r for r in round_runs[i + 1 :] if r["label"] == bare.label)
                        bare_rps = (prev_bare["rps"] + next_bare["rps"]) / 2
                        result["ratio"] = result["rps"] / bare_rps if bare_rps else None
                        result["bare_cpu_us_per_req"] = (
                            prev_bare["cpu_us_per_req"] + next_bare["cpu_us_per_req"]
                        ) / 2
                    for result in round_runs:
                        if result["label"] == bare.label:
                            result["ratio"] = 1.0
                            result["bare_cpu_us_per_req"] = result["cpu_us_per_req"]
                    runs.extend(round_runs)
    finally:
        for proc in pyspy_procs:
            proc.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
        for spec in started_specs:
            stop_server(spec)
        if redis_prefixes:
            with contextlib.suppress(Exception):
                n = redis_cleanup(args.redis_url, redis_prefixes)
                log(f"removed {n} Redis keys under {nonce}:*")
        if "mysql" in available:
            with contextlib.suppress(Exception), mysql_connect(args.mysql_url) as conn:
                for table in (f"{nonce}_records", f"{nonce}_wsgi"):
                    conn.cursor().execute(f"DROP TABLE IF EXISTS `{table}`")
                log(f"dropped MySQL tables {nonce}_*")
        if pg_created:
            with contextlib.suppress(Exception), postgres_connect(args.postgres_url) as conn:
                conn.execute(f'DROP SCHEMA "{pg_schema}" CASCADE')
                log(f"dropped PostgreSQL schema {pg_schema}")
        shutil.rmtree(tmpdir, ignore_errors=True)

    sidecar_report = None
    if not args.no_proxy:
        sidecar_report = measure_sidecar(args, client)
    if not args.no_micro:
        micro = run_micro(stamp, available, env_urls)
    hook_cost = metrics_hook_cost()
    inprocess = inprocess_figures()
    calls = call_figures(env_urls)
    replicas = replica_figures()
    tasks = task_figures(env_urls)
    rpc = rpc_figures()

    rows = summarize(runs, specs)
    versions = {p: v for p in SHARED_STACK if (v := version_of(p))}
    versions["retrysafe"] = version_of("retrysafe") or "?"
    report = {
        "meta": {
            "date": started.strftime("%Y-%m-%d %H:%M UTC"),
            "nproc": os.cpu_count(),
            "cpu_model": cpu_model(),
            "python": platform.python_version(),
            "commit": git_commit(),
            "client": client_name,
            "connections": args.connections,
            "duration": args.duration,
            "repeat": args.repeat,
            "pinned": pin,
            "versions": versions,
            "peer_versions": peer_meta,
            "loadavg_median": median([r["loadavg"] for r in runs]),
            "elapsed_s": round((dt.datetime.now(dt.UTC) - started).total_seconds()),
        },
        "rows": rows,
        "versus_peers": versus_peers(rows),
        "versus_lean": versus_lean(rows),
        "skipped": skipped,
        "semantics": {
            spec.label: [v for k, v in spec.checks.items() if v != "ok"]
            for spec in specs
            if any(v != "ok" for v in spec.checks.values())
        },
        "micro": micro,
        "metrics_hook_us": hook_cost,
        "inprocess_us": inprocess,
        "calls_us": calls,
        "replicas_us": replicas,
        "tasks_ms": tasks,
        "grpc_us": rpc,
        "runs": runs,
        "sidecar": sidecar_report,
    }
    md = markdown(report)
    (RESULTS / f"bench-{stamp}.json").write_text(json.dumps(report, indent=2))
    (RESULTS / f"bench-{stamp}.md").write_text(md)
    shutil.copyfile(RESULTS / f"bench-{stamp}.md", RESULTS / "latest.md")
    shutil.copyfile(RESULTS / f"bench-{stamp}.json", RESULTS / "latest.json")
    print(md)
    log(f"results: bench/results/bench-{stamp}.json and .md ({report['meta']['elapsed_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
