"""Read a file through io_uring into arenalib.BufferPool buffers, with the raw-syscall client
examples/raw_uring.py (standard library only).

    python examples/io_uring_read.py FILE [--fixed]

The pattern, with up to DEPTH (8) reads in flight:

* raw_uring takes addresses, so a request names a pool buffer by its address: ``seg =
  pool.acquire()``, ``i = pool.index(seg)``, then ``ring.prep_readv(fd, iovs[i], offset,
  user_data=i)``, where ``iovs[i] = raw_uring.iovec_array([pool.iovecs()[i]])`` describes buffer
  ``i`` and is built once for the pool's life (``pool.iovecs()[i] == (seg.address, len(seg))``).
* On the completion of ``user_data`` i the data is in ``seg``: read it through the segment (which
  checks it is alive), then ``pool.release(seg)``.  Keep the segment acquired until its completion
  arrives: the kernel writes into the buffer until then, and a released buffer may already be the
  next request's.
* Fixed buffers (--fixed): ``ring.register_buffers(pool.iovecs())`` makes buffer ``i`` fixed buffer
  ``i`` (the kernel pins its pages); read with ``ring.prep_read_fixed(fd, seg.address, len(seg),
  offset, i, user_data=i)``.  Unregister before the pool closes: the kernel would go on writing
  into the pinned pages, whatever they hold by then.

Exits with status 77 when io_uring is unavailable (the kernel lacks or refuses io_uring_setup).
"""

from __future__ import annotations

import errno
import hashlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import raw_uring

from arenalib import BufferPool, Segment

BLOCK = 64 * 1024
DEPTH = 8


def read_file(ring: raw_uring.Ring, path: str, fixed: bool = False) -> tuple[int, str]:
    """Read ``path`` with up to DEPTH reads in flight; returns (bytes read, sha256 of the content)."""
    fd = os.open(path, os.O_RDONLY)
    size = os.fstat(fd).st_size
    digest = hashlib.sha256()
    try:
        with BufferPool(BLOCK, DEPTH) as pool:
            iovs = [raw_uring.iovec_array([pair]) for pair in pool.iovecs()]
            if fixed:
                ring.register_buffers(pool.iovecs())
            inflight: dict[int, tuple[int, Segment]] = {}  # buffer index -> (offset, segment)
            done: dict[int, bytes] = {}  # offset -> data, until it is next in order
            next_offset = next_digest = 0
            try:
                while next_digest < size:
                    # Fill the ring: one read per free buffer.
                    while next_offset < size and (seg := pool.try_acquire()) is not None:
                        i = pool.index(seg)
                        if fixed:
                            ring.prep_read_fixed(fd, seg.address, len(seg), next_offset, i, user_data=i)
                        else:
                            ring.prep_readv(fd, iovs[i], next_offset, user_data=i)
                        inflight[i] = (next_offset, seg)
                        next_offset += BLOCK
                    ring.submit()
                    # Reap what has completed (at least one): raw_uring.check raises OSError for -errno.
                    for i, res in ring.wait(1):
                        offset, seg = inflight.pop(i)
                        n = raw_uring.check(res)
                        if n != min(BLOCK, size - offset):
                            raise OSError(errno.EIO, f"short read: {n} bytes at offset {offset}")
                        done[offset] = seg[:n]
                        pool.release(seg)
                    while next_digest in done:  # completions may come out of order
                        chunk = done.pop(next_digest)
                        digest.update(chunk)
                        next_digest += len(chunk)
            finally:
                if inflight:  # an error above: let the kernel finish with the buffers first
                    ring.wait(ring.inflight)
                if fixed:
                    ring.unregister_buffers()  # before the pool closes
            stats = pool.stats()
            print(f"{stats['acquisitions']} reads, high water {stats['high_water']} buffers")
    finally:
        os.close(fd)
    return size, digest.hexdigest()


def main() -> int:
    args = [a for a in sys.argv[1:] if a != "--fixed"]
    if len(args) != 1:
        print(__doc__.splitlines()[3].strip(), file=sys.stderr)
        return 2
    try:
        ring = raw_uring.Ring(DEPTH)
    except raw_uring.Unavailable as e:
        print(f"io_uring is unavailable here: {e}")
        return 77
    with ring:
        size, digest = read_file(ring, args[0], fixed="--fixed" in sys.argv)
    print(f"read {size} bytes, sha256 {digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
