"""bench/bufring.py at a small scale, in a child process: every server (Ring with and without
RingFrameReader, selectors, asyncio) receives every byte its client sends, the per-completion loops
of Python and C both run, and run.py reports the tables and targets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import assert_ok, run_python, tooling_only

import arenalib

pytestmark = tooling_only

BENCH = Path(__file__).resolve().parent.parent / "bench"

SMALL_RUN = f"""
    import json, sys
    sys.path.insert(0, {str(BENCH)!r})
    import bufring
    import _report
    import run as runner
    from _common import Config, QuietProgress

    bufring.SETTINGS["quick"] = {{"mem_rounds": 1, "tp_rounds": 2, "oh_rounds": 2, "oh_messages": 300}}
    bufring.MEM_CONNECTIONS = 300
    bufring.TP_BYTES = 4 << 20
    res = bufring.run(Config.quick(), QuietProgress())
    print(json.dumps({{"res": res, "tables": bufring.tables(res),
                      "targets_text": _report.targets_text(runner.targets({{"bufring": res}}))}}))
"""


def test_bufring_experiment_receives_every_byte_and_reports():
    try:
        with arenalib.BufferPool(64, 1) as pool, arenalib.Ring(2) as ring:
            ring.provide(pool, 0)
    except OSError as exc:
        pytest.skip(f"provided-buffer rings are not available here: {exc}")
    out = json.loads(assert_ok(run_python(SMALL_RUN)).splitlines()[-1])
    res = out["res"]
    assert res["memory"]["connections"] == 300
    for cells in res["memory"]["cells"].values():
        assert cells[0]["bytes"] == 300 * ((32 << 10) + 8)
    for size, cell in res["throughput"].items():
        for kind, cells in cell["cells"].items():
            assert len(cells) == 2
            assert all(c["bytes"] == 16 * cell["per_conn"] * (int(size) + 8) for c in cells), kind
        # the Ring servers' pools: the selectors server's buffer memory, and the memory experiment's
        assert [c["buffers"] for c in cell["cells"]["ring"]] == [16, 16]
        assert [c["buffers"] for c in cell["cells"]["ring_frames"]] == [16, 16]
        assert [c["buffers"] for c in cell["cells"]["ring_pool64"]] == [64, 64]
    assert res["memory"]["cells"]["ring"][0]["buffers"] == 64
    assert set(res["overhead"]) == {"64", "1000", "4096"}
    assert all(c["c_ns"]["median"] > 0 and c["python_ns"]["median"] > 0 for c in res["overhead"].values())
    assert "RSS growth MiB" in out["tables"] and "Python CPU" in out["tables"]
    assert "ns of CPU per completion over C" in out["targets_text"]
