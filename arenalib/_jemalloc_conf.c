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
 * lg_extent_max_active_fit:64  by default (6) jemalloc splits no dirty extent more than 64 times
 *                          the request, and it coalesces freed extents of 16 KiB and more at once:
 *                          a reset slot's dirty pages are one extent of the scope's size, which a
 *                          scope of blocks whose extent is under 1/64 of it never reuses (20 KiB
 *                          extents: 16 KiB blocks + a cache-oblivious page, 5120-byte slabs; 28 KiB
 *                          slabs of 3584).  Such a 16 MiB scope faulted in all 5,100 pages again at
 *                          every close while its old ones sat dirty (mapped +20 MiB a scope until
 *                          decay); 64 (jemalloc's cap for its muzzy and retained extents): 3 faults.
 *                          (The cap keeps long-lived heaps from splitting big extents for small
 *                          blocks; a slot's arena is reset as a whole at close, and what an open
 *                          arena frees decays within seconds.)
 */
#include "jemalloc.h"

const char *je_malloc_conf =
    "background_thread:false,dirty_decay_ms:1000,muzzy_decay_ms:0,tcache_max:131072,narenas:1,"
    "oversize_threshold:1073741824,lg_extent_max_active_fit:64";
