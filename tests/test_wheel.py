"""The wheel a user installs (issue 29), used as a user would use it (slow tier: `python3 dev.py test -m
slow`).

`python3 dev.py wheel` builds this interpreter's wheel (from the sdist of the committed tree; a wheel
in dist/ whose sources have not changed is reused), which is installed with `pip install --no-index`
into a fresh venv whose PATH has no C compiler.  From a temporary folder, never the checkout: a first
program with nothing but arenalib installed, then the public-API tests and mypy over a typed program.
Those two borrow pytest, hypothesis, NumPy and mypy from the developer venv through a .pth line that
comes after the fresh venv's own site-packages (a .pth line only adds a path: the developer venv's
editable arenalib is not activated), so the arenalib they import is the installed one, which each run
proves.  Also checked: `auditwheel show` says manylinux_2_28 or older, the wheel is at most 2 MiB, its
extensions export their PyInit_ function alone, and `import arenalib` takes at most 20 ms.
"""

from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest
from support import ROOT, SANITIZED

sys.path.insert(0, str(ROOT / "tools"))
import build_wheels

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(SANITIZED, reason="the wheel is a release build, not the ASan one")]

# The tests of the public API that need nothing but an installed arenalib (no compiler, no checkout).
PUBLIC_API_TESTS = ["test_arenas.py", "test_segment.py", "test_pool.py", "test_frames.py"]
# Loaded into that pytest run: it leaves out the tests whose fixtures build a Cython consumer of the C
# API (they need a compiler), and proves, in the same process, which arenalib the tests imported.
INSTALLED_COPY_PLUGIN = """
from pathlib import Path

import arenalib
import arenalib._arena

NEEDS_A_COMPILER = {"consumer", "example_consumers", "cython_consumers"}


def pytest_collection_modifyitems(config, items):
    left_out = [item for item in items if NEEDS_A_COMPILER & set(getattr(item, "fixturenames", ()))]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = [item for item in items if item not in left_out]


def pytest_sessionfinish(session):
    for module in (arenalib, arenalib._arena):
        assert Path(module.__file__).is_relative_to(SITE), module.__file__
    Path(__file__).with_name("imported.txt").write_text(arenalib._arena.__file__)
"""
COMPILERS = ["cc", "gcc", "clang", "tcc", "zig", "x86_64-linux-gnu-gcc"]
# Modules `import arenalib` must not bring in: each costs milliseconds, and none is needed before use.
HEAVY_MODULES = {"numpy", "asyncio", "ssl", "ctypes", "multiprocessing", "concurrent", "email", "http"}

FIRST_PROGRAM = """
    import hashlib
    import arenalib

    with arenalib.ConfinedArena() as arena:
        header = arena.allocate(64)                              # zeroed
        block = arena.allocate(1 << 20, zero=False, align=4096)  # as it comes
        block.fill(7)
        assert header.tobytes() == bytes(64) and block.address % 4096 == 0
        digest = hashlib.sha256(block).hexdigest()
    assert digest == hashlib.sha256(b"\\x07" * (1 << 20)).hexdigest()
    assert not block.alive
    scratch = arenalib.SlicingArena()
    with scratch.frame() as f:
        kept = f.allocate(4096, zero=False).fill(1)
    try:
        kept.tobytes()
    except arenalib.ArenaClosedError:
        pass
    else:
        raise AssertionError("a segment of a rewound frame was still usable")
    scratch.close()
    with arenalib.BufferPool(4096, 4) as pool:
        buffer = pool.acquire().fill(2)
        assert buffer.tobytes() == b"\x02" * 4096
        pool.release(buffer)
    print(arenalib.__file__)
    print(arenalib.__version__, arenalib.jemalloc_version())
"""

TYPED_PROGRAM = """
    import arenalib

    def checksum(data: bytes) -> int:
        with arenalib.ConfinedArena(max_bytes=1 << 20) as arena:
            seg = arena.allocate(len(data), zero=False)
            seg[:] = data
            return sum(memoryview(seg))

    with arenalib.SlicingArena() as arena:
        reveal_type(arena.allocate(16))
        reveal_type(arena.frame())
    print(checksum(b"abc"))
"""

# Each line must be an error that mypy reports: the installed stubs are read, not skipped.
WRONG_PROGRAM = """
    import arenalib

    arena = arenalib.Arena(max_bytes="1 MiB")
    segment: bytes = arena.allocate(16)
    arenalib.ConfinedArena().allocate(16, zero=False).no_such_method()
"""


def _base_python() -> str:
    """This interpreter outside its venv: the one to build a wheel for and to make the user's venv with."""
    name = f"python{sys.version_info[0]}.{sys.version_info[1]}{sys.abiflags}"
    path = Path(sys.base_prefix) / "bin" / name
    return str(path) if path.exists() else sys._base_executable  # type: ignore[attr-defined]


def _python_abi_tag() -> str:
    version = f"{sys.version_info[0]}{sys.version_info[1]}"
    return f"cp{version}-cp{version}{sys.abiflags}"


def _auditwheel() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "arenalib" / "wheel-tools" / "bin" / "auditwheel"


@pytest.fixture(scope="module")
def wheel() -> Path:
    result = subprocess.run([sys.executable, str(ROOT / "dev.py"), "wheel", "--python", _base_python()],
                            capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    [path] = (ROOT / "dist").glob(f"arenalib-*-{_python_abi_tag()}-*.whl")
    return path


@pytest.fixture(scope="module")
def user_venv(wheel, tmp_path_factory) -> dict:
    """A fresh venv with the wheel installed, a PATH without a C compiler, a folder to work in."""
    root = tmp_path_factory.mktemp("user")
    venv = root / "venv"
    subprocess.run([_base_python(), "-m", "venv", str(venv)], check=True, capture_output=True)
    path = str(venv / "bin")
    assert not [c for c in COMPILERS if shutil.which(c, path=path)], "the user's PATH has a compiler"
    env = {"PATH": path, "HOME": str(root), "LANG": "C.UTF-8",
           # a download would go nowhere
           "http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9"}
    install = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--no-index",
                              "--disable-pip-version-check", str(wheel)],
                             capture_output=True, text=True, env=env, cwd=root)
    assert install.returncode == 0, install.stdout + install.stderr
    site = subprocess.run([str(venv / "bin" / "python"), "-c",
                           "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True, env=env, cwd=root).stdout.strip()
    work = root / "work"
    work.mkdir()
    return {"venv": venv, "python": str(venv / "bin" / "python"), "env": env, "site": Path(site),
            "work": work}


def _run(user: dict, *args: str, code: str | None = None,
         env: dict | None = None) -> subprocess.CompletedProcess:
    argv = [user["python"], *args] + (["-c", textwrap.dedent(code)] if code is not None else [])
    return subprocess.run(argv, capture_output=True, text=True, env=env or user["env"], cwd=user["work"],
                          timeout=600)


def _borrow_developer_tools(user: dict) -> None:
    """pytest, hypothesis, NumPy, mypy from the developer venv, after the installed arenalib on sys.path."""
    (user["site"] / "zz-developer-tools.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")


def test_wheel_is_manylinux_2_28_or_older_small_and_exports_only_init_functions(wheel):
    tag = build_wheels.auditwheel_tag(_auditwheel(), wheel)
    glibc = build_wheels.manylinux_glibc(tag)
    assert glibc is not None and glibc <= (2, 28), tag
    assert tag.endswith("_x86_64"), tag
    assert tag in wheel.name, (tag, wheel.name)  # the tag auditwheel repair gave it is the one it has
    assert wheel.stat().st_size <= build_wheels.MAX_WHEEL_BYTES, wheel.stat().st_size
    assert build_wheels.unexpected_exports(wheel) == {}


def test_first_program_runs_from_the_installed_copy(user_venv):
    result = _run(user_venv, code=FIRST_PROGRAM)
    assert result.returncode == 0, result.stderr
    location, versions = result.stdout.splitlines()
    assert Path(location).is_relative_to(user_venv["site"]), location
    assert re.fullmatch(r"\d+\.\d+\.\d+ 5\.3\.0-0-g[0-9a-f]{40}", versions), versions


def test_import_loads_only_arenalib_and_the_standard_library(user_venv):
    # What keeps `import arenalib` cheap, checked as behaviour: it imports no third-party package
    # (NumPy, the ring's liburing probe, asyncio's loop wait for their own first use) and no heavy
    # standard module.  The time it takes is printed for the record, not asserted (a loaded machine
    # would fail a timing check).
    probe = """
        import sys, time
        before = set(sys.modules)
        t = time.perf_counter()
        import arenalib
        elapsed = time.perf_counter() - t
        print(elapsed)
        print(" ".join(sorted(set(sys.modules) - before)))
    """
    times = []
    for _ in range(7):
        result = _run(user_venv, code=probe)
        assert result.returncode == 0, result.stderr
        elapsed, loaded = result.stdout.splitlines()
        times.append(float(elapsed))
    loaded_roots = {name.partition(".")[0] for name in loaded.split()}
    foreign = {m for m in loaded_roots - {"arenalib"}
               if m not in sys.stdlib_module_names and not m.startswith("_cython_") and m != "cython_runtime"}
    assert not foreign, foreign
    assert not loaded_roots & HEAVY_MODULES, loaded_roots & HEAVY_MODULES
    best, median = min(times), statistics.median(times)
    print(f"import arenalib from the wheel: best {best * 1e3:.1f} ms, median {median * 1e3:.1f} ms")


def test_public_api_tests_pass_against_the_installed_copy(user_venv, tmp_path):
    _borrow_developer_tools(user_venv)
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "installed_copy.py").write_text(f"SITE = {str(user_venv['site'])!r}\n" + INSTALLED_COPY_PLUGIN)
    tests = [str(ROOT / "tests" / name) for name in PUBLIC_API_TESTS]
    result = _run(user_venv, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "installed_copy",
                  "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(ROOT), "-x", *tests,
                  env={**user_venv["env"], "PYTHONPATH": str(plugins)})
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-3000:]
    assert Path((plugins / "imported.txt").read_text()).is_relative_to(user_venv["site"])
    passed = re.search(r"(\d+) passed", result.stdout)
    assert passed and int(passed.group(1)) > 300, result.stdout[-2000:]


def test_mypy_checks_a_user_program_against_the_installed_stubs(user_venv, tmp_path):
    _borrow_developer_tools(user_venv)
    good, wrong = tmp_path / "good.py", tmp_path / "wrong.py"
    good.write_text(textwrap.dedent(TYPED_PROGRAM))
    wrong.write_text(textwrap.dedent(WRONG_PROGRAM))
    cache = tmp_path / "mypy-cache"
    mypy = ["-m", "mypy", "--strict", "--cache-dir", str(cache), "--no-error-summary"]
    result = _run(user_venv, *mypy, "--verbose", str(good))
    # reveal_type is a note, not an error: the exit status is 0 and the types are the stubs' own
    assert result.returncode == 0, result.stdout + result.stderr
    assert 'Revealed type is "arenalib._arena.Segment"' in result.stdout, result.stdout
    assert 'Revealed type is "arenalib._arena.Frame"' in result.stdout, result.stdout
    # mypy read the installed package's stubs (--verbose logs the path of each module it parses)
    parsed = dict(re.findall(r"^LOG:  Parsing (\S+) \((arenalib[\w.]*)\)$", result.stderr, re.MULTILINE))
    parsed = {module: Path(path) for path, module in parsed.items()}
    assert parsed["arenalib._arena"].name == "_arena.pyi", parsed
    assert all(path.is_relative_to(user_venv["site"]) for path in parsed.values()), parsed
    result = _run(user_venv, *mypy, str(wrong))
    assert result.returncode == 1, result.stdout + result.stderr
    errors = [line for line in result.stdout.splitlines() if ": error:" in line]
    assert [int(line.split(":")[1]) for line in errors] == [4, 5, 6], result.stdout
    assert '"max_bytes" to "Arena" has incompatible type "str"' in result.stdout, result.stdout
