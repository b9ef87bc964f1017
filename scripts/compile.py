"""Compile the request's hot path with mypyc: the compiled build of the same source.

The ``.py`` files stay the reference (the pure wheel is them alone); this makes C extensions of
the modules in :data:`MODULES`, which Python imports in preference to the ``.py`` files beside
them. The wheel's build hook (``hatch_build.py``, on with ``RETRYSAFE_COMPILE=1``) runs it;
so can a developer::

    python scripts/compile.py --out build/compiled    # the extension modules, laid out by package

Needs mypy (which ships mypyc), setuptools and a C compiler.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"

#: What runs on every keyed request (the shells, the runners, the core's flow and codec, the
#: memory store), and the call and RPC layers: a Python generator that delegates to a compiled
#: one (``yield from``) which stops inside an ``except`` block leaves that block's exception as
#: the thread's current one, so the operation's subclasses are compiled with it. Left out:
#: modules that compiled code cannot hold as they are (``_core/transaction.py``:
#: runtime-checkable protocols; ``_core/errors.py``: exceptions users and the client subclass;
#: ``_core/config.py``: compiled, its dataclasses would check each field's type before
#: ``__post_init__`` reads ``ttl="1d"`` or names a wrong option, and would carry mypyc's
#: stand-ins for their annotations), what runs once per process, and ``_core/_mypyc.py``.
MODULES = (
    "retrysafe/_core/call/layer.py",
    "retrysafe/_core/codec.py",
    "retrysafe/_core/drive.py",
    "retrysafe/_core/drive_sync.py",
    "retrysafe/_core/events.py",
    "retrysafe/_core/fingerprint.py",
    "retrysafe/_core/http.py",
    "retrysafe/_core/keys.py",
    "retrysafe/_core/operation.py",
    "retrysafe/_core/options.py",
    "retrysafe/_core/problems.py",
    "retrysafe/_core/records.py",
    "retrysafe/_core/request.py",
    "retrysafe/_core/routes.py",
    "retrysafe/_core/rpc.py",
    "retrysafe/_core/scope.py",
    "retrysafe/_async/_keeper.py",
    "retrysafe/_async/runner.py",
    "retrysafe/_sync/_keeper.py",
    "retrysafe/_sync/runner.py",
    "retrysafe/_asgi_routes.py",
    "retrysafe/_body.py",
    "retrysafe/asgi.py",
    "retrysafe/wsgi.py",
    "retrysafe/stores/memory.py",
)

_SETUP = """
import sys
from setuptools import setup
from mypyc.build import mypycify

setup(
    name="retrysafe-compiled",
    # The build's environment has no optional dependency: what the compiled modules import
    # from them (lazily) is Any, and only the compiled modules' own errors are reported.
    ext_modules=mypycify(
        ["--ignore-missing-imports", "--follow-imports=silent", *sys.argv[3:]],
        opt_level="3",
        target_dir=sys.argv[2],
    ),
    script_args=["build_ext", "--build-lib", sys.argv[1], "--build-temp", sys.argv[2]],
)
"""


def compile_to(out: Path) -> list[Path]:
    """Compile :data:`MODULES` into ``out`` (laid out as in ``src``); returns the files made."""
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    # Kept between builds (build/ is not in git): mypy's cache and the C files, so an unchanged
    # source is neither checked nor compiled again.
    work = SRC.parent / "build" / "mypyc"
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "MYPY_CACHE_DIR": str(work / "cache")}
    # From src, the modules' paths are their own names.
    command = [sys.executable, "-c", _SETUP, str(out), str(work), *MODULES]
    subprocess.run(command, cwd=SRC, env=env, check=True)
    return sorted(path for path in out.rglob("*") if path.suffix in (".so", ".pyd"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="where the extensions go")
    args = parser.parse_args(argv)
    for path in compile_to(args.out):
        print(path.relative_to(args.out.resolve()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
