"""The performance model: matmul optimisation steps in the documented order of speed, engine-bound
kernels, the timeline, Trainium2 against Trainium3, and nki.benchmark / nki.profile."""
import json
import os

import ml_dtypes
import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl
from torchneuron.nki import perf

import matmul_steps
from neuron_testing import line_of

HERE = os.path.abspath(__file__)
BF16 = ml_dtypes.bfloat16


def modelled(kernel, *args, machine=None, **kwargs):
    from torchneuron.nki.machine import resolve_machine
    m = resolve_machine(machine) if machine else None
    result, records, used, _ = perf.run_profiled(kernel, args, kwargs, target=m)
    return result, perf.model(records, used, kernel.fn.__name__)


@pytest.fixture(scope="module")
def matmul_reports():
    rng = np.random.default_rng(7)
    k, m, n = 1024, 2048, 2048
    a = rng.standard_normal((k, m), dtype=np.float32).astype(BF16)
    b = rng.standard_normal((k, n), dtype=np.float32).astype(BF16)
    ref = a.astype(np.float32).T @ b.astype(np.float32)
    reports = {}
    for step in matmul_steps.STEPS:
        out, rep = modelled(step, a, b)
        # each step computes the product (bf16 output: within its rounding)
        np.testing.assert_allclose(out.astype(np.float32), ref, rtol=1e-2, atol=0.3)
        reports[step.fn.__name__] = rep
    small_a, small_b = np.ascontiguousarray(a[:128, :64]), np.ascontiguousarray(b[:128, :512])
    out, reports["basic"] = modelled(matmul_steps.basic, small_a, small_b)
    np.testing.assert_allclose(out.astype(np.float32), small_a.astype(np.float32).T @ small_b.astype(np.float32),
                               rtol=1e-2, atol=0.3)
    return reports


def test_matmul_tutorial_steps_come_out_in_the_documented_order(matmul_reports):
    r = matmul_reports
    lat = [r[s].latency_ns for s in ("tiled", "hoisted", "blocked", "optimized")]
    assert lat == sorted(lat, reverse=True) and len(set(lat)) == 4, lat
    mfu = [r[s].mfu for s in ("basic", "tiled", "hoisted", "blocked", "optimized")]
    assert mfu == sorted(mfu) and len(set(mfu)) == 5, mfu
    # the first steps are bound by the DMA queues; the last keeps the Tensor Engine mostly busy
    assert r["tiled"].bottleneck == "dma" and r["tiled"].engines["dma"]["busy"] > 0.9
    assert r["optimized"].engines["tensor"]["busy"] > 0.7 and r["optimized"].mfu > 0.7
    # the same work: every same-shape step does the same matmul FLOPs
    assert len({r[s].flops for s in ("tiled", "hoisted", "blocked", "optimized")}) == 1
    assert r["tiled"].flops == 2 * 1024 * 2048 * 2048
    # less data moved per step
    moved = [r[s].hbm_bytes for s in ("tiled", "hoisted", "blocked", "optimized")]
    assert moved == sorted(moved, reverse=True)


@nki.jit
def scalar_bound(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    r = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    for _ in range(48):
        nisa.activation(dst=r, op=nl.exp, data=t)  # MARK-ACTIVATION
    nisa.dma_copy(dst=out, src=r)
    return out


@nki.jit
def vector_bound(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    r = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    for _ in range(48):
        nisa.tensor_tensor(dst=r, data1=t, data2=t, op=np.multiply)
    nisa.dma_copy(dst=out, src=r)
    return out


@nki.jit
def dma_bound(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    for i in range(x.shape[0] // 128):
        t = nl.ndarray((128, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[i * 128:(i + 1) * 128, :])
        nisa.dma_copy(dst=out[i * 128:(i + 1) * 128, :], src=t)
    return out


@nki.jit
def tensor_bound(a, b):
    out = nl.ndarray((a.shape[1], b.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    sa = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    sb = nl.ndarray(b.shape, dtype=b.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=sa, src=a)
    nisa.dma_copy(dst=sb, src=b)
    acc = nl.ndarray((a.shape[1], b.shape[1]), dtype=nl.float32, buffer=nl.psum)
    for _ in range(256):
        nisa.nc_matmul(acc, sa, sb)
    res = nl.ndarray(acc.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=acc)
    nisa.dma_copy(dst=out, src=res)
    return out


def test_engine_bound_kernels_keep_that_engine_busy():
    x = np.random.default_rng(0).uniform(-1, 1, (128, 2048)).astype(np.float32)
    cases = [(scalar_bound, (x,), "scalar"), (vector_bound, (x,), "vector"),
             (dma_bound, (np.tile(x, (16, 1)),), "dma"),
             (tensor_bound, (x[:, :128].astype(BF16), x[:, :512].astype(BF16)), "tensor")]
    for kernel, args, engine in cases:
        _, rep = modelled(kernel, *args)
        assert rep.bottleneck == engine, (kernel.fn.__name__, rep.summary())
        assert rep.engines[engine]["busy"] > 0.9, (kernel.fn.__name__, rep.summary())
        others = [e for e in ("tensor", "vector", "scalar", "gpsimd") if e != engine]
        assert all(rep.engines[e]["busy"] < 0.2 for e in others), rep.summary()
    # the tensor-bound kernel runs near the peak: 256 full bf16 matmuls at 79 TFLOPS
    _, rep = modelled(tensor_bound, x[:, :128].astype(BF16), x[:, :512].astype(BF16))
    assert rep.flops == 256 * 2 * 128 * 128 * 512
    assert 0.85 < rep.mfu <= 1.0


def test_timeline_is_per_engine_instructions_with_source_lines():
    x = np.random.default_rng(1).uniform(-1, 1, (128, 512)).astype(np.float32)
    tl = nki.timeline(scalar_bound, x)
    assert isinstance(tl, list) and len(tl) == 50
    assert {e["engine"] for e in tl} == {"dma", "scalar"}
    acts = [e for e in tl if e["name"] == "nisa.activation"]
    assert len(acts) == 48
    assert all(e["source"] == f"{HERE}:{line_of(HERE, 'MARK-ACTIVATION')}" for e in acts)
    for e in tl:
        assert set(e) >= {"engine", "start", "end", "name", "source"}
        assert 0 <= e["start"] <= e["end"] <= e["ready"]
    # a compute engine runs one instruction at a time, in program order
    acts.sort(key=lambda e: e["step"])
    assert all(a["end"] <= b["start"] + 1e-9 for a, b in zip(acts, acts[1:]))
    # the output DMA starts after the last activation that writes its source
    store = max((e for e in tl if e["engine"] == "dma"), key=lambda e: e["step"])
    assert store["start"] >= acts[-1]["ready"] - 1e-9


def test_trainium3_moves_data_faster_than_trainium2():
    x = np.random.default_rng(2).uniform(-1, 1, (2048, 1024)).astype(np.float32)
    _, on_trn2 = modelled(dma_bound, x, machine="trn2")
    _, on_trn3 = modelled(dma_bound, x, machine="trn3")
    assert on_trn2.machine.key == "trn2" and on_trn3.machine.key == "trn3"
    # DMA bandwidth per core: 368 against 528 GB/s
    ratio = on_trn2.latency_ns / on_trn3.latency_ns
    assert 1.3 < ratio < 1.5, ratio


def test_benchmark_reports_model_and_emulator_latency(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    x = np.random.default_rng(3).uniform(-1, 1, (128, 512)).astype(np.float32)
    bench = nki.benchmark(warmup=1, iters=3, save_neff_name="file.neff", save_trace_name="profile.ntff")(scalar_bound)
    out = bench(x)
    np.testing.assert_allclose(out, np.exp(x), rtol=1e-6)
    res = bench.benchmark_result
    model = nki.estimate(scalar_bound, x)
    for p in (0, 1, 10, 25, 50, 90, 99, 100):
        assert res.nc_latency.get_latency_percentile(p) == pytest.approx(model.latency_us)
    assert res.emulator_iterations == 3 and res.emulator_latency.get_latency_percentile(50) > 0
    assert res.mfu == res.model.mfu and 0 < res.mbu < 1
    assert "nki.benchmark scalar_bound" in capsys.readouterr().out
    trace = json.loads((tmp_path / "profile.ntff").read_text())
    assert len(trace["instructions"]) == 50 and trace["otherData"]["machine"] == "trn2"
    assert trace["neuronNkiKernels"][0]["kernel"] == "scalar_bound"     # what the explorer's NKI view reads
    assert json.loads((tmp_path / "file.neff").read_text())["instructions"] == 50


def test_benchmark_takes_tensor_specs():
    import torchneuron.nki.typing as nt
    bench = nki.benchmark(warmup=0, iters=1, quiet=True)(dma_bound)
    bench(nt.tensor[[512, 1024], nl.bfloat16])
    rep = bench.benchmark_result.model
    assert rep.hbm_bytes == 2 * 512 * 1024 * 2


def test_profile_writes_the_trace(tmp_path):
    x = np.random.default_rng(4).uniform(-1, 1, (128, 512)).astype(np.float32)
    nki.profile(working_directory=str(tmp_path), save_neff_name="k.neff", save_trace_name="k.ntff")(vector_bound)(x)
    data = json.loads((tmp_path / "k.ntff").read_text())
    rows = {e["args"]["name"] for e in data["traceEvents"] if e["ph"] == "M"}
    assert rows == {"tensor", "vector", "scalar", "gpsimd", "dma"}
    assert sum(1 for e in data["traceEvents"] if e["ph"] == "X" and e["cat"] == "vector") == 48
    assert (tmp_path / "vector_bound_summary.json").exists()
    with pytest.raises(ValueError, match="absolute"):
        nki.profile(working_directory="relative/dir")(vector_bound)


@nki.jit
def beta1_tiled(lhsT, rhs):
    k, m = lhsT.shape
    n = rhs.shape[1]
    out = nl.ndarray((m, n), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(m // 128):
        acc = nl.zeros((128, 512), nl.float32, buffer=nl.psum)
        for kk in nl.affine_range(k // 128):
            a = nl.load(lhsT[kk * 128:(kk + 1) * 128, i * 128:(i + 1) * 128])
            b = nl.load(rhs[kk * 128:(kk + 1) * 128, 0:512])
            acc += nisa.nc_matmul(a, b)                       # accumulates in PSUM: no Vector add
        res = nl.ndarray((128, 512), dtype=out.dtype, buffer=nl.sbuf)
        res[...] = nl.copy(acc, dtype=out.dtype)              # written by the copy itself
        nl.store(out[i * 128:(i + 1) * 128, :], value=res)
    return out


def test_beta1_accumulation_and_assignment_cost_no_extra_instructions():
    rng = np.random.default_rng(5)
    a = rng.standard_normal((512, 256)).astype(BF16)
    b = rng.standard_normal((512, 512)).astype(BF16)
    out, rep = modelled(beta1_tiled, a, b)
    np.testing.assert_allclose(out.astype(np.float32), a.astype(np.float32).T @ b.astype(np.float32), rtol=1e-2, atol=0.3)
    names = [e["name"] for e in rep.timeline()]
    assert names.count("nisa.nc_matmul") == 8
    # the engine instructions are the matmuls, the loads and stores and one copy per tile (the zeroed PSUM
    # accumulator costs nothing: its group's first matmul overwrites it)
    assert rep.engines["vector"]["instructions"] == 2 and rep.engines["dma"]["instructions"] == 16 + 2
    assert "in-place update" not in names and "tile assignment" not in names


def test_explorer_layout_with_occupancy():
    x = np.random.default_rng(6).uniform(-1, 1, (128, 2048)).astype(np.float32)
    _, rep = modelled(scalar_bound, x)
    k = rep.nki_trace()
    assert set(k) >= {"kernel", "source", "instructions", "occupancy", "sbuf_capacity", "psum_capacity"}
    assert k["sbuf_capacity"] == 28 << 20 and k["psum_capacity"] == 2 << 20
    assert {i["engine"] for i in k["instructions"]} == {"DMA", "Scalar"}
    line = line_of(HERE, "MARK-ACTIVATION")
    acts = [i for i in k["instructions"] if i["name"] == "nisa.activation"]
    assert all(i["line"] == f"{HERE}:{line}" for i in acts)
    assert "MARK-ACTIVATION" in k["source"].splitlines()[line - 1]     # the source the lines index
    # two [128, 2048] float32 tiles live together, then nothing
    peaks = [o["sbuf_bytes"] for o in k["occupancy"]]
    assert max(peaks) == 2 * 2048 * 4 * 128 and peaks[-1] == 0
    times = [o["t_ns"] for o in k["occupancy"]]
    assert times == sorted(times) and times[-1] <= rep.latency_ns


@nki.jit
def accumulate_row_blocks(x):
    out = nl.ndarray((128, x.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    s = nl.zeros((128, x.shape[1]), dtype=nl.float32, buffer=nl.sbuf)
    for i in nl.affine_range(x.shape[0] // 128):
        s[...] += nl.load(x[i * 128:(i + 1) * 128, :])     # a Vector add; the view assigned back moves nothing
    nl.store(out, value=s)
    return out


def test_augmented_assignment_to_a_subscript_is_one_instruction():
    x = np.random.default_rng(7).standard_normal((512, 256)).astype(np.float32)
    out, rep = modelled(accumulate_row_blocks, x)
    np.testing.assert_allclose(out, x.reshape(4, 128, 256).sum(axis=0), rtol=1e-5, atol=1e-5)
    assert rep.engines["vector"]["instructions"] == 1 + 4       # the zeros and four adds
    assert rep.engines["dma"]["instructions"] == 4 + 1
