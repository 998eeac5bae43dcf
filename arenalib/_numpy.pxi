# NumPy arrays allocated from an arena (issue 28): NEP 49's data-memory handler.
#
# NumPy allocates the data of every array through the handler current in the calling context (a
# ContextVar of NumPy's, set by PyDataMem_SetHandler: a PyCapsule named "mem_handler" pointing to a
# PyDataMem_Handler), and each array keeps a reference to the capsule it was allocated with, through
# which it frees (and ndarray.resize reallocates) its data later, from whichever thread drops it.
# `with arena.numpy():` sets a capsule of this arena's for the block; numpy_handler(arena) makes one.
#
# The promise is arenalib's: nothing an array can reach is ever freed first.  Every block handed to
# NumPy counts as a buffer export of the arena (Lifetime.exports), so the project's one mechanism for
# exports does the rest: close() and reset() refuse with BufferError while an array lives, a deferred
# close (the end of `with arena:`) keeps the memory until the last array's free, which gives it back
# (core_release_held, as a segment's last export release does).  Each capsule holds a reference to
# its arena, and each array one to its capsule, so the arena object outlives every array of its.
#
# Which arena kinds: Arena only.  NumPy frees from any thread, which a shared Arena allows and a
# ConfinedArena does not (its memory is its owner thread's alone, which no NumPy array can promise);
# a SlicingArena frees nothing one by one, so the temporaries NumPy makes in a loop would pile up
# until a reset that live arrays refuse.  Both are refused with UnsupportedOperation (numpy_arena()).
#
# The handler's functions run with the calling thread's state attached (NumPy holds the GIL for them;
# on a free-threaded build other threads run meanwhile) and never run Python code or make an object:
# a finalizer that closes the arena can only run before an allocation (NumPy makes the array object
# first) or after it, never inside.  They announce their use of the arena as every Python-level
# access does (access_enter: a close or reset of another thread waits for it), then:
#
# - allocate: from the arena (its books, max_bytes and thread caches: arena_allocate).  A block of
#   under NP_LARGE_MIN bytes has a header in front of the data saying the size NumPy asked for and
#   which allocator the block is from; a bigger one is page-aligned, and has one too, its data 16
#   bytes into the page as glibc's big blocks have theirs, unless the array's size is a jemalloc
#   size class's own (every power of two), which a header would push into the next class, a
#   quarter bigger: then its data is the page's start and the arena's table of big blocks has its
#   size (src/numpy_large.h).  An arena
#   closed meanwhile (an asyncio task that inherited the block's context and runs after the
#   block) hands NumPy's default handler the allocation instead, counted in stats()'s
#   numpy_fallbacks; a request past max_bytes or with no memory gets NULL (NumPy's MemoryError).
# - free: for page-aligned data, the table (every block handed out with page-aligned data is in it,
#   the big ones and the few small ones whose data falls on a page); else the header, 16 bytes
#   before, in the same page.  Either says which allocator the block is from and its size (NumPy's
#   may differ from the one it allocated: an empty array frees 1 byte of an elsize-byte block).  An
#   arena block goes back to the open arena, or stays in the closed arena's held slot, garbage to
#   be dropped in bulk when the last one goes; either way the export count drops, and the last one
#   completes a deferred close.
# - realloc (ndarray.resize, np.fromiter): a big block is resized in the arena (arena_resize_checked:
#   in place when jemalloc can) while the new size keeps its kind (big, with a header only where
#   the class has room); any other block moves to a new block of the kind its new size asks for (a
#   small one is within jemalloc's small and thread-cached classes, which resize in place seldom);
#   for a block of a closed arena, the new one is NumPy's default handler's.
#
# Small blocks (up to NP_CACHE_MAX bytes of data) are kept for reuse on a GIL build, as NumPy's own
# handler keeps its own: a few per 16-byte bucket, in the arena's NumpyCache, which the GIL guards
# (NumPy calls the handler with it held, as its own cache needs), whichever thread calls.  A kept
# block is not an export, and stays allocated in the arena's books, which keeping and taking it do not
# touch (a thread's books are a look-up away, and updating them cost a pair of np.empty(8) ~2.5 ns of
# its handler's ~11: 2026-12-06); instead the arena's SharedState counts the kept blocks' bytes
# (idle_bytes), which the peak leaves out (shared_update_peak), and the bytes handed out again
# (reused_bytes), which allocated_total adds (shared_totals); stats() takes the kept blocks out of
# live_bytes and live_segments (numpy_read_books; it shows them as numpy_cached_bytes).  A C-level
# reset without the GIL of an Arena takes the GIL first on a GIL build (arena_reset_slow): the
# handler's functions, which hold it, then never run during the reset (a block taken while
# jemalloc reset its arena went to an array and, freed, to jemalloc twice: an attack found it,
# 2026-12-06).  A block is handed out again only in the generation it was kept
# in and while the arena is open: a reset or close (any, C-level ones too) makes the whole cache
# stale at once, with no list to walk.  A reset drops the blocks with the rest of the arena's
# memory and books; a close leaves what is allocated to the slot as garbage, kept blocks included,
# so Python's close (and an unclosed arena's collection) gives them back to the arena first
# (numpy_cache_flush): unflushed, every `with Arena() as a, a.numpy():` left up to 134 KiB in the
# reused slot (found by an attack, 2026-12-04).  A C-level arena_close() of a Python Arena does not
# flush: its slot counts the kept blocks with the rest of what the arena left allocated.
# A limited arena (max_bytes) keeps none: its limit counts what arrays hold.
# Why: an np.empty(8) cost 1.08x and an np.zeros(100) 1.21x NumPy's own handler's with a trip to the
# arena for each block, and NEP 49 handlers are called for every small temporary.
#
# No build-time NumPy: the handler struct is declared in src/numpy.h, and NumPy's C API is taken from
# the table of its capsule _ARRAY_API at first use (numpy_api()), its version checked there.

from cpython.mem cimport PyMem_RawCalloc, PyMem_RawFree
from cpython.object cimport PyObject
from cpython.contextvars cimport (
    PyContextVar_Get, PyContextVar_New_with_default, PyContextVar_Reset, PyContextVar_Set,
)
from cpython.pycapsule cimport PyCapsule_CheckExact, PyCapsule_GetPointer, PyCapsule_IsValid, PyCapsule_New
from cpython.ref cimport Py_DECREF, Py_INCREF
from cpython.version cimport PY_VERSION_HEX
from libc.string cimport memcpy, memset, strncpy

from arenalib._abi cimport (
    CACHE_MAX_SIZE, FREE_THREADED, ArenaCore, Lifetime, ThreadCache, arenalib_load_owner, books_remove,
    load_first_cache, thread_ident,
)
from arenalib._jemalloc cimport MALLOCX_LG_ALIGN, je_nallocx
from arenalib._shared cimport shared_count_allocation
from arenalib._table cimport ARENA_ECLOSED, ARENA_ENOMEM, ARENA_KIND_CONFINED, ARENA_KIND_SHARED, ARENA_OK

cdef extern from "Python.h":
    int PyGC_Enable()   # 3.10+: each returns whether the collector was enabled
    int PyGC_Disable()

cdef extern from "src/numpy.h":
    ctypedef struct NpAllocator "arenalib_np_allocator":
        void* ctx
        void* (*malloc)(void* ctx, size_t size) noexcept nogil
        void* (*calloc)(void* ctx, size_t nelem, size_t elsize) noexcept nogil
        void* (*realloc)(void* ctx, void* ptr, size_t new_size) noexcept nogil
        void (*free)(void* ctx, void* ptr, size_t size) noexcept nogil
    ctypedef struct NpHandler "arenalib_np_handler":
        char name[127]
        unsigned char version
        NpAllocator allocator
    ctypedef struct NpHeader "arenalib_np_header":
        size_t size
        size_t tag
    ctypedef struct NpApi "arenalib_np_api":
        object (*set_handler)(object)  # a new reference; NULL (an exception set) on error
        PyObject* default_capsule
        NpHandler* default_handler
        bint thp_madvise
        size_t big_lead
    size_t NP_HEADER "ARENALIB_NP_HEADER"
    size_t NP_TAG_ARENA "ARENALIB_NP_TAG_ARENA"
    size_t NP_TAG_DEFAULT "ARENALIB_NP_TAG_DEFAULT"
    NpHeader* np_header_of "arenalib_np_header_of"(void* data) noexcept nogil
    bint np_mul_overflow "__builtin_mul_overflow"(size_t a, size_t b, size_t* out) noexcept nogil
    NpApi* np_api_get "arenalib_np_api_get"() noexcept nogil
    NpApi* np_api_publish "arenalib_np_api_publish"(NpApi* api) noexcept nogil
    int NP_GET_ABI_VERSION "ARENALIB_NP_GET_ABI_VERSION"
    int NP_GET_FEATURE_VERSION "ARENALIB_NP_GET_FEATURE_VERSION"
    int NP_SET_HANDLER "ARENALIB_NP_SET_HANDLER"
    int NP_DEFAULT_HANDLER "ARENALIB_NP_DEFAULT_HANDLER"
    unsigned int np_call_version "arenalib_np_call_version"(void** table, int index) noexcept
    size_t NP_HUGE_MIN "ARENALIB_NP_HUGE_MIN"
    size_t NP_HUGE_ALIGN "ARENALIB_NP_HUGE_ALIGN"
    void np_advise "arenalib_np_advise"(void* block, size_t size, bint huge) noexcept nogil
    Shards* LIVE_NUMPY "arenalib_live_numpy"

cdef extern from "src/numpy_large.h":
    ctypedef struct NumpyLarge "arenalib_np_large":
        pass
    size_t NP_LARGE_MIN "ARENALIB_NP_LARGE_MIN"
    size_t NP_PAGE "ARENALIB_NP_PAGE"
    size_t NP_HAS_HEADER "ARENALIB_NP_HAS_HEADER"
    bint np_page_aligned "arenalib_np_page_aligned"(const void* data) noexcept nogil
    char* np_page_of "arenalib_np_page_of"(const void* data) noexcept nogil
    int np_large_add "arenalib_np_large_add"(NumpyLarge* table, void* data, size_t size) noexcept nogil
    bint np_large_lookup "arenalib_np_large_lookup"(NumpyLarge* table, void* data, size_t* size,
                                                    bint take) noexcept nogil
    NumpyLarge* np_large_make "arenalib_np_large_make"(void** slot) noexcept nogil
    void np_large_free "arenalib_np_large_free"(void** slot) noexcept nogil

cdef enum:
    NP_FEATURE_MIN = 0x0F       # NPY_1_22_API_VERSION: NEP 49's handler API is there from 1.22
    NP_HANDLER_NAME_MAX = 127


cdef str _NEEDS_NUMPY = ("arenalib's NumPy scopes (arena.numpy(), numpy_handler()) need NumPy 1.22 or newer, "
                         "whose C API has NEP 49's PyDataMem_SetHandler")


# -- NumPy's C API, taken from its capsule at first use ----------------------------------------------

cdef inline NpApi* numpy_api() except NULL:
    """NumPy's handler API (imported, checked and published on first use); ImportError saying why
    when NumPy is absent or too old."""
    cdef NpApi* api = np_api_get()
    return api if api != NULL else _numpy_api_load()


cdef NpApi* _numpy_api_load() except NULL:
    from importlib import import_module  # (Cython's own import takes a None in sys.modules for a module)
    try:
        numpy = import_module("numpy")
        try:
            umath = import_module("numpy._core._multiarray_umath")  # NumPy 2
        except ModuleNotFoundError as error:
            if not (error.name or "").startswith("numpy._core"):
                raise
            umath = import_module("numpy.core._multiarray_umath")  # NumPy 1.x
        c_api = umath._ARRAY_API
        global _numpy_hugepage_switch
        _numpy_hugepage_switch = getattr(umath, "_get_madvise_hugepage", None)
    except (ImportError, AttributeError) as error:
        # NumPy absent, or without the modules and table of 1.22+.  Anything else (a MemoryError,
        # a signal handler's exception during the import) is not about NumPy: it goes through.
        raise ImportError(f"{_NEEDS_NUMPY}: {type(error).__name__}: {error}") from error
    version = getattr(numpy, "__version__", "?")
    if not PyCapsule_IsValid(c_api, NULL):
        raise ImportError(f"{_NEEDS_NUMPY}: NumPy {version}'s _ARRAY_API is not its C-API capsule")
    cdef void** table = <void**>PyCapsule_GetPointer(c_api, NULL)
    # The table's entries are the same from NumPy 1.22 to 2.4 (see src/numpy.h); a NumPy of another
    # C ABI (a major version after 2) may have moved them: refused rather than called blind.
    cdef unsigned int abi = np_call_version(table, NP_GET_ABI_VERSION)
    cdef unsigned int feature = np_call_version(table, NP_GET_FEATURE_VERSION)
    if abi >> 24 not in (1, 2):
        raise ImportError(f"{_NEEDS_NUMPY}: NumPy {version} has C ABI {abi:#x}; arenalib knows the tables "
                          "of ABI 1 and 2 (NumPy 1.22 to 2.x)")
    if feature < NP_FEATURE_MIN:
        raise ImportError(f"{_NEEDS_NUMPY}: NumPy {version} has C API {feature:#x} "
                          f"(1.22 is {NP_FEATURE_MIN:#x})")
    cdef PyObject* default_capsule = (<PyObject**>table[NP_DEFAULT_HANDLER])[0]
    if (table[NP_SET_HANDLER] == NULL or default_capsule == NULL
            or not PyCapsule_IsValid(<object>default_capsule, b"mem_handler")):
        raise ImportError(f"{_NEEDS_NUMPY}: NumPy {version}'s C API has no handler functions")
    cdef NpHandler* default_handler = <NpHandler*>PyCapsule_GetPointer(<object>default_capsule,
                                                                       b"mem_handler")
    if default_handler.version < 1:
        raise ImportError(f"{_NEEDS_NUMPY}: NumPy {version}'s default handler is of version "
                          f"{default_handler.version}")
    cdef NpApi* api = <NpApi*>PyMem_RawCalloc(1, sizeof(NpApi))
    if api == NULL:
        raise MemoryError("cannot allocate arenalib's NumPy API record")
    api.set_handler = <object (*)(object)>table[NP_SET_HANDLER]
    api.default_capsule = default_capsule
    api.default_handler = default_handler
    api.thp_madvise = _thp_mode() == "madvise"
    # A cache line's start for the data of big arrays where NumPy's loops use 64-byte vectors
    # (src/numpy_large.h says why); a missing key (another NumPy) is NumPy's plain x86-64 build.
    features = getattr(umath, "__cpu_features__", None)
    api.big_lead = 64 if isinstance(features, dict) and features.get("AVX512_SKX") is True else NP_HEADER
    Py_INCREF(<object>default_capsule)  # NumPy's singleton: kept for good, as NumPy keeps it
    cdef NpApi* published = np_api_publish(api)
    if published != api:  # another thread loaded it first: the same values
        Py_DECREF(<object>default_capsule)
        PyMem_RawFree(api)
    return published


def _thp_mode():
    """The kernel's transparent huge page mode ("always", "madvise", "never"; None: unknown)."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            words = f.read().split()
    except OSError:
        return None
    chosen = [w.strip("[]") for w in words if w.startswith("[")]
    return chosen[0] if chosen else None


# NumPy's switch of its huge-page advice (np._core.multiarray._get_madvise_hugepage), found with the
# C API; None: this NumPy has none.
_numpy_hugepage_switch = None


cdef bint _numpy_wants_hugepages():
    """Whether NumPy's default handler advises huge pages now."""
    switch = _numpy_hugepage_switch
    return switch is not None and bool(switch())


# -- the handler capsule --------------------------------------------------------------------------

cdef struct NumpyContext:
    # What a capsule points to: the handler NumPy calls (first, so the capsule's pointer is both),
    # and what its functions need, for as long as the capsule lives.
    NpHandler handler
    ArenaCore* core
    NumpyBooks* books
    NumpyCache* cache          # books.cache, one load nearer (NULL on a free-threaded build)
    NpHandler* fallback        # NumPy's default handler: what serves allocations after a close
    bint hugepages             # advise huge pages for big blocks (see src/numpy.h)
    size_t big_lead            # where a big block's data starts, where its class has room (numpy.h)
    PyObject* arena            # a reference, dropped with the capsule


cdef ArenaBase numpy_arena(object arena):
    """``arena`` if NumPy arrays can be allocated from it (an Arena, NumPy 1.22+), else the error."""
    if not isinstance(arena, ArenaBase):
        raise TypeError(f"arena must be an arenalib.Arena, not {type(arena).__name__}")
    cdef ArenaBase base = arena
    name = type(base).__name__
    if base._core.kind == ARENA_KIND_CONFINED:
        raise UnsupportedOperation(
            f"{name}.numpy(): a ConfinedArena's memory is its owner thread's alone, and a NumPy array's "
            "is not (any thread may read it, and drop its last reference, which frees it there); use "
            "arenalib.Arena, whose memory any thread may free")
    if base._core.kind != ARENA_KIND_SHARED:
        raise UnsupportedOperation(
            f"{name}.numpy(): a SlicingArena frees nothing one by one, so every temporary NumPy makes "
            "(a*b + c makes one per operation) would stay allocated until a reset or close, which live "
            "arrays refuse; use arenalib.Arena")
    numpy_api()
    return base


cdef object numpy_handler_of(ArenaBase arena):
    """A new handler capsule of ``arena`` (an Arena that numpy_arena() accepted)."""
    cdef NpApi* api = numpy_api()
    cdef NumpyContext* context = <NumpyContext*>PyMem_RawCalloc(1, sizeof(NumpyContext))
    if context == NULL:
        raise MemoryError("cannot allocate a NumPy handler")
    strncpy(context.handler.name, b"arenalib.Arena", NP_HANDLER_NAME_MAX - 1)
    context.handler.version = 1
    context.handler.allocator.ctx = context
    context.handler.allocator.malloc = _np_malloc
    context.handler.allocator.calloc = _np_calloc
    context.handler.allocator.realloc = _np_realloc
    context.handler.allocator.free = _np_free
    context.core = &arena._core
    context.books = &arena._numpy
    context.fallback = api.default_handler
    context.hugepages = api.thp_madvise and _numpy_wants_hugepages()
    context.big_lead = api.big_lead
    context.arena = <PyObject*>arena
    if not FREE_THREADED and arena._numpy.cache == NULL:  # (none made: blocks go to the arena)
        arena._numpy.cache = <NumpyCache*>PyMem_RawCalloc(1, sizeof(NumpyCache))
    context.cache = arena._numpy.cache  # (freed with the arena, which the capsule holds)
    if np_large_make(&arena._numpy.large) == NULL:
        PyMem_RawFree(context)
        raise MemoryError("cannot allocate the NumPy handler's table of big blocks")
    Py_INCREF(arena)
    try:
        capsule = PyCapsule_New(context, b"mem_handler", _numpy_context_free)
    except BaseException:
        Py_DECREF(arena)
        PyMem_RawFree(context)
        raise
    # Made first (it may start a GC, whose finalizers may close the arena), checked last: a capsule
    # of an arena closed since would only ever hand out NumPy's default allocations.
    arena._check_usable()
    return capsule


cdef void _numpy_context_free(object capsule) noexcept:
    """The capsule's destructor: its last array (or scope) is gone."""
    cdef NumpyContext* context = <NumpyContext*>PyCapsule_GetPointer(capsule, b"mem_handler")
    if context == NULL:
        return
    cdef PyObject* arena = context.arena
    PyMem_RawFree(context)
    Py_DECREF(<object>arena)  # may be the arena's last reference: its dealloc runs


# -- the handler's functions (the calling thread's state attached; no Python code, no object) ----

cdef void* _np_malloc(void* ctx, size_t size) noexcept nogil:
    cdef void* data = _np_take(<NumpyContext*>ctx, size, False)
    return data if data != NULL else _np_allocate(<NumpyContext*>ctx, size, False)


cdef void* _np_calloc(void* ctx, size_t nelem, size_t elsize) noexcept nogil:
    cdef size_t size
    if np_mul_overflow(nelem, elsize, &size):
        return NULL
    cdef void* data = _np_take(<NumpyContext*>ctx, size, True)
    return data if data != NULL else _np_allocate(<NumpyContext*>ctx, size, True)


cdef inline void* _np_take(NumpyContext* context, size_t size, bint zero) noexcept nogil:
    """The common case of an allocation, apart so that it runs in few registers: a kept block for an
    array of ``size`` bytes (zeroed if ``zero``), or NULL, and _np_allocate() serves it."""
    cdef void* block = _np_cache_take(context, size)
    if block == NULL:
        return NULL
    if zero:
        memset(<char*>block + NP_HEADER, 0, size)
    _np_count_out(context, size)
    return _np_hand_out(block, size)


cdef void* _np_allocate(NumpyContext* context, size_t size, bint zero) noexcept nogil:
    """A block of ``size`` bytes for NumPy: the arena's, or NumPy's default handler's once the arena
    is closed; NULL when memory (or max_bytes) refuses."""
    if size > MAX_SIZE - NP_HEADER:
        return NULL
    if size >= NP_LARGE_MIN:
        # Apart, out of line (_np_realloc_big calls it too): the small blocks' path is this
        # function's own, as GCC lays it out with nothing of the big ones' in between.
        return _np_allocate_big(context, size, zero)
    cdef void* block = NULL
    cdef ArenaCore* core = context.core
    cdef int err = ARENA_ECLOSED
    cdef void* token = access_enter(&core.life)  # a close or reset of another thread waits for this
    if core.open:
        err = arena_allocate(core, np_block_size(core, size), 1, zero, &block)
        if err == ARENA_OK and not _np_record_page_aligned(context, block, size):
            arena_free(core, block, np_block_size(core, size))
            err = ARENA_ENOMEM
        if err == ARENA_OK:
            # Counted as a buffer export before anyone can close: close and reset refuse from now on.
            _np_count_out(context, size)
            if size > CACHE_MAX_SIZE:
                shared_update_peak(core)  # (see _np_allocate_big)
    access_exit(token)
    if err == ARENA_ECLOSED:
        return _np_fallback_allocate(context, size, zero)
    if err != ARENA_OK:
        return NULL
    return _np_hand_out(block, size)


cdef inline bint _np_record_page_aligned(NumpyContext* context, void* block, size_t size) noexcept nogil:
    """A block with a header whose data falls on a page (a slab region in about 256 does) is in
    the table too, marked as having one: free() then never reads before a page-aligned address that
    is not in the table (a second free, a pointer never handed out), which may be unmapped.  False:
    no memory to record it."""
    cdef char* data = <char*>block + NP_HEADER
    return (not np_page_aligned(data)
            or np_large_add(<NumpyLarge*>context.books.large, data, size | NP_HAS_HEADER) == 0)


cdef void* _np_allocate_big(NumpyContext* context, size_t size, bint zero) noexcept nogil:
    """_np_allocate() of NP_LARGE_MIN bytes or more: a page-aligned block (see _np_big_block) with a
    header where its size class has room for one, the data 16 or 64 bytes into the page
    (_np_big_lead); else with none, the data on the page, recorded in the arena's table of big
    blocks (src/numpy_large.h says why)."""
    cdef size_t lead = _np_big_lead(context, size)
    cdef void* block = NULL
    cdef ArenaCore* core = context.core
    cdef int err = ARENA_ECLOSED
    cdef void* token = access_enter(&core.life)  # a close or reset of another thread waits for this
    if core.open:
        err = _np_big_block(context, size + lead, size, zero, &block)
        if (err == ARENA_OK and not lead
                and np_large_add(<NumpyLarge*>context.books.large, block, size) != 0):
            arena_free(core, block, size)  # (no memory for the table's growth)
            err = ARENA_ENOMEM
        if err == ARENA_OK:
            # Counted as a buffer export before anyone can close: close and reset refuse now.
            _np_count_out(context, size)
            # As a C-level caller, the handler leaves peak_bytes to the next Python-level allocate,
            # but for big blocks, which a peak is about (the small ones' ~30 cycles were an eighth
            # of a np.empty(8)'s cost over NumPy's own handler).
            shared_update_peak(core)
    access_exit(token)
    if err == ARENA_ECLOSED:
        return _np_fallback_allocate(context, size, zero)
    if err != ARENA_OK:
        return NULL
    if lead:
        return _np_hand_out(<char*>block + lead - NP_HEADER, size)
    shard_add(LIVE_NUMPY, 1)
    trace_track(TRACE_DOMAIN, <size_t>block, size)
    return block


cdef inline size_t _np_class_room(NumpyContext* context, size_t size) noexcept nogil:
    """The bytes the jemalloc size class of a big array's data has beyond them (0 for the classes' own
    sizes: powers of two and three more a doubling)."""
    cdef size_t usable = je_nallocx(size, MALLOCX_LG_ALIGN(arenalib_ctz(_np_large_align(context, size))))
    return usable - size if usable > size else 0


cdef inline size_t _np_big_lead(NumpyContext* context, size_t size) noexcept nogil:
    """The bytes before the data of a new big block for an array of ``size``: the handler's lead
    (16 or 64: src/numpy_large.h) where its class has room for it, else 16 where it has room for the
    header, else none."""
    cdef size_t room = _np_class_room(context, size)
    if room >= context.big_lead:
        return context.big_lead
    return NP_HEADER if room >= NP_HEADER else 0


cdef inline int _np_big_block(NumpyContext* context, size_t block_size, size_t size, bint zero,
                              void** out) noexcept nogil:
    """arena_allocate() of the big block of ``block_size`` bytes for an array of ``size``: on a page,
    or on a huge page where its pages are advised huge, advised before their first touch (a zeroing
    memset's included)."""
    cdef bint huge = context.hugepages and size >= NP_HUGE_MIN
    cdef bint zero_after = zero and huge and block_size <= EAGER_ZERO_LIMIT  # (else jemalloc's: untouched)
    cdef int err = arena_allocate(context.core, block_size, _np_large_align(context, size),
                                  zero and not zero_after, out)
    if err == ARENA_OK and huge:
        np_advise(out[0], block_size, True)
        if zero_after:
            memset(out[0], 0, block_size)
    return err


cdef inline size_t _np_large_align(NumpyContext* context, size_t size) noexcept nogil:
    """A big block's alignment: a page, or a huge page where its pages are advised huge (only the
    2 MiB-aligned spans wholly inside an advised range get huge pages)."""
    return NP_HUGE_ALIGN if context.hugepages and size >= NP_HUGE_MIN else NP_PAGE


cdef inline size_t np_block_size(ArenaCore* core, size_t size) noexcept nogil:
    """The bytes an arena block of ``size`` data bytes has: the header's too, and, where blocks may be
    kept (a GIL build, no max_bytes, which never changes while a block lives), a small size rounded up
    to its cache bucket's (the same jemalloc size class), so that every block of a bucket serves every
    size of it."""
    if not FREE_THREADED and size <= NP_CACHE_MAX and core.max_bytes < 0:
        return ((size + 15) & ~<size_t>15) + NP_HEADER
    return size + NP_HEADER


cdef inline void _np_count_out(NumpyContext* context, size_t size) noexcept nogil:
    """An arena block goes to an array: one more export of the arena, and the handler's books."""
    count_add(&context.core.life.exports, 1)
    count_add(&context.books.arrays, 1)
    count_add(&context.books.nbytes, <Py_ssize_t>size)


cdef inline void* _np_hand_out(void* block, size_t size) noexcept nogil:
    """The data of arena block ``block`` for an array of ``size`` bytes, its header written."""
    cdef NpHeader* header = <NpHeader*>block
    header.size = size
    header.tag = NP_TAG_ARENA
    shard_add(LIVE_NUMPY, 1)
    cdef char* data = <char*>block + NP_HEADER
    trace_track(TRACE_DOMAIN, <size_t>data, size)
    return data


# -- the cache of small blocks (GIL builds; see the top of this file) ------------------------------

cdef inline void _np_cache_forget(NumpyCache* cache, uint64_t generation) noexcept nogil:
    """Empty the cache without touching its blocks, for ``generation``."""
    memset(cache.count, 0, sizeof(cache.count))
    cache.generation = generation


cdef inline void* _np_cache_take(NumpyContext* context, size_t size) noexcept nogil:
    """A kept block for ``size`` data bytes, or NULL (none kept, the cache stale)."""
    cdef NumpyCache* cache = context.cache
    if FREE_THREADED or cache == NULL or size > NP_CACHE_MAX:
        return NULL
    cdef size_t bucket = (size + 15) >> 4
    cdef unsigned char n = cache.count[bucket]
    if n == 0:
        return NULL
    cdef ArenaCore* core = context.core
    if not core.open or cache.generation != core.life.generation:
        _np_cache_forget(cache, 0)
        return NULL
    cdef size_t block_size = (bucket << 4) + NP_HEADER  # np_block_size() of every size of the bucket
    n -= 1
    cache.count[bucket] = n
    store_size(&core.shared.reused_bytes, core.shared.reused_bytes + block_size)
    store_ssize(&core.shared.idle_bytes, core.shared.idle_bytes - <Py_ssize_t>block_size)
    return cache.kept[bucket * NP_CACHE_DEPTH + n]


cdef inline bint _np_cache_keep(NumpyContext* context, NpHeader* header, size_t size) noexcept nogil:
    """Keep the block of an array of ``size`` bytes that died; False when it is not for the cache
    (too big, its bucket full, the arena closed or limited, a free-threaded build)."""
    cdef NumpyCache* cache = context.cache
    if FREE_THREADED or cache == NULL or size > NP_CACHE_MAX:
        return False
    if np_page_aligned(<char*>header + NP_HEADER):
        return False  # (its record is gone with the array, and a kept block has none)
    cdef ArenaCore* core = context.core
    if not core.open or core.max_bytes >= 0:  # (a closed arena's blocks go in bulk)
        return False
    if cache.generation != core.life.generation:
        _np_cache_forget(cache, core.life.generation)
    cdef size_t bucket = (size + 15) >> 4
    cdef unsigned char n = cache.count[bucket]
    if n == NP_CACHE_DEPTH:
        return False
    cache.kept[bucket * NP_CACHE_DEPTH + n] = header
    cache.count[bucket] = n + 1
    store_ssize(&core.shared.idle_bytes, core.shared.idle_bytes + <Py_ssize_t>((bucket << 4) + NP_HEADER))
    return True


cdef int numpy_cache_flush(ArenaBase arena) except -1:
    """Give the blocks the handler keeps back to the open arena: before a purge, which can then hand
    their pages back too, and before a close (see the top of this file); a reset drops them."""
    cdef NumpyCache* cache = arena._numpy.cache
    if cache == NULL:
        return 0
    cdef ArenaCore* core = &arena._core
    cdef ThreadCache* tc = _thread_cache(core) if core.open else NULL  # (NULL: no memory for one)
    cdef size_t bucket, block_size
    cdef unsigned char i
    if tc != NULL and cache.generation == core.life.generation:
        for bucket in range(NP_CACHE_BUCKETS):
            block_size = (bucket << 4) + NP_HEADER
            for i in range(cache.count[bucket]):
                arena_free(core, cache.kept[bucket * NP_CACHE_DEPTH + i], block_size)
    _np_cache_forget(cache, 0)  # (left out with no thread cache: allocated until a reset or close)
    store_ssize(&core.shared.idle_bytes, 0)
    return 0


cdef Py_ssize_t numpy_read_books(ArenaBase arena, Books* books) noexcept:
    """read_books() of ``arena`` as its users see them, with the blocks the handler keeps out of
    the live figures; the kept blocks' bytes (0 when the cache is stale).  The caller keeps closes
    out (access_enter), as for read_books()."""
    read_books(&arena._core, books)
    cdef NumpyCache* cache = arena._numpy.cache
    cdef Py_ssize_t nbytes = 0, blocks = 0
    cdef size_t bucket
    if cache == NULL:
        return 0
    if arena._core.open and cache.generation == arena._core.life.generation:
        for bucket in range(NP_CACHE_BUCKETS):
            blocks += cache.count[bucket]
            nbytes += cache.count[bucket] * <Py_ssize_t>((bucket << 4) + NP_HEADER)
    books.live_bytes -= nbytes
    books.live_segments -= blocks
    return nbytes


cdef void numpy_books_free(NumpyBooks* books) noexcept:
    """At the arena's deallocation (after every capsule and array of it)."""
    PyMem_RawFree(books.cache)
    books.cache = NULL
    np_large_free(&books.large)


cdef void* _np_fallback_allocate(NumpyContext* context, size_t size, bint zero) noexcept nogil:
    """NumPy's default allocation, with the handler's header (the arena is closed), counted."""
    cdef void* data = _np_fallback_block(context, size, zero)
    if data != NULL:
        count_add(&context.books.fallbacks, 1)
    return data


cdef void* _np_fallback_block(NumpyContext* context, size_t size, bint zero) noexcept nogil:
    """The data of a block of NumPy's default handler with the handler's header in front."""
    cdef NpAllocator* fallback = &context.fallback.allocator
    cdef void* block
    if zero:
        block = fallback.calloc(fallback.ctx, size + NP_HEADER, 1)
    else:
        block = fallback.malloc(fallback.ctx, size + NP_HEADER)
    if block == NULL:
        return NULL
    if not _np_record_page_aligned(context, block, size):
        fallback.free(fallback.ctx, block, size + NP_HEADER)
        return NULL
    cdef NpHeader* header = <NpHeader*>block
    header.size = size
    header.tag = NP_TAG_DEFAULT
    return <char*>block + NP_HEADER


cdef void _np_fallback_free(NumpyContext* context, NpHeader* header) noexcept nogil:
    """Give a block of _np_fallback_block() back to NumPy's default handler."""
    header.tag = 0  # a second free of the block finds no tag, and leaves it alone
    context.fallback.allocator.free(context.fallback.allocator.ctx, header, header.size + NP_HEADER)


cdef void _np_free(void* ctx, void* data, size_t size) noexcept nogil:
    # ``size`` is NumPy's idea of the size, which may differ from the one allocated: unused.
    if data == NULL:
        return
    cdef NumpyContext* context = <NumpyContext*>ctx
    if np_page_aligned(data):
        # Every block handed out with page-aligned data is recorded: its record is taken (a second
        # free finds none), and one not recorded is not the handler's, and not even read.
        if not np_large_lookup(<NumpyLarge*>context.books.large, data, &size, True):
            return
        if not size & NP_HAS_HEADER:  # a big block
            trace_untrack(TRACE_DOMAIN, <size_t>data)
            _np_release(context, data, size, size)
            return
    cdef NpHeader* header = np_header_of(data)  # (in the same page as the data, or recorded)
    cdef size_t tag = header.tag
    if tag == NP_TAG_DEFAULT:
        _np_fallback_free(context, header)
    elif tag == NP_TAG_ARENA:
        header.tag = 0  # a second free of the block finds no tag, and leaves it alone
        trace_untrack(TRACE_DOMAIN, <size_t>data)
        if not _np_put_back(context, header):
            _np_release_headed(context, header)
    # else: not a block of the handler's (a second free, a pointer it never made): never touched


cdef inline bint _np_put_back(NumpyContext* context, NpHeader* header) noexcept nogil:
    """The common case of a free, apart so that it runs in few registers: keep the block of a dead
    array for reuse and count it gone; False when it is not for the cache (_np_release() then)."""
    cdef size_t size = header.size
    if not _np_cache_keep(context, header, size):
        return False
    _np_count_in(context, size)
    return True


cdef inline void _np_count_in(NumpyContext* context, size_t size) noexcept nogil:
    """An array's block is back (kept, in the arena, or the closed arena's garbage): one export less,
    and the last one completes a deferred close."""
    cdef Lifetime* life = &context.core.life
    count_add(&context.books.arrays, -1)
    count_add(&context.books.nbytes, -<Py_ssize_t>size)
    shard_add(LIVE_NUMPY, -1)
    # The count first, then the flag (a deferred close sets the flag, then reads the count): of the
    # last release and the close, one sees the other, and core_release_held() runs once.
    count_add(&life.exports, -1)
    if state_read(&life.release_pending) and count_read(&life.exports) == 0:
        with gil:  # held already (NumPy calls with it): core_release_held() is declared with it
            core_release_held(context.core)


cdef void _np_release_headed(NumpyContext* context, NpHeader* header) noexcept nogil:
    """_np_release() of an arena block with a header (its tag taken off): a small block starts at its
    header; a big one on the page of its data, its lead before the data (_np_big_lead)."""
    cdef size_t size = header.size
    cdef char* block
    if size < NP_LARGE_MIN:
        _np_release(context, header, np_block_size(context.core, size), size)
        return
    block = np_page_of(header)
    _np_release(context, block, size + NP_HEADER + <size_t>(<char*>header - block), size)


cdef void _np_release(NumpyContext* context, void* block, size_t block_size, size_t size) noexcept nogil:
    """An arena block of ``block_size`` bytes that held an array of ``size`` NumPy is done with: back
    into the open arena, or left to the closed arena's held slot (dropped in bulk with it); the last
    one completes a deferred close."""
    cdef ArenaCore* core = context.core
    cdef Lifetime* life = &core.life
    if context.hugepages and size >= NP_HUGE_MIN:
        np_advise(block, block_size, False)
    cdef void* token = access_enter(life)
    if core.open:
        arena_free(core, block, block_size)
    access_exit(token)
    _np_count_in(context, size)


cdef void* _np_realloc(void* ctx, void* data, size_t size) noexcept nogil:
    cdef NumpyContext* context = <NumpyContext*>ctx
    if data == NULL:
        return _np_allocate(context, size, False)
    if size > MAX_SIZE - NP_HEADER:
        return NULL
    cdef size_t old
    if np_page_aligned(data):  # (see _np_free)
        if not np_large_lookup(<NumpyLarge*>context.books.large, data, &old, False):
            return NULL
        if not old & NP_HAS_HEADER:
            return _np_realloc_big(context, <char*>data, old, size, 0)
    cdef NpHeader* header = np_header_of(data)
    cdef size_t tag = header.tag
    if tag != NP_TAG_ARENA and tag != NP_TAG_DEFAULT:
        return NULL  # not a block of the handler's: never touched
    old = header.size
    if tag == NP_TAG_ARENA and old >= NP_LARGE_MIN:
        return _np_realloc_big(context, <char*>data, old, size, <size_t>(<char*>data - np_page_of(data)))
    # A small arena block moves to a new block of the kind its new size asks for; one of NumPy's
    # default (after a close) to another of its.
    cdef void* moved = (_np_allocate(context, size, False) if tag == NP_TAG_ARENA
                        else _np_fallback_block(context, size, False))
    if moved == NULL:
        return NULL  # NumPy keeps the old block
    memcpy(moved, data, min(old, size))
    cdef size_t recorded
    if np_page_aligned(data):
        np_large_lookup(<NumpyLarge*>context.books.large, data, &recorded, True)  # (its record goes)
    if tag == NP_TAG_ARENA:
        header.tag = 0
        trace_untrack(TRACE_DOMAIN, <size_t>data)
        _np_release(context, header, np_block_size(context.core, old), old)
    else:
        _np_fallback_free(context, header)
    return moved


cdef void* _np_realloc_big(NumpyContext* context, char* data, size_t old, size_t size,
                           size_t lead) noexcept nogil:
    """Resize the big block of the array of ``old`` bytes at ``data``, ``lead`` bytes into the block
    (its header and offset, or 0: a block recorded in the table), in the arena, in place when
    jemalloc can, while the new size keeps the block's kind (big, and with a header only where its
    class has room for the lead); else, or once the arena closed (deferred) while the array lived,
    the bytes move to a new block (NumPy's default's after a close) and the old one is released."""
    cdef NumpyLarge* table = <NumpyLarge*>context.books.large
    cdef ArenaCore* core = context.core
    cdef char* block = data - lead
    cdef void* resized = NULL
    cdef void* moved
    cdef NpHeader* header
    cdef int err = ARENA_ECLOSED
    cdef void* token
    if size >= NP_LARGE_MIN and (lead == 0 or _np_class_room(context, size) >= lead):
        token = access_enter(&core.life)
        if core.open:
            if context.hugepages and old >= NP_HUGE_MIN:
                np_advise(block, old + lead, False)  # (a shrink or a move gives pages back)
            if lead:
                # The tag off first: a move frees the block inside the resize, and its old address,
                # freed or realloc'ed again (a stale pointer), must find no tag, as after a free.
                np_header_of(data).tag = 0
            else:
                # The record out first: a move frees ``data`` inside the resize, and another thread
                # may be handed it and record it before this one could say the block moved.
                np_large_lookup(table, data, &old, True)
            err = arena_resize_checked(core, block, old + lead, size + lead,
                                       _np_large_align(context, size), False, 0, &resized)
            if err == ARENA_OK:
                count_add(&context.books.nbytes, <Py_ssize_t>size - <Py_ssize_t>old)
                if size > old:
                    shared_update_peak(core)  # (see _np_allocate_big)
            else:
                resized, size = block, old
            if lead:
                header = np_header_of(<char*>resized + lead)
                header.size = size
                header.tag = NP_TAG_ARENA
            else:
                # Never needs memory on a GIL build (a record went, one comes); with the GIL off,
                # only when other threads filled the table meanwhile and it cannot grow: the block
                # then stays unrecorded, and its array's free finds no record and leaves it to the
                # close.
                np_large_add(table, resized, size)
            if context.hugepages and size >= NP_HUGE_MIN:
                np_advise(resized, size + lead, True)
        access_exit(token)
        if err == ARENA_OK:
            trace_untrack(TRACE_DOMAIN, <size_t>data)
            trace_track(TRACE_DOMAIN, <size_t>resized + lead, size)
            return <char*>resized + lead
        if err != ARENA_ECLOSED:
            return NULL  # no memory, or max_bytes: NumPy keeps the old block
    # (_np_allocate_big() called from here too keeps GCC from inlining it into _np_allocate())
    moved = (_np_allocate_big(context, size, False) if size >= NP_LARGE_MIN
             else _np_allocate(context, size, False))
    if moved == NULL:
        return NULL
    memcpy(moved, data, min(old, size))
    if lead:
        np_header_of(data).tag = 0
        trace_untrack(TRACE_DOMAIN, <size_t>data)
        _np_release(context, block, old + lead, old)
    elif np_large_lookup(table, data, &old, True):
        trace_untrack(TRACE_DOMAIN, <size_t>data)
        _np_release(context, data, old, old)
    return moved


# -- the Python API -----------------------------------------------------------------------------

# The scope chain of this context: a link for each numpy() scope entered here and not yet ended, the
# innermost first.  What lets a scope that ends out of order (generators closed in another order)
# leave NumPy's handler to the scopes entered after it, and one ending in another context see it.
# Links never change once made, so a context copied from this one (an asyncio task's) keeps the
# chain as it was, and no walk can loop; what changes (a scope ended out of order, what it replaced)
# is on the scope, and only its home context, the one it was entered in, changes or reads it.
cdef object _scope_chain = PyContextVar_New_with_default(b"arenalib_numpy_scopes", None)

cdef extern from *:
    """
    /* The context object current on this thread (CPython's own field, public since 3.7): a copy of
       a context is another object, and a context stays the same object while its variables change. */
    static inline void *arenalib_current_context(void) { return (void *)PyThreadState_Get()->context; }
    """
    void* current_context "arenalib_current_context"() noexcept


@cython.final
cdef class _ScopeLink:
    """One entry of a scope in a context's scope chain (collected by the cyclic GC, as its scope)."""
    cdef NumpyScope scope
    cdef _ScopeLink outer       # the link innermost when this one was made
    cdef uint64_t entry         # the scope's entry it was made for: current while scope._entry is


@cython.final
cdef class NumpyScope:
    """What arena.numpy() returns: a with-statement that makes NumPy allocate the data of the arrays
    created in the block (in this context) from the arena; see Arena.numpy()."""

    # Collected by the cyclic GC: a scope never ended holds its entry's token, which holds the
    # context it began in, whose chain holds the scope.
    cdef ArenaBase _arena
    cdef object _previous       # the handler the block replaced, while entered or ended out of order
    cdef object _token          # its entry's token of the chain's ContextVar: what its exit resets
    cdef uint64_t _entry        # its entry now (0: none), while entered or ended out of order
    cdef uint64_t _entries      # its entries so far: each link names the one it was made for
    cdef void* _home            # the context it was entered in, kept alive by _token (identity only)
    cdef bint _entered          # from its entry until its exit is done
    cdef bint _exiting          # an exit is under way (the thread that claimed it ends it)
    cdef bint _left             # ended out of order: its handler goes with the scopes entered after it

    def __init__(self, *args, **kwargs):
        raise TypeError("NumpyScope cannot be constructed directly; use arena.numpy()")

    def __enter__(self):
        if self._arena is None:  # made by NumpyScope.__new__(NumpyScope), not by arena.numpy()
            raise TypeError("this NumpyScope belongs to no arena; make scopes with arena.numpy()")
        cdef _ScopeLink link = _ScopeLink.__new__(_ScopeLink)
        link.scope = self
        link.outer = _innermost_link()
        with cython.critical_section(self):
            self._entries += 1
            link.entry = self._entries
        previous, token = _enter_scope(numpy_handler_of(self._arena), link)
        cdef bint refused
        cdef bint left
        # With the GIL off, two threads may enter or exit one scope object at once: its fields change
        # under a critical section, where nothing runs Python code (the values replaced are None).
        with cython.critical_section(self):
            refused = self._entered or self._exiting or self._left
            left = self._left and not (self._entered or self._exiting)
            if not refused:
                self._entered = True
                self._previous = previous
                self._token = token
                self._entry = link.entry
                self._home = current_context()
        if refused:
            _leave_scope(token, previous, False, None)
            if not left:
                raise RuntimeError("this numpy() scope is entered already; call arena.numpy() again "
                                   "for another")
            raise RuntimeError("this numpy() scope ended before a scope entered after it (or was "
                               "ended from another context); call arena.numpy() again for another")
        return self._arena

    def __exit__(self, exc_type, exc, tb):
        cdef bint claimed, foreign
        cdef uint64_t entry
        # Claimed for the whole exit: with the GIL off, another thread's entry meanwhile (refused
        # while _entered holds) replaced the fields the exit was reading.  An exit in another context
        # than the entry's claims nothing: the scope stays entered, for its home's own exit (a block
        # still running there), and is marked ended for the scopes around it there (a generator
        # suspended in it, closed elsewhere: its home never ends it).
        with cython.critical_section(self):
            claimed = self._entered and not self._exiting
            foreign = claimed and self._home != current_context()
            entry = self._entry
            if foreign:
                self._left = True
            elif claimed:
                self._exiting = True
        if foreign:
            raise RuntimeError(_OTHER_CONTEXT)
        if not claimed:
            return False  # not entered, or another thread is ending it: as a second exit
        try:
            _scope_exit(self, entry)
        finally:
            with cython.critical_section(self):
                self._entered = False
                self._exiting = False
        return False

    def __repr__(self):
        state = "entered" if self._entered else "ended out of order" if self._left else "not entered"
        return f"<arenalib.NumpyScope of {self._arena!r}, {state}>"

    def __reduce__(self):
        raise TypeError("a NumpyScope cannot be pickled")


cdef inline bint _passed_over(_ScopeLink link, void* here, bint above) noexcept:
    """Whether a walk of this context's chain passes over ``link``: its entry is still current, it
    began in this context (``here``), and it ended out of order; ``above`` the scope ending (the
    walk to it), ended from another context too, while its block may still be running here (the
    walk under it leaves such a scope to its own end).  A scope of another context (the chain was
    copied from it) stops the walk, and is never changed from here."""
    cdef NumpyScope scope = link.scope
    with cython.critical_section(scope):
        return (scope._entry == link.entry and scope._home == here and scope._left
                and (above or not scope._entered))


cdef int _scope_exit(NumpyScope scope, uint64_t entry) except -1:
    """The end of ``scope``'s block (its entry ``entry``).  The innermost scope of this context (once
    those entered after it that ended out of order are passed over) restores the handler it
    replaced, or the one the scopes under it that ended out of order replaced; any other ends out
    of order: NumPy's handler stays the one of the scopes entered after it, until they end (as a
    frame left out of order goes with the frame entered after it).  A scope ending in another
    context than it began in (a generator suspended in it, closed on another thread, in a task or
    in a copied context) raises RuntimeError, as ContextVar.reset() of its token says: the context
    it began in keeps its handler until a scope entered there ends."""
    cdef void* here = current_context()  # (its home: __exit__ refused any other)
    cdef _ScopeLink top = _innermost_link()
    cdef _ScopeLink walk = top
    while walk is not None and not (walk.scope is scope and walk.entry == entry):
        if not _passed_over(walk, here, True):
            break  # a scope entered after it is still open: it ends out of order
        walk = walk.outer
    if walk is None or walk.scope is not scope or walk.entry != entry:
        with cython.critical_section(scope):
            scope._left = True
        return 0
    # The innermost open scope here: what it replaced comes back, or what the scopes under it that
    # ended out of order replaced (they go with it).
    cdef _ScopeLink mine = walk
    cdef object restore, token
    with cython.critical_section(scope):
        restore = scope._previous
        token = scope._token
    cdef _ScopeLink below = mine.outer
    while below is not None and _passed_over(below, here, False):
        with cython.critical_section(below.scope):
            restore = below.scope._previous
        below = below.outer
    try:
        _leave_scope(token, restore, below is not mine.outer, below)
    except ValueError:  # the token's context is another one: nothing changed
        with cython.critical_section(scope):
            scope._left = True
        raise RuntimeError(_OTHER_CONTEXT) from None
    # Those let go drop what they hold (the links above this scope's, and under it down to ``below``).
    _drop_scopes(top, below)
    return 0


cdef str _OTHER_CONTEXT = (
    "this numpy() scope ended in another context than it began in (a generator suspended in it "
    "closed on another thread, in a task or in a copied context): NumPy's handler stays "
    "arenalib's in the context it began in until a scope entered there ends")


cdef int _drop_scopes(_ScopeLink start, _ScopeLink stop) except -1:
    """End the entries of the links from ``start`` down the chain to ``stop`` (excluded): their
    scopes drop what they hold and may be entered again."""
    cdef _ScopeLink walk = start
    cdef NumpyScope scope
    cdef object dropped_previous, dropped_token
    while walk is not None and walk is not stop:
        scope = walk.scope
        dropped_previous = dropped_token = None  # (the last ones dropped here, outside the section)
        with cython.critical_section(scope):
            if scope._entry == walk.entry:
                dropped_previous, dropped_token = scope._previous, scope._token
                scope._previous = None
                scope._token = None
                scope._entry = 0
                scope._home = NULL
                scope._left = False
                scope._entered = False  # (one ended from another context: its home's end is moot)
        walk = walk.outer
    return 0


cdef NumpyScope numpy_scope(ArenaBase arena):
    """arena.numpy()."""
    cdef NumpyScope scope = NumpyScope.__new__(NumpyScope)
    scope._arena = numpy_arena(arena)
    return scope


def numpy_handler(arena):
    """A NEP 49 data-memory handler (a PyCapsule named "mem_handler") that allocates from ``arena``
    (an open Arena), for code that sets NumPy's handler itself (set_numpy_handler(), or
    PyDataMem_SetHandler from C).  Its arrays follow the lifetime rules of arena.numpy()'s.

    ImportError without NumPy 1.22 or newer; UnsupportedOperation for a ConfinedArena or a
    SlicingArena; ArenaClosedError for a closed arena."""
    return numpy_handler_of(numpy_arena(arena))


def set_numpy_handler(handler):
    """Make ``handler`` (a "mem_handler" capsule, such as numpy_handler()'s, or None for NumPy's
    default) NumPy's data-memory handler in the current context; returns the one it replaces.

    NumPy keeps the handler in a ContextVar: this sets it for the calling thread's current context
    (and the asyncio tasks created in it from now on), as PyDataMem_SetHandler does."""
    cdef NpApi* api = numpy_api()
    if handler is not None and not PyCapsule_CheckExact(handler):
        raise TypeError(f"set_numpy_handler() takes a 'mem_handler' capsule or None, not "
                        f"{type(handler).__name__}")
    return _set_handler(<object>api.default_capsule if handler is None else handler)


cdef inline _ScopeLink _innermost_link():
    """The link of the scope innermost in this context (None: none), with no method call."""
    cdef PyObject* value = NULL
    PyContextVar_Get(_scope_chain, NULL, &value)  # (cannot fail for a ContextVar)
    if value == NULL:
        return None
    result = <object>value
    Py_DECREF(result)  # PyContextVar_Get() gave a new reference
    if type(result) is not _ScopeLink:
        return None  # (a value set there by other code than arenalib's: no chain to walk)
    return <_ScopeLink>result


cdef object _set_handler(object capsule):
    """NumPy's PyDataMem_SetHandler(capsule), a ContextVar.set() (see _held_off)."""
    cdef NpApi* api = numpy_api()
    cdef bint was_enabled = _held_off()
    try:
        return api.set_handler(capsule)
    finally:
        if was_enabled:
            PyGC_Enable()


cdef tuple _enter_scope(object capsule, _ScopeLink link):
    """NumPy's handler set to ``capsule`` and ``link`` made the innermost of this context's chain,
    under one hold of the collector: (the handler replaced, the chain's token)."""
    cdef NpApi* api = numpy_api()
    cdef bint was_enabled = _held_off()
    try:
        previous = api.set_handler(capsule)
        return previous, PyContextVar_Set(_scope_chain, link)
    finally:
        if was_enabled:
            PyGC_Enable()


cdef int _leave_scope(object token, object restore, bint set_below, object below) except -1:
    """Undo a scope's entry: the chain reset by ``token`` (ValueError, changing nothing, in another
    context than the token's: first), NumPy's handler ``restore``, and (``set_below``) ``below``
    the innermost (scopes that ended out of order went with it)."""
    cdef NpApi* api = numpy_api()
    cdef bint was_enabled = _held_off()
    try:
        PyContextVar_Reset(_scope_chain, token)
        api.set_handler(restore)
        if set_below:
            PyContextVar_Set(_scope_chain, below)
    finally:
        if was_enabled:
            PyGC_Enable()
    return 0


cdef inline bint _held_off() noexcept:
    """Hold the collector off (True: it was on) around context variable sets on 3.10 and 3.11.
    There a collection can start inside a set's own allocations, and a finalizer it runs that sets
    a context variable too (one that enters a numpy() scope) frees the table the set is still
    walking: a crash (CPython gh-148891; an attack with two threads whose finalizers entered
    scopes crashed 4 runs in 4).  3.12 runs the collector only between bytecodes."""
    return PY_VERSION_HEX < 0x030C0000 and PyGC_Disable()


cdef Py_ssize_t segment_exports(ArenaBase arena) noexcept:
    """The arena's buffer exports alive now, its NumPy arrays (also counted as exports) left out."""
    cdef Py_ssize_t arrays, nbytes
    numpy_figures(arena, &arrays, &nbytes)
    return max(0, count_read(&arena._core.life.exports) - arrays)


cdef str exports_in_words(ArenaBase arena, bint detail=False):
    """What holds the arena's memory, in words: "3 buffer export(s)", "2 NumPy array(s) and 1 buffer
    export(s)" (``detail``: what they are, and the arrays' bytes)."""
    cdef Py_ssize_t arrays, nbytes
    numpy_figures(arena, &arrays, &nbytes)
    cdef Py_ssize_t exports = segment_exports(arena)
    words = (f"{exports} buffer export(s) of its segments (memoryview, NumPy array of a segment, io_uring "
             "request in flight ...)") if detail else f"{exports} buffer export(s)"
    if not arrays:
        return words
    made = (f"{arrays} NumPy array(s) of {nbytes} bytes made in its numpy() scopes" if detail
            else f"{arrays} NumPy array(s)")
    return made if not exports else f"{made} and {words}"


cdef int numpy_figures(ArenaBase arena, Py_ssize_t* arrays, Py_ssize_t* nbytes) noexcept:
    """The arena's NumPy arrays alive now and their bytes, read as figures of the moment."""
    arrays[0] = count_read(&arena._numpy.arrays)
    nbytes[0] = count_read(&arena._numpy.nbytes)
    return 0
