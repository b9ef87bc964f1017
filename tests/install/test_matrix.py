"""The install matrix: the wheel, built once, installed with each extra alone into a fresh
virtualenv, outside the source tree, where ``import retrysafe``, ``retrysafe --help`` and the
integration the extra is for must work.

The integration is a project of the README (the extras it shows) or of ``projects.md`` beside
this file (the others), run by the docs harness with the virtualenv's programs: a real server
process and the four wire checks for a server extra (uvicorn, gunicorn, ``flask run``,
``manage.py runserver``, ``retrysafe proxy``), one request through the transport for a client
extra, a reserve/release round trip on each face for a store extra. A virtualenv holds the wheel
with the one extra its project's ``pip install`` line names, plus the server that line names
(uvicorn, gunicorn), nothing else.

The virtualenvs are made with uv (``uv venv`` + ``uv pip install``), all at once in a few
threads while the first tests run; ``RETRYSAFE_MATRIX_INSTALLER=pip`` makes them with
``python -m venv`` and pip instead, to compare. Build, install and run times are printed at the
end of the run (and written to ``test-artifacts/install-matrix.txt``).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from retrysafe import __version__

from ..conftest import RUN_ID
from ..docs.harness import Project, projects, run_project, user_environment
from ..docs.services import SERVICES

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
OWN = Path(__file__).with_name("projects.md")

#: extra -> (page, project) that proves it.
MATRIX: dict[str, tuple[Path, str]] = {
    "none": (OWN, "none"),
    "redis": (OWN, "redis"),
    "postgres": (OWN, "postgres"),
    "mysql": (OWN, "mysql"),
    "fastapi": (README, "fastapi"),
    "starlette": (README, "asgi"),
    "flask": (README, "flask"),
    "django": (README, "django"),
    "drf": (OWN, "drf"),
    "sqlalchemy": (OWN, "sqlalchemy"),
    "httpx": (README, "httpx"),
    "requests": (README, "requests"),
    "proxy": (README, "proxy"),
    "prometheus": (OWN, "prometheus"),
    "otel": (OWN, "otel"),
    "amqp": (OWN, "amqp"),
    "celery": (OWN, "celery"),
    "dramatiq": (OWN, "dramatiq"),
    "aiohttp": (ROOT / "docs" / "getting-started" / "aiohttp.md", "aiohttp"),
    "grpc": (ROOT / "docs" / "guides" / "grpc.md", "grpc"),
    "rq": (OWN, "rq"),
    "arq": (OWN, "arq"),
    "huey": (OWN, "huey"),
    "taskiq": (OWN, "taskiq"),
    "nats": (OWN, "nats"),
}
#: Extras whose project needs a service the test run provides (skip or fail as conftest says).
NEEDS = {
    "redis": "redis_url",
    "postgres": "postgres_url",
    "mysql": "mysql_url",
    "amqp": "rabbitmq_url",
    "celery": "redis_url",
    "dramatiq": "redis_url",
    "rq": "redis_url",
    "arq": "redis_url",
    "taskiq": "redis_url",
    "nats": "nats_url",
}
THREADS = 3  # the machine has 2 cores, shared: installs mostly wait on the network and disk


def project_of(extra: str) -> Project:
    page, name = MATRIX[extra]
    return next(p for p in projects(page) if p.name == name)


def requirements(extra: str, wheel: Path) -> list[str]:
    """The project's ``pip install`` line with the wheel in place of ``retrysafe``.

    It must name this extra alone (or none for the core): anything else it names is a server.
    """
    found: list[str] = []
    for requirement in project_of(extra).requirements():
        named = re.fullmatch(r"retrysafe(?:\[([\w,-]+)\])?", requirement)
        if named is None:
            found.append(requirement)
            continue
        extras = named.group(1)
        assert extras == (None if extra == "none" else extra), (extra, requirement)
        found.append(f"{wheel}[{extras}]" if extras else str(wheel))
    assert any(str(wheel) in r for r in found), f"{extra}: no pip install line names retrysafe"
    return found


@dataclass
class Timings:
    installer: str
    build: float = 0.0
    started: float = field(default_factory=time.monotonic)
    install: dict[str, float] = field(default_factory=dict)
    run: dict[str, float] = field(default_factory=dict)

    def report(self) -> str:
        lines = [
            f"install matrix ({self.installer}): wheel built in {self.build:.1f} s; "
            f"wall time {time.monotonic() - self.started:.1f} s for {len(self.run)} extras",
        ]
        for extra in MATRIX:
            if extra in self.install or extra in self.run:
                lines.append(
                    f"  {extra:<11} virtualenv {self.install.get(extra, 0):5.1f} s, "
                    f"checks {self.run.get(extra, 0):5.1f} s"
                )
        return "\n".join(lines)


class Matrix:
    """The wheel, and a virtualenv per extra made in the background."""

    def __init__(self, root: Path, extras: list[str]) -> None:
        self.root = root
        self.installer = os.environ.get("RETRYSAFE_MATRIX_INSTALLER", "uv")
        self.timings = Timings(self.installer)
        self.wheel = self._build()
        self.pool = ThreadPoolExecutor(THREADS, thread_name_prefix="matrix")
        # The checks run in the pool too: they mostly wait on processes and the network.
        self.jobs: dict[str, Future[None]] = {e: self.pool.submit(self._job, e) for e in extras}

    def _build(self) -> Path:
        out = self.root / "dist"
        began = time.monotonic()
        uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or "uv"
        subprocess.run(
            [uv, "build", "--wheel", "--quiet", "--out-dir", str(out), str(ROOT)],
            check=True,
            capture_output=True,
            timeout=300,
        )
        self.timings.build = time.monotonic() - began
        (wheel,) = out.glob("retrysafe-*.whl")
        return wheel

    def _venv(self, extra: str) -> Path:
        began = time.monotonic()
        venv = self.root / f"venv-{extra}"
        wanted = requirements(extra, self.wheel)
        bin_dir = Path(sys.executable).parent
        if self.installer == "pip":
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
            command = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", *wanted]
        else:
            uv = shutil.which("uv", path=str(bin_dir)) or "uv"
            subprocess.run(
                [uv, "venv", "--quiet", "--python", sys.executable, str(venv)],
                check=True,
                capture_output=True,
                timeout=300,
            )
            command = [uv, "pip", "install", "--quiet", "--python", str(venv / "bin" / "python")]
            command += wanted
        result = subprocess.run(command, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, f"{shlex.join(command)}\n{result.stderr[-4000:]}"
        self.timings.install[extra] = time.monotonic() - began
        return venv

    def _job(self, extra: str) -> None:
        venv = self._venv(extra)
        began = time.monotonic()
        check_installed(venv, self.root / f"project-{extra}")
        self.timings.run[extra] = time.monotonic() - began

    def result(self, extra: str) -> None:
        """Wait for the extra's virtualenv and checks; re-raise what failed."""
        self.jobs[extra].result()

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


@pytest.fixture(scope="module")
def matrix(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Matrix]:
    wanted = [
        item.callspec.params["extra"]
        for item in request.session.items
        if item.module is sys.modules[__name__] and hasattr(item, "callspec")
    ]
    built = Matrix(tmp_path_factory.mktemp("matrix"), wanted)
    yield built
    built.close()
    report = built.timings.report()
    artifacts = ROOT / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    (artifacts / "install-matrix.txt").write_text(report + "\n")
    request.config.stash[REPORT] = report


REPORT = pytest.StashKey[str]()


def test_every_extra_is_in_the_matrix() -> None:
    import tomllib

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    # demo, all, test, bench and docs are sets for this repository's own use, not integrations.
    assert set(declared) - {"demo", "all", "test", "bench", "docs"} == set(MATRIX) - {"none"}


def test_every_extra_a_user_installs_is_in_the_readme_table() -> None:
    import re
    import tomllib

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    readme = (ROOT / "README.md").read_text()
    install = readme[readme.index("## Install") : readme.index("## FastAPI")]
    listed = {
        name
        for row in install.splitlines()
        if row.startswith("| `")
        for name in re.findall(r"`([a-z]+)`", row.split("|")[1])
    }
    assert set(declared) - {"all", "test", "bench", "docs"} == listed


@pytest.mark.timeout(900)  # the jobs run all at once, a few at a time: a test may wait long
@pytest.mark.parametrize("extra", list(MATRIX))
def test_the_extra_alone_installs_and_runs(
    extra: str, matrix: Matrix, request: pytest.FixtureRequest
) -> None:
    if extra in NEEDS:
        request.getfixturevalue(NEEDS[extra])  # skips, or fails under CI=true, without it
    matrix.result(extra)


def check_installed(venv: Path, folder: Path) -> None:
    """``import retrysafe`` (from the virtualenv, not the checkout), the command, and the
    extra's project."""
    extra = venv.name.removeprefix("venv-")
    folder.mkdir()
    bin_dir = venv / "bin"
    env = user_environment()

    def run(*argv: str) -> str:
        done = subprocess.run(
            argv, cwd=folder, env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, (extra, argv, done.stderr[-3000:])
        return done.stdout

    where = run(str(bin_dir / "python"), "-c", "import retrysafe; print(retrysafe.__file__)")
    assert Path(where.strip()).is_relative_to(venv), where  # the wheel, not the source tree
    assert "usage: retrysafe" in run(str(bin_dir / "retrysafe"), "--help")
    assert (
        run(str(bin_dir / "retrysafe"), "--version").strip()
        == f"retrysafe {__version__} (pure Python)"
    )
    project = folder / "project"
    project.mkdir()
    run_project(
        project_of(extra),
        project,
        bin_dir=bin_dir,
        services=SERVICES,
        env={"RS_RUN": RUN_ID, "RS_HERE": str(Path(__file__).parent)},
    )
