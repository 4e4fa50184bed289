"""Holistic Trace Analysis (holistictraceanalysis) reads traces with device rows in
the layout the profiler integration writes, and its temporal breakdown agrees
with the explorer's figures."""
import json
import os

import pytest

from synthetic_device_rows import add_synthetic_device_rows, handmade
from torchneuron.explorer import analyze

hta = pytest.importorskip("hta.trace_analysis", reason="holistictraceanalysis is in requirements.txt")
# HTA sorts with pandas' deprecated inplace=True.
pytestmark = pytest.mark.filterwarnings("ignore:The inplace keyword")


def _breakdown(trace, directory):
    """HTA's temporal breakdown of one trace (rank 0), as a dict."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "rank0.json"), "w") as f:
        json.dump({**trace, "distributedInfo": {"rank": 0}}, f)
    analysis = hta.TraceAnalysis(trace_dir=str(directory), include_last_profiler_step=True)
    (row,) = analysis.get_temporal_breakdown(visualize=False).to_dict("records")
    return row


def test_temporal_breakdown_of_a_handmade_trace(tmp_path):
    row = _breakdown(handmade(), tmp_path)
    # HTA's kernel time runs from the first task's start (5) to the last one's end (90): 85; the
    # tasks cover 46 of it. Compute excludes memory kernels (its names start with Memcpy/Memset).
    assert row["kernel_time(us)"] == 85 and row["idle_time(us)"] == 85 - 46
    assert row["compute_time(us)"] == 20 + 15 + 10 and row["non_compute_time(us)"] == 1
    assert analyze(handmade())["summary"]["overlap"]["device_busy_us"] == 46


def test_temporal_breakdown_of_a_real_host_trace_with_synthetic_rows(known_trace, tmp_path):
    with open(known_trace) as f:
        trace = add_synthetic_device_rows(json.load(f))
    row = _breakdown(trace, tmp_path)
    busy = analyze(trace)["summary"]["overlap"]["device_busy_us"]
    # HTA reads timestamps as whole microseconds: one per task edge at most.
    tasks = sum(1 for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy"))
    assert row["kernel_time(us)"] - row["idle_time(us)"] == pytest.approx(busy, abs=2 * tasks)
    assert 0 < row["compute_time(us)"] <= row["kernel_time(us)"]
