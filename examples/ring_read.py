"""Read a file with arenalib.Ring into the registered buffers of a BufferPool (read_fixed), with up to
DEPTH reads in flight, optionally with O_DIRECT; print the sha256 of the content and the throughput.

    python examples/ring_read.py FILE [--direct] [--depth N] [--block-size N]

The pattern:

* ``pool = BufferPool(block_size, depth, align=4096)``: one buffer per read in flight, each aligned
  to 4096 bytes, which O_DIRECT needs (the buffer's address, the file offset and the length must all
  be multiples of the device's logical block size; 4096 covers every common device).
* ``ring.register_pool(pool)``: buffer i becomes the kernel's fixed buffer i, its pages pinned once
  for the registration instead of once per request.  ``ring.read_fixed(fd, seg, offset,
  user_data=...)`` takes a live Segment acquired from that pool (never a bare index).
* ``ring.wait(1)`` submits what is queued, waits without the GIL, and returns ``[(user_data,
  result), ...]``; ``check(result)`` turns ``-errno`` into the matching OSError.

The safety rules, and what enforces them:

* The kernel writes into a segment until the read's completion is reaped.  The Ring holds a buffer
  export of the segment meanwhile, so ``pool.release(seg)`` (or ``seg.free()``) on a segment whose read
  is in flight raises BufferError and changes nothing: release a segment only after wait() has
  returned its completion (as the loop below does).
* While the pool is registered, ``pool.close()`` raises BufferError: ``ring.unregister_pool()`` (or
  ``ring.close()``, which cancels and reaps whatever is still in flight first) comes before the
  pool's close, which the nesting of the with-blocks below gives.
* Read the data through the segment (a memoryview of it, released before the segment is): the
  segment checks that it is alive.
* Completions arrive in any order: the digest takes the blocks in file order, so a completed block
  waits (its buffer held) until the blocks before it are in.
* O_DIRECT: the block size must be a multiple of 4096.  A filesystem that refuses O_DIRECT (tmpfs
  before Linux 6.6, some FUSE and network filesystems) fails the open or the first read with EINVAL:
  the example then says so and reads through the page cache.

Exits with status 77 when io_uring is unavailable (the kernel lacks it or refuses io_uring_setup).
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import os
import sys
import time

from arenalib import BufferPool, Ring, Segment, check

ALIGN = 4096


def open_direct(path: str) -> tuple[int, bool]:
    """``(fd, direct)``: ``path`` opened with O_DIRECT, or without it (and a message saying why) when
    the filesystem refuses it, at the open or at a first aligned read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        print(f"O_DIRECT refused by the filesystem of {path} ({exc.strerror}): reading through the "
              "page cache instead")
        return os.open(path, os.O_RDONLY), False
    # Some filesystems accept the flag at open and refuse the reads: try one aligned block.
    with BufferPool(ALIGN, 1, align=ALIGN) as probe:
        seg = probe.acquire()
        try:
            os.preadv(fd, [seg], 0)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                os.close(fd)
                raise
            os.close(fd)
            print(f"O_DIRECT reads refused by the filesystem of {path} ({exc.strerror}): reading "
                  "through the page cache instead")
            return os.open(path, os.O_RDONLY), False
        finally:
            probe.release(seg)
    return fd, True


def read_file(ring: Ring, fd: int, size: int, block: int, depth: int) -> tuple[str, int]:
    """Read ``size`` bytes of ``fd`` with up to ``depth`` read_fixed requests in flight; returns
    (sha256 of the content, reads issued)."""
    digest = hashlib.sha256()
    reads = 0
    with BufferPool(block, depth, align=ALIGN) as pool:
        ring.register_pool(pool)                      # pool.close() refuses until unregistered
        in_flight: dict[int, Segment] = {}            # offset -> segment being read into
        done: dict[int, tuple[Segment, int]] = {}     # offset -> (segment, bytes), until its turn
        next_offset = next_digest = 0
        try:
            while next_digest < size:
                # Fill the ring: one read per free buffer.
                while next_offset < size and (seg := pool.try_acquire()) is not None:
                    ring.read_fixed(fd, seg, next_offset, user_data=next_offset)
                    in_flight[next_offset] = seg
                    next_offset += block
                    reads += 1
                for offset, res in ring.wait(1):      # submits, waits for at least one completion
                    seg = in_flight.pop(offset)
                    n = check(res)                    # OSError for -errno
                    if n != min(block, size - offset):
                        raise OSError(errno.EIO, f"short read: {n} bytes at offset {offset}")
                    done[offset] = (seg, n)
                while next_digest in done:            # in file order
                    seg, n = done.pop(next_digest)
                    with memoryview(seg)[:n] as view:  # released before the segment is
                        digest.update(view)
                    pool.release(seg)                 # its read is reaped: the buffer is ours again
                    next_digest += n
        finally:
            if in_flight:   # an error above: let the kernel finish with the buffers before going on
                ring.wait(len(in_flight))
            ring.unregister_pool()                    # before the pool's close (the with-exit)
    return digest.hexdigest(), reads


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file")
    parser.add_argument("--direct", action="store_true", help="open with O_DIRECT (bypass the page cache)")
    parser.add_argument("--depth", type=int, default=8, help="reads in flight at most (default 8)")
    parser.add_argument("--block-size", type=int, default=1 << 20, help="bytes per read (default 1 MiB)")
    args = parser.parse_args()
    if args.depth < 1 or args.block_size < 1:
        parser.error("--depth and --block-size must be positive")
    if args.direct and args.block_size % ALIGN:
        parser.error(f"--direct needs a --block-size that is a multiple of {ALIGN}, not {args.block_size}")
    try:
        ring = Ring(args.depth)
    except OSError as exc:
        print(f"io_uring is unavailable here: {exc}")
        return 77
    with ring:
        fd, direct = open_direct(args.file) if args.direct else (os.open(args.file, os.O_RDONLY), False)
        try:
            size = os.fstat(fd).st_size
            start = time.perf_counter()
            digest, reads = read_file(ring, fd, size, args.block_size, args.depth)
            seconds = time.perf_counter() - start
        finally:
            os.close(fd)
    mode = "O_DIRECT" if direct else "page cache"
    print(f"read {size} bytes, sha256 {digest}")
    print(f"{reads} reads of {args.block_size} bytes, depth {args.depth}, {mode}: {seconds * 1e3:.1f} ms, "
          f"{size / max(seconds, 1e-9) / 1e6:.0f} MB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
