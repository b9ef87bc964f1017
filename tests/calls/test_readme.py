"""The README's five-line idempotent function runs as pasted: the effect once, then the stored
result, also from a second process."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def first_snippet() -> str:
    section = README.read_text().split("\n## Idempotent functions\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)[0]


def test_the_five_line_example_runs_its_effect_once(tmp_path: Path) -> None:
    code = first_snippet()
    runs = [
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path
        )
        for _ in range(2)
    ]
    assert [r.returncode for r in runs] == [0, 0], runs[0].stderr + runs[1].stderr
    assert runs[0].stdout == "charging o-1\nTrue\n"
    assert runs[1].stdout == "True\n"  # the second process found the stored result
    assert (tmp_path / "app.db").exists()
