"""Runs a program on one device and compares two runs.

A run executes the statements one by one in a fresh namespace and records,
per statement, whether it raised (and where: at the call, or at the
synchronisation after it when the profile synchronises after each statement),
the metadata of what it bound or wrote right after it (strides, storage
offset, dtype: no synchronisation needed), and at the end every name's
metadata, storage, `_base`, identity and value. The comparison with the CPU's
run is exact:

* values bit for bit (raw bits: NaN payloads and signed zeros count), except
  values that are undefined (the grown part of a resize_) and what is computed
  from them, which are not compared;
* dtypes, shapes, strides and storage offsets, at the statement and at the end;
* aliasing: which names share storage, which name is whose `_base`, which
  names are one object;
* exceptions: the same type at the same statement. An error the neuron run
  raises only at a later call or at a synchronisation is a mismatch (`error
  deferred`), except an error that depends on values (an index out of range)
  raised by the synchronisation right after its statement, as on CUDA.

The compiled path runs the program's statements as one function under
torch.compile(backend="neuron") against the CPU's eager run, floats within
COMPILED_TOLERANCE; where they differ beyond it, the CPU's Inductor decides
whether it is Inductor's own rounding (compiled on the CPU gives the same as
on neuron) or a mismatch.
"""
from __future__ import annotations

import contextlib
import math
import re
import warnings
from collections import Counter
from dataclasses import dataclass, field

import torch

import torchneuron

try:
    from ..neuron_testing import FusableFrom, queue_busy_work, raw_bits
except ImportError:  # pytest puts tests/ itself on sys.path: these are top-level modules there
    from neuron_testing import FusableFrom, queue_busy_work, raw_bits

from . import known_findings
from .generator import NAME, PROFILES, Program

DEVICE = "neuron"
# Compiled against eager, per floating dtype: (rtol, atol). Inductor fuses and
# reorders, computes half-precision types in float32 and rounds once, and uses
# its own vectorised math functions.
COMPILED_TOLERANCE = {torch.float16: (2e-2, 2e-2), torch.bfloat16: (1e-1, 1e-1), torch.float32: (1e-4, 1e-5),
                      torch.float64: (1e-9, 1e-12), torch.complex64: (1e-4, 1e-5)}
EXACT, UNCOMPARED = 0, 1  # how a value is compared


class _Stats(Counter):
    """What the comparisons covered, for the summaries: statements, raising statements, values
    compared bit for bit, not at all. Counted in the first neuron run of a program
    only (`counting`)."""

    counting = True

    def __setitem__(self, key, value):
        if self.counting:
            super().__setitem__(key, value)


stats = _Stats()


@dataclass
class Outcome:
    error: type | None = None
    message: str = ""
    at: str = ""               # "call" or "sync"


@dataclass
class Entry:
    """One name's tensor (or a Python value) as a run ends or as a statement leaves it."""
    is_tensor: bool
    dtype: object = None
    shape: tuple = ()
    stride: tuple = ()
    offset: int = 0
    conj: bool = False
    neg: bool = False
    storage: tuple = (0, 0)    # (data pointer, bytes)
    tensor: object = None      # the tensor itself (for `_base` and identity)
    value: object = None       # host copy of the values, or the Python value


@dataclass
class Run:
    outcomes: list = field(default_factory=list)
    created: dict = field(default_factory=dict)   # (statement, name) -> Entry, right after it
    final: dict = field(default_factory=dict)     # name -> Entry at the end
    final_error: Outcome | None = None            # raised by the last synchronisation
    compare_as: dict = field(default_factory=dict)  # name -> EXACT or UNCOMPARED (the CPU's run)


@dataclass
class Mismatch:
    kind: str                  # the class: "values", "strides", "exception type", "error deferred", ...
    where: str                 # a statement number or a name
    detail: str

    def __str__(self):
        return f"{self.kind} at {self.where}: {self.detail}"


def _entries(name, value):
    if isinstance(value, torch.Tensor):
        return [(name, value)]
    if isinstance(value, (tuple, list)) and value and all(isinstance(v, torch.Tensor) for v in value):
        return [(f"{name}[{i}]", v) for i, v in enumerate(value)]
    return [(name, value)]


def _meta(value) -> Entry:
    if not isinstance(value, torch.Tensor):
        return Entry(False, value=value)
    s = value.untyped_storage()
    return Entry(True, value.dtype, tuple(value.shape), tuple(value.stride()), value.storage_offset(),
                 value.is_conj(), value.is_neg(), (s.data_ptr(), s.nbytes()), value)


def _names(ns):
    return [n for n in ns if NAME.fullmatch(n)]


def _sync(device):
    if device != "cpu":
        torch.neuron.synchronize()


def _raised(device, e: BaseException) -> Outcome:
    """What a statement raised, as compared. Device errors are sticky (every later synchronising
    call raises them until reset_errors): once one is raised, it is cleared, so that later
    statements are compared on their own."""
    if device != "cpu":
        torch.neuron.reset_errors()
    return Outcome(type(e), _first_line(e))


def execute(program: Program, device: str, sync_each: bool = False) -> Run:
    """Runs `program` on `device` (its profile's setting, queued behind busy work for the fused path)."""
    run = Run()
    ns = {"torch": torch, "F": torch.nn.functional, "dev": device, "g": torch.Generator().manual_seed(program.seed)}
    fused = program.path == "fused" and device != "cpu"
    levels = {}  # the CPU's run: storage -> how its values are compared
    busy = fused
    with warnings.catch_warnings(), FusableFrom() if fused else contextlib.nullcontext():
        warnings.simplefilter("ignore")
        for i, st in enumerate(program.statements):
            if busy and st.kind != "input":
                queue_busy_work()
                busy = False
            out = Outcome()
            bound = set(ns)
            storages = _storages(st, ns) if device == "cpu" else {}
            try:
                exec(compile(st.code, f"<statement {i}>", "exec"), ns)
            except Exception as e:  # noqa: BLE001 - the exception is what is compared
                out = _raised(device, e)
                out.at = "call"
            if sync_each and out.error is None and device != "cpu":
                try:
                    _sync(device)
                except Exception as e:  # noqa: BLE001
                    out = _raised(device, e)
                    out.at = "sync"
                    for w in st.writes:  # a failed call binds nothing, as on the CPU
                        if w not in bound:
                            ns.pop(w, None)
            run.outcomes.append(out)
            for w in st.writes:
                if w in ns:
                    for n, v in _entries(w, ns[w]):
                        run.created[(i, n)] = _meta(v)
            if device == "cpu" and out.error is None:
                _follow_levels(st, ns, levels)
            if device == "cpu":
                _follow_growth(st, ns, storages, out.error is not None, levels)
        if device != "cpu":
            try:
                _sync(device)
            except Exception as e:  # noqa: BLE001
                run.final_error = _raised(device, e)
                run.final_error.at = "final synchronisation"
        for name in _names(ns):
            for n, v in _entries(name, ns[name]):
                e = _meta(v)
                if e.is_tensor:
                    try:
                        e.value = v.detach().cpu().resolve_conj().resolve_neg()
                    except Exception as ex:  # noqa: BLE001 - reading it failed: that is compared
                        _raised(device, ex)
                        e.value = ex
                run.final[n] = e
                if device == "cpu":
                    key = e.storage if e.is_tensor else ("name", name)
                    run.compare_as[n] = levels.get(key, levels.get(("name", name), EXACT))
    return run


def _first_line(e: BaseException) -> str:
    return (str(e).strip().split("\n") or [""])[0][:300]


def _storages(st, ns) -> dict:
    """The storages of what `st` writes, before it runs."""
    return {w: (ns[w].untyped_storage().data_ptr(), ns[w].untyped_storage().nbytes())
            for w in st.writes if isinstance(ns.get(w), torch.Tensor)}


def _follow_growth(st, ns, before, failed, levels):
    """A storage that `st` grew holds bytes nothing wrote: its values are not compared when the
    statement failed after growing it, or when other tensors view it (an out= that is a view
    grows its base's storage and writes only the view)."""
    for w, (ptr, nbytes) in before.items():
        t = ns.get(w)
        if not isinstance(t, torch.Tensor) or t.untyped_storage().nbytes() <= nbytes:
            continue
        shared = any(isinstance(v, torch.Tensor) and n != w and v.untyped_storage().data_ptr() in (
            ptr, t.untyped_storage().data_ptr()) for n, v in ns.items() if NAME.fullmatch(n))
        if failed or shared:
            levels[(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())] = UNCOMPARED


def _follow_levels(st, ns, levels):
    """How each storage's values are compared after `st` ran on the CPU: undefined values (the
    grown part of a resize_, uninitialised memory) and what is computed from them not at all."""
    level = EXACT
    for name in st.reads:
        for _, v in _entries(name, ns.get(name)):
            key = (v.untyped_storage().data_ptr(), v.untyped_storage().nbytes()) if isinstance(v, torch.Tensor) else ("name", name)
            level = max(level, UNCOMPARED if levels.get(key, EXACT) else EXACT)
    if st.uninitialised or re.search(r"\.resize_\(", st.code):
        level = UNCOMPARED
    if level == EXACT:
        return
    for w in st.writes:
        if w not in ns:
            continue
        for _, v in _entries(w, ns[w]):
            key = (v.untyped_storage().data_ptr(), v.untyped_storage().nbytes()) if isinstance(v, torch.Tensor) else ("name", w)
            levels[key] = max(levels.get(key, EXACT), level)


# ------------------------------------------------------------------------------------------- compare
def compare(program: Program, cpu: Run, dev: Run, sync_each: bool) -> list:
    found = _compare_outcomes(program, cpu, dev, sync_each)
    for key, c in cpu.created.items():
        d = dev.created.get(key)
        if d is not None:
            found += _compare_meta(c, d, f"statement {key[0]} ({key[1]})", program)
    final = _compare_final(cpu, dev, program)
    if found:  # names bound on one side only follow from an exception compared above
        final = [m for m in final if m.kind != "binding"]
    return found + final


def _compare_outcomes(program, cpu, dev, sync_each):
    found, pending = [], None  # pending: a CPU error the device did not raise at its call
    for i, (c, d) in enumerate(zip(cpu.outcomes, dev.outcomes)):
        st = program.statements[i]
        where = f"statement {i}"
        stats["statements"] += st.kind != "input"
        stats["statements raising on the CPU"] += c.error is not None
        if c.error and d.error:
            if d.at == "sync" and not (st.data_error and sync_each):
                found.append(Mismatch("error deferred", where, f"the CPU raises {c.error.__name__} at the call "
                                      f"({c.message}); neuron at the synchronisation after it ({d.error.__name__}: {d.message})"))
            elif d.at == "call" and c.error is not d.error:
                found.append(Mismatch("exception type", where, f"CPU {c.error.__name__} ({c.message}), "
                                      f"neuron {d.error.__name__} ({d.message})"))
        elif c.error:
            if pending is None:
                pending = (i, c)
        elif d.error:
            if pending is not None:
                j, pc = pending
                found.append(Mismatch("error deferred", f"statement {j}", f"the CPU raises {pc.error.__name__} at "
                                      f"the call ({pc.message}); neuron raises {d.error.__name__} only at statement {i} "
                                      f"({d.message})"))
                pending = None
            else:
                found.append(Mismatch("raises only on neuron", where, f"{d.error.__name__}: {d.message}"))
    if dev.final_error is not None:
        if pending is not None:
            j, pc = pending
            found.append(Mismatch("error deferred", f"statement {j}", f"the CPU raises {pc.error.__name__} at the "
                                  f"call ({pc.message}); neuron only at the final synchronisation "
                                  f"({dev.final_error.error.__name__}: {dev.final_error.message})"))
            pending = None
        else:
            found.append(Mismatch("raises only on neuron", "the final synchronisation",
                                  f"{dev.final_error.error.__name__}: {dev.final_error.message}"))
    if pending is not None:
        j, pc = pending
        found.append(Mismatch("raises only on cpu", f"statement {j}", f"{pc.error.__name__}: {pc.message}"))
    return found


def _compare_meta(c: Entry, d: Entry, where, program):
    if c.is_tensor != d.is_tensor:
        return [Mismatch("result type", where, f"CPU {type(c.value).__name__ if not c.is_tensor else 'tensor'}, "
                         f"neuron {type(d.value).__name__ if not d.is_tensor else 'tensor'}")]
    if not c.is_tensor:
        return []
    for kind, a, b in (("dtype", c.dtype, d.dtype), ("shape", c.shape, d.shape), ("strides", c.stride, d.stride),
                       ("storage offset", c.offset, d.offset), ("conjugate bit", c.conj, d.conj),
                       ("negative bit", c.neg, d.neg)):
        if a != b and not known_findings.tolerated(kind, c, d):
            return [Mismatch(kind, where, f"CPU {a}, neuron {b}" + (f" (shape {c.shape})" if kind != "shape" else ""))]
    return []


def _compare_values(c: Entry, d: Entry, level, where):
    if not c.is_tensor:
        if level == UNCOMPARED:
            return []
        return [] if _same_python(c.value, d.value) else [
            Mismatch("python value", where, f"CPU {c.value!r}, neuron {d.value!r}")]
    if isinstance(d.value, Exception):
        return [Mismatch("raises only on neuron", where, f"reading it: {type(d.value).__name__}: {_first_line(d.value)}")]
    if level == UNCOMPARED or c.shape != d.shape or c.dtype != d.dtype:
        stats["tensors not compared in value"] += 1
        return []
    stats["tensors compared bit for bit"] += 1
    if torch.equal(raw_bits(c.value), raw_bits(d.value)):
        return []
    return [Mismatch("values", where, _describe_difference(c.value, d.value))]


def _same_python(a, b) -> bool:
    """Equal Python values (lists of them too), NaN equal to NaN."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same_python(x, y) for x, y in zip(a, b))
    if isinstance(a, complex) and isinstance(b, complex):
        return _same_python(a.real, b.real) and _same_python(a.imag, b.imag)
    return type(a) is type(b) and (a == b or _both_nan(a, b))


def _both_nan(a, b):
    return isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)


def _describe_difference(c, d):
    bad = raw_bits(c) != raw_bits(d)
    if bad.dim() > c.dim():  # complex: real and imaginary parts
        bad = bad.any(-1)
    n = int(bad.sum())
    first = tuple(int(i) for i in bad.nonzero()[0]) if n else ()
    return (f"{n} of {c.numel()} elements differ ({c.dtype}); first at {first}: "
            f"CPU {c[first].item()!r}, neuron {d[first].item()!r}")


def _compare_final(cpu, dev, program):
    found = []
    names = list(cpu.final)
    for n in dev.final:
        if n not in cpu.final:
            found.append(Mismatch("binding", n, "bound on neuron only"))
    for n in names:
        c, d = cpu.final[n], dev.final.get(n)
        if d is None:
            found.append(Mismatch("binding", n, "bound on the CPU only"))
            continue
        found += _compare_meta(c, d, n, program)
        found += _compare_values(c, d, cpu.compare_as.get(n, EXACT), n)
    found += _compare_aliasing(cpu, dev)
    return found


def _compare_aliasing(cpu, dev):
    found = []
    names = [n for n in cpu.final if cpu.final[n].is_tensor and n in dev.final and dev.final[n].is_tensor]

    def relations(run):
        objects = {id(run.final[n].tensor): n for n in reversed(names)}
        shares, base, same = {}, {}, {}
        for i, p in enumerate(names):
            ep = run.final[p]
            same[p] = objects[id(ep.tensor)]
            b = ep.tensor._base
            base[p] = None if b is None else objects.get(id(b), f"an unnamed tensor of shape {tuple(b.shape)}")
            for q in names[i + 1:]:
                eq = run.final[q]
                if ep.storage[1] and eq.storage[1]:
                    shares[(p, q)] = ep.storage[0] == eq.storage[0]
        return shares, base, same

    cs, cb, co = relations(cpu)
    ds, db, do = relations(dev)
    for n in names:
        if co[n] != do[n]:
            found.append(Mismatch("aliasing", n, f"on the CPU the same object as {co[n]}, on neuron as {do[n]}"))
        elif cb[n] != db[n]:
            found.append(Mismatch("aliasing", n, f"_base: CPU {cb[n]}, neuron {db[n]}"))
    for pair, c in cs.items():
        if pair in ds and ds[pair] != c:
            verb = ("share storage on the CPU, not on neuron" if c else "share storage on neuron, not on the CPU")
            found.append(Mismatch("aliasing", f"{pair[0]} and {pair[1]}", verb))
    return found


# ------------------------------------------------------------------------------------------- eager paths
def check(program: Program) -> list:
    """The mismatches of `program` between the CPU and neuron, on its path's profile. neuron runs it
    twice: the executor runs the first call of each call signature synchronously (the CPU
    kernel decides) and queues later ones (as it taught), so the first run takes the paths
    a new program takes and the second those a program in a loop takes, whatever ran before in
    the process (a failure reproduces in a fresh one)."""
    if program.path == "compiled":
        return check_compiled(program)
    sync_each = PROFILES[program.path].sync_each
    cpu = execute(program, "cpu")
    found = []
    for label in ("first run", "second run"):
        dev = execute(program, DEVICE, sync_each)
        stats.counting = label == "first run"
        for m in compare(program, cpu, dev, sync_each):
            m.where = f"{m.where}, {label}"
            found.append(m)
        if found:
            break
    return found


def check_threaded(programs: list, own_streams: bool) -> dict:
    """The mismatches of each program (by seed) when their neuron runs happen at the same time, one
    host thread each, on the default stream or (`own_streams`) a stream each: the first and second
    run of each, as check() makes them, against its CPU run made alone. Programs that raise on the
    CPU are left out (a device error is the device's, whichever thread's work raised it); so are
    compiled ones. Comparisons are made after the threads are done."""
    import threading

    programs = [p for p in programs if p.path != "compiled"]
    cpu = {p.seed: execute(p, "cpu") for p in programs}
    programs = [p for p in programs if not any(o.error for o in cpu[p.seed].outcomes)]
    runs, failures = {}, []
    barrier = threading.Barrier(len(programs)) if programs else None

    def thread(p):
        try:
            stream = torch.neuron.Stream() if own_streams else torch.neuron.default_stream()
            with torch.neuron.stream(stream):
                barrier.wait()
                sync_each = PROFILES[p.path].sync_each
                runs[p.seed] = [execute(p, DEVICE, sync_each) for _ in range(2)]
        except BaseException as e:  # noqa: BLE001 - the runner failing is a finding too
            failures.append((p.seed, e))
            barrier.abort()

    with warnings.catch_warnings():  # execute's own catch_warnings is not thread-safe
        warnings.simplefilter("ignore")
        pool = [threading.Thread(target=thread, args=(p,)) for p in programs]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
    found = {seed: [Mismatch("runner error", "", f"{type(e).__name__}: {e}")] for seed, e in failures}
    for p in programs:
        for label, dev in zip(("first run", "second run"), runs.get(p.seed, [])):
            for m in compare(p, cpu[p.seed], dev, PROFILES[p.path].sync_each):
                m.where = f"{m.where}, {label} in a thread"
                found.setdefault(p.seed, []).append(m)
    return found


def locate(program: Program) -> list:
    """The neuron runs again, synchronised after each statement: say at which statement an error came."""
    cpu = execute(program, "cpu")
    for _ in range(2):
        found = compare(program, cpu, execute(program, DEVICE, sync_each=True), True)
        if found:
            return found
    return []


# ------------------------------------------------------------------------------------------- compiled
def function_source(program: Program) -> tuple[list, str]:
    """The inputs' statements, and the other statements as one function of the inputs."""
    inputs = [st for st in program.statements if st.kind == "input"]
    body = [st for st in program.statements if st.kind != "input"]
    params = [w for st in inputs for w in st.writes]
    bound = list(dict.fromkeys(params + [w for st in body for w in st.writes]))
    lines = [f"def fuzz_program({', '.join(params)}):"]
    lines += ["    " + line for st in body for line in st.code.split("\n")] or ["    pass"]
    lines.append("    return {" + ", ".join(f"{n!r}: {n}" for n in bound) + "}")
    return inputs, "\n".join(lines) + "\n"


def _run_function(program, device, compiled, backend="neuron"):
    """(results by name, exception) of the program's function on `device`, eager or compiled."""
    inputs, src = function_source(program)
    ns = {"torch": torch, "F": torch.nn.functional, "dev": device, "g": torch.Generator().manual_seed(program.seed)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for st in inputs:
            exec(compile(st.code, "<input>", "exec"), ns)
        exec(compile(src, f"<fuzz program {program.seed}>", "exec"), ns)
        fn = ns["fuzz_program"]
        if compiled:
            torch._dynamo.reset()
            fn = torch.compile(fn, backend=backend)
        args = [ns[w] for st in inputs for w in st.writes]
        try:
            out = fn(*args)
            _sync(device)
        except Exception as e:  # noqa: BLE001 - compared
            _raised(device, e)
            return None, e
    return out, None


def _host(v):
    if isinstance(v, torch.Tensor):
        return v.detach().cpu().resolve_conj().resolve_neg()
    if isinstance(v, (tuple, list)):
        return type(v)(_host(x) for x in v)
    return v


def _close(c, d) -> str | None:
    """None if `d` equals `c` within COMPILED_TOLERANCE, else how they differ."""
    if isinstance(c, torch.Tensor) and isinstance(d, torch.Tensor):
        if c.dtype != d.dtype or c.shape != d.shape:
            return f"dtype/shape: CPU {c.dtype} {tuple(c.shape)}, neuron {d.dtype} {tuple(d.shape)}"
        if c.dtype in COMPILED_TOLERANCE:
            rtol, atol = COMPILED_TOLERANCE[c.dtype]
            try:
                torch.testing.assert_close(d, c, rtol=rtol, atol=atol, equal_nan=True, check_stride=False)
            except AssertionError as e:
                return str(e).strip().split("\n\n")[0].replace("\n", "; ")
            return None
        return None if torch.equal(c, d) else f"{int((c != d).sum())} of {c.numel()} elements differ ({c.dtype})"
    if isinstance(c, (tuple, list)) and isinstance(d, (tuple, list)) and len(c) == len(d):
        for x, y in zip(c, d):
            diff = _close(x, y)
            if diff:
                return diff
        return None
    if isinstance(c, float) and isinstance(d, float):
        return None if math.isclose(c, d, rel_tol=1e-4, abs_tol=1e-5) or _both_nan(c, d) else f"CPU {c!r}, neuron {d!r}"
    return None if c == d else f"CPU {c!r}, neuron {d!r}"


def _compiled_sharing(cpu: dict, dev: dict) -> list:
    """Pairs of results that share storage in one run and not in the other."""
    names = [n for n in cpu if isinstance(cpu[n], torch.Tensor) and isinstance(dev.get(n), torch.Tensor)]
    found = []
    for i, p in enumerate(names):
        for q in names[i + 1:]:
            if not all(t.untyped_storage().nbytes() for t in (cpu[p], cpu[q], dev[p], dev[q])):
                continue
            c = cpu[p].untyped_storage().data_ptr() == cpu[q].untyped_storage().data_ptr()
            d = dev[p].untyped_storage().data_ptr() == dev[q].untyped_storage().data_ptr()
            if c != d:
                verb = "share storage on the CPU, not on neuron" if c else "share storage on neuron, not on the CPU"
                found.append(Mismatch("aliasing", f"{p} and {q}", verb))
    return found


def check_compiled(program: Program) -> list:
    """torch.compile(backend="neuron") of the program against the CPU's eager run."""
    stats.counting = True
    ceager, cexc = _run_function(program, "cpu", compiled=False)
    dout, dexc = _run_function(program, DEVICE, compiled=True)
    stats["statements"] += sum(st.kind != "input" for st in program.statements)
    if cexc or dexc:
        if cexc and dexc:
            stats["programs raising on both"] += 1
            return []
        if dexc and _run_function(program, "cpu", compiled=True, backend="inductor")[1] is not None:
            stats["programs raising under the CPU's Inductor too"] += 1  # Dynamo's or Inductor's own
            return []
        which = "neuron" if dexc else "cpu"
        e = dexc or cexc
        return [Mismatch(f"raises only on {which}", "the compiled call", f"{type(e).__name__}: {_first_line(e)}")]
    found = []
    for name, c in ceager.items():
        d = dout.get(name)
        if isinstance(c, torch.Tensor) and isinstance(d, torch.Tensor):
            if c.stride() != d.stride() and c.shape == d.shape:
                found.append(Mismatch("strides", name, f"CPU eager {c.stride()}, compiled on neuron {d.stride()}"))
        stats["results compared"] += 1
        diff = _close(_host(c), _host(d))
        if diff:
            found.append(Mismatch("values", name, diff))
    found += _compiled_sharing(ceager, dout)
    if found:
        # Inductor's own: compiled on the CPU, it computes (or shares) what it does on neuron.
        cind, iexc = _run_function(program, "cpu", compiled=True, backend="inductor")
        if iexc is None:
            own = []
            for m in found:
                if m.kind == "aliasing":
                    if m.where in {x.where for x in _compiled_sharing(cind, dout)}:
                        own.append(m)
                    continue
                c, d = cind.get(m.where), dout.get(m.where)
                same = c.stride() == d.stride() if m.kind == "strides" else _close(_host(c), _host(d)) is None
                if not same:
                    own.append(m)
            stats["differences that are Inductor's own (the CPU's Inductor computes the same)"] += len(found) - len(own)
            found = own
    return found
