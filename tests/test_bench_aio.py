"""bench/aio.py at a small scale, in a child process: both server protocols receive every frame on
each event loop that runs here (the server checks the count and bytes of each connection), and
run.py reports its tables and targets."""

from __future__ import annotations

import json
from pathlib import Path

from support import assert_ok, run_python, tooling_only

pytestmark = tooling_only

BENCH = Path(__file__).resolve().parent.parent / "bench"

SMALL_RUN = f"""
    import json, sys
    sys.path.insert(0, {str(BENCH)!r})
    import aio
    import _report
    import run as runner
    from _common import Config, QuietProgress

    aio.SETTINGS["quick"] = {{"rounds": 2, "frames": {{1 << 20: 8, 64 << 20: 1}}}}
    res = aio.run(Config.quick(), QuietProgress())
    print(json.dumps({{"res": res, "tables": aio.tables(res),
                      "targets_text": _report.targets_text(runner.targets({{"aio": res}}))}}))
"""


def test_aio_experiment_receives_every_frame_and_reports():
    out = json.loads(assert_ok(run_python(SMALL_RUN)).splitlines()[-1])
    res = out["res"]
    assert "asyncio" in res["cells"] and "asyncio" not in res["skipped"]
    assert set(res["cells"]) | set(res["skipped"]) == {"asyncio", "uvloop"}
    for by_size in res["cells"].values():
        assert set(by_size) == {str(1 << 20), str(64 << 20)}
        for cells in by_size.values():
            for kind in ("framereader", "bytearray"):
                assert len(cells[kind]["per_round"]["gb_per_s"]) == 2
                assert cells[kind]["gb_per_s"]["median"] > 0
            assert cells["ratios"]["throughput"]["median"] > 0
    text = out["targets_text"]
    assert text.count("aio: FrameReader over bytearray(n) per frame, asyncio loop") == 3
    assert "not measured" not in text
    assert "FrameReader (arena), seg.free(deferred=True)" in out["tables"]
