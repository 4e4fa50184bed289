"""Runs PyTorch's own device-generic test files on `cpu` and on `neuron` and
compares them test by test.

    PYTHONPATH=. .venv/bin/python -m tests.upstream.runner [--full] [--files test_ops,test_nn] [--report PATH]

Each file runs in worker processes of its own (``--worker``), which import it
as a module (not as ``__main__``), so that PyTorch's
``instantiate_device_type_tests`` makes its ``...CPU`` class and its
PrivateUse1 class (``torch._C._get_privateuse1_backend_name()``: ``neuron``),
instantiated as an accelerator's (instantiation.py).
A test exists on both when the two classes have the same test with the device
name swapped; each such pair is one test here, its id ``file::Class::name``
with the class's device suffix and the test's device token removed.

Per pair: the CPU variant runs, then the `neuron` one, then every `neuron`
device is synchronised and its errors taken and cleared, so an error queued
by the test is charged to it and not to the next one (the pattern of
tests/conftest.py and tests/opinfo/sweep.py). A pair counts against `neuron`
only when the CPU variant passed and the `neuron` one did not.

Sample mode (the default, CI): a fixed number of pairs per file
(``SAMPLE`` below), the pairs whose SHA-1 of the id is smallest: the same on
every run and machine, and the same tests on both devices; plus, for each
entry of the known-defect list, its first matching pair, so that every entry
is checked on every run. The few very slow tests in ``SLOW`` are left out of the sample.
``TORCHNEURON_UPSTREAM_SAMPLE_SCALE=4`` takes four times as many pairs per file;
``TORCHNEURON_UPSTREAM=full`` (or ``--full``) runs the files whole.

A worker that crashes or stops reporting is replaced; the test it was running
is recorded as a crash or a timeout, and the next worker goes on after it.
"""
import argparse
import fnmatch
import hashlib
import json
import os
import resource
import select
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# The files, and how many pairs of each the sample runs. The counts are set
# so that the sample of all files, imports included, fits CI's budget for this
# suite on 2 cores; heavier files (many OpInfo samples per test) get fewer.
SAMPLE = {  # heaviest first, so that the two workers finish close together
    "test_ops": 90,
    "test_linalg": 60,
    "test_unary_ufuncs": 200,
    "test_nn": 120,
    "test_binary_ufuncs": 200,
    "test_reductions": 160,
    "test_foreach": 60,
    "test_modules": 70,
    "test_torch": 160,
    "test_spectral_ops": 60,
    "test_scatter_gather_ops": 60,
    "test_view_ops": 120,
    "test_sort_and_select": 60,
    "test_type_promotion": 120,
    "test_tensor_creation_ops": 120,
    "test_autograd": 50,
    "test_shape_ops": 60,
    "test_indexing": 80,
    "test_masked": 40,
    "test_native_mha": 20,
    "test_segment_reductions": 40,
    "test_numpy_interop": 42,
    "test_complex": 16,
}

# Left out of the sample only (the long mode runs them): single tests that take
# tens of seconds on the CPU alone, each a sizeable part of the whole sample's budget.
SLOW = [
    "test_nn::TestNNDeviceType::test_grid_sample_large_index_*",
    "test_modules::TestModule::test_grad*_nn_RNN*_float64",
    "test_modules::TestModule::test_grad*_nn_GRU*_float64",
    "test_modules::TestModule::test_grad*_nn_LSTM*_float64",
    "test_reductions::TestReductions::test_ref_large_input_*",
    "test_tensor_creation_ops::TestTensorCreation::test_linspace_*",
    "test_tensor_creation_ops::TestTensorCreation::test_logspace_*",
]

# A test with no result for this long is stopped (its worker is killed).
TEST_TIMEOUT = {"sample": 120, "full": 600}


def mode():
    return "full" if os.environ.get("TORCHNEURON_UPSTREAM", "") == "full" else "sample"


def sha(s):
    return hashlib.sha1(s.encode()).hexdigest()


def matches(test_id, pattern):
    return fnmatch.fnmatchcase(test_id, pattern)


def select_ids(file, ids, full, known_patterns):
    """The pairs a run takes from a file's sorted ids, in run order."""
    if full:
        return list(ids)
    by_hash = sorted(ids, key=sha)
    scale = float(os.environ.get("TORCHNEURON_UPSTREAM_SAMPLE_SCALE", "1"))
    fast = [i for i in by_hash if not any(matches(i, p) for p in SLOW)]
    chosen = set(fast[:int(SAMPLE.get(file, 50) * scale)])
    for pattern in known_patterns:
        first = next((i for i in by_hash if matches(i, pattern)), None)
        if first is not None:
            chosen.add(first)
    return [i for i in ids if i in chosen]


# ----------------------------------------------------------------------------- worker


def _device_pairs(module):
    """{id: (cpu_class, cpu_name, neuron_class, neuron_name)} and the count of
    tests instantiated for one of the two devices only."""
    import unittest

    import torch
    dev = torch._C._get_privateuse1_backend_name()
    generic = {}
    for cls_name, cls in vars(module).items():
        if not (isinstance(cls, type) and issubclass(cls, unittest.TestCase)):
            continue
        dt = getattr(cls, "device_type", None)
        if dt == "cpu" and cls_name.endswith("CPU"):
            generic.setdefault(cls_name[:-3], {})["cpu"] = cls
        elif dt in ("privateuse1", dev):
            for suffix in ("PRIVATEUSE1", dev.upper()):
                if cls_name.endswith(suffix):
                    generic.setdefault(cls_name[:-len(suffix)], {})["neuron"] = cls
    pairs, one_sided = {}, 0
    for base, classes in sorted(generic.items()):
        cpu, neu = classes.get("cpu"), classes.get("neuron")
        cpu_names = {n for n in dir(cpu) if n.startswith("test")} if cpu else set()
        neu_names = {n for n in dir(neu) if n.startswith("test")} if neu else set()
        paired_cpu = set()
        for n in sorted(neu_names):
            tok = f"_{dev}" if f"_{dev}" in n else "_privateuse1"
            head, sep, tail = n.rpartition(tok)
            if not sep:
                one_sided += 1
                continue
            cn = head + "_cpu" + tail
            if cn in cpu_names:
                pairs[f"{module.__name__}::{base}::{head}{tail}"] = (cpu, cn, neu, n)
                paired_cpu.add(cn)
            else:
                one_sided += 1
        one_sided += len(cpu_names - paired_cpu)
    return pairs, one_sided


def _short(exc_text, limit=300):
    """The exception's own first line: what follows the last frame of the traceback
    (a chained exception's is the last one printed)."""
    lines = exc_text.rstrip().splitlines()
    frames = [i for i, ln in enumerate(lines) if ln.startswith("  File ")]
    start = frames[-1] + 1 if frames else 0
    for ln in lines[start:]:
        if ln.strip() and not ln.startswith(" "):
            return ln[:limit]
    return (lines[-1] if lines else exc_text)[:limit]


def _run_test(cls, name):
    """('pass'|'fail'|'skip', detail[, traceback])."""
    import unittest
    result = unittest.TestResult()
    try:
        cls(name).run(result)
    except BaseException as e:  # noqa: BLE001  (KeyboardInterrupt included: the test raised it)
        return "fail", f"{type(e).__name__}: {e}"[:300]
    if result.errors or result.failures:
        text = (result.errors or result.failures)[0][1]
        return "fail", _short(text), text if len(text) < 6000 else text[:3000] + "\n...\n" + text[-3000:]
    if result.unexpectedSuccesses:
        return "fail", "unexpected success"
    if result.skipped:
        return "skip", str(result.skipped[0][1])[:200]
    return "pass", ""


def _drain_device():
    """Waits for every `neuron` device; returns the errors its queued work raised."""
    import torch
    errors = []
    for i in range(torch.neuron.device_count()):
        try:
            torch.neuron.synchronize(i)
        except Exception as e:  # noqa: BLE001
            errors.append(f"{type(e).__name__}: {e}"[:300])
        errors += [str(m)[:300] for m in torch.neuron.device_errors(i)["unreported_errors"]]
        torch.neuron.reset_errors(i)
    return errors


def worker(file, test_dir, full, skip_from, only=None, trace_all=False):
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # what the tests print goes to the log, not into the protocol

    def emit(**kw):
        proto.write(json.dumps(kw) + "\n")

    sys.argv = [file]
    sys.path.insert(0, test_dir)
    import torch
    import torchneuron  # noqa: F401  (explicit, so the device exists with autoload off)
    from tests.upstream import compat, instantiation, lists
    compat.install()
    instantiation.install()
    t0 = time.time()
    module = __import__(file)
    compat.after_import(module)
    pairs, one_sided = _device_pairs(module)
    ids = sorted(pairs)
    known = [p for p, *_ in lists.KNOWN_DEFECTS if p.startswith(file + "::")]
    chosen = select_ids(file, ids, full, known)
    if only:
        chosen = [i for i in ids if matches(i, only)]
    mine = [p for p in known + lists.skip_patterns() + lists.own_skip_patterns() if p.startswith(file + "::")]
    unmatched = [p for p in mine if not any(matches(i, p) for i in ids)]
    emit(event="plan", total=len(ids), one_sided=one_sided, chosen=len(chosen), import_s=time.time() - t0,
         provided=compat.PROVIDED, unmatched=unmatched, adjusted=instantiation.ADJUSTED,
         widened=len(instantiation.WIDENED))
    started = set()
    torch.manual_seed(0)
    todo = chosen[chosen.index(skip_from) + 1:] if skip_from in chosen else chosen
    for tid in todo:
        skip = lists.skip_reason(tid)
        if skip:
            emit(event="result", id=tid, skip=skip)
            continue
        cpu_cls, cpu_name, neu_cls, neu_name = pairs[tid]
        emit(event="start", id=tid)
        out = {}
        for key, cls, name in (("cpu", cpu_cls, cpu_name), ("neuron", neu_cls, neu_name)):
            if cls not in started:
                started.add(cls)
                try:
                    cls.setUpClass()
                except Exception as e:  # noqa: BLE001
                    cls.__torchneuron_setup_error = f"setUpClass: {type(e).__name__}: {e}"[:300]
            err = getattr(cls, "__torchneuron_setup_error", None)
            t = time.time()
            status, detail, *trace = ("fail", err) if err else _run_test(cls, name)
            if key == "neuron":
                deferred = _drain_device()
                if deferred and status != "fail":
                    status, detail = "fail", "deferred device error: " + deferred[0]
            out[key] = {"status": status, "detail": detail, "s": round(time.time() - t, 3)}
            if trace and trace_all:
                out[key]["trace"] = trace[0]
        emit(event="result", id=tid, **out)
    emit(event="done")


# ----------------------------------------------------------------------------- parent


def _spawn(file, test_dir, full, skip_from, log, only):
    cmd = [sys.executable, "-m", "tests.upstream.runner", "--worker", file, "--test-dir", test_dir]
    if only:
        cmd += ["--only", only]
    if full:
        cmd.append("--full")
    if skip_from:
        cmd += ["--skip-from", skip_from]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    # Only the two device classes: the lazy and meta classes some files ask for are not compared.
    env["PYTORCH_TESTING_DEVICE_ONLY_FOR"] = "cpu,privateuse1"
    env["PYTORCH_PRINT_REPRO_ON_FAILURE"] = "0"  # the repro hint would be the last line of every failure
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=log, text=True, env=env)


def run_file(file, test_dir, full, log_dir, only=None):
    """All results of one file: {'plan': {...}, 'results': {id: {...}}, 'seconds': s}."""
    t0 = time.time()
    timeout = TEST_TIMEOUT["full" if full else "sample"]
    results, plan, skip_from = {}, None, None
    log = open(os.path.join(log_dir, file + ".log"), "w")
    while True:
        p = _spawn(file, test_dir, full, skip_from, log, only)
        current, finished, last = None, False, time.time()
        buf = ""
        while True:
            ready, _, _ = select.select([p.stdout], [], [], 5)
            if ready:
                chunk = os.read(p.stdout.fileno(), 1 << 16).decode()
                if not chunk:
                    break
                buf += chunk
                *lines, buf = buf.split("\n")
                for line in lines:
                    ev = json.loads(line)
                    last = time.time()
                    if ev["event"] == "plan":
                        plan = plan or ev
                    elif ev["event"] == "start":
                        current = ev["id"]
                    elif ev["event"] == "result":
                        results[ev.pop("id")] = ev
                        current = None
                    elif ev["event"] == "done":
                        finished = True
            elif time.time() - last > (timeout if current or plan else 600):
                p.kill()
                if current:
                    results[current] = {"cpu": {"status": "fail", "detail": f"timeout after {timeout} s"},
                                        "neuron": {"status": "fail", "detail": f"timeout after {timeout} s"},
                                        "event": "result"}
                break
        rc = p.wait()
        if finished:
            break
        if current is None and plan is None:
            results["__import__"] = {"error": f"worker exited with {rc} before its plan; see {log.name}"}
            break
        if current is not None and current not in results:
            results[current] = {"cpu": {"status": "crash", "detail": f"worker exited with {rc}"},
                                "neuron": {"status": "crash", "detail": f"worker exited with {rc}"}}
        skip_from = current or skip_from
        if current is None:  # died between tests: do not loop forever
            results["__worker__"] = {"error": f"worker exited with {rc} between tests; see {log.name}"}
            break
    log.close()
    return {"plan": plan, "results": results, "seconds": time.time() - t0}


def classify(res, file=None):
    """One pair's verdict: 'pass', 'neuron_only', 'known', 'cpu_fails', 'skipped_list',
    'skipped_test', 'neuron_skipped' (the test itself skips on neuron only)."""
    if "skip" in res:
        return "skipped_list"
    c, n = res["cpu"]["status"], res["neuron"]["status"]
    if c == "skip":
        return "skipped_test"
    if c != "pass":
        return "cpu_fails"
    if n == "pass":
        return "pass"
    if n == "skip":
        return "neuron_skipped"
    return "neuron_only"


def run(files, full, jobs, test_dir, log_dir, only=None):
    os.makedirs(log_dir, exist_ok=True)
    out, pending, running = {}, list(files), {}
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futs = {f: pool.submit(run_file, f, test_dir, full, log_dir, only) for f in pending}
        for f, fut in futs.items():
            out[f] = fut.result()
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker")
    ap.add_argument("--test-dir")
    ap.add_argument("--skip-from")
    ap.add_argument("--only", help="run the tests whose id matches this glob instead of the sample (with tracebacks)")
    ap.add_argument("--full", action="store_true", default=mode() == "full")
    ap.add_argument("--files", default=",".join(SAMPLE))
    ap.add_argument("--jobs", type=int, default=int(os.environ.get("TORCHNEURON_UPSTREAM_JOBS", "2")))
    ap.add_argument("--report", default=os.path.join(HERE, "REPORT.md"))
    ap.add_argument("--from-json", help="write the report of a saved run instead of running")
    ap.add_argument("--json", default=os.path.join(ROOT, ".cache", "upstream", "results.json"))
    a = ap.parse_args(argv)
    if a.worker:
        return worker(a.worker, a.test_dir, a.full, a.skip_from, a.only, trace_all=bool(a.only))
    from tests.upstream import fetch, report
    if a.from_json:  # re-render a saved run (the lists as they are now)
        saved = json.load(open(a.from_json))
        problems = report.write(saved["files"], saved["wall_s"], saved["full"], saved["jobs"], a.report,
                                saved.get("cpu_s"), saved.get("scale", 1))
        print(report.summary_line(saved["files"], saved["wall_s"]))
        return 1 if problems else 0
    test_dir = fetch.fetch()
    t0 = time.time()
    files = [f for f in a.files.split(",") if f]
    if a.only:
        files = [f for f in files if fnmatch.fnmatchcase(f, a.only.split("::")[0])]
    out = run(files, a.full, a.jobs, test_dir, os.path.join(os.path.dirname(a.json), "logs"), a.only)
    wall = time.time() - t0
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = ru.ru_utime + ru.ru_stime
    scale = float(os.environ.get("TORCHNEURON_UPSTREAM_SAMPLE_SCALE", "1"))
    json.dump({"files": out, "wall_s": wall, "cpu_s": cpu, "full": a.full, "jobs": a.jobs, "scale": scale},
              open(a.json, "w"), indent=1)
    problems = report.write(out, wall, a.full, a.jobs, a.report, cpu, scale)
    print(report.summary_line(out, wall))
    for p in problems:
        print("PROBLEM:", p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
