#!/usr/bin/env python3
"""Set up everything arenalib needs on a fresh machine, then run its tests or its benchmark.

    python3 dev.py bench            # the benchmark comparison, quick mode (--full for a careful run)
    python3 dev.py test             # the whole test suite (extra arguments go to pytest)
    python3 dev.py test --python 3.13
    python3 dev.py lint             # ruff, cython-lint, stub check
    python3 dev.py sanitize         # the whole suite on an ASan + UBSan build (jemalloc --enable-debug)

Each command is idempotent: it fetches the jemalloc tarball into subprojects/packagecache/ (from the
wrap's URL, else from Debian's source package), makes a venv per interpreter in .venv/, installs the
requirements, builds arenalib in place (an editable meson-python install, rebuilt on import when
sources change) and runs.  A second run reuses all of it.  Standard library only, Python 3.10+.
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

import fetch_jemalloc  # noqa: E402
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
                "subprojects/packagefiles/jemalloc/build_jemalloc.py"]
# Build variants: a tag suffix for the venv and build folders, and meson setup arguments.
VARIANTS = {None: ("", []), "asan": ("-asan", ["-Csetup-args=-Dsanitize=true"])}


def say(message: str) -> None:
    print(f"[dev] {message}", flush=True)


def run(cmd: list[str], **kwargs) -> None:
    subprocess.run(cmd, check=True, **kwargs)


def find_interpreter(spec: str | None) -> str:
    """A python executable for ``spec``: a path, a version such as 3.13, or None for this one."""
    if spec is None:
        return sys.executable
    if os.sep in spec:
        return spec
    pyenv_root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates = sorted(glob.glob(f"{pyenv_root}/versions/{spec}*/bin/python{spec}"), reverse=True)
    candidates.append(shutil.which(f"python{spec}"))  # may be a pyenv shim for an inactive version
    for candidate in filter(None, candidates):
        if subprocess.run([candidate, "-c", "pass"], capture_output=True).returncode == 0:
            return candidate
    raise SystemExit(f"no Python {spec} found (neither under {pyenv_root} nor python{spec} on PATH)")


def interpreter_tag(python: str) -> str:
    out = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                         check=True, capture_output=True, text=True).stdout.strip()
    return f"py{out}"


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


def ensure_requirements(venv: Path, groups: list[str]) -> None:
    vpython = str(venv / "bin" / "python")
    for group in groups:
        stamp = venv / f".arenalib-{group}-requirements"
        value = digest([REQUIREMENTS[group]])
        if up_to_date(stamp, value):
            continue
        say(f"installing {group} requirements")
        run([vpython, "-m", "pip", "install", "-q", "--disable-pip-version-check",
             "-r", str(REQUIREMENTS[group])])
        stamp.write_text(value)


def ensure_build(venv: Path, tag: str, setup_args: list[str]) -> Path:
    """Install arenalib in editable mode; later source edits are rebuilt on import."""
    fetch_jemalloc.ensure_tarball()
    for name in fetch_jemalloc.refresh_overlay():
        say(f"jemalloc overlay file {name} changed: copied into the extracted source")
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
    tag = interpreter_tag(python) + suffix
    venv = ensure_venv(python, tag)
    ensure_requirements(venv, ["build", *groups])
    return venv, ensure_build(venv, tag, setup_args)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["test", "bench", "lint", "sanitize", "setup"])
    parser.add_argument("--python", help="interpreter: a version (3.13) or a path; default: this one")
    parser.add_argument("--full", action="store_true", help="bench: the careful, longer run")
    # (arguments dev.py does not know go on to pytest or the benchmark)
    args, rest = parser.parse_known_args()

    groups = {"test": ["test"], "bench": ["bench"], "lint": ["lint", "test"], "setup": ["test"],
              "sanitize": ["test"]}
    variant = "asan" if args.command == "sanitize" else None
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
    if args.command == "bench":
        return subprocess.run([vpython, "bench/run.py", *(["--full"] if args.full else []), *rest]).returncode
    return subprocess.run([vpython, "tools/lint.py", *rest]).returncode


if __name__ == "__main__":
    sys.exit(main())
