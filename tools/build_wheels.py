"""The parts of ``python3 dev.py wheel`` that need no venv: the zig toolchain file, what auditwheel says,
what an extension exports, and whether a wheel in dist/ is still the one the sources make.

dev.py makes the venvs and runs the steps: the sdist (meson dist, the wrapped jemalloc and liburing
sources inside), then for each interpreter a wheel built from that sdist, offline, by ``zig cc``
targeting an older glibc (WHEEL_GLIBC), then ``auditwheel repair`` for the manylinux tag.  tests/test_wheel.py
uses the checks here on the wheel it installs.  Standard library only, Python 3.10+.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The newest glibc whose symbols the wheels may use: zig cc links against this version's symbol maps,
# so no newer symbol can be referenced (auditwheel then names the oldest manylinux the result fits).
WHEEL_GLIBC = (2, 28)
MAX_WHEEL_BYTES = 2 << 20  # issue 29: at most 2 MiB per interpreter


def write_native_file(path: Path, zig: Path, glibc: tuple[int, int] = WHEEL_GLIBC) -> Path:
    """A meson native file whose C compiler is zig cc for x86_64 Linux with glibc ``glibc``, baseline
    x86-64 instructions (not this machine's), and zig's own ar and ranlib."""
    target = f"x86_64-linux-gnu.{glibc[0]}.{glibc[1]}"
    text = (
        "# Written by dev.py wheel (tools/build_wheels.py): zig cc, an older glibc's symbol versions.\n"
        "[binaries]\n"
        f"c = ['{zig}', 'cc', '-target', '{target}', '-mcpu=baseline']\n"
        f"ar = ['{zig}', 'ar']\n"
        f"ranlib = ['{zig}', 'ranlib']\n"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path


def sources_id(root: Path = ROOT) -> str:
    """What the sdist is made of: meson dist archives the committed tree (HEAD), so its tree id, with
    the build recipe (the pinned wheel requirements, the glibc target, this file) that turns it into
    wheels.  Uncommitted edits are not in the sdist: see dirty()."""
    tree = subprocess.run(["git", "rev-parse", "HEAD^{tree}"], cwd=root, check=True, capture_output=True,
                          text=True).stdout.strip()
    h = hashlib.sha256(tree.encode())
    for name in ("requirements/wheel.txt", "requirements/wheel-tools.txt", "tools/build_wheels.py"):
        h.update((root / name).read_bytes())
    h.update(repr(WHEEL_GLIBC).encode())
    return h.hexdigest()[:24]


def dirty(root: Path = ROOT) -> list[str]:
    """Tracked files with uncommitted changes (not in an sdist that meson dist makes)."""
    out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, check=True,
                         capture_output=True, text=True).stdout
    return [line[3:] for line in out.splitlines() if line.strip()]


def auditwheel_tag(auditwheel: Path, wheel: Path) -> str:
    """The platform tag that ``auditwheel show`` says ``wheel`` is consistent with, e.g.
    manylinux_2_17_x86_64.  Raises RuntimeError with auditwheel's words when it names none."""
    result = subprocess.run([str(auditwheel), "show", str(wheel)], capture_output=True, text=True)
    text = " ".join((result.stdout + result.stderr).split())
    found = re.search(r'consistent with the following platform tag: "([a-z0-9_]+)"', text)
    if result.returncode != 0 or found is None:
        raise RuntimeError(f"auditwheel show {wheel.name}: {text}")
    return found.group(1)


def manylinux_glibc(tag: str) -> tuple[int, int] | None:
    """(2, 17) for manylinux_2_17_x86_64 (and for its alias manylinux2014_x86_64); None for a tag that
    is not a manylinux one (linux_x86_64)."""
    legacy = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
    if found := re.fullmatch(r"manylinux_(\d+)_(\d+)_\w+", tag):
        return int(found.group(1)), int(found.group(2))
    return legacy.get(tag.split("_x86_64")[0])


def exported_symbols(shared_object: Path) -> list[str]:
    """The names ``shared_object`` defines in its dynamic symbol table (``nm -D --defined-only``)."""
    if shutil.which("nm") is None:
        raise RuntimeError("binutils' nm is not installed: apt-get install binutils")
    out = subprocess.run(["nm", "-D", "--defined-only", str(shared_object)], capture_output=True, text=True,
                         check=True).stdout
    return sorted(line.split()[-1] for line in out.splitlines() if line.strip())


def unexpected_exports(wheel: Path) -> dict[str, list[str]]:
    """For each extension module in ``wheel``, the exported names other than its PyInit_<module>
    (an empty dict: each exports its init function alone)."""
    found = {}
    with tempfile.TemporaryDirectory(prefix="arenalib-wheel-") as tmp, zipfile.ZipFile(wheel) as zf:
        modules = [name for name in zf.namelist() if name.endswith(".so")]
        for name in modules:
            path = Path(zf.extract(name, tmp))
            wanted = f"PyInit_{path.name.split('.')[0]}"
            exported = exported_symbols(path)
            if exported != [wanted]:
                found[name] = exported
    if not modules:
        found["(none)"] = ["no extension module in the wheel"]
    return found
