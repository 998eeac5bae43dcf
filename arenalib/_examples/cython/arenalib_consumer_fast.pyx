# cython: language_level=3, boundscheck=False, wraparound=False, freethreading_compatible=True
"""The example consumer with arenalib's inline fast paths compiled in (``cimport arenalib.fast``):
the same source as arenalib_consumer.pyx, rebuilt against every arenalib version."""

from libc.stdint cimport uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy, memset

from arenalib.fast cimport (
    ARENA_EBUSY, ARENA_KIND_CONFINED, ARENA_OK, ArenaCore, ArenaMark, arena_allocate, arena_close,
    arena_core, arena_core_init, arena_free, arena_mark, arena_open, arena_raise, arena_rewind,
)

include "consumer_body.pxi"
