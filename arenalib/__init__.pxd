# cython: language_level=3
# The C-level API of arenalib, for Cython extensions: calls through a table of function pointers,
# and nothing of arenalib compiled in (as numpy.random's bit generators are).
#
#     from arenalib cimport ArenaCore, arena_core, arena_allocate, arena_free, arena_raise
#
#     core = arena_core(arena)              # with the GIL; keep a reference to `arena`
#     with nogil:
#         err = arena_allocate(core, 512, 0, False, &ptr)
#         ...
#         err = arena_free(core, ptr, 512)
#     arena_raise(err)                      # the matching Python exception, if any
#
# The nogil functions never raise: they return ARENA_OK or an error code.  arena_free() takes the
# size given to arena_allocate(), and a NULL pointer does nothing (as free(NULL)).  What it is
# given is not checked, as free() and jemalloc's sdallocx() do not check it: a pointer freed twice,
# not of that core, or with another size corrupts memory.  A module built against this API keeps
# working with later arenalib versions until the table changes; one built against another table
# gets ImportError from its first call, never a wrong call.  Each call costs a call through a
# pointer: for the inline fast paths instead (an allocate/free pair of ~2 ns, rebuilt against every
# arenalib version), cimport the same names from arenalib.fast.  One source builds either way:
# arenalib/_examples/cython/.
#
# Threads.  The same contract holds with the GIL and on a free-threaded CPython (3.13t), where nogil
# code and Python threads truly run at once:
# - an Arena's core: arena_allocate() and arena_free() from any threads at once (each thread has
#   its own thread cache);
# - a ConfinedArena's core: its owner thread only; any other gets ARENA_EWRONGTHREAD;
# - a SlicingArena's core: any thread, one carving at a time; the others get ARENA_EBUSY;
# - arena_close() and arena_reset(), and the Python close(), reset() and purge(), must come after
#   every nogil arena_allocate(), arena_free(), arena_mark() and arena_rewind() of that core on
#   other threads has returned (join your workers first): arenalib does not track C-level
#   callers.  Python-level users need no such care: close, reset, purge, free and release wait for
#   Python-level accesses of the memory under way on other threads, and those that come later raise;
# - arena_core() and arena_open()/arena_close() need the GIL (an attached thread state);
# - a segment's memory you write from nogil code is yours while the segment is alive: arenalib
#   does not stop another Python thread from freeing it under you.
# - after os.fork(), which stops only Python's threads: a SlicingArena that one of your threads
#   was inside (a carve, mark, rewind or reset) at the fork answers ARENA_EBUSY for good in the
#   child, as its Python methods raise ArenaError (its state may be half updated); close it there.
# For a scope without any Python object, put an ArenaCore on the stack, prepare it once with
# arena_core_init(), then use arena_open() / arena_close() (both need the GIL).  An ArenaCore must
# not be copied or moved while open: every call treats a copy (a core not at the address it was
# opened at) as closed (ARENA_ECLOSED), so it can never reach memory the original gave back.

from cpython.pycapsule cimport PyCapsule_Import
from libc.string cimport memset

from arenalib._fingerprints cimport TABLE_FINGERPRINT
from arenalib._table cimport (
    ARENA_EBUSY,
    ARENA_ECLOSED,
    ARENA_EEXPORTED,
    ARENA_EINVAL,
    ARENA_ELIMIT,
    ARENA_ENOMEM,
    ARENA_EUNSUPPORTED,
    ARENA_EWRONGTHREAD,
    ARENA_KIND_CONFINED,
    ARENA_KIND_SHARED,
    ARENA_KIND_SLICING,
    ARENA_EORDER,
    ARENA_ESTALEMARK,
    ARENA_OK,
    ArenaMark,
    ArenaTable,
)
from arenalib._table cimport OpaqueCore as ArenaCore

cdef extern from "Python.h":
    # Declared here rather than cimported from cpython.object, which imports the type objects.
    ctypedef struct PyObject
    void PyErr_SetString(PyObject* exception, const char* message)
    PyObject* PyExc_ImportError

cdef extern from *:
    """
    /* This module's pointer to arenalib's function table (set by the first call, with the GIL). */
    static void *arenalib_table_ptr = 0;
    """
    void* arenalib_table_ptr


cdef inline ArenaTable* _table() except NULL:
    """arenalib's function table, checked once per module (with the GIL)."""
    global arenalib_table_ptr
    if arenalib_table_ptr != NULL:
        return <ArenaTable*>arenalib_table_ptr
    cdef ArenaTable* table = <ArenaTable*>PyCapsule_Import(b"arenalib._arena._C_TABLE", 0)
    if table.fingerprint != TABLE_FINGERPRINT or table.core_size > sizeof(ArenaCore):
        # Set through the C API, not raised: every line of C here is compiled into each consumer.
        PyErr_SetString(PyExc_ImportError,
                        b"a Cython extension was compiled against another arenalib C API table: "
                        b"rebuild the extension against the arenalib it runs with")
        return NULL
    arenalib_table_ptr = table
    return table


cdef inline ArenaCore* arena_core(object arena) except NULL:
    """The C handle of an open Arena, ConfinedArena or SlicingArena (keep a reference to it)."""
    return _table().core_of(arena)


cdef inline int arena_raise(int code) except -1:
    """Raise the Python exception for an error code of the nogil functions (with the GIL held)."""
    if code == ARENA_OK:
        return 0
    return _table().raise_error(code)


cdef inline int arena_allocate(ArenaCore* core, size_t size, size_t align, bint zero,
                               void** out) noexcept nogil:
    """Allocate ``size`` bytes aligned to ``align`` (0 or a power of two up to 1 GiB), zeroed if
    ``zero``; the address goes to ``*out``.  Returns ARENA_OK or an error code (ARENA_ECLOSED for
    a core this module never had from arena_core() or arena_open())."""
    if arenalib_table_ptr == NULL:
        return ARENA_ECLOSED
    return (<ArenaTable*>arenalib_table_ptr).allocate(core, size, align, zero, out)


cdef inline int arena_free(ArenaCore* core, void* ptr, size_t size) noexcept nogil:
    """Give back one allocation of Arena or ConfinedArena; ``size`` must be the size allocated."""
    if arenalib_table_ptr == NULL:
        return ARENA_ECLOSED
    return (<ArenaTable*>arenalib_table_ptr).free(core, ptr, size)


cdef inline int arena_reset(ArenaCore* core) noexcept nogil:
    """Free every allocation at once and keep the arena open (no other thread may use it now).  An
    arena object's core takes the GIL for a moment if tracemalloc traces its segments; an
    arenalib.Arena's takes it for the whole reset on a GIL build (not on 3.13t), where the GIL is
    what its Python-level users hold while they use its memory."""
    if arenalib_table_ptr == NULL:
        return ARENA_ECLOSED
    return (<ArenaTable*>arenalib_table_ptr).reset(core)


cdef inline int arena_mark(ArenaCore* core, ArenaMark* out) noexcept nogil:
    """Mark a SlicingArena's carve position in ``out`` (storage the caller keeps) for
    arena_rewind().  Marks nest, one stack per arena.  ARENA_EUNSUPPORTED for the other kinds.  A
    mark lets the frames go whose exits were refused (Python's), which takes the GIL for a moment
    on a GIL build, as arena_rewind() does."""
    if arenalib_table_ptr == NULL:
        return ARENA_ECLOSED
    return (<ArenaTable*>arenalib_table_ptr).mark(core, out)


cdef inline int arena_rewind(ArenaCore* core, const ArenaMark* mark) noexcept nogil:
    """Rewind a SlicingArena to ``mark``: what was carved since is dead (its Segments raise) and is
    carved again; the mark and later ones are used up.  ARENA_ESTALEMARK for a mark of another
    arena or used up (by a rewind to it or to an earlier mark, a reset, a close); ARENA_EEXPORTED
    while a buffer export of a segment it would kill is alive; ARENA_EORDER while a frame entered
    after the mark is open.  No other thread may use what it kills meanwhile; on a GIL build, a
    rewind that kills segments carved from Python takes the GIL for a moment (their Python users
    hold it while they touch them), and one of C's carves alone does not: hold no lock here that
    a thread holding the GIL may wait for."""
    if arenalib_table_ptr == NULL:
        return ARENA_ECLOSED
    return (<ArenaTable*>arenalib_table_ptr).rewind(core, mark)


cdef inline void arena_core_init(ArenaCore* core) noexcept nogil:
    """Prepare an ArenaCore of your own (on the stack, in a struct) for arena_open(): closed."""
    memset(core, 0, sizeof(ArenaCore))


cdef inline int arena_open(ArenaCore* core, int kind, Py_ssize_t max_bytes,
                           size_t chunk_size) except -1:
    """Open an arena in an ArenaCore the caller owns (prepared by arena_core_init()).  kind:
    ARENA_KIND_*; max_bytes: -1 for no limit; chunk_size: the SlicingArena chunk size (0 for the
    default).  Needs the GIL; arena_close() undoes it."""
    return _table().open(core, kind, max_bytes, chunk_size)


cdef inline int arena_close(ArenaCore* core) except -1:
    """Free every allocation at once and give the memory back (GIL held); idempotent.  Raises
    WrongThreadError for a confined arena of another thread, BufferError while exports live."""
    return _table().close(core)
