"""The README's Prometheus project under several workers, as its README block starts them:
``uvicorn main:app --workers 2`` with ``PROMETHEUS_MULTIPROC_DIR`` exported. Every scrape, from
whichever worker answers it, counts every worker's requests."""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ..docs.harness import projects, user_environment
from ..e2e.servers import free_port, serving

pytestmark = pytest.mark.e2e

README = Path(__file__).resolve().parents[2] / "README.md"


def _workers_block() -> str:
    section = README.read_text().split("\n## Metrics and traces\n", 1)[1].split("\n## ", 1)[0]
    blocks: list[str] = re.findall(r"```sh\n(.*?)```", section, re.S)
    (block,) = [b for b in blocks if "--workers" in b]
    return block


@contextlib.contextmanager
def _serve(folder: Path, script: str) -> Iterator[str]:
    port = free_port()
    # The block as written; the server on a free port, in the foreground of this shell.
    script = script.replace("uvicorn main:app", f"exec uvicorn main:app --port {port}")
    env = {**user_environment(), "TMPDIR": str(folder)}  # mktemp -d inside the test's folder
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    url = f"http://127.0.0.1:{port}"
    with serving(
        ["bash", "-c", script],
        cwd=folder,
        env=env,
        log=folder / "uvicorn.log",
        ready=url + "/metrics",
    ):
        yield url


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (prometheus,) = [p for p in projects(README) if p.name == "prometheus"]
    for block in prometheus.blocks:
        if "file" in block.marker:
            (tmp_path / block.marker["file"]).write_text(block.code)
    return tmp_path


def _executed(url: str) -> float:
    # A fresh connection per scrape, so the scrapes land on either worker.
    text = httpx.get(url + "/metrics", timeout=10, headers={"Connection": "close"}).text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "retrysafe_requests_total" and s.labels.get("outcome") == "executed":
                return s.value
    return 0.0


def _files_by_pid(folder: Path) -> set[str]:
    return {p.stem.rsplit("_", 1)[-1] for p in folder.rglob("counter_*.db")}


@pytest.mark.timeout(120)
def test_every_scrape_counts_every_workers_requests(project: Path) -> None:
    block = _workers_block()
    assert "PROMETHEUS_MULTIPROC_DIR" in block and "--workers 2" in block
    with _serve(project, block) as url:
        sent = 0
        deadline = time.monotonic() + 30
        while len(_files_by_pid(project)) < 2:  # until both workers have served requests
            assert time.monotonic() < deadline and sent < 200, "one worker served every request"
            headers = {"Idempotency-Key": f'"pay-{sent}"', "Connection": "close"}
            response = httpx.post(url + "/payments", json={"n": sent}, headers=headers, timeout=10)
            assert response.status_code == 201
            sent += 1
        time.sleep(1.5)  # each worker writes its counts out every second
        counts = [_executed(url) for _ in range(8)]
        assert counts == [sent] * 8
