"""The benchmark command's smoke mode runs and writes the expected results
(so the suite cannot rot; no benchmark figure is checked)."""

import json
import os
import signal
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT_S = 600   # a few times the run's length on an idle 2-core host


def test_benchmark_smoke_run(tmp_path):
    # The run's sanitizer group switches the stream sanitizer on and off itself: a whole-suite run under
    # it (docs/sanitizers.md) does not pass it on.
    env = {k: v for k, v in os.environ.items() if k != "TORCHNEURON_STREAM_SANITIZER"} | {"PYTHONPATH": ROOT}
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "benchmarks", "run.py"), "--smoke",
                             "--out", str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)   # with the ranks and children it spawned
        _, err = proc.communicate()
        pytest.fail(f"the smoke run took over {TIMEOUT_S} s; its last output:\n{err[-3000:]}")
    assert proc.returncode == 0, err[-3000:]
    res = json.loads((tmp_path / "results.json").read_text())

    assert {"machine", "config", "limits", "tiny_ops", "large_ops", "end_to_end", "memory", "profile",
            "nki_kernels", "compiled", "huggingface", "targets", "elapsed_s"} <= set(res)
    assert res["config"]["smoke"] is True
    if not os.environ.get("TORCHNEURON_NKI_LIBRARY"):  # its group needs a checkout of the NKI Library
        assert "skipped" in res["nki_library"]
    for key in ("cpu_model", "logical_cores", "torch_version", "date"):
        assert res["machine"][key]
    assert res["limits"]["triad"]["gbytes_per_s"] > 0 and res["limits"]["matmul"]["gflops"] > 0
    ops = res["tiny_ops"]["ops"]
    assert set(ops) == {"add", "mul", "relu", "sum", "index", "cat", "mm_16x16", "view", "item", "dependent_step",
                        "independent_step"}
    for r in ops.values():
        assert r["neuron_enqueue_s"] > 0 and r["neuron_completed_s"] > 0 and r["cpu_s"] > 0
    assert {"matmul_64", "matmul_128", "conv2d_resnet_layer2", "softmax", "layer_norm",
            "embedding"} <= set(res["large_ops"])
    assert all(r["speed_vs_cpu"] > 0 for r in res["large_ops"].values())
    # the chains again on the AVX2 path, forced where the host has AVX-512
    chains = {n for n in res["large_ops"] if n.startswith("elementwise_chain")}
    avx2 = res["large_ops_avx2"]
    assert set(avx2) == (chains if res["machine"]["isa"]["host"] == "avx512" else set())
    assert all(r["isa"]["path"] == "avx2" and r["speed_vs_cpu"] > 0 for r in avx2.values())
    assert set(res["end_to_end"]) == {"gpt_train_step", "resnet18_train_step", "lstm_lm_train_step",
                                      "gpt_infer_batch1_token"}
    assert all(r["fused_tasks_per_step"] >= 0 for r in res["end_to_end"].values())
    assert set(res["fusion_workloads"]) == {"gpt_train_step", "transformer_block_train_step", "lstm_cell_train_step"}
    assert all(r["neuron_s"] > 0 and r["neuron_fusion_off_s"] > 0 and r["cpu_s"] > 0
               for r in res["fusion_workloads"].values())
    # end to end and compiled again on the AVX2 path, forced in a child where the host has AVX-512
    forced = res["machine"]["isa"]["path"] == "avx512"
    assert set(res.get("end_to_end_avx2", {})) == (set(res["end_to_end"]) if forced else set())
    assert set(res.get("compiled_avx2", {}).get("workloads", {})) == (
        set(res["compiled"]["workloads"]) if forced else set())
    for r in res["memory"].values():
        assert r["neuron_peak_allocated_bytes"] > 0 and r["reserved_over_allocated"] >= 1.0
    assert res["profile"]["components"]["ops_per_step"] > 0
    for r in res["nki_kernels"].values():   # matmul, attention: emulator, NumPy and PyTorch times
        assert r["numpy_replay_s"] > 0 and r["neuron_replay_s"] > 0 and r["numpy_loop_nest_s"] > 0
        assert r["cache_info"]["replays"] > 0 and r["max_abs_diff_vs_numpy"] < 0.1
    c = res["compiled"]["workloads"]["mlp_infer"]
    for v in ("cpu_inductor", "neuron_eager", "neuron_compiled", "neuron_reduce_overhead"):
        assert c[v]["s"] > 0
    assert res["compiled"]["replay_stats"]["replays"] > 0, res["compiled"]
    hf = res["huggingface"]
    for w in ("hf_llama_train_step", "minilm_encode"):
        assert hf[w]["neuron_s"] > 0 and hf[w]["cpu_s"] > 0
    for w in ("gpt_forward", "llama_generate"):
        for d in ("neuron", "cpu"):
            assert hf["first_call"][w][d]["first_call_s"] > 0 and hf["first_call"][w][d]["later_call_s"] > 0
    breakdown = hf["first_call"]["gpt_forward"]["neuron_breakdown"]
    assert breakdown["first"]["meta_signatures"] > 0 and breakdown["top_ops_by_extra_host_time"]
    assert {t["group"] for t in res["targets"]} == {"tiny ops", "large ops", "fusion", "end to end", "memory",
                                                    "compiled", "huggingface", "profiler", "lockin",
                                                    "distributed", "sanitizer", "soak", "nki kernels"} | (
        {"fusion, AVX2 path forced"} if avx2 else set()) | (
        {"end to end, AVX2 path forced", "compiled, AVX2 path forced"} if forced else set())

    md = (tmp_path / "RESULTS.md").read_text()
    assert "Smoke run" in md and "Where the time goes" in md and "## torch.compile" in md
    assert "## Adaptive eager in training" in md and "fused tasks per step/token" in md
    assert "NKI kernels on the emulator" in md and "## Hugging Face models" in md
    assert "## torch.distributed all_reduce" in md and "## Sanitizers' cost" in md and "## Soak" in md
    assert all(r["equal_results"] and r["neuron_s"] > 0 for r in res["distributed"]["all_reduce"]["sizes"].values())
    for png in ("tiny_ops.png", "large_ops.png", "end_to_end.png", "nki_kernels.png", "compiled.png",
                "huggingface.png"):
        assert (tmp_path / png).stat().st_size > 0

    # --merge: one group rerun into these results, the others kept, the rerun named in the report
    r = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "run.py"), "--smoke", "--only", "tiny_ops",
                        "--merge", "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": ROOT}, timeout=TIMEOUT_S)
    assert r.returncode == 0, r.stderr[-3000:]
    merged = json.loads((tmp_path / "results.json").read_text())
    assert merged["nki_kernels"] == res["nki_kernels"] and merged["tiny_ops"] != res["tiny_ops"]
    assert [x["groups"] for x in merged["rerun"]] == [["tiny_ops"]]
    assert {t["group"] for t in merged["targets"]} == {t["group"] for t in res["targets"]}
    assert "Rerun later with `--only tiny_ops --merge`" in (tmp_path / "RESULTS.md").read_text()
