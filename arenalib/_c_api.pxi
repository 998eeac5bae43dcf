# The C-level API's two function tables, filled here and published as capsules: _C_API, the
# InlineState of the inline fast paths (arenalib/fast.pxd falls back on its functions), and
# _C_TABLE, the table-only API's (arenalib/__init__.pxd calls nothing else).  Every function is one
# of _dispatch.pxi's entry points or wraps one: no rule is written here.

from cpython.pycapsule cimport PyCapsule_New

from arenalib._abi cimport ArenaCore, ArenaSlot, InlineState, abi_fingerprint, adopt_inline_state
from arenalib._fingerprints cimport TABLE_FINGERPRINT
from arenalib._table cimport ARENA_ECLOSED, ARENA_OK, ArenaMark, ArenaTable, OpaqueCore
from arenalib.fast cimport (
    arena_allocate, arena_close, arena_free, arena_mark, arena_open, arena_reset, arena_rewind,
)


cdef ArenaCore* arena_core_of(object arena) except NULL:
    """arena_core() of the C API: the core of an open Arena, ConfinedArena or SlicingArena."""
    if not isinstance(arena, ArenaBase):
        raise TypeError(f"expected Arena, ConfinedArena or SlicingArena, not {type(arena).__name__}")
    cdef ArenaBase base = arena
    if type(arena) is AutoArena:  # freed by the collector, which knows nothing of C's pointers
        raise UnsupportedOperation("the automatic arena is not handed to C; give C a segment's "
                                   "address, or an arena of its own")
    if not base._core.open:
        raise_error(ARENA_ECLOSED, base, None)
    return &base._core


cdef int arena_raise(int code) except -1:
    """arena_raise() of the C API: the exception for ``code`` (nothing for ARENA_OK)."""
    if code == ARENA_OK:
        return 0
    return raise_error(code, None, None)


cdef void arena_slot_free(ArenaSlot* slot, void* ptr) noexcept nogil:
    """Give a block of the slot's arena back to jemalloc."""
    je_dallocx(ptr, slot_flags(slot))


# -- the table-only API: the inline paths, compiled here once ----------------------------------------

cdef int _table_open(OpaqueCore* core, int kind, Py_ssize_t max_bytes, size_t chunk_size) except -1:
    return arena_open(<ArenaCore*>core, kind, max_bytes, chunk_size)


cdef int _table_close(OpaqueCore* core) except -1:
    return arena_close(<ArenaCore*>core)


cdef int _table_allocate(OpaqueCore* core, size_t size, size_t align, bint zero,
                         void** out) noexcept nogil:
    return arena_allocate(<ArenaCore*>core, size, align, zero, out)


cdef int _table_free(OpaqueCore* core, void* ptr, size_t size) noexcept nogil:
    return arena_free(<ArenaCore*>core, ptr, size)


cdef int _table_reset(OpaqueCore* core) noexcept nogil:
    return arena_reset(<ArenaCore*>core)


cdef int _table_mark(OpaqueCore* core, ArenaMark* out) noexcept nogil:
    return arena_mark(<ArenaCore*>core, out)


cdef int _table_rewind(OpaqueCore* core, const ArenaMark* mark) noexcept nogil:
    return arena_rewind(<ArenaCore*>core, mark)


cdef OpaqueCore* _table_core_of(object arena) except NULL:
    return <OpaqueCore*>arena_core_of(arena)


cdef void _table_core_init(OpaqueCore* core) noexcept nogil:
    memset(core, 0, sizeof(ArenaCore))


cdef ArenaTable _c_table


cdef int _capi_init() except -1:
    """Fill both tables and publish them as arenalib._arena._C_API and _C_TABLE."""
    cdef InlineState* state = _inline_state
    state.abi_fingerprint = abi_fingerprint()
    state.functions.open_slow = arena_open_slow
    state.functions.close_slow = arena_close_slow
    state.functions.allocate_slow = arena_allocate_slow
    state.functions.free_slow = arena_free_slow
    state.functions.reset = arena_reset_slow
    state.functions.raise_error = arena_raise
    state.functions.core_of = arena_core_of
    state.functions.slot_free = arena_slot_free
    state.functions.mark_slow = arena_mark_slow
    state.functions.rewind_slow = arena_rewind_slow
    if <size_t>&state.carvers % 64:
        raise ImportError("arenalib: its carver records are not on cache lines of their own")
    adopt_inline_state(state)
    globals()["_C_API"] = PyCapsule_New(state, b"arenalib._arena._C_API", NULL)
    if sizeof(ArenaCore) > sizeof(OpaqueCore):
        raise ImportError("arenalib: its ArenaCore outgrew the table-only API's OpaqueCore")
    _c_table.fingerprint = TABLE_FINGERPRINT
    _c_table.core_size = sizeof(ArenaCore)
    _c_table.open = _table_open
    _c_table.close = _table_close
    _c_table.allocate = _table_allocate
    _c_table.free = _table_free
    _c_table.reset = _table_reset
    _c_table.raise_error = arena_raise
    _c_table.core_of = _table_core_of
    _c_table.core_init = _table_core_init
    _c_table.mark = _table_mark
    _c_table.rewind = _table_rewind
    globals()["_C_TABLE"] = PyCapsule_New(&_c_table, b"arenalib._arena._C_TABLE", NULL)
    return 0
