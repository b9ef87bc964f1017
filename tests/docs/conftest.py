"""The documentation site, built once per test session with ``mkdocs build --strict``."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class BuiltSite:
    """A strict build of the site."""

    path: Path
    seconds: float
    log: str

    def page(self, src: str) -> str:
        """The HTML of the page built from ``docs/<src>`` (``reference/cli.md``)."""
        stem = src.removesuffix(".md")
        if stem == "index" or stem.endswith("/index"):
            html = self.path / stem.removesuffix("index") / "index.html"
        else:
            html = self.path / stem / "index.html"
        return html.read_text(encoding="utf-8")


def build_site(
    target: Path, config: Path = ROOT / "mkdocs.yml"
) -> subprocess.CompletedProcess[str]:
    """Run ``mkdocs build --strict`` into ``target``; returns the finished process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RETRYSAFE_")}
    env["NO_MKDOCS_2_WARNING"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(target)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


@pytest.fixture(scope="session")
def built_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BuiltSite]:
    """The site, built strictly (a broken link, a missing page, an unknown name fails it)."""
    target = tmp_path_factory.mktemp("site")
    started = time.monotonic()
    result = build_site(target)
    seconds = time.monotonic() - started
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stderr[-6000:]}"
    print(f"\nsite built in {seconds:.1f} s")
    yield BuiltSite(target, seconds, result.stderr)
