"""A state machine of NumPy arrays over arenas (issue 28): arrays made in `arena.numpy()` scopes (and in
contexts saved inside them, as an asyncio task created in the block keeps one, run later and from other
threads), views, resizes, pickles, deletions from this and other threads, buffer exports of segments,
close / reset / deferred close attempts and the scopes' exits, against a model of which allocator each
data buffer came from.

The model says, at every step: an array's contents; how many buffers each arena serves (stats()'s
numpy_arrays) and how many allocations fell back to NumPy's default after its close (numpy_fallbacks);
that close() and reset() refuse exactly while a buffer or an export of the arena lives; that a closed
arena keeps its slot (closing_arenas) exactly until its last buffer and export are gone."""

from __future__ import annotations

import contextvars
import pickle
import threading

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from numpy._core.multiarray import get_handler_name

import arenalib
from arenalib import ArenaClosedError

DEFAULT = -1  # the source of a buffer NumPy's default handler made outside every scope
# int64 elements: any count to 70,000, and the edges the handler's layout turns on (a block of more
# than 128 KiB has no header: 16,385 elements) with sizes that are jemalloc size classes (powers of two).
SIZES = st.one_of(st.integers(0, 70_000), st.sampled_from([2048, 16383, 16384, 16385, 20480, 131072]))
# The most the handler keeps for reuse (GIL builds): 4 blocks in each of 65 buckets, 16 to 1040 bytes.
CACHE_BOUND = 4 * sum(16 * bucket + 16 for bucket in range(65))


class Buffer:
    """An array's own data: where it came from (an arena's index, or DEFAULT), fallback (made by NumPy's
    default handler through a closed arena's handler), and what it holds."""

    def __init__(self, array, source, fallback, expected):
        self.array, self.source, self.fallback, self.expected = array, source, fallback, expected


def in_thread(function, *args):
    """function(*args) called in a new thread; its result."""
    out = []
    t = threading.Thread(target=lambda: out.append(function(*args)))
    t.start()
    t.join()
    return out[0]


class NumpyScopesMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.closing_before = arenalib.live_objects()["closing_arenas"]
        self.arenas = []      # every arena made; the last one is the current
        self.closed = []      # parallel to arenas
        self.fallbacks = []   # parallel: allocations NumPy's default served through its handler
        self.scopes = []      # (scope, arena index), entered in this context, innermost last
        self.contexts = []    # (context saved in a scope, arena index)
        self.buffers = []     # Buffer of each owner array alive
        self.views = []       # (view, the Buffer it views)
        self.exports = []     # (memoryview of a segment, arena index, byte)
        self.new_arena()

    # -- arenas and scopes ------------------------------------------------------------------------

    @precondition(lambda self: self.closed[-1])
    @rule()
    def new_arena(self):
        self.arenas.append(arenalib.Arena())
        self.closed.append(False)
        self.fallbacks.append(0)

    @rule(data=st.data())
    def enter_scope(self, data):
        index = data.draw(st.integers(0, len(self.arenas) - 1))
        scope = self.arenas[index].numpy()
        if self.closed[index]:
            with pytest.raises(ArenaClosedError):
                scope.__enter__()
            return
        scope.__enter__()
        self.scopes.append((scope, index))

    @precondition(lambda self: self.scopes)
    @rule()
    def exit_scope(self):
        scope, _ = self.scopes.pop()
        scope.__exit__(None, None, None)

    @precondition(lambda self: self.scopes)
    @rule()
    def save_context(self):
        # What asyncio.create_task() does in the block: the task runs later in a copy of it.
        self.contexts.append((contextvars.copy_context(), self.scopes[-1][1]))

    def _source(self, index):
        """Where a buffer made now through arena ``index``'s handler (DEFAULT: none) comes from."""
        if index == DEFAULT:
            return DEFAULT, False
        if self.closed[index]:
            self.fallbacks[index] += 1
            return index, True
        return index, False

    # -- arrays ------------------------------------------------------------------------------------

    def _pick(self, data):
        """One of the buffers, drawn by index (hypothesis keeps what it draws: never an array)."""
        return self.buffers[data.draw(st.integers(0, len(self.buffers) - 1))]

    @rule(n=SIZES, value=st.integers(-100, 100), zeros=st.booleans(), data=st.data())
    def create(self, n, value, zeros, data):
        where = data.draw(st.sampled_from(["here", "saved", "saved, another thread"] if self.contexts
                                          else ["here"]))
        def make():
            # One allocation each (np.full would also make a 0-d array of the value: a second one).
            x = np.zeros(n, dtype=np.int64) if zeros else np.empty(n, dtype=np.int64)
            x.fill(value)
            return x

        if where == "here":
            index = self.scopes[-1][1] if self.scopes else DEFAULT
            array = make()
        else:
            context, index = self.contexts[data.draw(st.integers(0, len(self.contexts) - 1))]
            run = context.copy().run  # a context is entered by one thread at a time
            array = run(make) if where == "saved" else in_thread(run, make)
        source, fallback = self._source(index)
        expected = [value] * n
        self.buffers.append(Buffer(array, source, fallback, expected))

    @precondition(lambda self: self.buffers)
    @rule(data=st.data(), step=st.integers(1, 3))
    def view(self, data, step):
        buffer = self._pick(data)
        self.views.append((buffer.array[::step], buffer))

    @precondition(lambda self: self.buffers)
    @rule(data=st.data(), n=SIZES)
    def resize(self, data, n):
        buffer = self._pick(data)
        if any(b is buffer for _, b in self.views):
            return  # NumPy's refcheck would refuse, and without it the views would dangle
        reallocated = n != buffer.array.size  # (NumPy reallocates only for another byte count)
        buffer.array.resize(n, refcheck=False)
        if (reallocated and buffer.source != DEFAULT and not buffer.fallback
                and self.closed[buffer.source]):
            # Reallocated through a closed arena's handler: the bytes move to NumPy's default.
            self.fallbacks[buffer.source] += 1
            buffer.fallback = True
        buffer.expected = (buffer.expected + [0] * n)[:n]

    def _current_open(self):
        return not self.scopes or not self.closed[self.scopes[-1][1]]

    # (Through a closed arena's handler, unpickling makes NumPy allocate a number of times of its own.)
    @precondition(lambda self: self.buffers and self._current_open())
    @rule(data=st.data())
    def pickle_roundtrip(self, data):
        buffer = self._pick(data)
        loaded = pickle.loads(pickle.dumps(buffer.array))
        if loaded.flags.owndata:  # else NumPy made it a view of the pickle's bytes
            source, fallback = self._source(self.scopes[-1][1] if self.scopes else DEFAULT)
            self.buffers.append(Buffer(loaded, source, fallback, list(buffer.expected)))
        else:
            assert loaded.tolist() == buffer.expected

    @precondition(lambda self: self.buffers or self.views)
    @rule(data=st.data(), another_thread=st.booleans())
    def delete(self, data, another_thread):
        if self.views and (not self.buffers or data.draw(st.booleans())):
            dropped = [self.views.pop(data.draw(st.integers(0, len(self.views) - 1)))]
        else:
            dropped = [self.buffers.pop(data.draw(st.integers(0, len(self.buffers) - 1)))]
        if another_thread:  # the thread drops the last reference this machine held
            t = threading.Thread(target=dropped.clear)
            t.start()
            t.join()
        dropped.clear()

    # -- segments' exports -------------------------------------------------------------------------

    @precondition(lambda self: not self.closed[-1])
    @rule(byte=st.integers(0, 255))
    def export_segment(self, byte):
        seg = self.arenas[-1].allocate(100, zero=False).fill(byte)
        self.exports.append((memoryview(seg), len(self.arenas) - 1, byte))

    @precondition(lambda self: self.exports)
    @rule(data=st.data())
    def release_export(self, data):
        self.exports.pop(data.draw(st.integers(0, len(self.exports) - 1)))[0].release()

    # -- close and reset ---------------------------------------------------------------------------

    def _held(self, index):
        """Buffers and exports of arena ``index`` alive now (each holds its memory)."""
        alive = {id(b): b for b in self.buffers}
        alive.update({id(b): b for _, b in self.views})
        arrays = sum(1 for b in alive.values() if b.source == index and not b.fallback)
        return arrays, sum(1 for e in self.exports if e[1] == index)

    @precondition(lambda self: not self.closed[-1])
    @rule(reset=st.booleans())
    def close_or_reset(self, reset):
        arena = self.arenas[-1]
        arrays, exports = self._held(len(self.arenas) - 1)
        if arrays or exports:
            with pytest.raises(BufferError, match=f"{arrays} NumPy array" if arrays else "buffer export"):
                arena.reset() if reset else arena.close()
            return
        if reset:
            arena.reset()
        else:
            arena.close()
            self.closed[-1] = True

    @precondition(lambda self: not self.closed[-1])
    @rule()
    def close_deferred(self):
        self.arenas[-1].close(deferred=True)
        self.closed[-1] = True

    # -- what the model says -----------------------------------------------------------------------

    @invariant()
    def the_arrays_hold_their_values(self):
        previous = arenalib.set_numpy_handler(None)  # the checks' own temporaries: NumPy's default
        try:
            for buffer in self.buffers:
                assert buffer.array.tolist() == buffer.expected
                name = get_handler_name(buffer.array)
                assert name == ("default_allocator" if buffer.source == DEFAULT else "arenalib.Arena")
            for view, buffer in self.views:
                assert view.base is buffer.array
            for view, _, byte in self.exports:
                assert view.tobytes() == bytes([byte]) * 100
        finally:
            arenalib.set_numpy_handler(previous)

    @invariant()
    def the_arenas_count_what_the_model_counts(self):
        closing = 0
        for index, arena in enumerate(self.arenas):
            arrays, exports = self._held(index)
            stats = arena.stats()
            assert (stats["numpy_arrays"], stats["numpy_fallbacks"], stats["closed"]) == (
                arrays, self.fallbacks[index], self.closed[index])
            assert stats["exports"] == exports
            # The blocks the handler keeps for reuse are out of the live figures, never below them.
            assert 0 <= stats["numpy_cached_bytes"] <= CACHE_BOUND
            assert stats["live_bytes"] >= (0 if stats["closed"] else stats["numpy_bytes"])
            closing += self.closed[index] and (arrays + exports) > 0
        assert arenalib.live_objects()["closing_arenas"] == self.closing_before + closing

    def teardown(self):
        while self.scopes:
            self.scopes.pop()[0].__exit__(None, None, None)
        for view, _, _ in self.exports:
            view.release()
        self.buffers.clear()
        self.views.clear()
        self.contexts.clear()
        for arena in self.arenas:
            arena.close()
        assert arenalib.live_objects()["closing_arenas"] == self.closing_before
        assert get_handler_name() == "default_allocator"


NumpyScopesMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
test_numpy_scopes_machine = NumpyScopesMachine.TestCase
