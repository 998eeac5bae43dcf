"""Build a free-threaded CPython (3.13t) from its release source, once per machine, outside the checkout.

No free-threaded interpreter is packaged for Debian 12, and python.org may be out of reach, so the
source comes from python.org's release tarball or, failing that, from Debian's python3.13 source
package of the next release (trixie): its orig tarball is byte-identical to upstream's (the sha256
below is pinned).  ``./configure --disable-gil`` plus the flavour's extra flags, ``make``, ``make
install`` into ``<cache>/cpython-<version>-<flavour>-<key>``, where the key hashes the tarball's sha256,
the configure line and RECIPE: a fresh clone or a CI run finds the interpreter built before and
spends no time on it (about ten minutes on two cores otherwise).

The cache folder is ``$ARENALIB_PYTHON_CACHE`` or ``~/.cache/arenalib/python``.

Usage: python3 tools/build_python.py [--flavour ft|ft-tsan]   (prints the interpreter's path)
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import fetch_sources

VERSION = "3.13.5"
TARBALL = f"Python-{VERSION}.tar.xz"
TARBALL_SHA256 = "93e583f243454e6e9e4588ca2c2662206ad961659863277afcdb96801647d640"
TARBALL_URL = f"https://www.python.org/ftp/python/{VERSION}/{TARBALL}"
DEBIAN_PACKAGE = "python3.13"
# Only trixie's sources: bookworm's python3.13 does not exist and the system's lists stay untouched.
DEBIAN_SOURCES = ["deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] "
                  "http://deb.debian.org/debian trixie main"]
# Bump when the build steps change in a way that must rebuild cached interpreters.
RECIPE = "1"
FLAVOURS = {
    "ft": ["--disable-gil"],
    # For the one ThreadSanitizer run of the race tests (tools/tsan.py).
    "ft-tsan": ["--disable-gil", "--with-thread-sanitizer"],
}
# Python's own modules the tests and pip need; a missing -dev package drops them silently.
REQUIRED_MODULES = ["ssl", "ctypes", "zlib", "bz2", "lzma", "sqlite3"]
DEBIAN_BUILD_DEPENDS = ["libssl-dev", "libffi-dev", "zlib1g-dev", "libbz2-dev", "liblzma-dev",
                        "libsqlite3-dev", "uuid-dev", "libreadline-dev"]


def cache_root() -> Path:
    return Path(os.environ.get("ARENALIB_PYTHON_CACHE") or Path.home() / ".cache" / "arenalib" / "python")


def prefix_for(flavour: str) -> Path:
    key = hashlib.sha256("\0".join([TARBALL_SHA256, RECIPE, *FLAVOURS[flavour]]).encode()).hexdigest()[:16]
    return cache_root() / f"cpython-{VERSION}-{flavour}-{key}"


def interpreter(prefix: Path) -> Path:
    return prefix / "bin" / f"python{VERSION.rsplit('.', 1)[0]}t"


def _log(message: str) -> None:
    print(f"[build_python] {message}", file=sys.stderr, flush=True)


def _build(prefix: Path, flavour: str) -> None:
    tarball = fetch_sources.obtain_tarball(cache_root() / TARBALL, TARBALL_SHA256, TARBALL_URL,
                                           DEBIAN_PACKAGE, DEBIAN_SOURCES)
    with tempfile.TemporaryDirectory(prefix="arenalib-cpython-") as tmp:
        with tarfile.open(tarball) as archive:
            safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # 3.10.12+/3.11.4+
            archive.extractall(tmp, **safe)
        source = Path(tmp) / f"Python-{VERSION}"
        log = Path(tmp) / "build.log"
        steps = [["./configure", f"--prefix={prefix}", *FLAVOURS[flavour]],
                 ["make", f"-j{os.cpu_count() or 2}"], ["make", "install"]]
        for step in steps:
            _log(" ".join(step))
            with log.open("a") as out:
                done = subprocess.run(step, cwd=source, stdout=out, stderr=subprocess.STDOUT)
            if done.returncode != 0:
                tail = "".join(log.read_text().splitlines(keepends=True)[-40:])
                raise SystemExit(f"{' '.join(step)} failed:\n{tail}")


def _check(python: Path) -> None:
    probe = ("import sys, sysconfig, importlib, importlib.util\n"
             "assert sysconfig.get_config_var('Py_GIL_DISABLED') == 1, 'not a free-threaded build'\n"
             "assert not sys._is_gil_enabled(), 'GIL enabled'\n"
             f"missing = [m for m in {REQUIRED_MODULES!r} if not importlib.util.find_spec(m)]\n"
             "[importlib.import_module(m) for m in " + repr(REQUIRED_MODULES) + " if m not in missing]\n"
             "assert not missing, missing\n")
    done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{python} is not usable: {done.stderr.strip().splitlines()[-1]}\n"
                         f"(Debian: apt-get install {' '.join(DEBIAN_BUILD_DEPENDS)}, then run again)")


def tsan_suppressions() -> str:
    """CPython's own list of ThreadSanitizer reports inside the free-threaded interpreter (races
    its developers know of and judged benign), from the release source."""
    tarball = fetch_sources.obtain_tarball(cache_root() / TARBALL, TARBALL_SHA256, TARBALL_URL,
                                           DEBIAN_PACKAGE, DEBIAN_SOURCES)
    with tarfile.open(tarball) as archive:
        member = archive.extractfile(f"Python-{VERSION}/Tools/tsan/suppressions_free_threading.txt")
        return member.read().decode()


def ensure_python(flavour: str = "ft") -> Path:
    """The free-threaded interpreter of ``flavour``, built first if the cache does not have it."""
    prefix = prefix_for(flavour)
    python = interpreter(prefix)
    complete = prefix / ".arenalib-complete"
    if complete.exists():
        return python
    prefix.parent.mkdir(parents=True, exist_ok=True)
    with open(prefix.parent / f".{prefix.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two runs at once: the second waits for the first's build
        if not complete.exists():
            shutil.rmtree(prefix, ignore_errors=True)  # a build that died half way
            _log(f"building CPython {VERSION} ({' '.join(FLAVOURS[flavour])}) into {prefix}: "
                 "about ten minutes, once per machine")
            _build(prefix, flavour)
            _check(python)
            complete.write_text(f"{VERSION} {' '.join(FLAVOURS[flavour])}\n")
    return python


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flavour", choices=sorted(FLAVOURS), default="ft")
    print(ensure_python(parser.parse_args().flavour))


if __name__ == "__main__":
    main()
