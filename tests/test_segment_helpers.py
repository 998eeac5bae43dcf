"""The Panama-style helpers of issue 27 (allocate_from, allocate_string, arenalib.copy, mismatch, ==,
hex, readonly, is_accessible_by) against bytes/bytearray, their Python equivalents; the argument
slips of the same issue; Python code run inside the helpers (an __index__ or __buffer__ that kills
the segment, a collection at every allocation).  The child-process re-entrancy matrix has them
too (tests/safety_child.py)."""

from __future__ import annotations

import ctypes
import gc
import io
import re
import sys
import threading

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from support import KINDS

import arenalib
from arenalib import ArenaClosedError, UnsupportedOperation

PATTERN = bytes(range(256)) * 4  # 1024 bytes


def filled(arena, data: bytes):
    seg = arena.allocate(len(data), zero=False)
    seg[:] = data
    return seg


# -- allocate_from ---------------------------------------------------------------------------------


@pytest.mark.parametrize("make", [bytes, bytearray, memoryview, lambda b: np.frombuffer(b, np.uint8)])
def test_allocate_from_copies_any_buffer(arena, make):
    source = make(PATTERN)
    seg = arena.allocate_from(source)
    assert seg.tobytes() == PATTERN
    assert seg.arena is arena


def test_allocate_from_is_a_copy_not_a_view(arena):
    source = bytearray(PATTERN)
    seg = arena.allocate_from(source)
    source[0] = 99
    assert seg[0] == PATTERN[0]
    seg[1] = 77
    assert source[1] == PATTERN[1]


def test_allocate_from_copies_a_strided_or_multidimensional_buffer_in_c_order(arena):
    strided = memoryview(PATTERN)[::3]
    assert arena.allocate_from(strided).tobytes() == bytes(strided)
    matrix = np.arange(24, dtype=np.int32).reshape(4, 6)[:, ::2]  # not contiguous
    seg = arena.allocate_from(matrix)
    assert seg.tobytes() == matrix.tobytes() == bytearray(matrix)
    assert len(seg) == matrix.nbytes


def test_allocate_from_a_segment_of_the_same_arena_and_with_align(arena):
    first = filled(arena, PATTERN)
    second = arena.allocate_from(first, align=4096)
    assert second.address % 4096 == 0
    assert second == first and second.address != first.address
    assert first.exports == 0  # the source's export was released


def test_allocate_from_refuses_what_bytearray_refuses(arena):
    for bad in ("text", 12, None, [1, 2]):
        with pytest.raises(TypeError):
            arena.allocate_from(bad)
    with pytest.raises(ValueError):
        arena.allocate_from(b"x", align=3)
    dead = arena.allocate(8)
    arena.reset()
    with pytest.raises(ArenaClosedError):
        arena.allocate_from(dead)
    arena.close()
    with pytest.raises(ArenaClosedError):
        arena.allocate_from(b"abc")


def test_allocate_from_empty(arena):
    seg = arena.allocate_from(b"")
    assert len(seg) == 0 and seg.tobytes() == b""


# -- allocate_string -------------------------------------------------------------------------------


# "caf\xe9": one byte a character in the str too (Latin-1), but not its UTF-8; "hello": read in place.
@pytest.mark.parametrize("text", ["", "hello", "caf\xe9", "żółw 🐢", "a\x00b"])
def test_allocate_string_is_encode_plus_a_nul(arena, text):
    assert arena.allocate_string(text).tobytes() == text.encode() + b"\x00"
    assert arena.allocate_string(text, nul=False).tobytes() == text.encode()


@pytest.mark.parametrize(("encoding", "nul"), [("latin-1", 1), ("UTF-8", 1), ("ascii", 1), ("cp1252", 1),
                                               ("utf-16-le", 2), ("utf-16-be", 2), ("utf-16", 2),
                                               ("utf-32-le", 4), ("utf-32", 4)])
def test_allocate_string_other_encodings_end_with_one_nul_character(arena, encoding, nul):
    """As Panama's allocateFrom(String, Charset): the terminator is a NUL character of the encoding,
    two bytes in UTF-16 and four in UTF-32 (a C wchar_t/char16_t/char32_t string), after the byte
    order mark the encoding may put first."""
    text = "caf\xe9" if encoding != "ascii" else "cafe"
    for _ in range(2):  # the width is worked out once per encoding, then remembered
        seg = arena.allocate_string(text, encoding)
        assert seg.tobytes() == text.encode(encoding) + bytes(nul)
        assert seg.tobytes() == (text + "\x00").encode(encoding)
    assert arena.allocate_string(text, encoding, nul=False).tobytes() == text.encode(encoding)


def test_allocate_string_with_a_codec_refusing_nul_ends_with_one_zero_byte(arena):
    import codecs

    def search(name):
        if name != "arenalib_test_no_nul":
            return None

        def encode(text, errors="strict"):
            if "\x00" in text:
                raise UnicodeEncodeError("arenalib_test_no_nul", text, 0, 1, "no NUL")
            return text.upper().encode("ascii"), len(text)

        return codecs.CodecInfo(encode, lambda data, errors="strict": (bytes(data).decode(), len(data)),
                                name=name)

    codecs.register(search)
    try:
        assert arena.allocate_string("abc", "arenalib_test_no_nul").tobytes() == b"ABC\x00"
    finally:
        codecs.unregister(search)


def codec_search(name: str, encode):
    """A search function for codecs.register() that finds ``encode`` under ``name``."""
    import codecs

    def search(asked):
        if asked != name:
            return None
        return codecs.CodecInfo(encode, lambda data, errors="strict": (bytes(data).decode(), len(data)),
                                name=name)

    return search


def test_allocate_string_with_a_codec_refusing_nul_by_any_exception_ends_with_one_zero_byte(arena):
    import codecs

    def encode(text, errors="strict"):
        if "\x00" in text:
            raise ValueError("NUL not representable")
        return text.encode("ascii"), len(text)

    search = codec_search("arenalib_test_nul_value_error", encode)
    codecs.register(search)
    try:
        assert arena.allocate_string("abc", "arenalib_test_nul_value_error").tobytes() == b"abc\x00"
    finally:
        codecs.unregister(search)


def test_allocate_string_asks_a_codec_registered_again_under_a_name_anew(arena):
    """A codec unregistered and another registered under its name: the NUL's width is the new one's
    (only the standard library's encodings, which no registration overrides, are remembered)."""
    import codecs

    name = "arenalib_test_reregistered"
    for width in (1, 2, 4, 2):
        search = codec_search(name, lambda text, errors="strict", w=width: (
            text.encode({1: "ascii", 2: "utf-16-le", 4: "utf-32-le"}[w]), len(text)))
        codecs.register(search)
        try:
            assert arena.allocate_string("ab", name).tobytes() == ("ab\x00").encode(
                {1: "ascii", 2: "utf-16-le", 4: "utf-32-le"}[width])
        finally:
            codecs.unregister(search)


@pytest.mark.parametrize("how", ["reset", "close"])
def test_allocate_string_with_a_codec_that_resets_or_closes_the_arena(kind, how):
    # The encoding runs Python code (a codec of the user's) before anything is allocated: a reset
    # there leaves the arena usable, a close makes the call raise ArenaClosedError.
    import codecs

    a = kind()
    old = a.allocate(16).fill(1)

    def encode(text, errors="strict"):
        getattr(a, how)()
        return text.encode("utf-8"), len(text)

    def search(name):
        if name == f"arenalib_test_{how}":
            return codecs.CodecInfo(encode, lambda data, errors="strict": (data.decode(), len(data)),
                                    name=name)
        return None

    codecs.register(search)
    try:
        if how == "close":
            with pytest.raises(ArenaClosedError):
                a.allocate_string("abc", f"arenalib_test_{how}")
        else:
            assert a.allocate_string("abc", f"arenalib_test_{how}").tobytes() == b"abc\x00"
        assert not old.alive
    finally:
        codecs.unregister(search)
        a.close()


def test_allocate_string_refuses_a_codec_giving_no_bytes(arena):
    # (str.encode() itself turns a bytearray into bytes, and refuses a str; a subclass of bytes,
    # whose buffer its own code could give, comes through, and is refused here.)
    import codecs

    class Bytes(bytes):
        pass

    def search(name):
        if name == "arenalib_test_bytearray":
            return codecs.CodecInfo(lambda text, errors="strict": (Bytes(text, "utf-8"), len(text)),
                                    lambda data, errors="strict": (bytes(data).decode(), len(data)),
                                    name=name)
        return None

    codecs.register(search)
    try:
        with pytest.raises(TypeError, match="Bytes"):
            arena.allocate_string("abc", "arenalib_test_bytearray")
    finally:
        codecs.unregister(search)


def test_allocate_string_takes_a_str_subclass_by_its_characters(arena):
    class Text(str):
        def encode(self, *args, **kwargs):  # not what allocate_string() asks: str's own encoding
            return b"overridden"

    for text in ("h\xe9", "hi"):
        for encoding in ("utf-8", "utf-16-le", "latin-1"):
            seg = arena.allocate_string(Text(text), encoding)
            assert seg.tobytes() == str.encode(text, encoding) + bytes(2 if "16" in encoding else 1)


def test_allocate_string_errors_are_encodes(arena):
    with pytest.raises(UnicodeEncodeError):
        arena.allocate_string("\ud800")  # a lone surrogate, as "\ud800".encode() raises
    with pytest.raises(UnicodeEncodeError):
        arena.allocate_string("\xe9", "ascii")
    with pytest.raises(LookupError):
        arena.allocate_string("x", "no-such-codec")
    with pytest.raises(TypeError):
        arena.allocate_string(b"bytes")
    with pytest.raises(TypeError, match="nul"):
        arena.allocate_string("x", nul="yes")


# -- arenalib.copy ---------------------------------------------------------------------------------


def test_copy_between_segments_and_builtins(arena):
    seg = arena.allocate(64)
    arenalib.copy(PATTERN, 10, seg, 4, 20)
    model = bytearray(64)
    model[4:24] = PATTERN[10:30]
    assert seg.tobytes() == model
    out = bytearray(64)
    arenalib.copy(seg, 0, out, 0, 64)
    assert out == model
    array = np.zeros(16, np.uint32)  # offsets are in bytes, whatever the item size
    arenalib.copy(seg, 4, array, 2, 20)
    assert array.tobytes()[2:22] == model[4:24]


@pytest.mark.parametrize(("src_at", "dst_at", "n"),
                         [(0, 5, 40), (5, 0, 40), (3, 3, 50), (0, 0, 64), (7, 60, 4)])
def test_copy_within_one_segment_is_memmove(arena, src_at, dst_at, n):
    seg = filled(arena, PATTERN[:64])
    model = bytearray(PATTERN[:64])
    arenalib.copy(seg, src_at, seg, dst_at, n)
    model[dst_at:dst_at + n] = model[src_at:src_at + n]
    assert seg.tobytes() == model
    assert seg.exports == 0


def test_copy_overlapping_slices_of_one_segment(arena):
    seg = filled(arena, PATTERN[:64])
    model = bytearray(PATTERN[:64])
    arenalib.copy(seg.slice(0, 40), 0, seg.slice(8, 40), 0, 32)
    model[8:40] = model[0:32]
    assert seg.tobytes() == model


def test_copy_bounds_and_argument_errors(arena):
    seg = arena.allocate(16)
    with pytest.raises(IndexError):
        arenalib.copy(b"abc", 0, seg, 14, 3)
    with pytest.raises(IndexError):
        arenalib.copy(b"abc", 1, seg, 0, 3)
    with pytest.raises(IndexError, match=re.escape(f"reads [{1 << 70}:{1 << 70}+0] of a 3-byte src")):
        arenalib.copy(b"abc", 1 << 70, seg, 0, 0)  # the numbers passed, not bounded ones
    with pytest.raises(IndexError, match=re.escape(f"writes [{1 << 64}:{1 << 64}+0] of a 16-byte dst")):
        arenalib.copy(b"abc", 0, seg, 1 << 64, 0)
    arenalib.copy(b"abc", 3, seg, 16, 0)  # empty ranges at the ends are in bounds
    for args in ((b"abc", -1, seg, 0, 1), (b"abc", 0, seg, -1, 1), (b"abc", 0, seg, 0, -1)):
        with pytest.raises(ValueError):
            arenalib.copy(*args)
    with pytest.raises(TypeError, match="dst_offset"):
        arenalib.copy(b"abc", 0, seg, "0", 1)
    with pytest.raises(TypeError, match="read-only"):
        arenalib.copy(seg, 0, b"abcdef", 0, 1)
    with pytest.raises(TypeError, match="read-only"):
        arenalib.copy(b"a", 0, seg.readonly(), 0, 1)
    with pytest.raises(TypeError):
        arenalib.copy("text", 0, seg, 0, 1)
    with pytest.raises(BufferError):
        arenalib.copy(memoryview(PATTERN)[::2], 0, seg, 0, 1)
    assert seg.tobytes() == bytes(16)  # nothing was written by a refused copy
    seg.free() if type(arena) is not arenalib.SlicingArena else arena.reset()
    with pytest.raises(ArenaClosedError):
        arenalib.copy(b"abc", 0, seg, 0, 3)


# -- mismatch, ==, hex -----------------------------------------------------------------------------


def test_mismatch_is_panamas(arena):
    seg = filled(arena, PATTERN)
    assert seg.mismatch(PATTERN) == -1
    assert seg.mismatch(bytearray(PATTERN)) == -1
    assert seg.mismatch(seg) == -1
    assert seg.mismatch(PATTERN[:100]) == 100  # a prefix: the shorter one's length
    assert seg.mismatch(PATTERN + b"x") == len(PATTERN)
    assert seg.mismatch(b"") == 0
    for where in (0, 1, 255, 256, 257, 700, len(PATTERN) - 1):
        other = bytearray(PATTERN)
        other[where] ^= 0xFF
        assert seg.mismatch(other) == where
        assert seg.mismatch(np.frombuffer(bytes(other), np.uint8)) == where
    with pytest.raises(TypeError):
        seg.mismatch("text")


def test_equality_is_bytearrays(arena):
    seg = filled(arena, PATTERN[:32])
    other = filled(arena, PATTERN[:32])
    assert seg == PATTERN[:32] and PATTERN[:32] == seg
    assert seg == bytearray(PATTERN[:32]) and seg == memoryview(PATTERN[:32])
    assert seg == other and not seg != other
    assert seg != PATTERN[:31] and seg != PATTERN[1:33]
    other[5] = 0
    assert seg != other and not seg == other
    for unlike in ("text", 3, None, [1, 2]):
        assert seg != unlike and not seg == unlike
        assert (bytearray(PATTERN[:32]) == unlike) is (seg == unlike)
    strided = memoryview(PATTERN[:64])[::2]
    assert (seg == strided) is (bytearray(PATTERN[:32]) == strided)  # both NotImplemented: False
    assert seg.readonly() == seg


def test_equality_with_a_buffer_that_cannot_be_had_is_not_implemented(arena):
    """Whatever the exporter raises (NumPy: ValueError for a strided array), bytearray's
    comparison says NotImplemented, and so does a segment's: the other side answers."""
    seg = filled(arena, bytes(range(0, 10, 2)))
    strided = np.arange(10, dtype=np.uint8)[::2]
    assert (seg == strided).tolist() == (bytearray(bytes(range(0, 10, 2))) == strided).tolist()
    assert (seg != strided).tolist() == [False] * 5
    assert seg.__eq__(strided) is NotImplemented and seg.__ne__(strided) is NotImplemented


@pytest.mark.skipif(sys.version_info < (3, 12), reason="a Python __buffer__ is PEP 688's (3.12)")
def test_equality_with_a_buffer_whose_export_raises_is_not_implemented(arena):
    class Refusing:
        def __buffer__(self, flags):
            raise RuntimeError("cannot export now")

        def __eq__(self, other):
            return "answered"

    seg = filled(arena, b"ab")
    assert (seg == Refusing()) == "answered"
    assert (bytearray(b"ab") == Refusing()) == "answered"


def test_segment_is_unhashable(arena):
    seg = arena.allocate(8)
    assert Segment_hash_is_none()
    with pytest.raises(TypeError):
        hash(seg)
    with pytest.raises(TypeError):
        {seg}  # noqa: B018


def Segment_hash_is_none():
    return arenalib.Segment.__hash__ is None


def test_comparing_a_dead_segment_raises(arena):
    seg = arena.allocate(8)
    arena.reset()
    with pytest.raises(ArenaClosedError):
        seg == b"\0" * 8  # noqa: B015
    with pytest.raises(ArenaClosedError):
        seg.mismatch(b"")
    with pytest.raises(ArenaClosedError):
        seg.hex()
    live = arena.allocate(8)
    with pytest.raises(ArenaClosedError):
        live == seg  # noqa: B015
    other_dead = arena.allocate(8)
    arena.reset()  # two dead segments (each refused the other's export) compared by identity
    for left, right in [(seg, other_dead), (seg, seg)]:
        with pytest.raises(ArenaClosedError):
            left == right  # noqa: B015
        with pytest.raises(ArenaClosedError):
            left != right  # noqa: B015
    with pytest.raises(ArenaClosedError):
        seg in [other_dead]  # noqa: B015
    assert (seg == "text") is False  # no bytes to compare: as a released memoryview's


@pytest.mark.parametrize("args", [(), (":",), ("-", 2), (b" ", -3), ("_", 100), ("|", -1)])
def test_hex_is_bytes_hex(arena, args):
    seg = filled(arena, PATTERN[:37])
    assert seg.hex(*args) == PATTERN[:37].hex(*args)
    assert arena.allocate(0).hex(*args) == b"".hex(*args)


def test_hex_argument_errors_are_bytes_hex(arena):
    seg = filled(arena, PATTERN[:8])
    for args in (("ab",), ("é",), (1,), (":", "2"), (None, "2"), (None, 1.5), (None, 2**100),
                 (None, 2**40), (None, -2**31 - 1)):
        with pytest.raises((TypeError, ValueError, OverflowError)) as caught:
            seg.hex(*args)
        with pytest.raises(caught.type, match=re.escape(str(caught.value))):  # its words too
            PATTERN[:8].hex(*args) if args[0] is not None else PATTERN[:8].hex(bytes_per_sep=args[1])
    assert seg.exports == 0
    assert seg.hex(None, 3) == PATTERN[:8].hex(bytes_per_sep=3)  # judged, and ignored without a sep


# -- readonly --------------------------------------------------------------------------------------


def writable_buffer_request(obj) -> None:
    """PyObject_GetBuffer(obj, PyBUF_WRITABLE), as C code asking for a writable buffer makes it."""
    view = (ctypes.c_char * 256)()  # room for a Py_buffer
    get_buffer = ctypes.pythonapi.PyObject_GetBuffer
    get_buffer.argtypes = [ctypes.py_object, ctypes.c_void_p, ctypes.c_int]
    get_buffer(obj, ctypes.addressof(view), 0x0001)  # raises what the exporter raised
    ctypes.pythonapi.PyBuffer_Release.argtypes = [ctypes.c_void_p]
    ctypes.pythonapi.PyBuffer_Release(ctypes.addressof(view))


def test_readonly_shares_the_memory_and_refuses_writes(arena):
    seg = filled(arena, PATTERN[:64])
    view = seg.readonly()
    assert view == seg and len(view) == 64 and view.address == seg.address
    seg[0] = 200
    assert view[0] == 200  # the same memory
    with memoryview(view) as mv:
        assert mv.readonly
        with pytest.raises(TypeError):
            mv[0] = 1
    assert np.frombuffer(view, np.uint8).flags.writeable is False
    with pytest.raises(TypeError):
        view.fill(1)
    with pytest.raises(TypeError):
        view[0] = 1
    with pytest.raises(TypeError):
        view[0:2] = b"ab"
    for readonly in (view, b"bytes"):
        with pytest.raises(BufferError):
            writable_buffer_request(readonly)
        with pytest.raises(TypeError):
            ctypes.c_char.from_buffer(readonly)
    with pytest.raises(TypeError):
        io.BytesIO(b"data").readinto(view)  # "w*": a read-write buffer is required
    with pytest.raises(TypeError):
        view.slice(0, 8).fill(0)  # its slices are read-only too
    with pytest.raises(UnsupportedOperation):
        view.free()
    assert seg.tobytes() == bytes([200]) + PATTERN[1:64]
    writable_buffer_request(seg)  # the source stays writable
    ctypes.c_char.from_buffer(seg)
    seg.fill(3)
    assert view.tobytes() == bytes([3]) * 64


def test_readonly_shares_the_lifetime(arena):
    seg = arena.allocate(16)
    view = seg.readonly()
    with memoryview(view):
        assert seg.exports == 1  # an export of the view is one of its source
        with pytest.raises(BufferError):
            arena.reset()
    arena.reset()
    assert not view.alive
    with pytest.raises(ArenaClosedError):
        view.tobytes()
    with pytest.raises(ArenaClosedError):
        seg.readonly()


# -- is_accessible_by ------------------------------------------------------------------------------


def _other_thread() -> threading.Thread:
    thread = threading.Thread(target=lambda: None)
    thread.start()
    thread.join()
    return thread


def test_is_accessible_by(kind):
    other = _other_thread()
    unstarted = threading.Thread(target=lambda: None)
    with kind() as arena:
        seg = arena.allocate(8)
        confined = kind is arenalib.ConfinedArena
        assert seg.is_accessible_by(threading.current_thread())
        assert seg.is_accessible_by(threading.get_ident())
        assert seg.is_accessible_by(other) is not confined
        assert seg.is_accessible_by(other.ident) is not confined
        assert not seg.is_accessible_by(unstarted)
        assert not seg.is_accessible_by(-1) and not seg.is_accessible_by(1 << 64)
        assert seg.readonly().is_accessible_by(threading.get_ident())
        for bad in ("main", None, 1.5, True):
            with pytest.raises(TypeError):
                seg.is_accessible_by(bad)
    assert not seg.is_accessible_by(threading.current_thread())  # dead: accessible by none


def test_is_accessible_by_from_the_other_side():
    with arenalib.ConfinedArena() as arena:
        seg = arena.allocate(8)
        main = threading.current_thread()
        seen = []
        thread = threading.Thread(target=lambda: seen.append((seg.is_accessible_by(main),
                                                              seg.is_accessible_by(threading.current_thread()))))
        thread.start()
        thread.join()
        assert seen == [(True, False)]


# -- the slips of issue 27 -------------------------------------------------------------------------


def test_allocate_type_errors_name_the_argument(arena):
    with pytest.raises(TypeError, match="size"):
        arena.allocate("10")
    with pytest.raises(TypeError, match="size"):
        arena.allocate(1.5)
    with pytest.raises(TypeError, match="offset"):
        arena.allocate(8).slice("0", 1)


@pytest.mark.parametrize("bad", ["no", None, 1.0, b""])
def test_zero_is_a_bool_or_an_int(arena, bad):
    with pytest.raises(TypeError, match="zero"):
        arena.allocate(8, zero=bad)
    with pytest.raises(TypeError, match="zero"):
        arenalib.BufferPool(64, 2, zero=bad)


def test_zero_takes_bools_and_ints(arena):
    for flag in (True, False, 0, 1, 2):
        seg = arena.allocate(64, zero=flag)
        if flag:
            assert seg.tobytes() == bytes(64)
    with arenalib.SlicingArena() as slicing, slicing.frame() as frame:
        assert frame.allocate(8, zero=1).tobytes() == bytes(8)
        with pytest.raises(TypeError, match="zero"):
            frame.allocate(8, zero="yes")
    arenalib.BufferPool(64, 2, zero=1).close()


@pytest.mark.parametrize("value", [-1, 0])
def test_buffer_pool_sizes_say_what_is_accepted(value):
    for args in ((value, 4), (64, value)):
        with pytest.raises(ValueError) as caught:
            arenalib.BufferPool(*args)
        assert ">= 1" in str(caught.value) and ">= 0" not in str(caught.value)


# -- Python code run inside the helpers ------------------------------------------------------------


class Killing:
    """An int whose __index__ runs ``kill`` first (reset/close/free of the segment's arena)."""

    def __init__(self, value, kill):
        self.value, self.kill = value, kill

    def __index__(self):
        self.kill()
        return self.value


def _kill(arena, seg, way, deferred=False):
    """Way number ``way`` of killing ``seg``: a reset or close of its arena, or its free (with
    ``deferred``: a deferred close or free, which no export refuses).  Skips the test (the arena
    closed) where the kind has no such way."""
    ways = ([lambda: arena.close(deferred=True), lambda: seg.free(deferred=True)] if deferred
            else [arena.reset, arena.close, seg.free])
    if way == len(ways) - 1 and type(arena) is arenalib.SlicingArena:
        arena.close()
        pytest.skip("SlicingArena segments are not freed one by one")
    return ways[way]


@pytest.mark.parametrize("way", [0, 1, 2])
def test_an_index_killing_the_segment_mid_copy_raises(kind, way):
    for direction in ("into", "from"):
        arena = kind()
        seg = filled(arena, b"\x11" * 64)
        kill = _kill(arena, seg, way)
        out = bytearray(8)
        with pytest.raises(ArenaClosedError):
            if direction == "into":
                arenalib.copy(b"\x41" * 8, 0, seg, Killing(0, kill), 8)
            else:
                arenalib.copy(seg, Killing(0, kill), out, 0, 8)
        assert out == bytearray(8) and not seg.alive
        arena.close()


@pytest.mark.parametrize("way", [0, 1])
def test_an_index_killing_the_segment_deferred_mid_hex_raises(kind, way):
    """hex(sep, bytes_per_sep) converts bytes_per_sep before it takes its export: a deferred
    close or free (which an export does not refuse) in its __index__ leaves a dead segment."""
    arena = kind()
    seg = filled(arena, b"\x41" * 8)
    kill = _kill(arena, seg, way, deferred=True)
    with pytest.raises(ArenaClosedError):
        seg.hex(":", Killing(1, kill))
    assert not seg.alive and seg.exports == 0
    arena.close()


def test_allocate_from_a_segment_killed_while_the_copy_is_allocated_raises(kind):
    """allocate_from(seg) holds seg's export while it allocates the copy, which runs Python code
    (here: set_debug(True) formats the stack, under a trace function).  A deferred close of seg's
    arena there leaves the memory held but the segment dead: no copy of it comes back."""
    source_arena = kind()
    source = filled(source_arena, b"\x5a" * 16)
    fired = []

    def tracer(frame, event, arg):
        if not fired and frame.f_code.co_filename.endswith("traceback.py"):
            fired.append(True)
            source_arena.close(deferred=True)

    arenalib.set_debug(True)
    try:
        with arenalib.Arena() as target:
            sys.settrace(tracer)
            try:
                with pytest.raises(ArenaClosedError):
                    target.allocate_from(source)
            finally:
                sys.settrace(None)
            assert target.stats()["live_segments"] == 1  # the copy's segment, never filled
    finally:
        arenalib.set_debug(False)
    assert fired and not source.alive and source.exports == 0
    assert source_arena.stats()["closed"]


def test_a_buffer_closing_the_source_deferred_mid_copy_raises(arena):
    """A __buffer__ (3.12+) of dst runs after src's export is taken: a deferred close of src's
    arena there is not refused, and copy() raises instead of copying a dead segment."""
    seg = filled(arena, b"\x11" * 16)
    out = bytearray(16)

    class Exporter:
        def __buffer__(self, flags):
            arena.close(deferred=True)
            return memoryview(out)

    if not hasattr(memoryview, "__buffer__"):
        arena.close()
        pytest.skip("__buffer__ is 3.12+")
    with pytest.raises(ArenaClosedError):
        arenalib.copy(seg, 0, Exporter(), 0, 16)
    assert out == bytearray(16) and not seg.alive


def test_a_buffer_killing_its_own_segment_is_refused(arena):
    """A __buffer__ (3.12+) of the second buffer runs after the first is acquired: a kill of the
    first's arena is refused (BufferError in the callback), the copy goes ahead on live memory.
    mismatch() takes the other's buffer before it checks its own segment: the reset there works,
    and the segment says it is dead."""
    seg = filled(arena, b"\x11" * 16)
    refused = []

    class Exporter:
        def __buffer__(self, flags):
            try:
                arena.reset()
            except BufferError as exc:
                refused.append(exc)
            return memoryview(bytearray(16))

    if not hasattr(memoryview, "__buffer__"):
        pytest.skip("__buffer__ is 3.12+")
    target = Exporter()
    arenalib.copy(seg, 0, target, 0, 16)
    assert refused and seg.alive
    with pytest.raises(ArenaClosedError):
        seg.mismatch(Exporter())
    assert len(refused) == 1 and not seg.alive
    refused.clear()  # its traceback's frames hold the segment (3.13t frees them only at a later collection)


class _Closer:
    """Closes its arena when collected (in a cycle: at whatever allocation starts a collection).
    One class for every round: a class made per round holds its round's arena until a later
    collection on 3.13t."""

    def __del__(self):
        if not self.seg.exports:  # a close refused from __del__ would be unraisable
            self.arena.close()


def test_helpers_with_a_collection_at_every_allocation(kind):
    """gc.set_threshold(1): a finalizer closes the arena at whatever allocation the helper makes;
    each call either works on live memory or raises ArenaClosedError."""
    saved = gc.get_threshold()
    outcomes = set()
    try:
        for round_ in range(40):
            arena = kind()
            seg = filled(arena, PATTERN[:64])

            def plant(arena=arena, seg=seg):
                closer = _Closer()
                closer.arena, closer.seg, closer.cycle = arena, seg, closer

            gc.collect()
            plant()
            gc.set_threshold(1)
            try:
                call = round_ % 5
                if call == 0:
                    result = arena.allocate_from(seg).tobytes()
                elif call == 1:
                    result = arena.allocate_string("x" * 64).tobytes()
                elif call == 2:
                    result = seg.hex()
                elif call == 3:
                    result = seg.mismatch(bytearray(PATTERN[:64]))
                else:
                    result = seg == PATTERN[:64]
                outcomes.add("returned")
                assert result in (PATTERN[:64], b"x" * 64 + b"\0", PATTERN[:64].hex(), -1, True)
            except ArenaClosedError:
                outcomes.add("closed")
            finally:
                gc.set_threshold(*saved)
                gc.collect()
                arena.close()
    finally:
        gc.set_threshold(*saved)
    assert outcomes  # at least one round ran


# -- the helpers against a bytearray model ---------------------------------------------------------

SIZE = 48
offsets = st.integers(0, SIZE)
operations = st.one_of(
    st.tuples(st.just("copy_within"), offsets, offsets, offsets),
    st.tuples(st.just("copy_in"), st.binary(max_size=SIZE), offsets, offsets),
    st.tuples(st.just("copy_out"), offsets, offsets),
    st.tuples(st.just("mismatch"), st.binary(max_size=SIZE + 4)),
    st.tuples(st.just("flip"), st.integers(0, SIZE - 1)),
    st.tuples(st.just("hex"), st.sampled_from(["", ":", "-"]), st.integers(-5, 5).filter(bool)),
    st.tuples(st.just("copy_of")),
    st.tuples(st.just("readonly_slice"), offsets, offsets),
)


@given(kind_index=st.integers(0, len(KINDS) - 1), start=st.binary(min_size=SIZE, max_size=SIZE),
       ops=st.lists(operations, max_size=25))
def test_helpers_against_a_bytearray_model(kind_index, start, ops):
    with KINDS[kind_index]() as arena:
        seg = arena.allocate_from(start)
        model = bytearray(start)
        for op in ops:
            name = op[0]
            if name == "copy_within":
                _, src_at, dst_at, n = op
                fits = src_at + n <= SIZE and dst_at + n <= SIZE
                try:
                    arenalib.copy(seg, src_at, seg, dst_at, n)
                except IndexError:
                    assert not fits
                else:
                    assert fits
                    model[dst_at:dst_at + n] = model[src_at:src_at + n]
            elif name == "copy_in":
                _, data, dst_at, n = op
                fits = n <= len(data) and dst_at + n <= SIZE
                try:
                    arenalib.copy(data, 0, seg, dst_at, n)
                except IndexError:
                    assert not fits
                else:
                    assert fits
                    model[dst_at:dst_at + n] = data[:n]
            elif name == "copy_out":
                _, src_at, n = op
                out = bytearray(SIZE)
                if src_at + n <= SIZE:
                    arenalib.copy(seg, src_at, out, 0, n)
                    assert out[:n] == model[src_at:src_at + n]
            elif name == "mismatch":
                other = op[1]
                pairs = enumerate(zip(model, other, strict=False))
                expected = next((i for i, (a, b) in pairs if a != b), None)
                if expected is None:
                    expected = -1 if len(other) == SIZE else min(len(other), SIZE)
                assert seg.mismatch(other) == expected
                assert (seg == other) is (model == other)
                assert (seg != other) is (model != other)
            elif name == "flip":
                model[op[1]] ^= 1
                seg[op[1]] ^= 1
            elif name == "hex":
                _, sep, per = op
                args = (sep, per) if sep else ()
                assert seg.hex(*args) == model.hex(*args)
            elif name == "copy_of":
                copied = arena.allocate_from(seg)
                assert copied == model and copied.address != seg.address
            else:
                _, offset, n = op
                if offset + n <= SIZE:
                    part = seg.readonly().slice(offset, n)
                    assert part == model[offset:offset + n]
                    with pytest.raises(TypeError):
                        part.fill(0)
        assert seg == model and seg.tobytes() == model and seg.exports == 0
