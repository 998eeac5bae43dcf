"""The build: the extension carries a private jemalloc that never touches the process's malloc
(issue 2), the version is written once, and the sdist builds a wheel offline."""

import ctypes
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT, assert_ok, not_sanitized, run_python

import arenalib
import arenalib._arena
import arenalib._ring

EXTENSION = Path(arenalib._arena.__file__)
RING_EXTENSION = Path(arenalib._ring.__file__)  # liburing's static archive is linked in here
# (not_sanitized: on the ASan build, its runtime replaces malloc and exports symbols of its own,
# and jemalloc --enable-debug aborts on an unknown option)


@pytest.mark.skipif(shutil.which("nm") is None, reason="binutils' nm is not installed")
@not_sanitized
@pytest.mark.parametrize("extension", [EXTENSION, RING_EXTENSION], ids=["_arena", "_ring"])
def test_extension_exports_only_its_init_function(extension):
    out = subprocess.run(["nm", "-D", "--defined-only", str(extension)],
                         capture_output=True, text=True, check=True).stdout
    exported = [line.split()[-1] for line in out.splitlines() if line.strip()]
    assert exported == [f"PyInit_{extension.name.split('.')[0]}"], exported


@pytest.mark.skipif(shutil.which("nm") is None, reason="binutils' nm is not installed")
def test_liburing_is_linked_in_privately():
    # liburing's functions are in the ring's extension (not taken from a system liburing.so), hidden.
    out = subprocess.run(["nm", "--defined-only", str(RING_EXTENSION)],
                         capture_output=True, text=True, check=True).stdout
    names = {line.split()[-1]: line.split()[-2] for line in out.splitlines() if line.strip()}
    assert names.get("io_uring_queue_init_params") in ("t", "T"), sorted(names)[:20]
    needed = subprocess.run(["readelf", "-d", str(RING_EXTENSION)], capture_output=True, text=True,
                            check=False).stdout
    assert "liburing" not in needed


@pytest.mark.skipif(shutil.which("nm") is None, reason="binutils' nm is not installed")
def test_no_unprefixed_allocator_symbol_is_defined():
    # Not even hidden ones: jemalloc's public names all carry arenalib's prefix.
    out = subprocess.run(["nm", "--defined-only", str(EXTENSION)],
                         capture_output=True, text=True, check=True).stdout
    names = {line.split()[-1] for line in out.splitlines() if line.strip()}
    for name in ("malloc", "free", "calloc", "realloc", "mallocx", "posix_memalign", "mallctl"):
        assert name not in names
    assert "arenalib_je_mallocx" in names


@pytest.mark.skipif(shutil.which("readelf") is None, reason="binutils' readelf is not installed")
def test_extension_uses_no_static_tls():
    out = subprocess.run(["readelf", "-d", str(EXTENSION)],
                         capture_output=True, text=True, check=True).stdout
    assert "STATIC_TLS" not in out


@not_sanitized
def test_process_malloc_is_still_glibc():
    libc = ctypes.CDLL(None)
    # The default-namespace malloc/free resolve to glibc's, not to anything in our extension.
    dl_info = type("Dl_info", (ctypes.Structure,), {"_fields_": [
        ("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]})
    dladdr = libc.dladdr
    dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(dl_info)]
    for name in ("malloc", "free"):
        info = dl_info()
        address = ctypes.cast(getattr(libc, name), ctypes.c_void_p).value
        assert dladdr(address, ctypes.byref(info))
        assert b"libc.so" in info.dli_fname, (name, info.dli_fname)
        assert b"_arena" not in info.dli_fname


def test_malloc_and_free_still_work_with_glibc_after_import():
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    libc.malloc_usable_size.argtypes = [ctypes.c_void_p]
    libc.malloc_usable_size.restype = ctypes.c_size_t
    with arenalib.Arena() as arena:
        segment = arena.allocate(100)
        pointer = libc.malloc(100)
        assert pointer
        # glibc's own bookkeeping answers for a glibc pointer
        assert libc.malloc_usable_size(pointer) >= 100
        libc.free(pointer)
        assert segment.alive


IMPORT_ORDERS = [
    ("arenalib", "numpy", "pyarrow"),
    ("numpy", "arenalib", "pyarrow"),
    ("pyarrow", "numpy", "arenalib"),
    ("pyarrow", "arenalib", "numpy"),
]


@pytest.mark.skipif(importlib.util.find_spec("pyarrow") is None,
                    reason="pyarrow is not installed (no wheel for free-threaded CPython)")
@pytest.mark.parametrize("order", IMPORT_ORDERS, ids="-".join)
def test_side_by_side_with_numpy_and_pyarrow(order):
    # pyarrow carries its own jemalloc (je_arrow_ prefix): both must work in one process.
    out = assert_ok(run_python(f"""
        import importlib
        for name in {order!r}:
            importlib.import_module(name)
        import arenalib, numpy, pyarrow
        with arenalib.ConfinedArena() as arena:
            seg = arena.allocate(1 << 20, zero=False).fill(7)
            array = numpy.frombuffer(seg, dtype=numpy.uint8)
            assert int(array.sum()) == 7 << 20
            buf = pyarrow.allocate_buffer(1 << 20, memory_pool=pyarrow.jemalloc_memory_pool())
            numpy.frombuffer(buf, dtype=numpy.uint8)[:] = array
            del array
            assert pyarrow.py_buffer(seg.tobytes()).equals(buf)
        print("ok")
    """))
    assert out.strip() == "ok"


def test_versions_are_reported():
    assert arenalib.__version__ == importlib.metadata.version("arenalib")
    assert re.fullmatch(r"5\.3\.0-0-g[0-9a-f]{40}", arenalib.jemalloc_version())


# A version literal as pyproject.toml ([project] version = "0.1.0") or arenalib/__init__.py
# (__version__ = "0.1.0") would write it.
VERSION_LITERAL = re.compile(r"""^\s*(__version__|version)\s*=\s*["'][^"']*\d""", re.MULTILINE)


def test_version_is_written_once_in_meson_build():
    # meson.build's project version is the one place: meson-python puts it in the metadata
    # (pyproject.toml: dynamic = ["version"]) and arenalib reads it from there.
    assert arenalib.__version__ == importlib.metadata.version("arenalib")
    project = re.search(r"^project\((.*?)^\)", (ROOT / "meson.build").read_text(), re.MULTILINE | re.DOTALL)
    assert project is not None
    assert f"version: '{arenalib.__version__}'" in project.group(1)
    for name in ("pyproject.toml", "arenalib/__init__.py"):
        found = VERSION_LITERAL.findall((ROOT / name).read_text())
        assert not found, f"{name} writes a version of its own"


@not_sanitized
def test_prefixed_malloc_conf_variable_is_read():
    # With a prefix, jemalloc reads ARENALIB_JE_MALLOC_CONF (documented in the README).
    out = assert_ok(run_python("""
        import os
        import arenalib
        with arenalib.Arena() as arena:
            arena.allocate(10)
        print("ok")
    """))
    assert out.strip() == "ok"
    env_run = run_python("import arenalib; arenalib.Arena().close()",
                         env={**os.environ, "ARENALIB_JE_MALLOC_CONF": "no_such_option:1"})
    # jemalloc names the unknown option it read from our variable, and carries on.
    assert "no_such_option" in env_run.stderr
    assert env_run.returncode == 0


@pytest.mark.slow  # about 100 s: jemalloc and the extension built from scratch
def test_sdist_builds_without_network_or_package_cache(tmp_path):
    # The sdist carries jemalloc's source; building it must not need subprojects/packagecache/
    # (absent from the sdist) nor any download.
    pytest.importorskip("build")
    sdist_dir = tmp_path / "sdist"
    subprocess.run([sys.executable, "-m", "build", "--sdist", "--no-isolation", "-o", str(sdist_dir),
                    str(ROOT)], check=True, capture_output=True)
    [sdist] = sdist_dir.glob("arenalib-*.tar.gz")
    import tarfile

    with tarfile.open(sdist) as tar:
        names = tar.getnames()
    assert any(name.endswith("subprojects/jemalloc-5.3.0/configure") for name in names)
    assert any(name.endswith("subprojects/liburing-2.3/src/setup.c") for name in names)
    assert not any("packagecache" in name for name in names)
    wheel_dir = tmp_path / "wheel"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           # any attempt to download would go nowhere
           "http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9",
           # jemalloc built from the sdist's own source, not taken from the machine's build cache
           "ARENALIB_BUILD_CACHE": "off"}
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "--no-index",
         "-w", str(wheel_dir), str(sdist)], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    [wheel] = wheel_dir.glob("arenalib-*.whl")
    import zipfile

    with zipfile.ZipFile(wheel) as zf:
        files = zf.namelist()
    assert any(f.startswith("arenalib/_arena.") and f.endswith(".so") for f in files)
    assert "arenalib/__init__.pxd" in files
    # Both cimport surfaces, what they cimport, and the one header the inline paths include; the
    # extensions' own headers (arenalib/src) stay out.
    for name in ("fast.pxd", "_table.pxd", "_fingerprints.pxd", "_abi.pxd", "_blocks.pxd", "_confined.pxd",
                 "_shared.pxd", "_slicing.pxd", "_dispatch.pxd", "_arena.pxd", "include/arenalib/platform.h"):
        assert f"arenalib/{name}" in files, name
    assert not [f for f in files if f.startswith("arenalib/src/")]
    # nothing of jemalloc or liburing is installed: no headers, no archive, no library
    assert not [f for f in files if "jemalloc" in f.lower() and not f.endswith((".pxd", ".c"))]
    assert not [f for f in files if "uring" in f.lower()]


def _jemalloc_build_script():
    path = ROOT / "subprojects" / "packagefiles" / "jemalloc" / "build_jemalloc.py"
    spec = importlib.util.spec_from_file_location("build_jemalloc", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_jemalloc_build_cache_is_keyed_by_what_makes_the_build(tmp_path, monkeypatch):
    """The cache of built jemalloc archives (outside the checkout) keys each entry by the release,
    the configure line, the flags and the compiler, honours ARENALIB_BUILD_CACHE (off: no cache),
    and stores an entry whole or not at all."""
    script = _jemalloc_build_script()
    source = tmp_path / "jemalloc"
    source.mkdir()
    (source / "VERSION").write_text("5.3.0-0-g0\n")
    (source / "configure").write_text("#!/bin/sh\n")
    cc = ["cc"]
    key = script.build_key(source, "--with-jemalloc-prefix=arenalib_je_", "-g0", cc)
    assert key == script.build_key(source, "--with-jemalloc-prefix=arenalib_je_", "-g0", cc)
    assert key != script.build_key(source, "--with-jemalloc-prefix=arenalib_je_",
                                   "-g0 -fsanitize=address", cc)
    assert key != script.build_key(source, "--enable-debug", "-g0", cc)
    (source / "configure").write_text("#!/bin/sh\n# another release\n")
    assert key != script.build_key(source, "--with-jemalloc-prefix=arenalib_je_", "-g0", cc)
    monkeypatch.setenv("ARENALIB_BUILD_CACHE", "off")
    assert script.cache_dir(key) is None
    monkeypatch.setenv("ARENALIB_BUILD_CACHE", str(tmp_path / "cache"))
    entry = script.cache_dir(key)
    assert entry == tmp_path / "cache" / "jemalloc" / key
    build = tmp_path / "build"
    for built in script.OUTPUTS.values():
        (build / built).parent.mkdir(parents=True, exist_ok=True)
        (build / built).write_bytes(b"archive or header")
    script.store(entry, build)
    assert sorted(p.name for p in entry.iterdir()) == sorted(script.OUTPUTS)
    script.store(entry, build)  # stored already: kept, nothing half-written left beside it
    assert [p.name for p in entry.parent.iterdir()] == [key]


def test_an_edited_overlay_reaches_an_extracted_source(tmp_path, monkeypatch):
    """meson copies the wrap's overlay (patch_directory) only when it extracts the source:
    refresh_overlay() copies what changed since, and only that, so that dev.py builds with it."""
    spec = importlib.util.spec_from_file_location("fetch_sources", ROOT / "tools" / "fetch_sources.py")
    fetch = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fetch)
    subprojects = tmp_path / "subprojects"
    (subprojects / "packagefiles" / "jemalloc").mkdir(parents=True)
    (subprojects / "jemalloc-5.3.0").mkdir()
    (subprojects / "jemalloc.wrap").write_text(
        "[wrap-file]\ndirectory = jemalloc-5.3.0\npatch_directory = jemalloc\n")
    monkeypatch.setattr(fetch, "ROOT", tmp_path)
    (subprojects / "packagefiles" / "jemalloc" / "build_jemalloc.py").write_text("new\n")
    (subprojects / "packagefiles" / "jemalloc" / "meson.build").write_text("same\n")
    (subprojects / "jemalloc-5.3.0" / "build_jemalloc.py").write_text("old\n")
    (subprojects / "jemalloc-5.3.0" / "meson.build").write_text("same\n")
    assert fetch.refresh_overlay("jemalloc") == ["build_jemalloc.py"]
    assert (subprojects / "jemalloc-5.3.0" / "build_jemalloc.py").read_text() == "new\n"
    assert fetch.refresh_overlay("jemalloc") == []


def test_every_wrap_is_fetched_and_pinned():
    """Each wrap in subprojects/ is one fetch_sources knows (with its Debian source package), and pins
    its tarball's sha256."""
    spec = importlib.util.spec_from_file_location("fetch_sources", ROOT / "tools" / "fetch_sources.py")
    fetch = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fetch)
    wraps = sorted(p.stem for p in (ROOT / "subprojects").glob("*.wrap"))
    assert wraps == sorted(fetch.WRAPS)
    for name in wraps:
        assert re.fullmatch(r"[0-9a-f]{64}", fetch.read_wrap(name)["source_hash"].strip())


def test_a_venv_whose_making_was_cut_short_is_made_again(tmp_path, monkeypatch):
    """An interrupted dev.py leaves a venv with a python but no pip, which the next run used as it
    was (and every pip install in it failed): it is made again.  A whole venv is kept, and one made
    before dev.py marked its venvs is kept when its pip works."""
    monkeypatch.setattr(sys, "path", list(sys.path))  # (dev.py puts tools/ first)
    spec = importlib.util.spec_from_file_location("dev", ROOT / "dev.py")
    dev = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dev)
    ran = []
    monkeypatch.setattr(dev, "run", lambda cmd, **kwargs: ran.append(cmd))
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text("#!/bin/sh\nexit 1\n")  # `python -m pip` fails: no pip
    python.chmod(0o755)
    dev.ensure_venv(sys.executable, "cut-short", venv)
    assert [cmd[1:4] for cmd in ran] == [["-m", "venv", "--clear"], ["-m", "pip", "install"]]
    assert (venv / ".arenalib-venv").exists()
    ran.clear()
    dev.ensure_venv(sys.executable, "cut-short", venv)
    assert ran == []
    (venv / ".arenalib-venv").unlink()
    python.write_text("#!/bin/sh\nexit 0\n")  # an older, whole venv: its pip answers
    dev.ensure_venv(sys.executable, "cut-short", venv)
    assert ran == [] and (venv / ".arenalib-venv").exists()
