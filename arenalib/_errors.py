"""Exception classes of arenalib; each also derives from the builtin a caller would catch."""


class ArenaError(Exception):
    """Root of arenalib's own exceptions."""


class ArenaClosedError(ArenaError, ValueError):
    """The arena is closed, or the segment's memory was freed, reset or released (as closed files
    raise ValueError)."""


class WrongThreadError(ArenaError, RuntimeError):
    """A ConfinedArena or one of its segments was used from a thread other than its owner."""


class PoolExhaustedError(ArenaError):
    """BufferPool.acquire() found no free buffer."""


class UnsupportedOperation(ArenaError, TypeError):
    """The object does not support this operation (freeing a slice or a SlicingArena segment)."""
