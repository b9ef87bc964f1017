"""The task queues' examples (the README's Celery section, the tasks guide's Dramatiq section)
are ones a user can copy: the Celery task passes the worker's start-up check on the Redis broker,
and the Dramatiq worker module names the extras its store needs and sends nothing at import."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from .harness import free_port, user_environment, with_test_services

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
TASKS = ROOT / "docs/guides/tasks.md"


def _section(page: Path, title: str) -> str:
    return page.read_text().split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def _python(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def _run(folder: Path, module: str, code: str) -> subprocess.CompletedProcess[str]:
    (folder / "tasks.py").write_text(module)
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=folder,
        env={**user_environment(), "PYTHONPATH": str(folder)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_celery_example_passes_the_workers_check(tmp_path: Path) -> None:
    (readme,) = _python(_section(README, "Celery and Dramatiq"))
    assert readme == _python(_section(TASKS, "Celery"))[0]  # the guide shows the same task
    assert 'broker="redis://' in readme  # the broker whose visibility timeout is checked
    check = (
        "import tasks; from retrysafe.contrib.celery import check_worker as c; print(c(tasks.app))"
    )
    done = _run(tmp_path, with_test_services(readme), check)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_dramatiq_section_names_the_extra_its_store_needs() -> None:
    section = _section(TASKS, "Dramatiq")
    worker = _python(section)[0]
    assert 'store="postgresql://' in worker
    assert "pip install 'retrysafe[dramatiq,postgres]'" in section


def test_the_dramatiq_worker_module_sends_nothing_at_import(tmp_path: Path) -> None:
    worker, sender = _python(_section(TASKS, "Dramatiq"))[:2]
    # Nothing listens on these: importing the module must not need the broker or the store.
    closed = free_port()
    module = re.sub(r"@localhost(:\d+)?/", f"@127.0.0.1:{closed}/", worker)
    module = module.replace("postgresql://localhost/", f"postgresql://127.0.0.1:{closed}/")
    assert module.count(f"127.0.0.1:{closed}") == 2, module
    done = _run(tmp_path, module, "import tasks; print(tasks.charge.actor_name)")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "charge"
    assert "from tasks import charge" in sender and ".send" in sender


def test_the_celery_lock_libraries_have_a_migration_page_under_migrating() -> None:
    nav = (ROOT / "mkdocs.yml").read_text().split("\nnav:\n", 1)[1]
    migrating = nav.split("\n  - Migrating:\n", 1)[1].split("\n  - ", 1)[0]
    assert "migrating/celery-once.md" in migrating
    text = (ROOT / "docs/migrating/celery-once.md").read_text()
    assert "| celery-once | retrysafe |" in text and "| celery-singleton | retrysafe |" in text


def test_the_powertools_page_says_the_testing_switch_covers_functions() -> None:
    text = (ROOT / "docs/migrating/powertools-functions.md").read_text()
    (row,) = [line for line in text.splitlines() if line.startswith("| `POWERTOOLS_IDEMPOTENCY")]
    assert "idempotency_disabled()" in row and "none for functions" not in row
