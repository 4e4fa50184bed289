"""AWS's NKI Library kernels on the emulator: time per launch, first and replayed.

For one test case per kernel family of a checkout of aws-neuron/nki-library (the
smallest case of the test function named in ``CASES``), run by the project's runner
(``torchneuron.nki.library``) in the suite's simulation mode, the kernel launch the test
makes is timed:

* first: the launch as the test makes it (interprets the kernel, records its trace);
* replayed, lowered: later launches of the same signature on new copies of the inputs
  (the trace lowered to closures, ``torchneuron/nki/lower/``), where it lowers;
* replayed, generic: the same with ``TORCHNEURON_NKI_FAST_REPLAY=0`` (instruction function
  by instruction function), interleaved with the lowered ones; medians of each.

A group in benchmarks/run.py's sense (``STEPS``, ``run(cfg, bar)``, ``markdown(res)``). It needs
a checkout: ``TORCHNEURON_NKI_LIBRARY=/path/to/nki-library``; without one the group records that
it was skipped. Alone (prints the table)::

    TORCHNEURON_NKI_LIBRARY=/path/to/nki-library .venv/bin/python -m benchmarks.nki_library
"""
from __future__ import annotations

import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECKOUT_ENV = "TORCHNEURON_NKI_LIBRARY"
# where the child process writes its measurements
OUT_ENV = "TORCHNEURON_NKI_LIBRARY_BENCH_OUT"
REPEATS_ENV = "TORCHNEURON_NKI_LIBRARY_BENCH_REPEATS"

# family (a test directory under test/integration/nkilib) -> (test file, test function)
CASES = {
    "core/attention (CTE)": ("core/attention/test_attention_cte.py", "test_attention_cte_no_cp_unit"),
    "core/attention (backward)": ("core/attention/test_attention_bwd.py", "test_attention_bwd_sequence_packing"),
    "core/attention (TKG mask)": ("core/attention/test_gen_mask_tkg.py", "test_swa_with_active_mask"),
    "core/cumsum": ("core/cumsum/test_cumsum.py", "test_cumsum_fast"),
    "core/embeddings (RoPE)": ("core/embeddings/test_rope.py", "test_rope_fast"),
    "core/max": ("core/max/test_cascaded_max.py", "test_cascaded_max_unit"),
    "core/moe/moe_tkg": ("core/moe/moe_tkg/test_moe_tkg.py", "test_moe_tkg_sbuf_io"),
    "core/output_projection (CTE)": ("core/output_projection/test_output_proj_cte.py",
                                     "test_output_proj_cte_bf16_unit"),
    "core/output_projection (TKG)": ("core/output_projection/test_output_proj_tkg.py", "test_output_proj_tkg_unit"),
    "core/qkv": ("core/qkv/test_qkv_cte.py", "test_qkv_cte_accuracy_unit"),
    "core/rmsnorm": ("core/rmsnorm/test_rmsnorm_quant.py", "test_rmsnorm_row_quant_sweep"),
    "core/router_topk": ("core/router_topk/test_router_topk.py", "test_router_topk_sweep"),
    "core/subkernels (layernorm TKG)": ("core/subkernels/test_layernorm_tkg.py", "test_layernorm_tkg_sweep"),
    "core/topk": ("core/topk/test_topk.py", "test_topk_sweep"),
    "experimental/conv": ("experimental/conv/test_conv1d.py", "test_conv1d_basic"),
    "experimental/dynamic_shapes": ("experimental/dynamic_shapes/test_dynamic_elementwise_add.py",
                                    "test_dynamic_elementwise_add_fast"),
    "experimental/transformer": ("experimental/transformer/test_attention_block_tkg.py",
                                 "test_attn_blk_megakernel"),
}
STEPS = 1


# -- in the child: the suite's launches timed ------------------------------------------

def _timed_cpu_simulate(kernel):
    """The simulator's ``cpu_simulate``, timing the first launch each test makes."""
    from torchneuron.nki import cpu_simulator

    class Timed:
        def __init__(self, grid=()):
            self.grid = grid

        def __getitem__(self, grid):
            return Timed(grid)

        def __call__(self, **inputs):
            sim = cpu_simulator.cpu_simulate(kernel)[self.grid]
            test = os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0]
            if test in _measured:
                return sim(**inputs)
            fresh = [copy.deepcopy(inputs) for _ in range(2 * _repeats() + 1)]
            t0 = time.perf_counter()
            out = sim(**inputs)
            first = time.perf_counter() - t0
            row = {"test": test, "kernel": getattr(kernel, "__name__", str(kernel)), "first_s": first}
            sim(**fresh.pop())  # the first replay lowers the trace
            lowered, generic = [], []
            for _ in range(_repeats()):
                for fast, times in (("1", lowered), ("0", generic)):
                    os.environ["TORCHNEURON_NKI_FAST_REPLAY"] = fast
                    args = fresh.pop()
                    t0 = time.perf_counter()
                    sim(**args)
                    times.append(time.perf_counter() - t0)
            os.environ.pop("TORCHNEURON_NKI_FAST_REPLAY")
            info = sim.kernel.cache_info()
            row.update(replay_lowered_s=statistics.median(lowered), replay_generic_s=statistics.median(generic),
                       lowered=bool(info["lowered"]), replays=info["replays"],
                       not_replayed=(info["unreplayable"] or info["not_lowered"] or [""])[0][:160])
            _measured[test] = row
            return out
    return Timed()


_measured: dict = {}


def _repeats() -> int:
    return int(os.environ.get(REPEATS_ENV, "5"))


def pytest_collection_modifyitems(session, config, items):
    """(In the child:) only the test functions ``CASES`` names (``-k`` would also take the ones
    whose names start with theirs)."""
    wanted = {fn for _, fn in CASES.values()}
    kept = [item for item in items if getattr(item, "originalname", item.name) in wanted]
    config.hook.pytest_deselected(items=[item for item in items if item not in kept])
    items[:] = kept


def pytest_sessionstart(session):
    """(A pytest plugin in the child:) the simulator's ``nki.cpu_simulate`` becomes the timed one."""
    sys.modules["nki_cpu_simulator.nki"].cpu_simulate = _timed_cpu_simulate


def pytest_sessionfinish(session):
    with open(os.environ[OUT_ENV], "w") as f:
        json.dump(list(_measured.values()), f)


# -- in the parent ----------------------------------------------------------------------

def measure(checkout: str, machine: str = "trn2", repeats: int = 5, timeout: int = 120) -> list[dict]:
    """One row per family of ``CASES`` that launched a kernel, in a child interpreter running the runner."""
    paths = sorted({os.path.join("test", "integration", "nkilib", f) for f, _ in CASES.values()})
    with tempfile.TemporaryDirectory(prefix="nkilib-bench-") as tmp:
        out, report = os.path.join(tmp, "rows.json"), os.path.join(tmp, "cases.json")
        cmd = [sys.executable, "-m", "torchneuron.nki.library", checkout, "--machine", machine, "--per-test", "1",
               "--timeout", str(timeout), "--child-report", report, "--", *paths, "-p", "benchmarks.nki_library"]
        env = dict(os.environ, NEURON_LAUNCH_BLOCKING="1", PYTHONPATH=os.pathsep.join(
            [ROOT, os.environ.get("PYTHONPATH", "")]), **{OUT_ENV: out, REPEATS_ENV: str(repeats)})
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if not os.path.exists(out):
            raise RuntimeError(f"the NKI Library benchmark did not run:\n{proc.stdout[-4000:]}")
        with open(out) as f:
            rows = json.load(f)
        with open(report) as f:
            outcomes = json.load(f)["cases"]
    by_file = {f: family for family, (f, _) in CASES.items()}
    for r in rows:
        path = r["test"].split("::")[0]
        r["family"] = next((fam for f, fam in by_file.items() if path.endswith(f)), path)
        # (the runner names a case from the suite's test/ directory)
        case = outcomes.get(r["test"].removeprefix("test/"), {})
        r["outcome"] = case.get("outcome", "?")
    return sorted(rows, key=lambda r: r["family"])


def run(cfg, bar) -> dict:
    checkout = os.environ.get(CHECKOUT_ENV)
    if not checkout or not os.path.isdir(os.path.join(checkout, "test", "integration")):
        bar.update(1)
        return {"skipped": f"no NKI Library checkout ({CHECKOUT_ENV} names none)"}
    load = list(os.getloadavg())
    rows = measure(checkout, repeats=cfg.pick(5, 2))
    bar.update(1)
    return {"checkout": _commit(checkout), "rows": rows, "loadavg_start": load, "loadavg_end": list(os.getloadavg())}


def _commit(checkout):
    try:
        return subprocess.run(["git", "-C", checkout, "log", "-1", "--format=%h %s"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return os.path.basename(os.path.abspath(checkout))


def markdown(res: dict) -> str:
    from .common import fmt_time
    from .report import _table  # (report.py imports this module: its table helper is read when rendering)
    head = "## AWS's NKI Library kernels on the emulator\n\n"
    if "skipped" in res:
        return head + f"Not run: {res['skipped']}.\n"
    s = [head + f"Checkout {res['checkout']}, Trainium2 model; per kernel family, the smallest case of one test "
         "function (benchmarks/nki_library.py): the kernel launch the test makes, first (interpreted and "
         "recorded) and replayed on new copies of its inputs, lowered and generic (medians, interleaved). "
         f"Load average {res['loadavg_start'][0]:.1f} at the start, {res['loadavg_end'][0]:.1f} at the end "
         "(the host is shared).\n"]
    rows = []
    for r in res["rows"]:
        best = r["replay_lowered_s"] if r["lowered"] else r["replay_generic_s"]
        rows.append((r["family"], f"`{r['kernel']}`", fmt_time(r["first_s"]),
                     fmt_time(r["replay_lowered_s"]) if r["lowered"] else "-", fmt_time(r["replay_generic_s"]),
                     f"{r['first_s'] / best:.0f}", r["outcome"],
                     "" if r["lowered"] else r["not_replayed"].split(" at ")[0]))
    s.append(_table(["family", "kernel", "first launch", "replay, lowered", "replay, generic", "first / replay",
                     "test", "not lowered because"], rows))
    return "\n".join(s)


if __name__ == "__main__":
    from .common import Config

    class _Bar:
        def update(self, n):
            pass
    print(markdown(run(Config(), _Bar())))
