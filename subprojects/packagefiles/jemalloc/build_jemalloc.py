"""Configure and build jemalloc's static PIC archive for arenalib; copy the archive and header to --out.

Run by the overlay meson.build as a custom_target.  jemalloc's own make install is never used: its
Makefile hard-sets DESTDIR, so it would write into the real /usr/local when run as root.
"""

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path


def copy_if_changed(src: Path, dest: Path) -> None:
    # Unchanged outputs keep their mtime, so ninja does not relink the extension for nothing.
    if dest.exists() and dest.read_bytes() == src.read_bytes():
        return
    shutil.copyfile(src, dest)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--source", required=True, type=Path)
    parser.add_argument("--build", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--prefix", required=True, help="public symbol prefix, e.g. arenalib_je_")
    parser.add_argument("--debug", action="store_true", help="jemalloc --enable-debug (assertions)")
    parser.add_argument("--cflags", default="", help="extra C flags (sanitizers)")
    parser.add_argument("--cc", nargs="+", required=True)
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
    stamp = build / "arenalib-configure.stamp"
    if not stamp.exists() or stamp.read_text() != signature:
        subprocess.run(configure, cwd=build, env=env, check=True, stdout=subprocess.DEVNULL)
        stamp.write_text(signature)
    jobs = str(os.cpu_count() or 2)
    extra = " ".join(["-g0", args.cflags]) if not args.debug else " ".join(["-g", args.cflags])
    subprocess.run(["make", "-j", jobs, f"EXTRA_CFLAGS={extra}", "lib/libjemalloc_pic.a"],
                   cwd=build, env=env, check=True, stdout=subprocess.DEVNULL)
    args.out.mkdir(parents=True, exist_ok=True)
    copy_if_changed(build / "lib" / "libjemalloc_pic.a", args.out / "libjemalloc_pic.a")
    copy_if_changed(build / "include" / "jemalloc" / "jemalloc.h", args.out / "jemalloc.h")
    return 0


if __name__ == "__main__":
    sys.exit(main())
