/* What arenalib's NumPy data-memory handler (arenalib/_numpy.pxi) needs below Cython: NEP 49's
   handler struct, the header in front of every block the handler hands out, the NumPy C API it
   found at run time, and the live counter of live_objects().

   C, not Cython: the structs are NumPy's own layout (numpy/ndarraytypes.h, version 1), declared
   here so that arenalib builds without NumPy's headers; the C API is published once with a
   compare-and-swap (two threads may load it at once on a free-threaded build).  Included by
   arenalib/_numpy.pxi only, into the one translation unit of arenalib._arena. */

#ifndef ARENALIB_SRC_NUMPY_H
#define ARENALIB_SRC_NUMPY_H

#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#include "arenalib/platform.h"  /* ARENALIB_FREE_THREADED */

/* NEP 49: PyDataMemAllocator and PyDataMem_Handler of numpy/ndarraytypes.h (NumPy >= 1.22, the
   layout of version 1, which NumPy only ever extends at the end). */
typedef struct {
    void *ctx;
    void *(*malloc)(void *ctx, size_t size);
    void *(*calloc)(void *ctx, size_t nelem, size_t elsize);
    void *(*realloc)(void *ctx, void *ptr, size_t new_size);
    void (*free)(void *ctx, void *ptr, size_t size);
} arenalib_np_allocator;

typedef struct {
    char name[127];
    uint8_t version;
    arenalib_np_allocator allocator;
} arenalib_np_handler;

/* In front of every block the handler hands out, arena or fallback, but the big arena ones
   (src/numpy_large.h): the size NumPy asked for (NumPy's free passes a size of its own, which may
   differ) and which allocator the block is from.  16 bytes keep the data as aligned as malloc's
   (16 on x86-64). */
typedef struct {
    size_t size;
    size_t tag;
} arenalib_np_header;

#define ARENALIB_NP_HEADER ((size_t)sizeof(arenalib_np_header))
/* Tags: "ARNANPYA" (the arena's), "ARNANPYD" (NumPy's default handler's, after a close). */
#define ARENALIB_NP_TAG_ARENA ((size_t)0x41524E414E505941ULL)
#define ARENALIB_NP_TAG_DEFAULT ((size_t)0x41524E414E505944ULL)

static inline arenalib_np_header *arenalib_np_header_of(void *data) {
    return (arenalib_np_header *)((char *)data - ARENALIB_NP_HEADER);
}

/* The NumPy C API arenalib calls, from the table of the capsule _ARRAY_API: published once. */
typedef struct {
    PyObject *(*set_handler)(PyObject *);   /* PyDataMem_SetHandler, [304] */
    PyObject *(*get_handler)(void);         /* PyDataMem_GetHandler, [305] */
    PyObject *default_capsule;              /* PyDataMem_DefaultHandler, [306] (a reference) */
    arenalib_np_handler *default_handler;   /* what it points to */
    int thp_madvise;                        /* the kernel's THP mode is "madvise" */
    size_t big_lead;                        /* 16 or 64: src/numpy_large.h */
} arenalib_np_api;

static arenalib_np_api *arenalib_np_api_ptr;

static inline arenalib_np_api *arenalib_np_api_get(void) {
    return __atomic_load_n(&arenalib_np_api_ptr, __ATOMIC_ACQUIRE);
}

/* Publish ``api`` unless another thread did first; the one published either way. */
static inline arenalib_np_api *arenalib_np_api_publish(arenalib_np_api *api) {
    arenalib_np_api *expected = NULL;
    if (__atomic_compare_exchange_n(&arenalib_np_api_ptr, &expected, api, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE))
        return api;
    return expected;
}

/* Entries of NumPy's C-API table, as numpy/__multiarray_api.h numbers them (the same from NumPy
   1.22 to 2.4: numpy/_core/code_generators/numpy_api.py). */
#define ARENALIB_NP_GET_ABI_VERSION 0       /* PyArray_GetNDArrayCVersion */
#define ARENALIB_NP_GET_FEATURE_VERSION 211 /* PyArray_GetNDArrayCFeatureVersion */
#define ARENALIB_NP_SET_HANDLER 304
#define ARENALIB_NP_GET_HANDLER 305
#define ARENALIB_NP_DEFAULT_HANDLER 306

static inline unsigned int arenalib_np_call_version(void **table, int index) {
    return ((unsigned int (*)(void))table[index])();
}

/* Huge pages for big arrays, as NumPy's default handler asks for them (its indicate_hugepages():
   MADV_HUGEPAGE, unless np._core.multiarray._set_madvise_hugepage(False)).  Where the kernel's THP
   mode is "madvise", an array's pages are advised before their first touch and the advice taken
   back (MADV_NOHUGEPAGE) when the block goes back, so that the arena's later users of those
   addresses do not get 2 MiB pages for small blocks.  The pages wholly inside the block only: a
   large jemalloc block has its pages to itself.
   From 2 MiB, where NumPy's handler starts at 4 MiB: NumPy's data starts 16 bytes into glibc's
   block, so only from 4 MiB is a whole 2 MiB page sure to lie inside it; an arena block advised
   huge starts on one (ARENALIB_NP_HUGE_ALIGN), so a 2 MiB array is one huge page.  At 2-4 MiB the
   loop c = a*b + a took 1.03-1.05x NumPy's default handler's time with 4 KiB pages and 0.97-0.99x
   advised (A/B, 2 and 3 MiB and 3.5 MB, 2 runs each, 2026-12-06); under 2 MiB no huge page fits. */
#define ARENALIB_NP_HUGE_MIN ((size_t)1 << 21)
#define ARENALIB_NP_HUGE_ALIGN ((size_t)1 << 21)  /* x86-64's huge page */

static inline void arenalib_np_advise(void *block, size_t size, int huge) {
    uintptr_t start = ((uintptr_t)block + 4095) & ~(uintptr_t)4095;
    uintptr_t end = ((uintptr_t)block + size) & ~(uintptr_t)4095;
    if (end > start)
        (void)madvise((void *)start, end - start, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
}

/* Arena-backed NumPy buffers alive, for live_objects() (sharded as the segments' counter is:
   every array made and dropped counts). */
#if ARENALIB_FREE_THREADED
static arenalib_shard arenalib_live_numpy[ARENALIB_SHARDS];
#else
static arenalib_shard arenalib_live_numpy[1];
#endif

#endif  /* ARENALIB_SRC_NUMPY_H */
