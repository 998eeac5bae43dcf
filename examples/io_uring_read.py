"""Read a file through io_uring into arenalib.BufferPool buffers (with the `liburing` package from PyPI).

    python examples/io_uring_read.py FILE [--fixed]

The pattern, given how liburing 2026.3.30 takes buffers:

* ``liburing.Iovec`` accepts only bytes, bytearray and memoryview objects (not a Segment), and keeps a
  memoryview's buffer export for good.  ``Iovec([memoryview(seg)])`` would therefore pin the segment:
  release() and close() would raise BufferError forever.  ``io_uring_prep_read`` and
  ``io_uring_prep_read_fixed`` accept only a bytearray, whose memory is never the pool's.
* So build the Iovecs once, from ``pool.raw_views()``: one plain memoryview per buffer, in index order,
  not counted as exports.  ``iovs[i] = Iovec([views[i]])`` describes buffer ``i`` for the pool's whole
  life; no per-request Iovec is made.
* Per request: ``seg = pool.acquire()``, ``i = pool.index(seg)``, ``io_uring_prep_readv(sqe, fd,
  iovs[i], offset)`` with ``sqe.user_data = i``; on its completion the data is in ``seg`` (read it
  through the segment, which checks it is alive), then ``pool.release(seg)``.  Keep the segment
  acquired until its completion arrives: the kernel writes into the buffer until then.
* Fixed buffers (--fixed): ``io_uring_register_buffers(ring, Iovec(views))`` makes buffer ``i`` fixed
  buffer ``i``; read with ``io_uring_prep_readv_fixed(sqe, fd, iovs[i], i, offset)`` (Linux 6.15+).
  Unregister (or exit the ring) before the pool closes.

The raw views do not track which buffers are acquired (they only hand addresses to the kernel), so
everything the program reads goes through the acquired segments; they keep the region's memory
allocated while they live, so even a late write through one never lands in freed memory.
Exits with status 77 when io_uring is unavailable.
"""

from __future__ import annotations

import hashlib
import os
import sys

import liburing

from arenalib import BufferPool

BLOCK = 64 * 1024
DEPTH = 8


def read_file(path: str, fixed: bool = False) -> tuple[int, str]:
    """Read ``path`` with up to DEPTH reads in flight; returns (bytes read, sha256 of the content)."""
    ring = liburing.Ring()
    liburing.io_uring_queue_init(DEPTH, ring)
    fd = os.open(path, os.O_RDONLY)
    size = os.fstat(fd).st_size
    digest = hashlib.sha256()
    try:
        with BufferPool(BLOCK, DEPTH) as pool:
            views = pool.raw_views()
            iovs = [liburing.Iovec([view]) for view in views]
            if fixed:
                liburing.io_uring_register_buffers(ring, liburing.Iovec(views))
            cqe = liburing.Cqe()
            inflight: dict[int, tuple[int, object]] = {}  # buffer index -> (offset, segment)
            done: dict[int, bytes] = {}                    # offset -> data, until it is next in order
            next_offset = next_digest = 0
            try:
                while next_digest < size:
                    # Fill the ring: one read per free buffer.
                    while next_offset < size and (seg := pool.try_acquire()) is not None:
                        i = pool.index(seg)
                        sqe = liburing.io_uring_get_sqe(ring)
                        if fixed:
                            liburing.io_uring_prep_readv_fixed(sqe, fd, iovs[i], i, next_offset)
                        else:
                            liburing.io_uring_prep_readv(sqe, fd, iovs[i], next_offset)
                        sqe.user_data = i
                        inflight[i] = (next_offset, seg)
                        next_offset += BLOCK
                    liburing.io_uring_submit(ring)
                    # Reap one completion (res raises OSError for a failed read).
                    liburing.io_uring_wait_cqe(ring, cqe)
                    entry = cqe[0]
                    i = entry.user_data
                    offset, seg = inflight.pop(i)
                    try:
                        n = entry.res
                    finally:
                        liburing.io_uring_cqe_seen(ring, entry)
                    done[offset] = seg[:n]
                    pool.release(seg)
                    while next_digest in done:  # completions may come out of order
                        chunk = done.pop(next_digest)
                        digest.update(chunk)
                        next_digest += len(chunk) if chunk else size
            finally:
                if fixed:
                    liburing.io_uring_unregister_buffers(ring)
            print(f"{pool.stats()['acquisitions']} reads, high water {pool.stats()['high_water']} buffers")
    finally:
        os.close(fd)
        liburing.io_uring_queue_exit(ring)
    return size, digest.hexdigest()


def main() -> int:
    args = [a for a in sys.argv[1:] if a != "--fixed"]
    if len(args) != 1:
        print(__doc__.splitlines()[2].strip(), file=sys.stderr)
        return 2
    try:
        probe = liburing.Ring()
        liburing.io_uring_queue_init(1, probe)
        liburing.io_uring_queue_exit(probe)
    except OSError as e:
        print(f"io_uring is unavailable here: {e}")
        return 77
    size, digest = read_file(args[0], fixed="--fixed" in sys.argv)
    print(f"read {size} bytes, sha256 {digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
