#!/usr/bin/env python3
"""Set up everything arenalib needs on a fresh machine, then run its tests or its benchmark.

    python3 dev.py bench            # the benchmark comparison, quick mode (--full for a careful run)
    python3 dev.py test             # the whole test suite (extra arguments go to pytest)
    python3 dev.py test --python 3.13
    python3 dev.py test --python 3.13t   # free-threaded CPython, built once per machine (~10 min)
    python3 dev.py lint             # ruff, cython-lint, stub check
    python3 dev.py sanitize         # the whole suite on an ASan + UBSan build (jemalloc --enable-debug)
    python3 dev.py tsan             # the thread races under ThreadSanitizer, on a free-threaded
                                    # CPython built --with-thread-sanitizer (once per machine)

Each command is idempotent: it fetches the jemalloc and liburing tarballs into
subprojects/packagecache/ (from each wrap's URL, else from Debian's source package), makes a venv per
interpreter in .venv/, installs the requirements, builds arenalib in place (an editable meson-python
install, rebuilt on import when sources change) and runs.  A second run reuses all of it.  Standard
library only, Python 3.10+.

``--python`` takes a path, a version (3.13: pyenv's, else python3.13 on PATH) or a version ending in
"t" (3.13t): a free-threaded CPython, which tools/build_python.py builds from source into
~/.cache/arenalib/python the first time (about ten minutes) and later runs reuse.  The venv and build
folders are named by version and ABI flags (.venv/py3.13 and .venv/py3.13t), so the two never mix.  A
free-threaded interpreter installs requirements/<group>-ft.txt where that file exists (no pyarrow, no
liburing: neither ships a wheel it can load), and dev.py refuses a "t" spec whose interpreter is not
built with Py_GIL_DISABLED.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "tools"))

import build_python  # noqa: E402
import fetch_sources  # noqa: E402
import sanitize  # noqa: E402

REQUIREMENTS = {
    "build": ROOT / "requirements" / "build.txt",
    "test": ROOT / "requirements" / "test.txt",
    "bench": ROOT / "requirements" / "bench.txt",
    "lint": ROOT / "requirements" / "lint.txt",
}
BUILD_INPUTS = ["pyproject.toml", "meson.build", "meson.options", "arenalib/meson.build",
                "subprojects/packagefiles/jemalloc/meson.build",
                "subprojects/packagefiles/jemalloc/meson.options",
                "subprojects/packagefiles/jemalloc/build_jemalloc.py",
                "subprojects/packagefiles/liburing/meson.build",
                "subprojects/packagefiles/liburing/src/include/liburing/meson.build",
                "subprojects/packagefiles/liburing/src/include/liburing/compat.h.in"]
# Build variants: a tag suffix for the venv and build folders, and meson setup arguments.
VARIANTS = {None: ("", []), "asan": ("-asan", ["-Csetup-args=-Dsanitize=true"]),
            "tsan": ("-tsan", ["-Csetup-args=-Dtsan=true"])}
# What `dev.py tsan` runs when given no pytest arguments: the tests where threads race.
TSAN_TESTS = ["tests/test_free_threading.py", "tests/test_threads.py", "tests/test_safety.py", "-k",
              "not matrix"]


def say(message: str) -> None:
    print(f"[dev] {message}", flush=True)


def run(cmd: list[str], **kwargs) -> None:
    subprocess.run(cmd, check=True, **kwargs)


def wants_free_threading(spec: str | None) -> bool:
    """Whether ``spec`` asks for a free-threaded interpreter: a version ending in "t" (3.13t)."""
    return spec is not None and os.sep not in spec and spec.endswith("t")


def find_interpreter(spec: str | None) -> str:
    """A python executable for ``spec``: a path, a version such as 3.13, a free-threaded version such
    as 3.13t (built by tools/build_python.py, once per machine), or None for this one."""
    if spec is None:
        return sys.executable
    if os.sep in spec:
        return spec
    if wants_free_threading(spec):
        buildable = build_python.VERSION.rsplit(".", 1)[0]
        if spec[:-1] not in ("", buildable):
            raise SystemExit(f"--python {spec}: tools/build_python.py builds only the free-threaded "
                             f"CPython {buildable}t (--python {buildable}t)")
        return str(build_python.ensure_python("ft"))
    pyenv_root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates = sorted(glob.glob(f"{pyenv_root}/versions/{spec}*/bin/python{spec}"), reverse=True)
    candidates.append(shutil.which(f"python{spec}"))  # may be a pyenv shim for an inactive version
    for candidate in filter(None, candidates):
        if subprocess.run([candidate, "-c", "pass"], capture_output=True).returncode == 0:
            return candidate
    raise SystemExit(f"no Python {spec} found (neither under {pyenv_root} nor python{spec} on PATH)")


def interpreter_tag(python: str) -> tuple[str, bool]:
    """(the venv and build folder tag: py3.13, py3.13t, ..., whether ``python`` is a free-threaded
    build).  The tag carries sys.abiflags, so a free-threaded and a GIL build never share a venv."""
    probe = ("import sys, sysconfig; print('%d.%d' % sys.version_info[:2] + sys.abiflags, "
             "sysconfig.get_config_var('Py_GIL_DISABLED') == 1)")
    version, free_threaded = subprocess.run([python, "-c", probe], check=True, capture_output=True,
                                            text=True).stdout.split()
    return f"py{version}", free_threaded == "True"


def digest(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for path in paths:
        h.update(path.read_bytes() if path.exists() else b"-")
    return h.hexdigest()


def up_to_date(stamp: Path, value: str) -> bool:
    return stamp.exists() and stamp.read_text() == value


def ensure_venv(python: str, tag: str) -> Path:
    venv = ROOT / ".venv" / tag
    vpython = venv / "bin" / "python"
    if not vpython.exists():
        say(f"creating {venv.relative_to(ROOT)} with {python}")
        run([python, "-m", "venv", str(venv)])
        # An old interpreter's bundled pip lacks -C (config settings for meson-python).
        run([str(vpython), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--upgrade", "pip"])
    return venv


def requirements_file(group: str, free_threaded: bool) -> Path:
    """The requirements of ``group``: its -ft variant on a free-threaded interpreter, where there is one
    (PEP 508 has no marker for free-threading, so the choice is made here)."""
    path = REQUIREMENTS[group]
    ft = path.with_name(f"{path.stem}-ft{path.suffix}")
    return ft if free_threaded and ft.exists() else path


def included_files(path: Path) -> list[Path]:
    """``path`` and the requirements files it pulls in with -r / -c, recursively."""
    found = [path]
    for line in path.read_text().splitlines():
        parts = line.split("#", 1)[0].split()
        if len(parts) == 2 and parts[0] in ("-r", "-c", "--requirement", "--constraint"):
            found += included_files(path.parent / parts[1])
    return found


def ensure_requirements(venv: Path, groups: list[str], free_threaded: bool) -> None:
    vpython = str(venv / "bin" / "python")
    for group in groups:
        path = requirements_file(group, free_threaded)
        stamp = venv / f".arenalib-{group}-requirements"
        value = digest(included_files(path))
        if up_to_date(stamp, value):
            continue
        say(f"installing {group} requirements ({path.relative_to(ROOT)})")
        run([vpython, "-m", "pip", "install", "-q", "--disable-pip-version-check", "-r", str(path)])
        stamp.write_text(value)


def ensure_build(venv: Path, tag: str, setup_args: list[str]) -> Path:
    """Install arenalib in editable mode; later source edits are rebuilt on import."""
    for wrap in fetch_sources.WRAPS:
        fetch_sources.ensure_tarball(wrap)
        for name in fetch_sources.refresh_overlay(wrap):
            say(f"{wrap} overlay file {name} changed: copied into the extracted source")
    stamp = venv / ".arenalib-editable"
    value = digest([ROOT / p for p in BUILD_INPUTS]) + str(ROOT) + " ".join(setup_args)
    build_dir = ROOT / "build" / tag
    if up_to_date(stamp, value) and (build_dir / "build.ninja").exists():
        return build_dir
    say(f"building arenalib (jemalloc included) in {build_dir.relative_to(ROOT)}")
    run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
         "--no-build-isolation", "--no-deps", f"-Cbuild-dir={build_dir}", *setup_args,
         "-e", str(ROOT)])
    stamp.write_text(value)
    return build_dir


def prepare(python_spec: str | None, groups: list[str], variant: str | None = None) -> tuple[Path, Path]:
    """The venv (made and filled if needed) and the build folder of arenalib for this interpreter."""
    suffix, setup_args = VARIANTS[variant]
    python = find_interpreter(python_spec)
    tag, free_threaded = interpreter_tag(python)
    if wants_free_threading(python_spec) and not free_threaded:
        raise SystemExit(f"--python {python_spec}: {python} is not a free-threaded build "
                         "(sysconfig Py_GIL_DISABLED is not 1); remove it from the cache and run again")
    tag += suffix
    venv = ensure_venv(python, tag)
    ensure_requirements(venv, ["build", *groups], free_threaded)
    return venv, ensure_build(venv, tag, setup_args)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["test", "bench", "lint", "sanitize", "tsan", "setup"])
    parser.add_argument("--python", help="interpreter: a version (3.13), a free-threaded version (3.13t, "
                        "built once per machine) or a path; default: this one")
    parser.add_argument("--full", action="store_true", help="bench: the careful, longer run")
    # (arguments dev.py does not know go on to pytest or the benchmark)
    args, rest = parser.parse_known_args()

    groups = {"test": ["test"], "bench": ["bench"], "lint": ["lint", "test"], "setup": ["test"],
              "sanitize": ["test"], "tsan": ["test"]}
    variant = {"sanitize": "asan", "tsan": "tsan"}.get(args.command)
    if args.command == "tsan":
        args.python = str(build_python.ensure_python("ft-tsan"))
    venv, build_dir = prepare(args.python, groups[args.command], variant)
    vpython = str(venv / "bin" / "python")
    os.chdir(ROOT)
    if args.command == "setup":
        return 0
    if args.command == "test":
        return subprocess.run([vpython, "-m", "pytest", *rest]).returncode
    if args.command == "sanitize":
        # Rebuild what changed now, not under the preloaded sanitizer runtime at first import.
        run([str(venv / "bin" / "ninja"), "-C", str(build_dir)], stdout=subprocess.DEVNULL)
        # A sanitizer report goes to file descriptor 2 of a process it kills: pytest must not
        # capture that descriptor, or the report is lost.
        capture = [] if any(a == "-s" or a.startswith("--capture") for a in rest) else ["--capture=sys"]
        return subprocess.run([vpython, "-m", "pytest", *capture, *rest],
                              env=sanitize.sanitizer_env(build_dir)).returncode
    if args.command == "tsan":
        run([str(venv / "bin" / "ninja"), "-C", str(build_dir)], stdout=subprocess.DEVNULL)
        return subprocess.run([vpython, "-m", "pytest", "--capture=sys", *(rest or TSAN_TESTS)],
                              env=sanitize.tsan_env(build_dir, build_python.tsan_suppressions())).returncode
    if args.command == "bench":
        return subprocess.run([vpython, "bench/run.py", *(["--full"] if args.full else []), *rest]).returncode
    return subprocess.run([vpython, "tools/lint.py", *rest]).returncode


if __name__ == "__main__":
    sys.exit(main())
