"""Test helpers: traces with synthetic device rows, in the layout the profiler
integration writes (pid = device index, tid = stream, args "device", "stream",
"correlation", "External id", and the emulator's "operator", "kind",
"fused_members", "queued_us"; ac2g flows from each launching operator).

`TraceBuilder` writes a trace event by event, so a test knows every figure by
hand. `add_synthetic_device_rows` adds made-up device tasks to a real host
trace (one per operator that would launch one); its timing is a simple queue
model, not the device's, and the trace is marked as synthetic so the report
says so."""
from __future__ import annotations

import copy

DEVICE_TYPE_NEURON = 20  # c10::DeviceType::PrivateUse1

# Operators that only change metadata: they launch no task.
METADATA_OPS = {
    "aten::view", "aten::t", "aten::transpose", "aten::as_strided", "aten::expand", "aten::reshape",
    "aten::permute", "aten::unsqueeze", "aten::squeeze", "aten::slice", "aten::select", "aten::alias",
    "aten::detach", "detach", "aten::empty", "aten::empty_strided", "aten::resize_", "aten::lift_fresh",
    "aten::_unsafe_view", "aten::numpy_T", "aten::contiguous", "aten::result_type", "aten::is_nonzero",
}
# Element-wise operators the generator merges into fused tasks when they follow each other.
# Copies: a copy task each (direction unknown from the host side).
COPY_OPS = {"aten::copy_", "aten::_copy_from"}
ELEMENTWISE_OPS = {"aten::add", "aten::add_", "aten::mul", "aten::mul_", "aten::sub", "aten::div",
                   "aten::relu", "aten::threshold_backward", "aten::gelu", "aten::tanh", "aten::sigmoid"}
SYNC_READS = {"aten::_local_scalar_dense"}


class TraceBuilder:
    """A chrome trace built event by event: host ranges on (host pid, tid), device
    tasks on (pid = device, tid = stream), flows, memory events."""

    def __init__(self, host_pid=4242, host_tid=4242):
        self.host_pid, self.host_tid = host_pid, host_tid
        self.events = [{"ph": "M", "name": "process_name", "pid": host_pid, "tid": 0, "ts": 0,
                        "args": {"name": "python"}},
                       {"ph": "M", "name": "thread_name", "pid": host_pid, "tid": host_tid, "ts": 0,
                        "args": {"name": f"thread {host_tid} (python)"}}]
        self.next_ext_id, self.next_corr = 1, 1
        self.extra = {}
        self.devices = set()

    def op(self, name, ts, dur, *, tid=None, cat="cpu_op"):
        """A host operator (or annotation); returns its External id."""
        ext = self.next_ext_id
        self.next_ext_id += 1
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": self.host_pid,
                            "tid": tid or self.host_tid, "ts": ts, "dur": dur, "args": {"External id": ext}})
        return ext

    def python(self, name, ts, dur, *, tid=None, py_id=None, parent_id=None):
        """A Python frame, named as the profiler names them: "file.py(line): function";
        with py_id, the profiler's "Python id" and "Python parent id" too."""
        args = {} if py_id is None else {"Python id": py_id, "Python parent id": parent_id}
        self.events.append({"ph": "X", "cat": "python_function", "name": name, "pid": self.host_pid,
                            "tid": tid or self.host_tid, "ts": ts, "dur": dur, "args": args})

    def task(self, name, ts, dur, *, ext_id, launch_ts=None, device=0, stream=0, kind="op", operator=None,
             fused_members=None, queued=None, cat="kernel", with_ext_id=True, tid=None):
        """A device task launched by the operator with External id ext_id; launch_ts is
        where its flow starts on the host thread."""
        corr = self.next_corr
        self.next_corr += 1
        args = {"device": device, "stream": stream, "correlation": corr, "kind": kind}
        if with_ext_id:
            args["External id"] = ext_id
        if operator is not None:
            args["operator"] = operator
        if fused_members is not None:
            args["fused_members"] = list(fused_members)
        if queued is not None:
            args["queued_us"] = queued
        if device not in self.devices:
            self.devices.add(device)
            self.events.append({"ph": "M", "name": "process_name", "pid": device, "tid": 0, "ts": 0,
                                "args": {"name": f"neuron:{device}"}})
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": device, "tid": stream,
                            "ts": ts, "dur": dur, "args": args})
        if launch_ts is not None:
            self.events.append({"ph": "s", "id": corr, "pid": self.host_pid, "tid": tid or self.host_tid,
                                "ts": launch_ts, "cat": "ac2g", "name": "ac2g"})
            self.events.append({"ph": "f", "id": corr, "pid": device, "tid": stream, "ts": ts,
                                "cat": "ac2g", "name": "ac2g", "bp": "e"})
        return corr

    def memory(self, ts, nbytes, *, allocated, reserved, addr, device=0, device_type=DEVICE_TYPE_NEURON, tid=None):
        self.events.append({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]",
                            "pid": self.host_pid, "tid": tid or self.host_tid, "ts": ts,
                            "args": {"Total Reserved": reserved, "Total Allocated": allocated, "Bytes": nbytes,
                                     "Device Id": device, "Device Type": device_type, "Addr": addr}})

    def trace(self):
        return {"schemaVersion": 1, "deviceProperties": [], "traceEvents": list(self.events), **self.extra}


def handmade():
    """A trace whose figures the tests work out by hand: one host thread, one
    core, one stream; times in us.

    host:   train.py:<module> [0,100] > train_step [0,62] > aten::mm [0,10], aten::add [12,16],
            <built-in method item> [19.5,60.5] > aten::item [20,60] > aten::_local_scalar_dense [21,59];
            log_metrics [61,69]; aten::mul [70,75]
    device: mm [5,25] (queued 2), fused add+relu [25,40] (queued 13), Memcpy DtoH [41,42] (queued 21),
            mul [80,90] (queued 71)
    memory (neuron:0): +1000 at 1 (in mm), +500 at 13 (in add), -1000 at 30, +800 at 71 (in mul);
            reserved 2048, then 4096 at 71
    """
    b = TraceBuilder()
    b.python("train.py(1): <module>", 0, 100)
    b.python("train.py(30): train_step", 0, 62)
    mm = b.op("aten::mm", 0, 10)
    add = b.op("aten::add", 12, 4)
    b.python("<built-in method item of Tensor object at 0x7f0000>", 19.5, 41)
    b.op("aten::item", 20, 40)
    lsd = b.op("aten::_local_scalar_dense", 21, 38)
    b.python("train.py(50): log_metrics", 61, 8)
    mul = b.op("aten::mul", 70, 5)
    b.task("mm", 5, 20, ext_id=mm, launch_ts=2, queued=2, operator="aten::mm")
    b.task("fused_add_relu", 25, 15, ext_id=add, launch_ts=13, queued=13, kind="fused", operator="aten::add",
           fused_members=["aten::add", "aten::relu"])
    b.task("Memcpy DtoH (neuron -> host)", 41, 1, ext_id=lsd, launch_ts=21.5, queued=21, kind="copy",
           cat="gpu_memcpy", operator="aten::_local_scalar_dense")
    b.task("mul", 80, 10, ext_id=mul, launch_ts=71, queued=71, operator="aten::mul")
    b.memory(1, 1000, allocated=1000, reserved=2048, addr=1)
    b.memory(13, 500, allocated=1500, reserved=2048, addr=2)
    b.memory(30, -1000, allocated=500, reserved=2048, addr=1)
    b.memory(71, 800, allocated=1300, reserved=4096, addr=3)
    return b.trace()


def _numel(dims):
    n = 1
    for d in dims or []:
        if isinstance(d, int):
            n *= max(d, 1)
    return n


def add_synthetic_device_rows(trace: dict, *, device=0, stream=0, us_per_element=0.002, min_task_us=2.0) -> dict:
    """A copy of a real host trace with made-up device tasks: one per operator that
    would launch one (innermost operators that are not metadata-only), queued when
    the operator starts, run in launch order on one stream for a time proportional
    to its first input's size. Consecutive element-wise operators become one fused
    task; each `.item()` read becomes a device-to-host copy, each copy_ a copy task.
    Device allocations follow each task's output, freed three tasks later."""
    out = copy.deepcopy(trace)
    events = out["traceEvents"]
    ops = [e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    by_thread = {}
    for e in ops:
        by_thread.setdefault((e["pid"], e["tid"]), []).append(e)
    leaves = []
    for evs in by_thread.values():
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
        for i, e in enumerate(evs):
            end = e["ts"] + e["dur"]
            has_child = i + 1 < len(evs) and evs[i + 1]["ts"] < end
            if not has_child and e["name"] not in METADATA_OPS:
                leaves.append(e)
    leaves.sort(key=lambda e: e["ts"])
    host = ops[0] if ops else {"pid": 1, "tid": 1}
    events.append({"ph": "M", "name": "process_name", "pid": device, "tid": 0, "ts": 0,
                   "args": {"name": f"neuron:{device}"}})
    events.append({"ph": "M", "name": "thread_name", "pid": device, "tid": stream, "ts": 0,
                   "args": {"name": f"stream {stream}"}})
    free_at, corr, allocated, reserved, live = 0.0, 10_000, 0, 0, []
    group = []

    def emit(members, kind, name, dur, dtoh=False):
        nonlocal free_at, corr, allocated, reserved
        first = members[0]
        queued = first["ts"] + min(first["dur"] * 0.5, 5.0)
        start = max(queued + 1.0, free_at)
        free_at = start + dur
        corr += 1
        args = {"device": device, "stream": stream, "correlation": corr,
                "External id": first["args"].get("External id"), "operator": first["name"],
                "kind": kind, "queued_us": queued}
        if kind == "fused":
            args["fused_members"] = [m["name"] for m in members]
        events.append({"ph": "X", "cat": "gpu_memcpy" if dtoh else "kernel", "name": name, "pid": device,
                       "tid": stream, "ts": start, "dur": dur, "args": args})
        events.append({"ph": "s", "id": corr, "pid": first["pid"], "tid": first["tid"], "ts": queued,
                       "cat": "ac2g", "name": "ac2g"})
        events.append({"ph": "f", "id": corr, "pid": device, "tid": stream, "ts": start,
                       "cat": "ac2g", "name": "ac2g", "bp": "e"})
        nbytes = 4 * _numel((first["args"].get("Input Dims") or [[1]])[0])
        allocated += nbytes
        reserved = max(reserved, -(-allocated // (1 << 16)) * (1 << 16))
        events.append({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": first["pid"],
                       "tid": first["tid"], "ts": queued,
                       "args": {"Total Reserved": reserved, "Total Allocated": allocated, "Bytes": nbytes,
                                "Device Id": device, "Device Type": DEVICE_TYPE_NEURON, "Addr": corr * 4096}})
        live.append((corr * 4096, nbytes))
        if len(live) > 3:
            addr, size = live.pop(0)
            allocated -= size
            events.append({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]",
                           "pid": first["pid"], "tid": first["tid"], "ts": queued + 0.5,
                           "args": {"Total Reserved": reserved, "Total Allocated": allocated, "Bytes": -size,
                                    "Device Id": device, "Device Type": DEVICE_TYPE_NEURON, "Addr": addr}})

    def task_us(e):
        return max(min_task_us, us_per_element * _numel((e["args"].get("Input Dims") or [[1]])[0]))

    def flush():
        if group:
            if len(group) == 1:
                emit(group, "op", group[0]["name"].replace("aten::", ""), task_us(group[0]))
            else:
                emit(group, "fused", "fused_" + "_".join(m["name"].replace("aten::", "") for m in group),
                     max(task_us(m) for m in group))
            group.clear()

    for e in leaves:
        if e["name"] in ELEMENTWISE_OPS and (not group or group[-1]["tid"] == e["tid"]):
            group.append(e)
            continue
        flush()
        if e["name"] in SYNC_READS:
            emit([e], "copy", "Memcpy DtoH (neuron -> host)", 1.0, dtoh=True)
        elif e["name"] in COPY_OPS:
            emit([e], "copy", "Memcpy (synthetic)", task_us(e), dtoh=True)
        else:
            emit([e], "op", e["name"].replace("aten::", ""), task_us(e))
    flush()
    out["neuronExplorerSyntheticDeviceRows"] = True
    return out


NKI_SOURCE = """@nki.jit
def scaled_add(a, b):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    x = nl.load(a)
    y = nl.load(b)
    z = nl.multiply(x, 2.0)
    nl.store(out, value=z + y)
    return out
"""


def synthetic_nki_kernel():
    """A made-up instruction trace of a small kernel, in the "neuronNkiKernels" layout:
    two loads (DMA), a multiply (Scalar), an add (Vector), a store (DMA)."""
    ins = [("DMA", "load a", 0, 400, 4), ("DMA", "load b", 100, 500, 5), ("Scalar", "multiply", 400, 700, 6),
           ("Vector", "tensor_tensor add", 700, 900, 7), ("DMA", "store out", 900, 1300, 7)]
    return {
        "kernel": "scaled_add", "source": NKI_SOURCE,
        "instructions": [{"engine": e, "name": n, "start_ns": s, "end_ns": t, "line": f"kernels.py:{line}"}
                         for e, n, s, t, line in ins],
        "occupancy": [{"t_ns": 0, "sbuf_bytes": 0, "psum_bytes": 0}, {"t_ns": 400, "sbuf_bytes": 65536, "psum_bytes": 0},
                      {"t_ns": 500, "sbuf_bytes": 131072, "psum_bytes": 0},
                      {"t_ns": 700, "sbuf_bytes": 196608, "psum_bytes": 2048},
                      {"t_ns": 1300, "sbuf_bytes": 0, "psum_bytes": 0}],
        "sbuf_capacity": 24 * 1024 * 1024, "psum_capacity": 2 * 1024 * 1024,
    }
