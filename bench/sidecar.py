"""The `retrysafe proxy` part of `make bench`: the sidecar against the backend it fronts.

One backend (the bare endpoint of ``bench/apps.py`` under uvicorn, 1 worker), and in front of it,
each in its own process: ``retrysafe proxy`` on memory, SQLite and Redis (its defaults: no
access log, which would cost the proxy about 58 us of CPU per request), and nginx from Debian's
package as a plain reverse proxy (keep-alive upstream, no access log): the reference for what
forwarding itself costs. wrk (``-t1``) drives, per concurrency (1, 32 and 128), interleaved with
the backend itself: ``direct X1 X2 direct X3 X4 ... direct``; each row's ratio is its req/s
over the mean of the two direct runs around it. Rows: direct, nginx, the proxy with no key
(pure forwarding), a new key per request on each store, and replays of one stored key on each
store. Around each run the CPU time of the proxy (or nginx), the backend and the store server is
read, so CPU per request stands next to req/s.

Nothing is pinned to a core here: three processes (load generator, proxy, backend) share the
machine's cores, as they would on a host running a sidecar.

Run alone (the same as the proxy part of ``make bench``)::

    .venv/bin/python bench/sidecar.py --duration 5
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import run
from run import AppSpec, log, median, pids_named, server_cpu

CONCURRENCY = (1, 32, 128)
#: (row label, proxy, wrk mode): "direct" and "nginx" are the references.
ROWS: tuple[tuple[str, str, str], ...] = (
    ("nginx", "nginx", "new"),
    ("proxy, no key", "memory", "nokey"),
    ("proxy memory, new key", "memory", "new"),
    ("proxy sqlite, new key", "sqlite", "new"),
    ("proxy redis, new key", "redis", "new"),
    ("proxy memory, replay", "memory", "replay"),
    ("proxy sqlite, replay", "sqlite", "replay"),
    ("proxy redis, replay", "redis", "replay"),
)
#: Minimum ratio to direct at c=32 (a sidecar's budget on this machine class).
TARGETS = {
    "proxy, no key": 0.33,
    "proxy memory, new key": 0.25,
    "proxy redis, new key": 0.2,
    "proxy memory, replay": 0.3,
    "proxy sqlite, replay": 0.3,
    "proxy redis, replay": 0.3,
}
#: What the proxy may add to the median latency at c=1, in ms.
ADDED_MS = 1.0

NGINX_CONF = """
worker_processes 1;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    upstream backend {{ server 127.0.0.1:{upstream}; keepalive 64; }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}
}}
"""


def ensure_nginx() -> str | None:
    """Debian's nginx (``apt-get install nginx`` when missing and running as root)."""
    found = shutil.which("nginx") or (
        "/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None
    )
    if found or os.geteuid() != 0 or not shutil.which("apt-get"):
        return found
    log("nginx is missing: apt-get install nginx")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "install", "-y", "-q", "nginx"], ["apt-get", "update", "-q"]):
        subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, check=False)
        if Path("/usr/sbin/nginx").exists():
            return "/usr/sbin/nginx"
    subprocess.run(
        ["apt-get", "install", "-y", "-q", "nginx"], env=env, stdout=subprocess.DEVNULL, check=False
    )
    return shutil.which("nginx") or (
        "/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None
    )


def start_proxy(spec: AppSpec, upstream: int) -> None:
    spec.port = run.free_port()
    cmd = [spec.python, "-m", "retrysafe", "proxy", "--listen", f"127.0.0.1:{spec.port}"]
    cmd += ["--upstream", f"http://127.0.0.1:{upstream}", "--store", spec.store]
    env = dict(os.environ, PYTHONPATH=str(run.ROOT / "src"))
    spec.proc = subprocess.Popen(cmd, cwd=run.ROOT, env=env, stdin=subprocess.DEVNULL)
    run.wait_ready(spec, 30)


def start_nginx(spec: AppSpec, nginx: str, upstream: int, workdir: Path) -> None:
    spec.port = run.free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    workdir.chmod(0o777)  # nginx's workers run as nobody and write their temp files here
    conf = workdir / "nginx.conf"
    conf.write_text(NGINX_CONF.format(dir=workdir, upstream=upstream, port=spec.port))
    spec.proc = subprocess.Popen(
        [nginx, "-c", str(conf), "-p", str(workdir)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    run.wait_ready(spec, 30)


def stop(spec: AppSpec) -> None:
    if spec.proc is None or spec.proc.poll() is not None:
        return
    spec.proc.send_signal(signal.SIGINT if spec.app != "nginx" else signal.SIGQUIT)
    try:
        spec.proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        spec.proc.kill()
        spec.proc.wait()


def _measure(
    client: str | None,
    spec: AppSpec,
    mode: str,
    nonce: str,
    duration: float,
    connections: int,
    backend: AppSpec,
    store_pids: list[int],
) -> dict[str, Any]:
    assert spec.proc is not None and backend.proc is not None
    load_before = os.getloadavg()[0]
    before = server_cpu(spec.proc.pid) or 0.0
    backend_before = server_cpu(backend.proc.pid) or 0.0
    store_before = run.cpu_snapshot(store_pids)
    result = run.load(client, spec, mode, nonce, duration, connections, pin=False)
    after = server_cpu(spec.proc.pid) or 0.0
    backend_after = server_cpu(backend.proc.pid) or 0.0
    store_after = run.cpu_snapshot(store_pids)
    requests = max(1, result["requests"])
    result.update(
        loadavg=max(load_before, os.getloadavg()[0]),
        rps=result["requests"] / (result["duration_us"] / 1e6),
        proxy_cpu_us=None if spec is backend else (after - before) * 1e6 / requests,
        backend_cpu_us=(backend_after - backend_before) * 1e6 / requests,
        store_cpu_us=run.cpu_delta(store_before, store_after) * 1e6 / requests
        if store_pids
        else None,
    )
    return result


def run_sidecar(
    client: str | None,
    *,
    duration: float,
    repeat: int,
    warmup: float,
    redis_url: str | None,
    concurrency: tuple[int, ...] = CONCURRENCY,
) -> dict[str, Any]:
    """Measure the sidecar; return the rows and what was skipped (see the module docstring)."""
    nonce = f"side{uuid.uuid4().hex[:10]}"
    python = sys.executable
    tmpdir = Path(tempfile.mkdtemp(prefix="retrysafe-sidecar-"))
    skipped: dict[str, str] = {}
    backend = AppSpec("direct", "bare", "", python)
    proxies: dict[str, AppSpec] = {}
    stores = {"memory": "memory://", "sqlite": f"sqlite:///{tmpdir}/proxy.db"}
    prefix = f"{nonce}:proxy:"
    if redis_url is None:
        skipped["proxy redis"] = "no Redis"
    else:
        sep = "&" if "?" in redis_url else "?"
        stores["redis"] = f"{redis_url}{sep}prefix={prefix}"
    runs: list[dict[str, Any]] = []
    try:
        run.start_server(backend, pin=False, profile_dir=None)
        run.check_semantics(backend, nonce)
        for kind, url in stores.items():
            spec = AppSpec(f"proxy {kind}", "proxy", kind, python, url)
            log(f"starting {spec.label}")
            start_proxy(spec, backend.port)
            run.check_semantics(spec, nonce)
            if any(v != "ok" for v in spec.checks.values()):
                log(f"{spec.label}: {spec.checks}")
            proxies[kind] = spec
        nginx = ensure_nginx()
        if nginx is None:
            skipped["nginx"] = "nginx is not installed (apt-get install nginx)"
        else:
            spec = AppSpec("nginx", "nginx", "", python)
            start_nginx(spec, nginx, backend.port, tmpdir / "nginx")
            spec.replay_key = backend.replay_key
            proxies["nginx"] = spec
        rows = [(label, proxies[kind], mode) for label, kind, mode in ROWS if kind in proxies]
        redis_pids = pids_named("redis-server")
        for _label, spec, mode in [("direct", backend, "new"), *rows]:
            run.load(client, spec, mode, f"{nonce}w", warmup, 32, pin=False)
        for round_no in range(repeat):
            for connections in concurrency:
                rotated = rows[round_no % len(rows) :] + rows[: round_no % len(rows)]
                sequence: list[tuple[str, AppSpec, str]] = [("direct", backend, "new")]
                for i, row in enumerate(rotated):
                    sequence.append(row)
                    if i % 2 == 1 or i == len(rotated) - 1:
                        sequence.append(("direct", backend, "new"))
                measured = []
                for label, spec, mode in sequence:
                    pids = redis_pids if spec.store_kind == "redis" else []
                    run_nonce = f"{nonce}r{round_no}c{connections}{len(runs) + len(measured)}"
                    result = _measure(
                        client, spec, mode, run_nonce, duration, connections, backend, pids
                    )
                    result.update(label=label, connections=connections, round=round_no)
                    measured.append(result)
                    log(
                        f"sidecar c={connections:<3d} {label:24s} {result['rps']:9,.0f} req/s  "
                        f"p50 {result['p50_us'] / 1000:6.2f} ms  proxy "
                        f"{run.fmt(result['proxy_cpu_us'], '5.0f')} us/req  backend "
                        f"{result['backend_cpu_us']:5.0f} us/req"
                        + (
                            f"  non-2xx {result['errors_status']}"
                            if result["errors_status"]
                            else ""
                        )
                    )
                for i, result in enumerate(measured):
                    if result["label"] == "direct":
                        result["ratio"] = 1.0
                        continue
                    prev = next(r for r in reversed(measured[:i]) if r["label"] == "direct")
                    nxt = next(r for r in measured[i + 1 :] if r["label"] == "direct")
                    result["direct_rps"] = (prev["rps"] + nxt["rps"]) / 2
                    result["direct_p50_us"] = (prev["p50_us"] + nxt["p50_us"]) / 2
                    result["ratio"] = result["rps"] / result["direct_rps"]
                runs.extend(measured)
    finally:
        for spec in [*proxies.values(), backend]:
            stop(spec)
        if redis_url is not None:
            with contextlib.suppress(Exception):
                run.redis_cleanup(redis_url, [prefix])
        shutil.rmtree(tmpdir, ignore_errors=True)
    checks = {spec.label: spec.checks for spec in proxies.values() if spec.app == "proxy"}
    return {"rows": summarize(runs), "skipped": skipped, "checks": checks, "runs": runs}


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (label, concurrency): medians over the rounds."""
    rows = []
    labels = ["direct", *(label for label, _, _ in ROWS)]
    for connections in sorted({r["connections"] for r in runs}):
        rows_before = len(rows)
        for label in labels:
            mine = [r for r in runs if r["label"] == label and r["connections"] == connections]
            if not mine:
                continue
            row: dict[str, Any] = {
                "label": label,
                "connections": connections,
                "rps": median([r["rps"] for r in mine]),
                "ratio": median([r["ratio"] for r in mine]),
                "p50_ms": median([r["p50_us"] / 1000 for r in mine]),
                "p99_ms": median([r["p99_us"] / 1000 for r in mine]),
                "added_p50_ms": median(
                    [
                        (r["p50_us"] - r["direct_p50_us"]) / 1000
                        for r in mine
                        if "direct_p50_us" in r
                    ]
                ),
                "proxy_cpu_us": median([r["proxy_cpu_us"] for r in mine]),
                "backend_cpu_us": median([r["backend_cpu_us"] for r in mine]),
                "store_cpu_us": median([r["store_cpu_us"] for r in mine]),
                "non2xx": sum(r["errors_status"] for r in mine),
                "socket_errors": sum(
                    r["errors_connect"] + r["errors_read"] + r["errors_write"] + r["errors_timeout"]
                    for r in mine
                ),
            }
            direct = next((r for r in rows[rows_before:] if r["label"] == "direct"), None)
            spent = (
                (row["proxy_cpu_us"] or 0.0) + row["backend_cpu_us"] + (row["store_cpu_us"] or 0.0)
            )
            # The ratio if CPU were all that counted: direct's backend CPU over all the CPU a
            # proxied request costs (steadier than req/s when other work shares the machine).
            row["cpu_ratio"] = (
                direct["backend_cpu_us"] / spent
                if direct and direct["connections"] == connections and spent
                else None
            )
            target = TARGETS.get(label) if connections == 32 else None
            row["target"] = target
            row["met"] = None if target is None or row["ratio"] is None else row["ratio"] >= target
            rows.append(row)
    return rows


def verdicts(rows: list[dict[str, Any]]) -> list[str]:
    """The claims the sidecar's figures make, each with met / MISSED."""
    out = []
    for row in rows:
        if row["target"] is not None:
            out.append(
                f"{row['label']} at c=32: {run.fmt(row['ratio'], '.2f')}x direct "
                f"(>= {row['target']:.2f}: {'met' if row['met'] else 'MISSED'})"
            )
    for row in rows:
        if row["connections"] == 1 and row["label"].startswith("proxy") and row["added_p50_ms"]:
            ok = row["added_p50_ms"] <= ADDED_MS
            out.append(
                f"{row['label']} at c=1 adds {row['added_p50_ms']:.2f} ms to the median "
                f"(<= {ADDED_MS:.0f} ms: {'met' if ok else 'MISSED'})"
            )
    by_label: dict[str, dict[int, float]] = {}
    for row in rows:
        by_label.setdefault(row["label"], {})[row["connections"]] = row["rps"]
    for label, series in by_label.items():
        if not label.startswith("proxy") or len(series) < 2:
            continue
        levels = sorted(series)
        # "Does not fall": each level keeps at least 90% of the one below (run-to-run noise).
        holds = all(series[b] >= 0.9 * series[a] for a, b in itertools.pairwise(levels))
        shown = " -> ".join(f"{series[c]:,.0f}" for c in levels)
        out.append(
            f"{label}, req/s at c={'/'.join(map(str, levels))}: {shown} "
            f"({'does not fall' if holds else 'FALLS'})"
        )
    nginx = {r["connections"]: r for r in rows if r["label"] == "nginx"}
    for row in rows:
        other = nginx.get(row["connections"])
        if row["label"] == "proxy, no key" and other and other["rps"] and row["rps"]:
            out.append(
                f"pure forwarding at c={row['connections']}: the proxy does "
                f"{row['rps'] / other['rps']:.2f}x nginx's req/s; CPU per request "
                f"{run.fmt(row['proxy_cpu_us'], '.0f')} us against nginx's "
                f"{run.fmt(other['proxy_cpu_us'], '.0f')} us"
            )
    return out


def markdown(report: dict[str, Any]) -> list[str]:
    """The sidecar's section of the bench report."""
    loads = [r["loadavg"] for r in report.get("runs", []) if "loadavg" in r]
    lines = [
        "## retrysafe proxy (sidecar) in front of the bare endpoint",
        "",
        f"Load average (1 min) during the runs: median {median(loads):.1f}, "
        f"{min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} cores; the machine's other "
        "work moves req/s far more than the CPU columns."
        if loads
        else "",
        "",
        "The backend: the bare endpoint (uvicorn, 1 worker). Proxy: `retrysafe proxy` with its "
        "defaults (1 worker, no access log), no core pinning (load "
        "generator, proxy and backend share the cores). ratio = req/s over direct (the backend "
        "alone) measured around it; CPU = "
        "process CPU per request (utime+stime) of the proxy (or nginx), the backend and the "
        "store server; CPU ratio = direct's backend CPU/req over the sum of those (the ratio "
        "if CPU were all that counted: steadier than req/s when other work shares the machine).",
        "",
        "| c | path | req/s | ratio | target | p50 ms | p99 ms | added p50 ms | proxy CPU us/req "
        "| backend CPU us/req | store CPU us/req | CPU ratio | non-2xx |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["rows"]:
        target = ""
        if r["target"] is not None:
            target = f">= {r['target']:.2f} {'met' if r['met'] else 'MISSED'}"
        errors = r["non2xx"] + r["socket_errors"]
        lines.append(
            f"| {r['connections']} | {r['label']} | {run.fmt(r['rps'], ',.0f')} "
            f"| {run.fmt(r['ratio'], '.2f')} | {target} | {run.fmt(r['p50_ms'], '.2f')} "
            f"| {run.fmt(r['p99_ms'], '.2f')} | {run.fmt(r['added_p50_ms'], '+.2f')} "
            f"| {run.fmt(r['proxy_cpu_us'], '.0f')} | {run.fmt(r['backend_cpu_us'], '.0f')} "
            f"| {run.fmt(r['store_cpu_us'], '.0f')} | {run.fmt(r.get('cpu_ratio'), '.2f')} "
            f"| {errors} |"
        )
    lines.append("")
    lines += [f"- {line}" for line in verdicts(report["rows"])]
    for label, checks in report.get("checks", {}).items():
        bad = [f"{k}: {v}" for k, v in checks.items() if v != "ok"]
        if bad:
            lines.append(f"- {label} probes: {'; '.join(bad)}")
    for name, why in report.get("skipped", {}).items():
        lines.append(f"- skipped {name}: {why}")
    lines.append("")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per run")
    parser.add_argument("--repeat", type=int, default=1, help="rounds")
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--concurrency", default=",".join(map(str, CONCURRENCY)))
    parser.add_argument(
        "--redis-url", default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
    )
    args = parser.parse_args(argv)
    client = run.ensure_wrk(allow_install=True)
    redis_url = None if run.redis_reachable(args.redis_url) else args.redis_url
    report = run_sidecar(
        client,
        duration=args.duration,
        repeat=args.repeat,
        warmup=args.warmup,
        redis_url=redis_url,
        concurrency=tuple(int(c) for c in args.concurrency.split(",") if c),
    )
    print("\n".join(markdown(report)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
