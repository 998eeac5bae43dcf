"""A TCP server that serves many connections from one BufferPool through arenalib.Ring's provided
buffers and multishot receive, and answers each length-prefixed frame with its length and sha256
(examples/frame_server.py's protocol: examples/frame_client.py is its client too).

    python examples/ring_server.py [--host 127.0.0.1] [--port 8765] [--once | --connections N]
                                   [--buffers 64] [--buffer-size 16384] [--max-frame-size N]
                                   [--max-connections 1024]

The pattern:

* ``ring.provide(pool, GROUP)`` lends the pool's buffers to the kernel once; each accepted socket
  gets one ``ring.recv_multishot(sock, GROUP, user_data=conn)``, armed until it ends.  The receive
  buffers are the pool's 64, whatever the number of connections: memory follows the data in flight,
  not the connections.
* ``ring.wait(1)`` returns ``(conn, Received)`` pairs.  ``conn.reader.feed(received)`` (an
  ``arenalib.aio.RingFrameReader``) copies the bytes into the frames they belong to and releases the
  received Segment at once, which gives its buffer back to the ring; each whole frame reaches
  ``on_frame``.
* A receive that ends (``more`` False) is re-armed, unless the stream ended or failed: -ENOBUFS (every
  buffer out at once) and the kernel ending a receive are part of the protocol, not errors.
* Replies go out through the ring too (``ring.send``, one in flight per connection, the next ones
  gathered meanwhile), never by a blocking ``sendall()`` in the loop: a client that reads none of
  its replies stalls only itself, and past MAX_UNSENT bytes of them its connection is ended.
* Each armed receive and each send holds one of the ring's ``cq_entries`` request slots until it
  ends (the wake pipe's read holds one more), so the ring is sized for ``--max-connections`` and a
  connection past them is closed at once (more would make ``recv_multishot()`` raise
  OSError(EBUSY)).
* New connections come from a thread blocked in ``accept()``, which hands them over through a queue
  and wakes the ring through a pipe the ring reads (one ring, one owner thread: the acceptor never
  touches the ring).

The safety rules:

* Release each received Segment (``free()``) when done with it: until then its buffer is out of the
  ring, and with every buffer out the receives end with -ENOBUFS.  A released Segment is dead for
  good (ArenaClosedError), even once the kernel fills its buffer again for another connection.
* A reply that fails (the client reset the connection) ends that connection's stream, not the
  server: its socket is shut down, and its receive ends.
* The pool cannot close or reset while provided: ``ring.close()`` (or ``withdraw()``) first.
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import os
import queue
import socket
import struct
import sys
import threading
import time

from arenalib import BufferPool, Ring, Segment
from arenalib.aio import RingFrameReader

REPLY = struct.Struct("!Q32s")   # a frame's length and its sha256
GROUP = 0
WAKE = object()                  # the user_data of the wake pipe's read
MAX_UNSENT = 1 << 20             # replies a client has not taken yet, before it is cut off


class Sent:
    """The user_data of a connection's send: its completion names the connection."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn


class Connection:
    def __init__(self, sock: socket.socket, max_frame_size: int, ring: Ring) -> None:
        self.sock = sock
        self.ring = ring
        self.nbytes = 0
        self.reader = RingFrameReader(self.on_frame, max_frame_size=max_frame_size)
        self.unsent = bytearray()    # replies not handed to a send yet
        self.sending = b""           # the bytes of the send in flight (the ring pins them)
        self.sent = Sent(self)
        self.received_all = False    # its receive ended: the socket closes once the replies are out
        self.closed = False

    def on_frame(self, seg: Segment) -> None:
        digest = hashlib.sha256(seg).digest()
        size = len(seg)
        seg.free()
        self.nbytes += size
        self.unsent += REPLY.pack(size, digest)
        if len(self.unsent) > MAX_UNSENT:
            raise ConnectionError(f"the client took none of its last {len(self.unsent)} bytes of replies")
        self.send_next()

    def send_next(self) -> None:
        """Hand the replies gathered to one send, unless one is in flight; close the socket once
        the receive has ended and every reply is out."""
        if self.sending or self.closed:
            return
        if self.unsent:
            self.sending = bytes(self.unsent)
            self.unsent.clear()
            self.ring.send(self.sock, self.sending, user_data=self.sent)
        elif self.received_all:
            self.closed = True
            self.sock.close()

    def on_sent(self, result: int) -> None:
        if result < 0:  # the client went away: its replies go, and its stream ends
            self.sending = b""
            self.unsent.clear()
            self.stop_receiving()
        else:
            self.sending = self.sending[result:]  # a part sent: the rest first
        if self.sending:
            self.ring.send(self.sock, self.sending, user_data=self.sent)
        else:
            self.send_next()

    def stop_receiving(self) -> None:
        """End the stream: the receive ends (EOF), the replies already gathered still go out."""
        try:
            self.sock.shutdown(socket.SHUT_RD)
        except OSError:  # reset by the client already: the receive ends anyway
            pass


def accept_forever(listener: socket.socket, handed: queue.Queue, wake_w: int) -> None:
    short = False  # said once per spell of accept() failing for want of file descriptors
    while True:
        try:
            sock, _ = listener.accept()
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                # Out of file descriptors (or memory) for now: the connection waits in the backlog
                # until connections close.  Returning would have left the server deaf for good.
                if not short:
                    print(f"accept: {exc.strerror}; retrying until connections close", file=sys.stderr,
                          flush=True)
                short = True
                time.sleep(0.1)
                continue
            return  # the listener closed: the server is done
        short = False
        handed.put(sock)
        os.write(wake_w, b"!")


def serve(host: str, port: int, connections: int, buffers: int, buffer_size: int, max_frame_size: int,
          max_connections: int = 1024) -> int:
    listener = socket.create_server((host, port))
    wake_r, wake_w = os.pipe()
    handed: queue.Queue = queue.Queue()
    wake_buf = bytearray(64)
    served = frames = nbytes = refused = 0
    open_connections = 0
    closing: set[Connection] = set()  # their receive ended, replies still going out
    bound = listener.getsockname()
    print(f"listening on {bound[0]}:{bound[1]} (io_uring, {buffers} buffers of {buffer_size} bytes)",
          flush=True)
    pool = BufferPool(buffer_size, buffers)
    try:
        # A completion queue of 2 * (max_connections + 1): a receive and a send per connection, and
        # the wake read.
        with Ring(max(1, max_connections) + 1) as ring:
            ring.provide(pool, GROUP)
            ring.read(wake_r, wake_buf, user_data=WAKE)
            # Accepting from now on (before the ring, a burst of connections could take the fds
            # io_uring_setup needs).
            threading.Thread(target=accept_forever, args=(listener, handed, wake_w), daemon=True).start()
            while not (connections and served >= connections and not closing):
                for conn, res in ring.wait(1):
                    if conn is WAKE:
                        while not handed.empty():
                            sock = handed.get()
                            if open_connections + len(closing) >= max_connections:  # no slots left
                                sock.close()
                                refused += 1
                                continue
                            conn = Connection(sock, max_frame_size, ring)
                            ring.recv_multishot(sock, GROUP, user_data=conn)
                            open_connections += 1
                        ring.read(wake_r, wake_buf, user_data=WAKE)
                        continue
                    if type(conn) is Sent:
                        conn.conn.on_sent(res)
                        if conn.conn.closed:
                            closing.discard(conn.conn)
                        continue
                    reader = conn.reader
                    try:
                        more = reader.feed(res)
                    except Exception:  # its stream ended (no replies taken, a frame too big for
                        more = res.more  # memory ...): reader.error has it, the server goes on
                    if more:
                        if reader.error is not None:  # stop its stream: the receive ends with EOF
                            conn.stop_receiving()
                        continue
                    if not reader.eof and reader.error is None:
                        ring.recv_multishot(conn.sock, GROUP, user_data=conn)  # ENOBUFS, or ended
                        continue
                    conn.received_all = True
                    conn.send_next()  # closes the socket now, or once the last reply is out
                    if not conn.closed:
                        closing.add(conn)
                    open_connections -= 1
                    served += 1
                    frames += reader.frames
                    nbytes += conn.nbytes
                    error = reader.error
                    if isinstance(error, OSError) and error.errno in (errno.ECONNRESET, errno.EPIPE):
                        error = None  # the client went away: the end of its stream
                    why = f" ({type(error).__name__}: {error})" if error is not None else ""
                    print(f"connection closed: {reader.frames} frames, {conn.nbytes} bytes{why}", flush=True)
    finally:
        listener.close()
        pool.close()
        os.close(wake_r)
        os.close(wake_w)
    why = f" ({refused} refused: more than --max-connections {max_connections} at once)" if refused else ""
    print(f"served {served} connection(s), {frames} frames, {nbytes} bytes{why}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765, help="0: any free port (printed)")
    parser.add_argument("--once", action="store_true", help="exit when the first connection closes")
    parser.add_argument("--connections", type=int, default=0, help="exit when N connections closed")
    parser.add_argument("--buffers", type=int, default=64, help="receive buffers, for every connection")
    parser.add_argument("--buffer-size", type=int, default=16384)
    parser.add_argument("--max-frame-size", type=int, default=1 << 30, help="largest frame accepted")
    parser.add_argument("--max-connections", type=int, default=1024,
                        help="connections open at once (one ring request slot each); more are closed")
    args = parser.parse_args()
    connections = 1 if args.once else args.connections
    return serve(args.host, args.port, connections, args.buffers, args.buffer_size, args.max_frame_size,
                 args.max_connections)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
