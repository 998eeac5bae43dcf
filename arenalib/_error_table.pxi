# One table from error code to exception class and message, for the Python methods (which add what
# was being done and name the arena) and for the C API's arena_raise(): one wording for both.

from arenalib._abi cimport Books
from arenalib._table cimport (
    ARENA_EBUSY, ARENA_ECLOSED, ARENA_EEXPORTED, ARENA_EINVAL, ARENA_ELIMIT, ARENA_ENOMEM,
    ARENA_ERROR_CODES, ARENA_EUNSUPPORTED, ARENA_EWRONGTHREAD, ARENA_OK,
)

from arenalib._errors import ArenaClosedError, ArenaError, UnsupportedOperation, WrongThreadError

# Indexed by error code.
cdef tuple _ERROR_TABLE = (
    None,                                                                    # ARENA_OK
    (MemoryError, "out of memory"),                                          # ARENA_ENOMEM
    (MemoryError, "the arena's max_bytes would be exceeded"),                # ARENA_ELIMIT
    (ArenaClosedError, "the arena is closed"),                               # ARENA_ECLOSED
    (WrongThreadError, "a confined arena was used from another thread"),     # ARENA_EWRONGTHREAD
    (ValueError, "align must be a power of two from 1 to 1 GiB"),            # ARENA_EINVAL
    (BufferError, "buffer exports of the arena's segments are alive"),       # ARENA_EEXPORTED
    # (or was when the process forked, its state maybe half updated: busy for good in the child)
    (ArenaError,                                                             # ARENA_EBUSY
     "the SlicingArena is in use by another thread, or was when this process forked"),
    (UnsupportedOperation,                                                   # ARENA_EUNSUPPORTED
     "not supported by this kind of arena (SlicingArena segments cannot be freed one by one; "
     "marks are SlicingArena's)"),
    (ValueError, "the mark is of another arena, or used up (by a rewind to it or to an earlier "
                 "mark, a reset, a close)"),                                 # ARENA_ESTALEMARK
    (ValueError, "a frame entered after the mark is still open"),            # ARENA_EORDER
)
assert len(_ERROR_TABLE) == ARENA_ERROR_CODES


cdef str _with_figures(int code, ArenaBase arena, str message):
    """``message`` made specific to ``arena``: its name, and the figures that explain the error."""
    name = type(arena).__name__
    cdef Books books
    if code == ARENA_ECLOSED:
        return f"{name} is closed"
    if code == ARENA_EWRONGTHREAD:
        return str(_wrong_thread_error(arena))
    if code == ARENA_ELIMIT:
        read_books(&arena._core, &books)
        return (f"max_bytes={arena._core.max_bytes} of {name} would be exceeded "
                f"({books.live_bytes} bytes in use)")
    if code == ARENA_EEXPORTED:
        return (f"{exports_in_words(arena, True)} are alive; release them first"
                + (exported_segments(arena) if segment_exports(arena) else ""))
    return message


cdef int raise_error(int code, ArenaBase arena, str context) except -1:
    """Raise the exception for error ``code``: "<context>: <message>", the message naming ``arena``
    and its figures when one is given (None: the C API, which knows only the code)."""
    if code <= ARENA_OK or code >= ARENA_ERROR_CODES:
        raise ArenaError(f"unknown arenalib error code {code}")
    exc_type, message = _ERROR_TABLE[code]
    if arena is None:
        raise exc_type(f"{context}: {message}" if context else message)
    message = _with_figures(code, arena, message)
    # A closed arena or a wrong thread is said the same whatever was being done.
    if context and code != ARENA_ECLOSED and code != ARENA_EWRONGTHREAD:
        message = f"{context}: {message}"
    raise exc_type(message)
