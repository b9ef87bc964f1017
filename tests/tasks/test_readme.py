"""The README's Celery example runs as written: its ``tasks.py`` in a real ``celery worker``
(prefork) on the real Redis broker, and its command line sending the task twice: the worker
charges once. The only change: a queue of this run's own (the command line's ``-Q`` and the
producer's default queue), so that runs on a shared broker never meet."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import redis

from tests.conftest import RUN_ID
from tests.docs.harness import user_environment, with_test_services

README = Path(__file__).resolve().parents[2] / "README.md"

pytestmark = pytest.mark.e2e


def blocks() -> tuple[str, str]:
    section = README.read_text().split("\n## Celery and Dramatiq\n", 1)[1].split("\n## ", 1)[0]
    python = re.findall(r"```python\n(.*?)```", section, flags=re.S)[0]
    shell = re.findall(r"```sh\n(.*?)```", section, flags=re.S)[0]
    return python, shell


@pytest.mark.timeout(90)
def test_the_celery_example_charges_once(tmp_path: Path, redis_url: str) -> None:
    python, shell = blocks()
    assert "localhost:6379/0" in python
    python = with_test_services(
        python
    )  # the run's Redis (RETRYSAFE_TEST_REDIS_URL), as on every page
    worker_line, send_line = shell.strip().splitlines()
    assert worker_line == "celery -A tasks worker &"
    (tmp_path / "tasks.py").write_text(python)
    queue = f"tasks_readme_{RUN_ID}_{uuid.uuid4().hex[:8]}"  # kombu's keys: swept at the end
    env = {**user_environment(), "PYTHONPATH": str(tmp_path)}  # a user's: no test settings
    log = tmp_path / "worker.log"
    with open(log, "w") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "tasks", "worker", "-Q", queue, "-c", "1"],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        command = send_line.removeprefix("python -c ").strip("'")
        sender = f"import tasks; tasks.app.conf.task_default_queue = {queue!r}\n{command}"
        done = subprocess.run(
            [sys.executable, "-c", sender], cwd=tmp_path, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        broker = redis.Redis.from_url(redis_url)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if "charging" in log.read_text() and broker.llen(queue) == 0:
                time.sleep(2.0)  # the second copy, taken off the queue, is answered
                break
            time.sleep(0.2)
        broker.delete(queue)
        broker.close()
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(timeout=20)
    lines = log.read_text().splitlines()
    assert not [line for line in lines if "visibility_timeout" in line]  # the check accepts it
    # (the worker logs a print's words as they are written: "charging", " ", "o-1")
    assert sum(line.endswith("] charging") for line in lines) == 1, "\n".join(lines)
