"""``pip install '.[docs]'`` then ``mkdocs build``, as the contributing notes say: the docs extra
alone, in a fresh virtualenv, builds the site strictly (its hooks import what they run)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ..docs.harness import user_environment

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(600)
def test_the_docs_extra_alone_builds_the_site(tmp_path: Path) -> None:
    venv = tmp_path / "venv-docs"
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or "uv"
    subprocess.run(
        [uv, "venv", "--quiet", "--python", sys.executable, str(venv)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    python = venv / "bin" / "python"
    install = [uv, "pip", "install", "--quiet", "--python", str(python), f"{ROOT}[docs]"]
    done = subprocess.run(install, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    env = user_environment()
    env["PATH"] = os.pathsep.join([str(venv / "bin"), env.get("PATH", "")])
    env["NO_MKDOCS_2_WARNING"] = "1"
    site = tmp_path / "site"
    build = [str(venv / "bin" / "mkdocs"), "build", "--strict", "-d", str(site)]
    done = subprocess.run(build, cwd=ROOT, env=env, capture_output=True, text=True, timeout=500)
    assert done.returncode == 0, done.stderr[-6000:]
    # The problem pages show what the proxy answered in the build (the hook runs it).
    page = (site / "reference/problems/upstream-unreachable/index.html").read_text()
    assert "urn:retrysafe:problem:upstream-unreachable" in page
