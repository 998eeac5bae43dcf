# Private declarations of the vendored jemalloc (symbol prefix arenalib_je_).  Not part of the public
# cimport API: no public .pxd names a jemalloc type or function.

cdef extern from "jemalloc.h" nogil:
    void* je_mallocx(size_t size, int flags)
    void je_sdallocx(void* ptr, size_t size, int flags)
    void je_dallocx(void* ptr, int flags)
    size_t je_sallocx(const void* ptr, int flags)
    int je_mallctl(const char* name, void* oldp, size_t* oldlenp, void* newp, size_t newlen)
    int je_mallctlnametomib(const char* name, size_t* mibp, size_t* miblenp)
    int je_mallctlbymib(const size_t* mib, size_t miblen, void* oldp, size_t* oldlenp,
                        void* newp, size_t newlen)
    const char* JEMALLOC_VERSION

    int MALLOCX_LG_ALIGN(unsigned la)
    int MALLOCX_ZERO
    int MALLOCX_TCACHE(unsigned tc)
    int MALLOCX_TCACHE_NONE
    int MALLOCX_ARENA(unsigned a)
