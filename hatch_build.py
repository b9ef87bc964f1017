"""The wheel's build hook: the compiled build, on request.

By default it does nothing: ``python -m build`` makes the pure wheel and the sdist. With
``RETRYSAFE_COMPILE=1`` the wheel is a platform wheel: the same ``.py`` files plus the hot path
compiled with mypyc from them (``scripts/compile.py``), which Python imports first.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


def _requested() -> bool:
    return os.environ.get("RETRYSAFE_COMPILE", "") not in ("", "0")


class CompiledBuild(BuildHookInterface):
    """Adds the mypyc extensions to the wheel when ``RETRYSAFE_COMPILE=1``."""

    PLUGIN_NAME = "custom"

    def dependencies(self) -> list[str]:
        return ["mypy>=2.4", "setuptools>=70"] if _requested() else []

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel" or version == "editable" or not _requested():
            return
        out = Path(tempfile.mkdtemp(prefix="retrysafe-compiled-"))
        script = Path(self.root) / "scripts" / "compile.py"
        subprocess.run([sys.executable, str(script), "--out", str(out)], check=True)
        for path in sorted(out.rglob("*.so")) + sorted(out.rglob("*.pyd")):
            build_data["force_include"][str(path)] = path.relative_to(out).as_posix()
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
