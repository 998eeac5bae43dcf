"""Lint and type-check: ruff for Python, cython-lint for .pyx/.pxd/.pxi, mypy stubtest for the stubs.

Run through ``python3 dev.py lint`` (inside the venv that has arenalib and the lint requirements)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    py = sys.executable
    bin_dir = Path(py).parent
    cython_files = sorted(
        str(p.relative_to(ROOT)) for folder in ("arenalib", "bench", "tests") for ext in ("pyx", "pxd", "pxi")
        for p in ROOT.glob(f"{folder}/**/*.{ext}"))
    allowlist = str(ROOT / "tools" / "stubtest-allowlist.txt")
    steps = {
        "ruff": [py, "-m", "ruff", "check", "."],
        "cython-lint": [str(bin_dir / "cython-lint"), *cython_files],
        "stubtest": [py, "-m", "mypy.stubtest", "arenalib", "--allowlist", allowlist],
    }
    # cython-lint runs pycodestyle from PATH: the venv's bin must come first.
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    failed = 0
    for name, step in steps.items():
        print(f"[lint] {name}", flush=True)
        failed |= subprocess.run(step, cwd=ROOT, env=env).returncode != 0
    print("lint: " + ("FAILED" if failed else "ok"))
    return int(failed)


if __name__ == "__main__":
    sys.exit(main())
