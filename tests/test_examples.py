"""The examples of arenalib.Ring and arenalib.aio, run end to end in child processes:
examples/ring_read.py (read_fixed into a registered pool, page cache and O_DIRECT, and its fallback
when the filesystem refuses O_DIRECT) and examples/frame_server.py with examples/frame_client.py over
loopback, with asyncio's loop and uvloop.  (examples/io_uring_read.py, the raw-syscall reader, is run
by tests/test_pool.py.)"""

from __future__ import annotations

import hashlib
import os
import resource
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import TIMEOUT_S, run_python
from test_aio import uvloop_usable

import arenalib

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
RING_READ = EXAMPLES / "ring_read.py"


@pytest.fixture(scope="module")
def data_file(tmp_path_factory) -> tuple[str, bytes]:
    """A file of 3 MiB + 1000 bytes on the disk (not tmpfs, where O_DIRECT may mean nothing): its
    last block is partial, which O_DIRECT reads as a short read at the end of the file."""
    data = os.urandom(3 * (1 << 20) + 1000)
    path = tmp_path_factory.mktemp("ring_read") / "data.bin"
    path.write_bytes(data)
    return str(path), data


def ring_read(*argv: str) -> subprocess.CompletedProcess:
    result = run_python(RING_READ, *argv)
    if result.returncode == 77:
        pytest.skip(result.stdout.strip())
    return result


@pytest.mark.parametrize("options", [
    [],
    ["--direct"],
    ["--direct", "--depth", "32", "--block-size", "65536"],
    ["--depth", "1", "--block-size", "4096"],
    ["--depth", "3", "--block-size", "1000"],   # an odd size: fine through the page cache
], ids=["default", "direct", "direct-qd32-64k", "qd1-4k", "odd-block"])
def test_ring_read_gives_the_files_sha256(data_file, options):
    path, data = data_file
    result = ring_read(path, *options)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"read {len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()}"
    block = int(options[options.index("--block-size") + 1]) if "--block-size" in options else 1 << 20
    depth = options[options.index("--depth") + 1] if "--depth" in options else "8"
    mode = "O_DIRECT" if "--direct" in options else "page cache"
    reads = -(-len(data) // block)
    assert lines[1].startswith(f"{reads} reads of {block} bytes, depth {depth}, {mode}: "), lines[1]
    assert lines[1].endswith(" MB/s")


def test_ring_read_of_an_empty_file(tmp_path):
    path = tmp_path / "empty"
    path.write_bytes(b"")
    result = ring_read(str(path), "--direct")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == f"read 0 bytes, sha256 {hashlib.sha256(b'').hexdigest()}"


def test_ring_read_refuses_an_unaligned_direct_block_size(data_file):
    result = run_python(RING_READ, data_file[0], "--direct", "--block-size", "1000")
    assert result.returncode == 2
    assert "--direct needs a --block-size that is a multiple of 4096, not 1000" in result.stderr


@pytest.mark.parametrize("where", ["open", "read"])
def test_ring_read_falls_back_when_o_direct_is_refused(data_file, where):
    """A filesystem that refuses O_DIRECT at the open, or accepts the flag and fails the reads with
    EINVAL (as some FUSE and network filesystems do): the example says so and reads through the
    page cache, with the right digest."""
    path, data = data_file
    refuse = "os.open" if where == "open" else "os.preadv"
    result = run_python(f"""
        import errno, os, runpy, sys
        real_open, real_preadv = os.open, os.preadv
        direct = set()

        def fake_open(path, flags, *args, **kwargs):
            if flags & os.O_DIRECT and {refuse!r} == "os.open":
                raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), path)
            fd = real_open(path, flags, *args, **kwargs)
            if flags & os.O_DIRECT:
                direct.add(fd)
            return fd

        def fake_preadv(fd, buffers, offset, *args):
            if fd in direct:
                raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
            return real_preadv(fd, buffers, offset, *args)

        os.open, os.preadv = fake_open, fake_preadv
        sys.argv = [{str(RING_READ)!r}, {path!r}, "--direct"]
        runpy.run_path({str(RING_READ)!r}, run_name="__main__")
    """)
    if result.returncode == 77:
        pytest.skip(result.stdout.strip())
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    what = "O_DIRECT refused" if where == "open" else "O_DIRECT reads refused"
    assert lines[0].startswith(f"{what} by the filesystem of {path} (Invalid argument): reading through "
                               "the page cache instead")
    assert lines[1] == f"read {len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()}"
    assert ", page cache: " in lines[2]


# -- the frame server and its client ----------------------------------------------------------------

def start_server(*argv: str, script: str = "frame_server.py",
                 fd_limit: int | None = None) -> tuple[subprocess.Popen, int, str]:
    """examples/frame_server.py (or ``script``) on a free port, with at most ``fd_limit`` file
    descriptors open when given: (the process, its port, the loop it says it runs)."""
    cmd = [sys.executable, "-X", "faulthandler", str(EXAMPLES / script), "--port", "0", *argv]

    def limit_fds():
        resource.setrlimit(resource.RLIMIT_NOFILE, (fd_limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              preexec_fn=limit_fds if fd_limit else None)
    first = server.stdout.readline()
    if not first.startswith("listening on "):
        server.kill()
        _, err = server.communicate()
        pytest.fail(f"the server did not start: {first!r}\n{err}")
    address, loop = first.removeprefix("listening on ").split(" (")
    return server, int(address.rsplit(":", 1)[1]), loop


def finish(server: subprocess.Popen) -> tuple[str, str]:
    try:
        out, err = server.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        server.kill()
        out, err = server.communicate()
        pytest.fail(f"the server did not exit after its connection closed\n{out}\n{err}")
    assert server.returncode == 0, err
    return out, err


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_frame_server_answers_every_frame(loop):
    if loop == "uvloop":
        why = uvloop_usable()
        if why:
            pytest.skip(why)
    flags = ["--no-uvloop"] if loop == "asyncio" else []
    server, port, loop_name = start_server("--once", *flags)
    try:
        assert loop_name == f"{loop} loop)\n"
        sizes = [0, 1, 7, 8, 9, 65535, 65536, 65537, 1 << 20, 5 << 20]
        result = run_python(EXAMPLES / "frame_client.py", "--port", str(port),
                            "--sizes", ",".join(map(str, sizes)), "--count", "25", *flags)
    finally:
        out, _ = finish(server)
    assert result.returncode == 0, result.stdout + result.stderr
    total = sum(sizes[i % len(sizes)] for i in range(25))
    assert result.stdout.startswith(f"25 frames, {total} bytes: every reply matched (")
    assert out.splitlines() == [f"connection closed: 25 frames, {total} bytes",
                                f"served 1 connection(s), 25 frames, {total} bytes"]


def test_frame_server_drops_a_connection_whose_frame_is_too_large():
    server, port, _ = start_server("--once", "--max-frame-size", "1000")
    try:
        result = run_python(EXAMPLES / "frame_client.py", "--port", str(port), "--sizes", "10,100000")
    finally:
        out, _ = finish(server)
    assert result.returncode == 1
    assert "the server" in result.stdout and "the connection after 1 of 2 replies" in result.stdout
    assert out.splitlines()[0] == ("connection closed: 1 frames, 10 bytes (FrameError: a frame of 100000 "
                                   "bytes is above max_frame_size (1000))")


# -- the io_uring server: provided buffers, multishot receive ----------------------------------------

def _ring_server_usable() -> str | None:
    try:
        with arenalib.Ring(2) as ring, arenalib.BufferPool(64, 1) as pool:
            ring.provide(pool, 0)
            ring.withdraw(0)
    except OSError as exc:
        return f"provided-buffer rings are not available here: {exc}"
    return None


def start_ring_server(*argv: str, fd_limit: int | None = None) -> tuple[subprocess.Popen, int, str]:
    """examples/ring_server.py, as start_server() starts frame_server.py (skipped where the kernel
    has no provided-buffer rings)."""
    why = _ring_server_usable()
    if why:
        pytest.skip(why)
    return start_server(*argv, script="ring_server.py", fd_limit=fd_limit)


def test_ring_server_answers_every_frame():
    server, port, what = start_ring_server("--once", "--buffers", "8", "--buffer-size", "5000")
    try:
        assert what == "io_uring, 8 buffers of 5000 bytes)\n"
        sizes = [0, 1, 7, 8, 9, 4999, 5000, 5001, 65537, 1 << 20, 5 << 20]
        result = run_python(EXAMPLES / "frame_client.py", "--port", str(port),
                            "--sizes", ",".join(map(str, sizes)), "--count", "25", "--no-uvloop")
    finally:
        out, _ = finish(server)
    assert result.returncode == 0, result.stdout + result.stderr
    total = sum(sizes[i % len(sizes)] for i in range(25))
    assert result.stdout.startswith(f"25 frames, {total} bytes: every reply matched (")
    assert out.splitlines()[-2:] == [f"connection closed: 25 frames, {total} bytes",
                                     f"served 1 connection(s), 25 frames, {total} bytes"]


def test_ring_server_serves_many_connections_from_one_pool():
    """30 clients at once against 4 buffers: the receives run out of buffers (ENOBUFS) and are
    re-armed; every reply still matches."""
    server, port, _ = start_ring_server("--connections", "30", "--buffers", "4", "--buffer-size",
                                        "4096")
    try:
        clients = [subprocess.Popen([sys.executable, str(EXAMPLES / "frame_client.py"), "--port", str(port),
                                     "--sizes", "100,70000,3", "--count", "6", "--no-uvloop"],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                   for _ in range(30)]
        outputs = [c.communicate(timeout=TIMEOUT_S) for c in clients]
    finally:
        out, _ = finish(server)
    for c, (stdout, stderr) in zip(clients, outputs, strict=True):
        assert c.returncode == 0, stdout + stderr
        assert stdout.startswith("6 frames, 140206 bytes: every reply matched")
    assert out.splitlines()[-1] == "served 30 connection(s), 180 frames, 4206180 bytes"


def test_ring_server_serves_others_while_a_client_reads_none_of_its_replies():
    """A client that sends empty frames as fast as it can and never reads the replies: the server
    answered with a blocking sendall() in its one loop, so once that client's socket filled, no
    other connection was served.  Replies go through the ring now; that client is cut off past
    MAX_UNSENT bytes of replies not taken."""
    server, port, _ = start_ring_server("--connections", "2")
    header = struct.Struct("!Q")
    greedy = socket.create_connection(("127.0.0.1", port))
    try:
        greedy.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        greedy.setblocking(False)
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            try:
                greedy.send(header.pack(0) * 1000)
            except BlockingIOError:
                time.sleep(0.01)
            except OSError:  # cut off by the server
                break
        result = run_python(EXAMPLES / "frame_client.py", "--port", str(port), "--sizes", "10,5000",
                            "--count", "4", "--no-uvloop", timeout=30)
    finally:
        greedy.close()
        out, _ = finish(server)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("4 frames, 10020 bytes: every reply matched")
    assert "ConnectionError: the client took none of its last" in out


def four_small_frames(port: int) -> subprocess.CompletedProcess:
    """examples/frame_client.py sending 4 frames of 1 and 100 bytes to the server on ``port``."""
    return run_python(EXAMPLES / "frame_client.py", "--port", str(port), "--sizes", "1,100", "--count", "4",
                      "--no-uvloop", timeout=60)


def test_ring_server_accepts_again_once_file_descriptors_are_back():
    """More connections than the server's file descriptors: accept() failed with EMFILE, and the
    accepting thread took that for the listener's close and ended (the server deaf for good)."""
    idle_count = 80
    server, port, _ = start_ring_server("--connections", str(idle_count + 1), fd_limit=64)
    try:
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(idle_count)]
        time.sleep(0.5)  # the server runs out of descriptors, the rest wait in the backlog
        for sock in idle:
            sock.close()
        result = four_small_frames(port)
    finally:
        out, err = finish(server)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "accept: Too many open files; retrying until connections close" in err
    assert out.splitlines()[-1] == f"served {idle_count + 1} connection(s), 4 frames, 202 bytes"


def test_ring_server_goes_on_when_a_frame_cannot_be_allocated():
    """A length prefix the arena cannot allocate (under --max-frame-size): feed()'s MemoryError
    left the server's loop, which caught only the errors of replies, and ended the server."""
    server, port, _ = start_ring_server("--connections", "2", "--max-frame-size", str(1 << 62))
    try:
        with socket.create_connection(("127.0.0.1", port)) as greedy:
            greedy.sendall(struct.pack("!Q", 1 << 48))
            assert greedy.recv(1) == b""  # its stream ended: the server shut its side
        result = four_small_frames(port)
    finally:
        out, _ = finish(server)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "(MemoryError: cannot allocate 281474976710656 bytes" in out


def test_ring_server_drops_a_connection_whose_frame_is_too_large():
    server, port, _ = start_ring_server("--once", "--max-frame-size", "1000")
    try:
        result = run_python(EXAMPLES / "frame_client.py", "--port", str(port), "--sizes", "10,100000",
                            "--no-uvloop")
    finally:
        out, _ = finish(server)
    assert result.returncode == 1
    assert "the connection after 1 of 2 replies" in result.stdout
    assert out.splitlines()[0] == ("connection closed: 1 frames, 10 bytes (FrameError: a frame of 100000 "
                                   "bytes is above max_frame_size (1000))")


def test_ring_server_holds_more_connections_than_its_old_ring_had_slots():
    """600 idle connections, then a client: each armed receive holds one of the ring's request
    slots, and the server's Ring(256) had 512 (cq_entries), so the 512th connection made it die with
    OSError(EBUSY).  Now the ring is sized by --max-connections (1024) and the client is served."""
    server, port, _ = start_ring_server("--once")
    idle = []
    try:
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(600)]
        result = run_python(EXAMPLES / "frame_client.py", "--port", str(port), "--sizes", "10,5000",
                            "--count", "4", "--no-uvloop")
    finally:
        out, err = finish(server)  # (--once: the first connection that closes is the client's)
        for sock in idle:
            sock.close()
    assert result.returncode == 0, result.stdout + result.stderr + err
    assert out.splitlines()[-1] == "served 1 connection(s), 4 frames, 10020 bytes"


def test_ring_server_closes_a_connection_past_max_connections():
    server, port, _ = start_ring_server("--once", "--max-connections", "2")
    try:
        first = socket.create_connection(("127.0.0.1", port))
        second = socket.create_connection(("127.0.0.1", port))
        third = socket.create_connection(("127.0.0.1", port))
        third.settimeout(TIMEOUT_S)
        assert third.recv(1) == b""  # closed by the server at once
        third.close()
        second.close()
        first.close()
    finally:
        out, _ = finish(server)
    # (Both others may close in the --once server's last batch of completions.)
    assert out.splitlines()[-1] in [f"served {n} connection(s), 0 frames, 0 bytes (1 refused: more than "
                                    "--max-connections 2 at once)" for n in (1, 2)]


def test_ring_server_outlives_a_client_that_resets_its_connection():
    """A client sends a 5 MiB frame and resets the connection (SO_LINGER 0) once the kernel has
    delivered every byte: the server reads the frame, hashes it, and its reply (sendall in on_frame)
    fails with EPIPE, which left RingFrameReader.feed() and ended the whole server.  Now that
    connection ends, and the next client is served."""
    import fcntl
    import struct
    import termios
    import time

    server, port, _ = start_ring_server("--connections", "2")
    try:
        with socket.create_connection(("127.0.0.1", port)) as rude:
            rude.sendall(struct.pack("!Q", 5 << 20) + b"x" * (5 << 20))
            unsent = bytearray(4)
            for _ in range(10000):  # until the peer's kernel has every byte (loopback ACKs at once)
                fcntl.ioctl(rude, termios.TIOCOUTQ, unsent)
                if not int.from_bytes(unsent, "little"):
                    break
                time.sleep(0.001)
            rude.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        result = run_python(EXAMPLES / "frame_client.py", "--port", str(port), "--sizes", "10",
                            "--count", "2", "--no-uvloop")
    finally:
        out, err = finish(server)
    assert result.returncode == 0, result.stdout + result.stderr + err
    assert "connection closed: 2 frames, 20 bytes" in out.splitlines()
    assert out.splitlines()[-1].startswith("served 2 connection(s)")
