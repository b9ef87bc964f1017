"""A test run cleans up what it wrote in Redis: after it, no key carries its RUN_ID."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import redis

from tests.docs.harness import user_environment

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(300)
def test_a_run_leaves_no_redis_keys_of_its_own(redis_url: str) -> None:
    run_id = uuid.uuid4().hex[:10]
    env = {
        **user_environment(),
        "RETRYSAFE_TEST_RUN_ID": run_id,
        "RETRYSAFE_TEST_REDIS_URL": redis_url,
    }
    # Tests that write records and metrics into Redis under the run's prefix.
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
         "tests/ops/test_sync_fronts.py", "-k", "redis"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"retrysafe test run: {run_id}" in done.stdout  # its keys carried this id
    assert " passed" in done.stdout
    client = redis.Redis.from_url(redis_url)
    try:
        left = list(client.scan_iter(match=f"*{run_id}*", count=1000))
    finally:
        client.close()
    assert left == []
