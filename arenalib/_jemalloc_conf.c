/* Compiled-in options of arenalib's private jemalloc.  Users override them at run time with the
 * ARENALIB_JE_MALLOC_CONF environment variable (the prefixed jemalloc reads <PREFIX>MALLOC_CONF,
 * not MALLOC_CONF).
 *
 * background_thread:false  no thread starts when the extension is imported (a thread started at
 *                          import can hang or crash the interpreter there: the pyarrow arm64 failure
 *                          mode).  arenalib turns it on with the first arena, one thread, restarted
 *                          in a fork's child (_slots.pxi, _start_idle_decay), unless this variable
 *                          names background_thread itself.
 * dirty_decay_ms:1000      freed-but-warm pages of an open arena return to the OS after about a
 *                          second of allocation activity, as pyarrow chose; muzzy_decay_ms:0 skips
 *                          the lazy-purge stage, so "returned" shows up in RSS at once.
 * tcache_max:131072        64 KiB buffers (io_uring's usual size) stay in the thread caches; with the
 *                          default 32 KiB every such pair bypasses the cache (~150 ns instead of ~10).
 * narenas:1                arenalib allocates only from explicit arenas; one automatic arena is
 *                          enough for jemalloc's own bookkeeping (and BufferPool regions).
 * oversize_threshold:1G    by default (8 MiB) jemalloc purges a freed oversize extent at once, so
 *                          every 8 MiB allocate+fill+free paid fresh page faults: 3.5 ms, against
 *                          75 us with this setting (64 MiB: 30 ms -> 1.9 ms).  Arenas hand memory
 *                          back on close (purge) and through decay instead.
 */
#include "jemalloc.h"

const char *je_malloc_conf =
    "background_thread:false,dirty_decay_ms:1000,muzzy_decay_ms:0,tcache_max:131072,narenas:1,"
    "oversize_threshold:1073741824";
