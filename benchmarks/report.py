"""Turns results into the targets table, PNG plots and RESULTS.md."""

from __future__ import annotations

import os

from . import distributed, flex_attention, lockin, nki_library, profiler, sanitizer, soak, torchtitan_step
from .common import fmt_bytes, fmt_time
from .large_ops import CHAINS
from .tiny_ops import STEPS_OF_TWO

TINY_MAX, LARGE_MIN, E2E_MIN, RESERVED_MAX, COMPILED_MIN = 1.5, 0.95, 1.0, 1.3, 1.0
HF_MIN, FIRST_CALL_MAX = 1.0, 2.0
NKI_OVER_TORCH_MAX = 3.0  # the emulator within 3x of PyTorch's own CPU time
CHAIN_MIN, CHAIN_BW_MIN = 2.0, 0.7
DEPENDENT_STEP_MAX = 1.1  # the target: a dependent chain of tiny operators at most 1.1x the CPU's time
AVX2_FORCED = "AVX2 path forced"  # large_ops.run_avx2_path, run._forced_avx2
AVX2_GROUP = f"fusion, {AVX2_FORCED}"
FORCED_AVX2_NOTE = ("The same workloads on the AVX2 path, forced on this AVX-512 host as a user forces it "
                    "(`ATEN_CPU_CAPABILITY=avx2`, in a process of its own): ATen's kernels, the device's own "
                    "loops and Inductor's generated code all at AVX2.")
ANALYSIS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "analysis.md")


def targets(res: dict) -> list[dict]:
    rows = []

    def add(group, name, figure, value, threshold, ok):
        rows.append({"group": group, "name": name, "figure": figure, "value": value,
                     "threshold": threshold, "met": bool(ok)})

    for op, r in res.get("tiny_ops", {}).get("ops", {}).items():
        limit = DEPENDENT_STEP_MAX if op == "dependent_step" else TINY_MAX
        per = "step" if op in STEPS_OF_TWO else "op"
        add("tiny ops", op, f"neuron completed time / CPU time per {per}", r["ratio_completed"],
            f"<= {limit}", r["ratio_completed"] <= limit)
    def fusion(group, op, r):  # adaptive eager's own targets
        add(group, op, "fused neuron speed / CPU speed", r["speed_vs_cpu"], f">= {CHAIN_MIN}",
            r["speed_vs_cpu"] >= CHAIN_MIN)
        frac = r.get("fraction_of_triad_alongside", r["neuron_fraction_of_bandwidth"])
        add(group, op, "fraction of triad bandwidth (ideal bytes; triad timed alongside)", frac,
            f">= {CHAIN_BW_MIN}", frac >= CHAIN_BW_MIN)

    for op, r in res.get("large_ops", {}).items():
        add("large ops", op, "neuron speed / CPU speed", r["speed_vs_cpu"], f">= {LARGE_MIN}",
            r["speed_vs_cpu"] >= LARGE_MIN)
        if op.startswith(CHAINS):
            fusion("fusion", op, r)
    for op, r in res.get("large_ops_avx2", {}).items():
        fusion(AVX2_GROUP, op, r)
    for key, group in (("end_to_end", "end to end"), ("end_to_end_avx2", f"end to end, {AVX2_FORCED}")):
        for w, r in res.get(key, {}).items():
            if w.endswith("_train_step"):
                add(group, w, "neuron speed / CPU speed", r["speed_vs_cpu"], f">= {E2E_MIN}",
                    r["speed_vs_cpu"] >= E2E_MIN)
    rows += compiled_targets(res) + compiled_targets(res, avx2=True)
    rows += profiler.targets(res) + lockin.targets(res) + distributed.targets(res)
    rows += sanitizer.targets(res) + soak.targets(res)
    hf = res.get("huggingface", {})
    for w, r in hf.items():
        if "speed_vs_cpu" in r:
            add("huggingface", w, "neuron speed / CPU speed", r["speed_vs_cpu"], f">= {HF_MIN}",
                r["speed_vs_cpu"] >= HF_MIN)
    for w, r in hf.get("first_call", {}).items():
        if isinstance(r, dict) and "ratio_first_call" in r:
            add("huggingface", f"first_call_{w}", "neuron first call / CPU first call (fresh processes)",
                r["ratio_first_call"], f"<= {FIRST_CALL_MAX}", r["ratio_first_call"] <= FIRST_CALL_MAX)
    for k, r in res.get("nki_kernels", {}).items():
        add("nki kernels", k, "emulator steady state / PyTorch's faster CPU time (bf16 or fp32)",
            r["replay_over_torch_cpu"], f"<= {NKI_OVER_TORCH_MAX}", r["replay_over_torch_cpu"] <= NKI_OVER_TORCH_MAX)
    for w, r in res.get("memory", {}).items():
        add("memory", w, "max_memory_reserved / max_memory_allocated", r["reserved_over_allocated"],
            f"<= {RESERVED_MAX}", r["reserved_over_allocated"] <= RESERVED_MAX)
    return rows


def compiled_targets(res: dict, avx2: bool = False) -> list[dict]:
    """Compiled neuron (the better of default and reduce-overhead) at least as
    fast as Inductor on the CPU backend, per workload (``avx2``: both on the
    forced AVX2 path)."""
    return [{"group": f"compiled, {AVX2_FORCED}" if avx2 else "compiled", "name": w,
             "figure": "compiled neuron speed / Inductor CPU speed",
             "value": r["best_speed_vs_cpu_inductor"], "threshold": f">= {COMPILED_MIN}",
             "met": bool(r["best_speed_vs_cpu_inductor"] >= COMPILED_MIN)}
            for w, r in res.get("compiled_avx2" if avx2 else "compiled", {}).get("workloads", {}).items()]


# -- plots ---------------------------------------------------------------------------

def plots(res: dict, out: str) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []

    def save(fig, name):
        fig.tight_layout()
        fig.savefig(os.path.join(out, name), dpi=110)
        plt.close(fig)
        made.append(name)

    if "tiny_ops" in res:
        ops = res["tiny_ops"]["ops"]
        names = list(ops)
        fig, ax = plt.subplots(figsize=(9, 4))
        w = 0.27
        for i, (key, label) in enumerate((("cpu_s", "CPU"), ("neuron_enqueue_s", "neuron enqueue"),
                                          ("neuron_completed_s", "neuron completed"))):
            ax.bar([j + (i - 1) * w for j in range(len(names))], [ops[n][key] * 1e6 for n in names], w,
                   label=label)
        ax.set_xticks(range(len(names)), names)
        ax.set_yscale("log")
        ax.set_ylabel("time per operator (us, log)")
        ax.set_title("Tiny tensors: time per operator")
        ax.legend()
        save(fig, "tiny_ops.png")

    def ratio_plot(group, name, title, line):
        data = res[group]
        names = [n for n in data if "speed_vs_cpu" in data[n]]
        fig, ax = plt.subplots(figsize=(9, 4))
        vals = [data[n]["speed_vs_cpu"] for n in names]
        ax.bar(names, vals, color=["tab:green" if v >= line else "tab:red" for v in vals])
        ax.axhline(1.0, color="black", lw=0.8)
        ax.axhline(line, color="gray", ls="--", lw=0.8, label=f"target {line}")
        ax.set_ylabel("neuron speed / CPU speed")
        ax.set_title(title)
        ax.tick_params(axis="x", rotation=20)
        ax.legend()
        save(fig, name)

    if "nki_kernels" in res:
        save(_nki_kernels_plot(res["nki_kernels"], plt), "nki_kernels.png")
    if "compiled" in res:
        ws = res["compiled"]["workloads"]
        names = list(ws)
        fig, ax = plt.subplots(figsize=(9, 4))
        w = 0.27
        for i, (key, label) in enumerate((("compiled_speed_vs_cpu_inductor", "default"),
                                          ("best_speed_vs_cpu_inductor", "best of default / reduce-overhead"),
                                          ("compiled_speed_vs_eager", "default vs eager neuron"))):
            ax.bar([j + (i - 1) * w for j in range(len(names))], [ws[n][key] for n in names], w, label=label)
        ax.axhline(COMPILED_MIN, color="gray", ls="--", lw=0.8)
        ax.set_xticks(range(len(names)), names)
        ax.set_ylabel("speed ratio (higher: compiled neuron faster)")
        ax.set_title("torch.compile: neuron vs Inductor CPU (first two) and vs eager neuron")
        ax.legend(fontsize=8)
        save(fig, "compiled.png")
    if "large_ops" in res:
        ratio_plot("large_ops", "large_ops.png", "Large operators: neuron vs CPU (higher is better)", LARGE_MIN)
    if "end_to_end" in res:
        ratio_plot("end_to_end", "end_to_end.png", "End to end: neuron vs CPU (higher is better)", E2E_MIN)
    if "huggingface" in res:
        ratio_plot("huggingface", "huggingface.png", "Hugging Face models: neuron vs CPU (higher is better)",
                   HF_MIN)
    return made


# -- markdown ------------------------------------------------------------------------

def _table(header, rows) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _met(ok) -> str:
    return "**met**" if ok else "**not met**"


def markdown(res: dict, plot_files: list[str]) -> str:
    m, lim = res["machine"], res["limits"]
    smoke = res["config"]["smoke"]
    s = ["# Benchmarks: `neuron` against the CPU backend\n"]
    isa = (f", the device's own loops on {m['isa']['path']} (the host's highest level: {m['isa']['host']})"
           if "isa" in m else "")
    if smoke:
        s.append("> **Smoke run** (tiny sizes, few repeats): the figures below mean nothing.\n")
    s.append(f"Machine: {m['cpu_model']}, {m['logical_cores']} logical cores ({m['usable_cores']} usable), "
             f"PyTorch {m['torch_version']} ({m['torch_num_threads']} intra-op threads), "
             f"{m['neuron_devices']} emulated NeuronCores{isa}. Date: {m['date']}. Load average (1 min) at start / end: "
             f"{m['loadavg_start'][0]:.1f} / {res.get('loadavg_end', [float('nan')])[0]:.1f} (a shared machine: "
             "other processes compete for the cores). "
             f"Suite time: {res['elapsed_s']:.0f} s. Command: `.venv/bin/python benchmarks/run.py"
             f"{' --smoke' if smoke else ''}`. Every figure is a median over {res['config']['repeats']} "
             "repeats (devices alternating, same process); all figures are in `results.json`.\n")
    for r in res.get("rerun", []):
        s.append(f"Rerun later with `--only {' --only '.join(r['groups'])} --merge` (replacing those groups): "
                 f"{r['date']}, {r['cpu_model']}, load average (1 min) at start / end "
                 f"{r['loadavg_start'][0]:.1f} / {r['loadavg_end'][0]:.1f}.\n")

    s.append("## Targets\n")
    rows = [(t["group"], t["name"], t["figure"], f"{t['value']:.2f}", t["threshold"], _met(t["met"]))
            for t in res["targets"]]
    s.append(_table(["group", "benchmark", "figure", "measured", "target", ""], rows))
    by_group = {}
    for t in res["targets"]:
        by_group.setdefault(t["group"], []).append(t["met"])
    s.append("Summary: " + "; ".join(f"{g}: {sum(v)}/{len(v)} met" for g, v in by_group.items()) + ".\n")

    s.append("## Machine limits (CPU backend)\n")
    tr, mm = lim["triad"], lim["matmul"]
    s.append(f"* Memory bandwidth, STREAM triad on {tr['elements'] // 2**20}M float32 "
             f"({fmt_bytes(tr['bytes'])} moved per call): **{tr['gbytes_per_s']:.1f} GB/s** best "
             f"({tr['gbytes_per_s_median']:.1f} GB/s median).\n"
             f"* float32 matmul {mm['n']}x{mm['n']}: **{mm['gflops']:.0f} GFLOP/s** best "
             f"({mm['gflops_median']:.0f} median).\n")

    if "tiny_ops" in res:
        t = res["tiny_ops"]
        s.append(f"## Tiny operators\n\nPer call, from {t['calls_per_sample']} calls in a Python loop on "
                 "tensors of 8 elements (mm: 16x16). *Enqueue*: the host returned from the calls; "
                 "*completed*: calls + synchronize. `dependent_step` (`a = a * 0.999 + b`, each step "
                 "reading the last) and `independent_step` (`x * 0.999 + b`) are steps of two operators, "
                 "timed per step. *CPU time*: the process's CPU time (all its threads) for the completed "
                 "calls over the CPU backend's, the cost to the cores whatever else runs on them.\n")
        rows = [(n, fmt_time(r["cpu_s"]), fmt_time(r["neuron_enqueue_s"]), fmt_time(r["neuron_completed_s"]),
                 f"{r['ratio_enqueue']:.2f}x", f"{r['ratio_completed']:.2f}x",
                 f"{r['ratio_cpu_time']:.2f}x" if "ratio_cpu_time" in r else "-") for n, r in t["ops"].items()]
        s.append(_table(["op", "CPU", "neuron enqueue", "neuron completed", "enqueue/CPU", "completed/CPU",
                         "CPU time/CPU"], rows))
        if "tiny_ops.png" in plot_files:
            s.append("\n![tiny ops](tiny_ops.png)\n")

    if "large_ops" in res:
        s.append("## Large operators\n\nOne call from an idle device, to completion. Fraction of the "
                 "limit: bandwidth-bound ops against the triad, compute-bound ones against the matmul peak.\n")
        rows = []
        for n, r in res["large_ops"].items():
            if "bytes" in r:
                frac = f"{r['cpu_fraction_of_bandwidth']:.0%} / {r['neuron_fraction_of_bandwidth']:.0%} of BW"
            else:
                frac = f"{r['cpu_fraction_of_peak']:.0%} / {r['neuron_fraction_of_peak']:.0%} of peak"
            rows.append((n, fmt_time(r["cpu_s"]), fmt_time(r["neuron_s"]), f"{r['speed_vs_cpu']:.2f}", frac))
        s.append(_table(["op", "CPU", "neuron", "neuron speed / CPU", "CPU / neuron fraction of limit"], rows))
        chains = [(n, r) for n, r in res["large_ops"].items() if "fraction_of_triad_alongside" in r]
        chains += list(res.get("large_ops_avx2", {}).items())
        if chains:
            s.append("\nFused chains against a triad over the same elements timed beside them, repeat by "
                     "repeat, each the best of three calls in a row (the target's figure). *Ceiling*: the "
                     "fraction the chain could reach if it took no longer than ATen's own kernels of its "
                     "library members (sigmoid, and tanh in chain8) alone, on data in cache, split perfectly "
                     "over both cores: fusion must compute them bit for bit as those kernels do (tanh is the "
                     "CPU's, MKL's: docs/numerics.md). *Path*: the instruction set "
                     "the device's own loops ran on; `avx2` on a host with AVX-512 is that path forced "
                     "(`ATEN_CPU_CAPABILITY=avx2`, in a process of its own).\n")
            rows = [(n, r["isa"]["path"], f"{r['fraction_of_triad_alongside']:.2f}", f"{r['speed_vs_cpu']:.2f}",
                     ", ".join(r.get("library", [])) or "none",
                     f"{r['library_floor_fraction_of_triad']:.2f}" if "library" in r else "-")
                    for n, r in chains]
            s.append(_table(["chain", "path", "fraction of triad", "speed / CPU", "library members", "ceiling"],
                            rows))
        if "large_ops.png" in plot_files:
            s.append("\n![large ops](large_ops.png)\n")

    if "end_to_end" in res:
        e = res["end_to_end"]
        s.append("## End to end (eager)\n")
        g, rn = e["gpt_train_step"]["model"], e["resnet18_train_step"]["model"]
        s.append(f"* `gpt_train_step`: the demo GPT (examples/gpt_model.py; {g['n_params'] / 1e6:.2f}M "
                 f"parameters, {g['n_layer']} layers, d_model {g['d_model']}, context {g['block_size']}, "
                 f"batch {g['batch']}): forward, backward, gradient clipping, AdamW (foreach).\n"
                 f"* `resnet18_train_step`: ResNet-18 in plain torch.nn ({rn['n_params'] / 1e6:.1f}M parameters), "
                 f"batch {rn['batch']} of 3x{rn['hw']}x{rn['hw']}, cross-entropy, SGD with momentum.\n")
        for name, r in e.items():
            if name.endswith("_lm_train_step"):
                lm = r["model"]
                s.append(f"* `{name}`: a word language model as pytorch/examples' word_language_model "
                         f"trains it ({lm['n_params'] / 1e6:.2f}M parameters): embedding {lm['emb']}, "
                         f"{lm['layers']}-layer {lm['rnn_type']} of {lm['hidden']}, linear decoder over "
                         f"{lm['vocab']} words; {lm['bptt']} steps of batch {lm['batch']}, the hidden state "
                         "carried over (detached), cross-entropy, gradient clipping at 0.25, SGD.\n")
        s.append("* `gpt_infer_batch1_token`: the GPT on one sequence, one forward per token, the next "
                 "token read back to the host (argmax + `.item()`): latency-bound.\n")
        def fused(r):  # per step, or per token for token generation
            if "fused_tasks_per_step" not in r:
                return "-"
            per = r.get("tokens_per_sample", 1)
            return f"{r['fused_tasks_per_step'] / per:.3g} of {r['fused_ops_per_step'] / per:.3g} ops"
        rows = [(n, fmt_time(r["cpu_s"]), fmt_time(r["neuron_s"]), f"{r['speed_vs_cpu']:.2f}", fused(r))
                for n, r in e.items()]
        s.append(_table(["workload", "CPU per step/token", "neuron per step/token", "neuron speed / CPU",
                         "fused tasks per step/token"], rows))
        if "end_to_end_avx2" in res:
            s.append(f"\n{FORCED_AVX2_NOTE}\n\n")
            s.append(_table(["workload", "CPU per step/token", "neuron per step/token", "neuron speed / CPU"],
                            [(n, fmt_time(r["cpu_s"]), fmt_time(r["neuron_s"]), f"{r['speed_vs_cpu']:.2f}")
                             for n, r in res["end_to_end_avx2"].items()]))
        if "end_to_end.png" in plot_files:
            s.append("\n![end to end](end_to_end.png)\n")

    if "fusion_workloads" in res:
        s.append("## Adaptive eager in training\n")
        s.append("The demo GPT's training step, a transformer block of it (its activations: batch 32, context 64, d_model 128) "
                 "and an LSTM cell written as its equations (batch 64, hidden 512, 8 steps), forward and "
                 "backward (benchmarks/fusion_workloads.py). Fused tasks: in one step, from the fuser's "
                 "counters. Times: medians of repeats interleaving fusion on, off and the CPU.\n")
        rows = [(n, f"{r['fused_tasks_per_step']} of {r['fused_ops_per_step']} ops",
                 str(r["elided_intermediates_per_step"]), fmt_time(r["neuron_s"]), fmt_time(r["neuron_fusion_off_s"]),
                 f"{r['fusion_speedup']:.2f}", fmt_time(r["cpu_s"]), f"{r['speed_vs_cpu']:.2f}")
                for n, r in res["fusion_workloads"].items()]
        s.append(_table(["workload", "fused tasks per step", "never written", "neuron", "fusion off",
                         "on / off speed", "CPU", "neuron speed / CPU"], rows))

    if "huggingface" in res:
        s.append(huggingface_markdown(res["huggingface"], "huggingface.png" in plot_files))

    if "compiled" in res:
        s.append(compiled_markdown(res["compiled"], "compiled.png" in plot_files))
    if "compiled_avx2" in res:
        s.append(f"{FORCED_AVX2_NOTE}\n\n")
        s.append(_table(["workload", "Inductor CPU", "compiled neuron", "reduce-overhead", "best / Inductor CPU"],
                        [(w, *(fmt_time(r[v]["s"]) for v in ("cpu_inductor", "neuron_compiled",
                                                            "neuron_reduce_overhead")),
                          f"{r['best_speed_vs_cpu_inductor']:.2f}")
                         for w, r in res["compiled_avx2"]["workloads"].items()]))

    if "memory" in res:
        s.append("## Memory\n\nPeak over building the model and running a few steps. neuron: the device "
                 "allocator (after `empty_cache` and `reset_peak_memory_stats`). CPU: growth of the "
                 "process's peak resident set (VmHWM reset through /proc/self/clear_refs, after "
                 "malloc_trim; page-granular, counts allocator slack and Python objects too).\n")
        rows = [(n, fmt_bytes(r["cpu_peak_bytes"]), fmt_bytes(r["neuron_peak_allocated_bytes"]),
                 fmt_bytes(r["neuron_peak_reserved_bytes"]), f"{r['reserved_over_allocated']:.2f}")
                for n, r in res["memory"].items()]
        s.append(_table(["workload", "CPU peak RSS growth", "neuron max allocated", "neuron max reserved",
                         "reserved / allocated"], rows))

    if "profile" in res:
        p = res["profile"]
        c = p["components"]
        s.append("## Where the time goes\n\nGPT training step on neuron, host path.\n")
        s.append(f"* {c['ops_per_step']} device operators per step. Host issue time of a step (from an idle "
                 f"device, not waiting): **{fmt_time(c['host_issue_s'])}**, i.e. "
                 f"**{c['host_us_per_op']:.1f} us of host time per operator**; completed step: "
                 f"{fmt_time(c['completed_s'])} (device tail after the host returned: "
                 f"{fmt_time(c['device_tail_s'])}); the CPU backend's step: {fmt_time(c['cpu_step_s'])}.\n")
        bound = "host" if c["host_issue_s"] > 0.7 * c["completed_s"] else "device"
        s.append(f"* The step is **{bound}-bound**: the host spends "
                 f"{c['host_issue_s'] / c['completed_s']:.0%} of the completed step time issuing.\n")
        s.append("\ncProfile (Python side, per step; builtins are the calls into ATen/the extension):\n\n")
        s.append(_table(["function", "calls/step", "own time/step", "share"],
                        [(f"`{r['function']}`", f"{r['calls_per_step']:g}", fmt_time(r["own_s"]),
                          f"{r['own_fraction']:.0%}") for r in p["cprofile_top"][:10]]))
        if p.get("perf_top"):
            s.append("\n`perf record` of the whole process during 10 steps (own samples, all threads):\n\n")
            s.append(_table(["share", "thread", "library", "symbol"],
                            [(f"{r['percent']:.1f}%", r["thread"], r["dso"], f"`{r['symbol'][:90]}`")
                             for r in p["perf_top"]["top"][:15]]))
    if "nki_kernels" in res:
        s.append(_nki_kernels_md(res["nki_kernels"], plot_files))
    if "nki_library" in res:
        s.append(nki_library.markdown(res["nki_library"]))
    if "profiler" in res:
        p = res["profiler"]
        s.append(f"## torch.profiler's cost\n\nPer call of a tiny `add`, from {p['calls_per_sample']} calls "
                 "synchronised (benchmarks/profiler.py); sessions' start and end outside the timing.\n\n")
        s.append(_table(["run", "per call"], [
            ("neuron, no profiler", fmt_time(p["neuron_off_s"])),
            ("neuron, CPU-only session", fmt_time(p["neuron_cpu_session_s"])),
            ("neuron, session with ProfilerActivity.NEURON", fmt_time(p["neuron_device_session_s"])),
            ("CPU backend, CPU-only session", fmt_time(p["cpu_cpu_session_s"])),
            ("device activities' own cost per task", f"{p['device_activity_cost_us']:.2f} us")]))
    if "lockin" in res:
        a = res["lockin"]["analysis"]
        s.append(f"## torchneuron-lockin\n\n{a['lines']:,} lines of installed transformers and accelerate "
                 f"source analysed at {a['lines_per_second']:,.0f} lines per second: {a['tying_lines']} lines "
                 "tie them to one vendor.\n")
    if "distributed" in res:
        s.append(distributed.markdown(res["distributed"]))
    if "sanitizer" in res:
        s.append(sanitizer.markdown(res["sanitizer"]))
    if "soak" in res:
        s.append(soak.markdown(res["soak"]))
    if "flex_attention" in res:
        s.append(flex_attention.markdown(res["flex_attention"]))
    if "torchtitan" in res:
        s.append(torchtitan_step.markdown(res["torchtitan"]))
    if not smoke and os.path.exists(ANALYSIS):
        with open(ANALYSIS) as f:
            s.append("\n" + f.read())
    return "\n".join(s)


# -- NKI kernels (benchmarks/nki_kernels.py) -------------------------------------------

_NKI_ROWS = (("numpy_replay_s", "emulator, steady state (trace replayed), NumPy arrays"),
             ("numpy_first_s", "emulator, first call (kernel interpreted + trace recorded), NumPy arrays"),
             ("numpy_interpret_s", "emulator, trace cache off (interpreted every call), NumPy arrays"),
             ("neuron_replay_s", "emulator, steady state, `neuron` tensors (one device task)"),
             ("neuron_first_s", "emulator, first call, `neuron` tensors (shape trace + task)"),
             ("numpy_loop_nest_s", "plain NumPy loop nest with the kernel's tiling (one BLAS thread)"))


def _nki_torch_rows(r):
    return [(k, f"PyTorch on the CPU, `{k[len('torch_cpu_'):-2].replace('_', ' ')}`")
            for k in r if k.startswith("torch_cpu_")]


def _nki_kernels_md(res: dict, plot_files: list[str]) -> str:
    s = ["## NKI kernels on the emulator\n\nTime of one call (median). Ratio: that time over the "
         "emulator's steady state on NumPy arrays. The emulator runs bfloat16 tile GEMMs on the host's matrix "
         "unit where it has one (a run of accumulations into one PSUM tile as one pass, on two threads), "
         "others on one BLAS thread; the NumPy loop nest does "
         "them all in float32 BLAS; PyTorch uses its intra-op threads.\n"]
    for name, r in res.items():
        base = r["numpy_replay_s"]
        rows = [(label, fmt_time(r[k]), f"{r[k] / base:.2f}") for k, label in _NKI_ROWS + tuple(_nki_torch_rows(r))]
        gemm = f"; bfloat16 tile GEMMs on {r['bf16_tile_gemm']}" if "bf16_tile_gemm" in r else ""
        s.append(f"\n**{name}** ({r['shape']}{gemm}); emulator vs NumPy loop nest max abs difference "
                 f"{r['max_abs_diff_vs_numpy']:.2g}.\n\n")
        s.append(_table(["variant", "time", "/ emulator steady state"], rows))
        models = [(m, r[f"model_{m}"]) for m in ("trn2", "trn3") if f"model_{m}" in r]
        if models:
            s.append("\nPerformance model (`nki.estimate`, modelled device time, not measured): " + "; ".join(
                f"{m}: {x['latency_us']:.1f} us, MFU {100 * x['mfu']:.0f}%, MBU {100 * x['mbu']:.0f}%, "
                f"{x['bottleneck']}-bound" for m, x in models) + ".\n")
    if "nki_kernels.png" in plot_files:
        s.append("\n![NKI kernels](nki_kernels.png)\n")
    return "\n".join(s)


def _nki_kernels_plot(res: dict, plt):
    fig, axes = plt.subplots(1, len(res), figsize=(11, 4))
    for ax, (name, r) in zip(list(axes) if len(res) > 1 else [axes], res.items()):
        keys = [k for k, _ in _NKI_ROWS] + [k for k, _ in _nki_torch_rows(r)]
        labels = [k[:-2].replace("numpy_", "np ").replace("neuron_", "neuron ").replace("torch_cpu_", "torch ")
                  .replace("_", " ") for k in keys]
        ax.barh(labels, [r[k] * 1e3 for k in keys], color=["tab:blue"] * 5 + ["tab:orange"] +
                ["tab:gray"] * (len(keys) - 6))
        ax.set_xlabel("ms per call")
        ax.set_title(f"{name}: {r['shape']}", fontsize=9)
        ax.invert_yaxis()
    return fig


def compiled_markdown(c: dict, plot: bool) -> str:
    s = ["## torch.compile\n\nSame models, weights and batches in one process: Inductor on the CPU backend "
         "(`backend=\"inductor\"`), eager `neuron`, `backend=\"neuron\"` (default mode) and "
         "`mode=\"reduce-overhead\"` (recorded device work replayed as one task). Per step or inference call, "
         "completed (device synchronised). `train`: compiled forward + AOTAutograd backward + eager SGD; "
         "`infer`: forward under `no_grad`.\n"]
    rows = []
    for w, r in c["workloads"].items():
        t = {v: r[v]["s"] for v in ("cpu_inductor", "neuron_eager", "neuron_compiled", "neuron_reduce_overhead")}
        rows.append((w, *(fmt_time(x) for x in t.values()), f"{r['compiled_speed_vs_cpu_inductor']:.2f}",
                     f"{r['best_speed_vs_cpu_inductor']:.2f}", f"{r['compiled_speed_vs_eager']:.2f}",
                     f"{r['reduce_overhead_speed_vs_default']:.2f}"))
    s.append(_table(["workload", "Inductor CPU", "eager neuron", "compiled neuron", "reduce-overhead",
                     "compiled / Inductor CPU", "best / Inductor CPU", "compiled / eager", "r-o / default"], rows))
    s.append("\nRatios are speeds (higher: the first named is faster).\n")
    host = {w: r["host_per_call_s"] for w, r in c["workloads"].items() if "host_per_call_s" in r}
    if host:
        s.append("\nHost time to issue one call while the device is busy (what the host thread pays):\n\n")
        s.append(_table(["workload", "eager neuron", "compiled (default)", "reduce-overhead"],
                        [(w, *(fmt_time(h[v]) for v in ("neuron_eager", "neuron_compiled", "neuron_reduce_overhead")))
                         for w, h in host.items()]))
    st = c.get("replay_stats", {})
    s.append(f"\nreduce-overhead: {st.get('recordings', 0)} graphs recorded, {st.get('replays', 0)} replays, "
             f"{st.get('not_recordable', 0)} graphs not recordable"
             + "".join(f"; {g}: {why}" for g, why in c.get("replay_reasons", {}).items()) + ".\n")
    lat = c.get("compile_latency")
    if lat:
        s.append(f"\nCompile latency ({lat['workload']}: first training step, compile included), each in a fresh "
                 "process: *cold* with an empty Inductor cache directory, *cached* in a second process reusing it.\n\n")
        s.append(_table(["backend", "cold first call", "cached first call", "cold process total",
                         "cached process total"],
                        [(b, fmt_time(lat[b]["cold"]["first_call_s"]), fmt_time(lat[b]["cached"]["first_call_s"]),
                          fmt_time(lat[b]["cold"]["process_s"]), fmt_time(lat[b]["cached"]["process_s"]))
                         for b in ("neuron", "cpu_inductor")]))
    if plot:
        s.append("\n![compiled](compiled.png)\n")
    return "\n".join(s)


# -- Hugging Face models (benchmarks/huggingface.py) ----------------------------------------

def huggingface_markdown(h: dict, plot: bool) -> str:
    s = ["## Hugging Face models (eager)\n"]
    if "hf_llama_train_step" in h:
        m = h["hf_llama_train_step"]["model"]
        s.append(f"* `hf_llama_train_step`: a random-initialised transformers `LlamaForCausalLM` "
                 f"({m['n_params'] / 1e6:.2f}M parameters, {m['layers']} layers, hidden {m['hidden']}, "
                 f"{m['heads']} heads ({m['kv_heads']} key-value), vocabulary {m['vocab']}), batch {m['batch']} "
                 f"of {m['seq']} tokens: forward with the loss, backward, gradient clipping, AdamW.\n")
    if "minilm_encode" in h:
        m = h["minilm_encode"]["model"]
        s.append(f"* `minilm_encode`: sentence-transformers all-MiniLM-L6-v2, the real weights "
                 f"({m['n_params'] / 1e6:.1f}M parameters), `encode` of {m['sentences']} sentences of 3-30 words "
                 f"in batches of {m['batch_size']} (tokenisation, the transformer, pooling, normalisation).\n")
    rows = [(n, fmt_time(r["cpu_s"]), fmt_time(r["neuron_s"]), f"{r['speed_vs_cpu']:.2f}")
            for n, r in h.items() if "speed_vs_cpu" in r]
    s.append(_table(["workload", "CPU per call", "neuron per call", "neuron speed / CPU"], rows))
    fc = h.get("first_call")
    if fc:
        z = fc["sizes"]
        s.append(f"\nFirst-call latency, each workload and device in a fresh process (device initialised and "
                 f"model moved before the clock starts; the result read back to the host): `gpt_forward`, the "
                 f"demo GPT's forward on a batch of {z['gpt_batch']} under `no_grad`; `llama_generate`, greedy "
                 f"`generate` of {z['new_tokens']} tokens from a {z['prompt']}-token prompt on the Llama above. "
                 "*Later*: the median of the next three calls in the same process. Medians over "
                 f"{fc['processes_per_device']} processes per device.\n\n")
        work = [w for w, r in fc.items() if isinstance(r, dict) and "ratio_first_call" in r]
        s.append(_table(["workload", "CPU first", "CPU later", "neuron first", "neuron later",
                         "neuron first / CPU first"],
                        [(w, fmt_time(fc[w]["cpu"]["first_call_s"]), fmt_time(fc[w]["cpu"]["later_call_s"]),
                          fmt_time(fc[w]["neuron"]["first_call_s"]), fmt_time(fc[w]["neuron"]["later_call_s"]),
                          f"{fc[w]['ratio_first_call']:.2f}") for w in work]))
        for w in work:
            b = fc[w].get("neuron_breakdown")
            if not b:
                continue
            f1, f2 = b["first"], b["second"]
            s.append(f"\nWhere `{w}`'s first call goes on neuron (one more fresh process, the first and second "
                     f"calls profiled alike): first call {fmt_time(f1['s'])}, second {fmt_time(f2['s'])}; inside "
                     f"Python meta kernels {fmt_time(f1['python_meta_s'])} and {fmt_time(f2['python_meta_s'])}; "
                     f"meta-pass signatures learned {f1['meta_signatures']} and {f2['meta_signatures']}. "
                     "Operators with the most extra host time on the first call (torch.profiler, self time):\n\n")
            s.append(_table(["operator", "calls", "first call", "second call", "extra"],
                            [(f"`{o['op']}`", o["calls"], fmt_time(o["first_s"]), fmt_time(o["second_s"]),
                              fmt_time(o["extra_s"])) for o in b["top_ops_by_extra_host_time"][:8]]))
    if plot:
        s.append("\n![Hugging Face models](huggingface.png)\n")
    return "\n".join(s)
