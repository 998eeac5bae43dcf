"""Put the release tarballs of the wraps (jemalloc, liburing) into meson's package cache.

One fetcher serves every wrap in subprojects/ (WRAPS names each with its Debian source package).
Meson builds a [wrap-file] from ``subprojects/packagecache/<source_filename>`` without touching the
network.  This script fills that cache: first from the wrap's ``source_url``; where that cannot be
reached, from the Debian source package of the same release (its orig tarball is byte-identical to the
upstream one), fetched with apt through a private sources list and private state and cache folders so
the system's apt configuration is left alone.  Whichever way a tarball came, its sha256 must equal the
wrap's ``source_hash``.  tools/build_python.py fetches CPython's tarball the same way (obtain_tarball).

Usage: python3 tools/fetch_sources.py [--no-url] [WRAP ...]   (default: every wrap; stdlib only, 3.10+)
"""

from __future__ import annotations

import argparse
import configparser
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "subprojects" / "packagecache"
# Each wrap (subprojects/<name>.wrap) and the Debian source package that carries its release tarball.
WRAPS = {"jemalloc": "jemalloc", "liburing": "liburing"}
URL_TIMEOUT_S = 10


def read_wrap(name: str) -> configparser.SectionProxy:
    """The [wrap-file] section of subprojects/``name``.wrap."""
    parser = configparser.ConfigParser(inline_comment_prefixes=None)
    path = ROOT / "subprojects" / f"{name}.wrap"
    if not parser.read(path):
        raise SystemExit(f"no wrap file {path}")
    return parser["wrap-file"]


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_from_url(url: str, dest: Path) -> None:
    with urllib.request.urlopen(url, timeout=URL_TIMEOUT_S) as response, dest.open("wb") as out:
        shutil.copyfileobj(response, out)


def _source_entries() -> list[str]:
    """The system's binary package sources, rewritten as deb-src entries (one-line and deb822)."""
    entries = []
    for path in ["/etc/apt/sources.list", *sorted(glob.glob("/etc/apt/sources.list.d/*.list"))]:
        if os.path.exists(path):
            for line in Path(path).read_text().splitlines():
                if line.strip().startswith("deb "):
                    entries.append(("list", "deb-src " + line.strip()[4:]))
    for path in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
        text = Path(path).read_text()
        stanzas = []
        for stanza in text.split("\n\n"):
            lines = [ln for ln in stanza.splitlines() if not ln.lstrip().startswith("#")]
            if any(ln.split(":", 1)[0].strip() == "Types" and "deb" in ln.split(":", 1)[1].split()
                   for ln in lines if ":" in ln):
                lines = ["Types: deb-src" if ln.startswith("Types:") else ln for ln in lines]
                stanzas.append("\n".join(lines))
        if stanzas:
            entries.append(("sources", "\n\n".join(stanzas)))
    return [f"{kind}\0{body}" for kind, body in entries]


def fetch_from_debian(dest: Path, wanted_hash: str, package: str,
                      sources: list[str] | None = None) -> None:
    """Download Debian's source ``package`` with apt into a scratch folder and take its orig tarball.

    ``sources`` are one-line deb-src entries to use instead of the system's own suites (a newer
    release's suite, say); by default the system's binary sources are rewritten as deb-src."""
    if shutil.which("apt-get") is None:
        raise RuntimeError("apt-get is not available")
    with tempfile.TemporaryDirectory(prefix="arenalib-apt-") as tmp:
        tmpdir = Path(tmp)
        parts = tmpdir / "sources.list.d"
        for sub in ("sources.list.d", "lists/partial", "cache/archives/partial", "download"):
            (tmpdir / sub).mkdir(parents=True)
        list_lines = []
        entries = [f"list\0{line}" for line in sources] if sources is not None else _source_entries()
        for n, entry in enumerate(entries):
            kind, body = entry.split("\0", 1)
            if kind == "list":
                list_lines.append(body)
            else:
                (parts / f"src{n}.sources").write_text(body + "\n")
        (parts / "src.list").write_text("\n".join(list_lines) + "\n")
        apt = [
            "apt-get", "-q",
            "-o", f"Dir::Etc::SourceList={parts / 'src.list'}",
            "-o", f"Dir::Etc::SourceParts={parts}",
            "-o", f"Dir::State::Lists={tmpdir / 'lists'}",
            "-o", f"Dir::Cache={tmpdir / 'cache'}",
            "-o", "APT::Sandbox::User=root",
        ]
        subprocess.run([*apt, "update"], check=True, stdout=subprocess.DEVNULL)
        subprocess.run([*apt, "source", "--download-only", package],
                       check=True, cwd=tmpdir / "download", stdout=subprocess.DEVNULL)
        for candidate in sorted((tmpdir / "download").glob("*.orig.tar.*")):
            if sha256_of(candidate) == wanted_hash:
                shutil.move(str(candidate), dest)
                return
        raise RuntimeError("Debian's orig tarball does not match the wrap's source_hash")


def refresh_overlay(name: str) -> list[str]:
    """Copy the overlay files of wrap ``name`` (subprojects/packagefiles/<name>/) over its already
    extracted source tree where they differ: meson applies a wrap's patch_directory only when it
    extracts, so an edited overlay would otherwise never reach an existing checkout's build.  Returns
    what it copied."""
    wrap = read_wrap(name)
    extracted = ROOT / "subprojects" / wrap["directory"].strip()
    overlay = ROOT / "subprojects" / "packagefiles" / wrap["patch_directory"].strip()
    copied = []
    if not extracted.is_dir():
        return copied
    for source in sorted(overlay.rglob("*")):
        target = extracted / source.relative_to(overlay)
        if source.is_file() and (not target.exists() or target.read_bytes() != source.read_bytes()):
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
            copied.append(str(source.relative_to(overlay)))
    return copied


def obtain_tarball(dest: Path, wanted: str, url: str | None, debian_package: str,
                   debian_sources: list[str] | None = None) -> Path:
    """``dest`` with sha256 ``wanted``: kept if already there, else from ``url``, else from the orig
    tarball of Debian's source package ``debian_package`` (see fetch_from_debian)."""
    if dest.exists() and sha256_of(dest) == wanted:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_suffix(dest.suffix + ".part")
    errors = []
    attempts = []
    if url:
        attempts.append(("source URL", lambda: fetch_from_url(url, partial)))
    attempts.append(("Debian source package",
                     lambda: fetch_from_debian(partial, wanted, debian_package, debian_sources)))
    for name, attempt in attempts:
        partial.unlink(missing_ok=True)
        try:
            attempt()
        except Exception as exc:  # every failure means: try the next source
            errors.append(f"{name}: {exc}")
            continue
        got = sha256_of(partial)
        if got == wanted:
            partial.replace(dest)
            print(f"{dest.name} from {name} (sha256 ok)")
            return dest
        errors.append(f"{name}: sha256 {got} != {wanted}")
    partial.unlink(missing_ok=True)
    raise SystemExit(
        f"could not obtain {dest.name}:\n  " + "\n  ".join(errors)
        + f"\nPut {dest.name} (sha256 {wanted}) into {dest.parent} by hand and run again."
    )


def ensure_tarball(name: str, try_url: bool = True) -> Path:
    """The release tarball of wrap ``name`` in the package cache, fetched first if need be."""
    wrap = read_wrap(name)
    return obtain_tarball(CACHE / wrap["source_filename"].strip(), wrap["source_hash"].strip(),
                          wrap["source_url"].strip() if try_url else None, WRAPS[name])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wraps", nargs="*", metavar="WRAP", help=f"{' or '.join(WRAPS)} (default: all)")
    parser.add_argument("--no-url", action="store_true", help="skip the upstream URL, use Debian's package")
    args = parser.parse_args()
    if unknown := sorted(set(args.wraps) - set(WRAPS)):
        parser.error(f"unknown wrap(s) {', '.join(unknown)}: choose from {', '.join(WRAPS)}")
    for name in args.wraps or WRAPS:
        ensure_tarball(name, try_url=not args.no_url)


if __name__ == "__main__":
    sys.exit(main())
