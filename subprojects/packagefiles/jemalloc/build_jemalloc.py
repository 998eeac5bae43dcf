"""Configure and build jemalloc's static PIC archive for arenalib; copy the archive and header to --out.

Run by the overlay meson.build as a custom_target.  jemalloc's own make install is never used: its
Makefile hard-sets DESTDIR, so it would write into the real /usr/local when run as root.

The two outputs are cached outside the checkout, keyed by everything that makes them (the release,
the configure line, the flags, the compiler and this script): a fresh clone, and each of CI's build
variants, then links a jemalloc built once per machine instead of building it again (minutes on a
slow machine).  The cache is $ARENALIB_BUILD_CACHE, else $XDG_CACHE_HOME/arenalib, else
~/.cache/arenalib; ARENALIB_BUILD_CACHE=off builds every time.
"""

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def copy_if_changed(src: Path, dest: Path) -> None:
    # Unchanged outputs keep their mtime, so ninja does not relink the extension for nothing.
    if dest.exists() and dest.read_bytes() == src.read_bytes():
        return
    shutil.copyfile(src, dest)


OUTPUTS = {"libjemalloc_pic.a": Path("lib") / "libjemalloc_pic.a",
           "jemalloc.h": Path("include") / "jemalloc" / "jemalloc.h"}


def cache_dir(key: str) -> Path | None:
    """Where the outputs built for ``key`` are kept, or None when caching is off."""
    root = os.environ.get("ARENALIB_BUILD_CACHE")
    if root == "off":
        return None
    if not root:
        base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
        root = Path(base) / "arenalib"
    return Path(root) / "jemalloc" / key


def build_key(source: Path, signature: str, extra: str, cc: list[str]) -> str:
    """A digest of everything the outputs depend on."""
    digest = hashlib.sha256()
    compiler = subprocess.run([*cc, "--version"], capture_output=True, text=True).stdout
    for part in (signature, extra, compiler, (source / "VERSION").read_text(),
                 hashlib.sha256((source / "configure").read_bytes()).hexdigest(),
                 hashlib.sha256(Path(__file__).read_bytes()).hexdigest()):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:32]


def store(cached: Path, build: Path) -> None:
    """Put the outputs in the cache at once (a rename), so a half-written entry is never used."""
    cached.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=cached.parent))
    for name, built in OUTPUTS.items():
        shutil.copyfile(build / built, staging / name)
    try:
        staging.rename(cached)
    except OSError:  # another build stored it first
        shutil.rmtree(staging, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--source", required=True, type=Path)
    parser.add_argument("--build", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--prefix", required=True, help="public symbol prefix, e.g. arenalib_je_")
    parser.add_argument("--debug", action="store_true", help="jemalloc --enable-debug (assertions)")
    parser.add_argument("--cflags", default="", help="extra C flags (sanitizers)")
    # The C compiler command, after "--" (it may carry options: zig cc -target x86_64-linux-gnu.2.28)
    parser.add_argument("cc", nargs="+")
    args = parser.parse_args()

    source = args.source.resolve()
    build = args.build.resolve()
    build.mkdir(parents=True, exist_ok=True)
    # The release tarball carries VERSION; passing it keeps configure from asking git, which would
    # answer for arenalib's own repository and stamp a bogus 0.0.0 version.
    version = (source / "VERSION").read_text().strip()
    configure = [
        str(source / "configure"),
        f"--with-version={version}",
        f"--with-jemalloc-prefix={args.prefix}",
        f"--with-private-namespace={args.prefix}private_",
        "--disable-initial-exec-tls",  # dlopen-safe TLS: without it the import fails (static TLS block)
        "--disable-cxx",               # no operator new/delete overrides
        "--disable-libdl",
        "--without-export",            # nothing of jemalloc is visible outside the extension
        "--enable-static",
        "--disable-shared",
        "--disable-doc",
        "--enable-stats",
    ]
    if args.debug:
        configure.append("--enable-debug")
    env = dict(os.environ, CC=" ".join(args.cc))
    signature = "\n".join([*configure, env["CC"], args.cflags])
    extra = " ".join(["-g0", args.cflags]) if not args.debug else " ".join(["-g", args.cflags])
    args.out.mkdir(parents=True, exist_ok=True)
    # The key leaves out where the source is: a release build (-g0) does not depend on it, and every
    # checkout, CI's fresh clone and dev.py wheel's unpacked sdist then share one cached build.
    key_signature = signature if args.debug else signature.replace(str(source), "<source>")
    cached = cache_dir(build_key(source, key_signature, extra, args.cc))
    if cached is not None and all((cached / name).exists() for name in OUTPUTS):
        for name in OUTPUTS:
            copy_if_changed(cached / name, args.out / name)
        return 0
    stamp = build / "arenalib-configure.stamp"
    if not stamp.exists() or stamp.read_text() != signature:
        subprocess.run(configure, cwd=build, env=env, check=True, stdout=subprocess.DEVNULL)
        stamp.write_text(signature)
    jobs = str(os.cpu_count() or 2)
    subprocess.run(["make", "-j", jobs, f"EXTRA_CFLAGS={extra}", "lib/libjemalloc_pic.a"],
                   cwd=build, env=env, check=True, stdout=subprocess.DEVNULL)
    for name, built in OUTPUTS.items():
        copy_if_changed(build / built, args.out / name)
    if cached is not None:
        try:
            store(cached, build)
        except OSError as exc:  # a read-only or full cache never fails the build
            print(f"build_jemalloc: not cached ({exc})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
