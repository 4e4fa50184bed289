"""The explorer's analysis (torchneuron/explorer/analysis.py) against traces whose
figures are worked out by hand in the comments, a real CPU-only trace, and a real
host trace with synthetic device rows."""
import json

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from synthetic_device_rows import TraceBuilder, add_synthetic_device_rows, handmade, synthetic_nki_kernel
from torchneuron.explorer import analysis, analyze, render_html


def test_busy_and_idle_by_cause():
    s = analyze(handmade())["summary"]
    # Window: first operator start (0) to last task end (90).
    assert s["window_us"] == 90
    (core,) = s["cores"]
    # Busy: [5,40] + [41,42] + [80,90] = 46; idle [0,5], [40,41], [42,80] = 44.
    assert core["busy_us"] == 46 and core["idle_us"] == 44
    # Queued, not started: [2,5] + [40,41] + [71,80] = 13. Waiting in .item() [20,60]: [42,60] = 18.
    # Host in an operator: [0,2] (mm) + [70,71] (mul) = 3. Empty queue: [60,70] = 10.
    assert core["idle"] == {"queued": 13, "sync": 18, "host_bound": 3, "empty_queue": 10}
    assert s["idle_share"]["sync"] == pytest.approx(18 / 44)


def test_sync_sites_and_empty_queue_frames():
    s = analyze(handmade())["summary"]
    (site,) = s["sync_sites"]  # aten::_local_scalar_dense is inside aten::item: one call
    assert site["label"] == ".item()" and site["op"] == "aten::item"
    assert site["frame_label"] == "train_step (train.py:30)"
    assert site["calls"] == 1 and site["idle_us"] == 18 and site["host_us"] == 40
    # The empty-queue gap [60,70] is spent in log_metrics.
    assert s["empty_queue_frames"] == [["log_metrics (train.py:50)", 10]]
    # Host-bound idle by the operator the host was running: mm [0,2], mul [70,71].
    assert dict(s["host_bound_ops"]) == {"aten::mm": 2, "aten::mul": 1}


def test_overlap():
    ov = analyze(handmade())["summary"]["overlap"]
    # Host issuing = top-level operators minus the wait: [0,10] + [12,16] + [70,75] = 19.
    # Device busy [5,40] + [41,42] + [80,90] = 46; both: [5,10] + [12,16] = 9.
    assert ov["host_active_us"] == 19 and ov["device_busy_us"] == 46 and ov["overlap_us"] == 9
    assert ov["share_of_device_busy"] == pytest.approx(9 / 46)


def test_device_time_by_operator_and_kind():
    a = analyze(handmade())
    s = a["summary"]
    top = [(r["name"], r["device_us"], r["tasks"]) for r in s["top_device_ops"]]
    assert top == [("aten::mm", 20, 1), ("aten::add", 15, 1), ("aten::mul", 10, 1), ("aten::_local_scalar_dense", 1, 1)]
    assert {k: v["us"] for k, v in s["kinds"].items()} == {"op": 30, "fused": 15, "compiled": 0, "nki": 0, "copy": 1}
    assert s["fused_groups"] == [{"members": ["aten::add", "aten::relu"], "us": 15, "tasks": 1}]
    ops = {r["name"]: r for r in a["operators"]}
    item = ops["aten::item"]
    # aten::item [20,60] holds aten::_local_scalar_dense [21,59]; the copy is launched by the inner call.
    assert item["calls"] == 1 and item["host_total_us"] == 40 and item["host_self_us"] == 2
    assert item["device_self_us"] == 0 and item["device_total_us"] == 1
    copy_task = next(i for i, t in enumerate(a["tasks"]) if a["strings"][t[4]] == "copy")
    assert item["tasks"] == [copy_task] and ops["aten::_local_scalar_dense"]["tasks"] == [copy_task]
    # Its call stack: innermost first, as "function (file:line)".
    (stack_id, count), = item["stacks"]
    frames = [a["strings"][f] for f in a["stacks"][stack_id]]
    assert count == 1 and frames == ["<built-in method item of Tensor object>", "train_step (train.py:30)",
                                     "<module> (train.py:1)"]


def test_memory_peak_fragmentation_and_links():
    a = analyze(handmade())
    (mem,) = [m for m in a["memory"] if m["label"] == "neuron:0"]
    assert mem["peak_allocated"] == 1500 and mem["peak_reserved"] == 4096
    assert mem["fragmentation"] == pytest.approx((4096 - 1500) / 4096)
    allocs = [(x["t"], x["end"], x["bytes"], a["strings"][a["ops"][x["op"]][3]]) for x in mem["allocations"]]
    assert allocs == [(1, 30, 1000, "aten::mm"), (13, None, 500, "aten::add"), (71, None, 800, "aten::mul")]
    # Each allocation's task is the one its operator launched.
    assert [a["strings"][a["tasks"][x["task"]][3]] for x in mem["allocations"]] == ["mm", "fused_add_relu", "mul"]


def test_recommendations_ranked_with_evidence():
    recs = analyze(handmade())["summary"]["recommendations"]
    # Scores: fragmentation 2596/4096; time findings over 90 us of device time: sync 18, queued 13,
    # empty queue 10; host-bound (3) and copies (1) fall under the 5% threshold.
    assert [r["kind"] for r in recs] == ["fragmentation", "sync", "queued", "empty_queue"]
    sync = recs[1]
    assert sync["title"] == "41% of device idle time is spent in `.item()` called from `train_step (train.py:30)`"
    assert sync["score"] == pytest.approx(18 / 90)
    assert "1 call(s) of aten::item" in sync["evidence"][0]
    assert "log_metrics (train.py:50)" in recs[3]["evidence"][1]
    assert [r["rank"] for r in recs] == [1, 2, 3, 4]


def test_two_cores_two_streams():
    b = TraceBuilder()
    op = b.op("aten::mm", 0, 1)
    b.task("a", 0, 10, ext_id=op, device=0, stream=0)
    b.task("b", 5, 10, ext_id=op, device=0, stream=1)
    b.task("c", 20, 10, ext_id=op, device=1, stream=0)
    a = analyze(b.trace())
    cores = {c["device"]: c for c in a["summary"]["cores"]}
    # Window [0,30]. Core 0: union of its streams [0,15]; core 1: [20,30].
    assert cores[0]["busy_us"] == 15 and cores[0]["idle_us"] == 15 and cores[0]["streams"] == [0, 1]
    assert cores[1]["busy_us"] == 10 and cores[1]["idle_us"] == 20
    assert [r["label"] for r in a["stream_rows"]] == ["neuron:0 stream 0", "neuron:0 stream 1", "neuron:1 stream 0"]
    assert a["summary"]["overlap"]["device_busy_us"] == 25


def test_task_linked_by_flow_when_it_has_no_external_id():
    b = TraceBuilder()
    mm = b.op("aten::mm", 0, 10)
    relu = b.op("aten::relu", 10, 10)
    # A runtime call inside relu carries relu's External id; the flow starts inside it.
    b.events.append({"ph": "X", "cat": "privateuse1_runtime", "name": "launch", "pid": b.host_pid,
                     "tid": b.host_tid, "ts": 12, "dur": 2, "args": {"External id": relu}})
    b.task("mm", 3, 5, ext_id=mm, launch_ts=4, with_ext_id=False)
    b.task("relu", 20, 5, ext_id=relu, launch_ts=13, with_ext_id=False)
    a = analyze(b.trace())
    launched_by = [a["strings"][a["ops"][t[5]][3]] for t in a["tasks"]]
    assert launched_by == ["aten::mm", "aten::relu"]


def test_only_calls_that_waited_count_as_waiting():
    b = TraceBuilder()
    mm = b.op("aten::mm", 0, 5)
    b.task("mm", 1, 20, ext_id=mm, queued=1)
    b.op("aten::item", 10, 12)   # mm in flight at 10, ends at 21 inside the call: waited
    b.op("aten::item", 30, 2)    # nothing in flight (a read of a CPU tensor): did not wait
    later = b.op("aten::add", 40, 2)
    b.task("add", 41, 9, ext_id=later, queued=41)
    s = analyze(b.trace())["summary"]
    (site,) = s["sync_sites"]
    assert site["calls"] == 2 and site["waited_calls"] == 1
    # Idle: [0,1], [21,41]. Waiting: [21,22]; the second read [30,32] is host-bound, as are [0,1] and [40,41].
    assert s["idle"] == {"queued": 0, "sync": 1, "host_bound": 4, "empty_queue": 16}


def test_frames_nest_by_python_ids_when_an_annotation_overlaps_them():
    # As the profiler writes a schedule's step: ProfilerStep#1 opens inside the frames of
    # prof.step() and outlives them; the operators after it run in train_step.
    b = TraceBuilder()
    b.python("train.py(1): <module>", 0, 100, py_id=1, parent_id=None)
    b.python("torch/profiler/profiler.py(1227): step", 0, 10, py_id=2, parent_id=1)
    b.op("ProfilerStep#1", 5, 90, cat="user_annotation")
    b.python("train.py(30): train_step", 12, 80, py_id=3, parent_id=1)
    b.op("aten::mm", 20, 5)
    a = analyze(b.trace())
    ops = {a["strings"][o[3]]: o for o in a["ops"]}
    frames = [a["strings"][f] for f in a["stacks"][ops["aten::mm"][6]]]
    assert frames == ["train_step (train.py:30)", "<module> (train.py:1)"]
    assert ops["aten::mm"][4] == 1  # lane: inside ProfilerStep#1
    # The annotation outlives step(): the innermost frame that contains all of it is <module>.
    assert [a["strings"][f] for f in a["stacks"][ops["ProfilerStep#1"][6]]] == ["<module> (train.py:1)"]


def test_enqueue_times_on_another_clock():
    b = TraceBuilder()
    op = b.op("aten::mm", 0, 10)
    base_ns = 1_790_000_000_000_000_000
    b.task("absolute", 20, 5, ext_id=op, queued=base_ns / 1000 + 12)  # Kineto's base time not taken off
    b.task("after its start", 30, 5, ext_id=op, queued=31)              # impossible: ignored
    b.task("on the clock", 40, 5, ext_id=op, queued=36)
    trace = {**b.trace(), "baseTimeNanoseconds": base_ns}
    assert [t[6] for t in analyze(trace)["tasks"]] == [12, None, 36]


def test_user_frames():
    assert analysis.is_user_frame("train.py(30): train_step")
    assert analysis.is_user_frame("/home/me/project/train.py(30): train_step")
    assert not analysis.is_user_frame("torch/nn/modules/module.py(1771): _call_impl")
    assert not analysis.is_user_frame("typing.py(359): inner")
    assert not analysis.is_user_frame("/usr/lib/python3.11/typing.py(359): inner")
    assert not analysis.is_user_frame("<built-in method item of Tensor object at 0x7f00>")
    assert not analysis.is_user_frame("<frozen importlib._bootstrap>(1165): _find_and_load")


def test_nki_reader_is_tolerant():
    trace = {"traceEvents": [], "neuronNkiKernels": [
        {"kernel": "k", "instructions": [
            {"engine": "Tensor", "name": "mm", "start_ns": 0, "end_ns": 100, "line": "k.py:3"},
            {"engine": "Tensor", "name": "mm", "start_ns": 50, "end_ns": 150},
            {"engine": "Vector", "name": "add", "start_ns": 200, "end_ns": 300, "line": "k.py:4"},
            {"engine": "Pool", "name": "new engine", "start_ns": 10, "end_ns": 20},
            {"engine": "DMA", "start_ns": "not a number"}, "not a dict"]},
        {"instructions": None}, 42]}
    k, empty = analyze(trace)["nki"]
    # Overlapping Tensor instructions count once: [0,150]; an unknown engine gets its own row.
    assert k["engine_busy_ns"]["Tensor"] == 150 and k["engine_busy_ns"]["Vector"] == 100
    assert k["engines"] == ["Tensor", "Vector", "Scalar", "GpSimd", "DMA", "Pool"]
    assert k["span_ns"] == 300 and len(k["instructions"]) == 4
    assert empty["kernel"] == "kernel" and empty["instructions"] == [] and empty["occupancy"] == []
    s = analyze({"traceEvents": [], "neuronNkiKernels": [synthetic_nki_kernel()]})["nki"][0]
    # DMA: loads [0,400] and [100,500] overlap (500), then the store [900,1300] (400).
    assert s["peak_sbuf"] == 196608 and s["peak_psum"] == 2048 and s["engine_busy_ns"]["DMA"] == 900


def test_cpu_only_trace_and_synthetic_rows_on_it(tmp_path):
    model = torch.nn.Linear(16, 16)
    x = torch.randn(4, 16)
    path = tmp_path / "cpu.json"
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, with_stack=True) as prof:
        model(x).relu().sum().item()
    prof.export_chrome_trace(str(path))
    raw = json.loads(path.read_text())
    a = analyze(str(path))
    s = a["summary"]
    assert not s["has_device_rows"] and s["cores"] == [] and a["tasks"] == []
    assert [r["kind"] for r in s["recommendations"]] == ["no_device_rows"]
    cpu_ops = [e for e in raw["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    assert sum(r["calls"] for r in a["operators"] if r["cat"] == "cpu_op") == len(cpu_ops)
    assert "aten::addmm" in {r["name"] for r in a["operators"]}
    assert "<html" in render_html(a)
    # The same host trace with synthetic device rows: every added task is analysed, on its stream.
    synthetic = add_synthetic_device_rows(raw)
    device_events = [e for e in synthetic["traceEvents"] if e.get("ph") == "X" and e.get("pid") == 0]
    b = analyze(synthetic)
    assert b["summary"]["synthetic_device_rows"] and len(b["tasks"]) == len(device_events) > 0
    assert all(t[5] >= 0 for t in b["tasks"])  # each linked to its launching operator
    assert b["summary"]["cores"][0]["busy_us"] == pytest.approx(
        analysis.total_length(analysis.merge_intervals([[e["ts"], e["ts"] + e["dur"]] for e in device_events])))


def test_embedded_json_cannot_close_the_script():
    from torchneuron.explorer.render import embedded_json
    text = embedded_json({"name": "</script><script>alert(1)</script>&"})
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text) == {"name": "</script><script>alert(1)</script>&"}
