# Private declarations of the vendored jemalloc (symbol prefix arenalib_je_).  Not part of the public
# cimport API: no public .pxd names a jemalloc type or function.

cdef extern from "jemalloc.h" nogil:
    void* je_mallocx(size_t size, int flags)
    void je_dallocx(void* ptr, int flags)
    void* je_rallocx(void* ptr, size_t size, int flags)
    size_t je_xallocx(void* ptr, size_t size, size_t extra, int flags)
    size_t je_sallocx(const void* ptr, int flags)
    size_t je_nallocx(size_t size, int flags)
    int je_mallctl(const char* name, void* oldp, size_t* oldlenp, void* newp, size_t newlen)
    int je_mallctlnametomib(const char* name, size_t* mibp, size_t* miblenp)
    int je_mallctlbymib(const size_t* mib, size_t miblen, void* oldp, size_t* oldlenp,
                        void* newp, size_t newlen)
    const char* JEMALLOC_VERSION

    int MALLOCX_LG_ALIGN(unsigned la)
    int MALLOCX_ZERO
    int MALLOCX_TCACHE_NONE


cdef extern from *:
    """
    /* jemalloc's MALLOCX_ARENA(a) is ((int)(a) + 1) << 20: from arena 2047 on that shifts into the
       sign bit, undefined behaviour.  The same flags, computed unsigned (and MALLOCX_TCACHE alike). */
    #define ARENALIB_MALLOCX_ARENA(a) ((int)(((unsigned)(a) + 1u) << 20))
    #define ARENALIB_MALLOCX_TCACHE(tc) ((int)(((unsigned)(tc) + 2u) << 8))
    """
    int MALLOCX_ARENA "ARENALIB_MALLOCX_ARENA"(unsigned a) noexcept nogil
    int MALLOCX_TCACHE "ARENALIB_MALLOCX_TCACHE"(unsigned tc) noexcept nogil
