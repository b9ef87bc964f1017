"""The package as built: the wheel carries every file of the source package (modules,
``py.typed``, Lua scripts, SQL files, Django migrations, the demo's page) and the LICENSE, the
metadata says version and license, twine accepts both files, and the README names the wheel
that ``python -m build`` writes."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from retrysafe import __version__

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "retrysafe"


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or "uv"
    subprocess.run(
        [uv, "build", "--quiet", "--out-dir", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return out


def source_files() -> set[str]:
    tracked = subprocess.run(
        ["git", "ls-files", "src/retrysafe"], cwd=ROOT, capture_output=True, text=True
    )
    if tracked.returncode == 0 and tracked.stdout.strip():
        paths = [ROOT / line for line in tracked.stdout.splitlines()]
    else:  # an unpacked sdist: no git
        paths = [p for p in PACKAGE.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    return {str(p.relative_to(ROOT / "src")) for p in paths if p.exists()}


def test_the_wheel_carries_the_whole_package_and_the_license(dist: Path) -> None:
    (wheel,) = dist.glob("*.whl")
    assert wheel.name == f"retrysafe-{__version__}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = archive.read(f"retrysafe-{__version__}.dist-info/entry_points.txt")
        metadata_text = archive.read(f"retrysafe-{__version__}.dist-info/METADATA").decode()
    missing = source_files() - names
    assert not missing, sorted(missing)
    for needed in (
        "retrysafe/py.typed",
        "retrysafe/stores/redis/lua/reserve.lua",
        "retrysafe/stores/postgres/postgres.sql",
        "retrysafe/stores/mysql/mysql.sql",
        "retrysafe/stores/sqlite/sqlite.sql",
        "retrysafe/contrib/django/migrations/0001_initial.py",
        "retrysafe/demo/static/index.html",
        f"retrysafe-{__version__}.dist-info/licenses/LICENSE",
    ):
        assert needed in names, needed
    assert b"retrysafe = retrysafe.cli:main" in entry_points
    metadata = Parser().parsestr(metadata_text)
    assert metadata["Version"] == __version__
    assert metadata["License-Expression"] == "MIT"
    assert metadata["Requires-Python"] == ">=3.11"
    assert metadata["Description-Content-Type"] == "text/markdown"
    # The core requires nothing: every requirement belongs to an extra.
    assert all("extra ==" in r for r in metadata.get_all("Requires-Dist", []))


def test_the_sdist_carries_the_sources_tests_and_license(dist: Path) -> None:
    (sdist,) = dist.glob("*.tar.gz")
    assert sdist.name == f"retrysafe-{__version__}.tar.gz"
    with tarfile.open(sdist) as archive:
        names = set(archive.getnames())
    top = f"retrysafe-{__version__}"
    for needed in ("LICENSE", "README.md", "CHANGELOG.md", "pyproject.toml", "tests/conftest.py"):
        assert f"{top}/{needed}" in names, needed


def test_twine_accepts_both(dist: Path) -> None:
    twine = shutil.which("twine", path=str(Path(sys.executable).parent)) or "twine"
    checked = subprocess.run(
        [twine, "check", "--strict", *map(str, [*dist.glob("*.whl"), *dist.glob("*.tar.gz")])],
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_readme_names_the_files_the_build_writes_and_the_changelog_this_release() -> None:
    readme = (ROOT / "README.md").read_text()
    assert f"dist/retrysafe-{__version__}-py3-none-any.whl" in readme
    assert f"dist/retrysafe-{__version__}.tar.gz" in readme
    assert "pip install ." in readme  # from a checkout
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert f"## [{__version__}] - " in changelog
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
