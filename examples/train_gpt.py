#!/usr/bin/env python
"""Train a small character-level GPT on the ``neuron`` device, then the same
model from the same seed on the CPU, and compare.

    python examples/train_gpt.py                     # neuron, then CPU reference
    python examples/train_gpt.py --device cpu --steps 100 --no-compare-cpu
    python examples/train_gpt.py --profile           # profile a few steps, write the explorer's report

Outputs (in ``--out``, default ``artifacts/``): ``loss_curve.png`` (device and
CPU curves plus their relative difference), ``summary.json``, and one
checkpoint per run (``gpt_<device>_step<N>.pt``, reloadable on any device with
``--resume``).  With ``--profile``, only a few steps run, under torch.profiler:
``profile/trace.json`` and the explorer's report ``profile/report.html``
(torchneuron.explorer) are written instead.  The text is generated procedurally (examples/gpt_model.py:
make_corpus); nothing is downloaded.  See gpt_model.py for how device/CPU
parity is kept (CPU-side seeding) and how peak memory is measured.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_model as gm  # noqa: E402


def parse_args(argv=None):
    d_m, d_t = gm.GPTConfig(), gm.TrainConfig()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--device", default="neuron", help="device to train on")
    p.add_argument("--steps", type=int, default=d_t.steps, help="training steps")
    p.add_argument("--compare-cpu", action=argparse.BooleanOptionalAction, default=True,
                   help="after the device run, train the same model from the same seed on the CPU")
    p.add_argument("--out", default="artifacts", help="output directory")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--compile", action="store_true",
                   help='torch.compile the model (backend "neuron" on neuron; Inductor for the CPU reference)')
    p.add_argument("--batch-size", type=int, default=d_t.batch_size)
    p.add_argument("--block-size", type=int, default=d_m.block_size, help="context length")
    p.add_argument("--d-model", type=int, default=d_m.d_model)
    p.add_argument("--n-layer", type=int, default=d_m.n_layer)
    p.add_argument("--n-head", type=int, default=d_m.n_head)
    p.add_argument("--dropout", type=float, default=d_m.dropout,
                   help="> 0 uses each device's own generator, so device and CPU curves then differ")
    p.add_argument("--attention", choices=["explicit", "sdpa"], default=d_m.attention,
                   help="explicit matmul+mask+softmax, or F.scaled_dot_product_attention")
    p.add_argument("--lr", type=float, default=d_t.lr, help="peak learning rate")
    p.add_argument("--warmup-steps", type=int, default=d_t.warmup_steps)
    p.add_argument("--grad-clip", type=float, default=d_t.grad_clip)
    p.add_argument("--optimizer", choices=["foreach", "fused", "forloop"], default=d_t.optimizer_impl,
                   help="AdamW implementation")
    p.add_argument("--resume", metavar="CKPT", help="continue from a checkpoint for --steps more steps "
                   "(loaded with map_location=<device>; the CPU reference resumes from it too)")
    p.add_argument("--text", metavar="FILE", help="train on this UTF-8 text instead of the generated corpus")
    p.add_argument("--sample-chars", type=int, default=160, help="length of the sampled text")
    p.add_argument("--target", choices=["trn2", "trn3"],
                   help="model the device run on Trainium (the twin, docs/target.md; also TORCHNEURON_TARGET): "
                        "modelled step time, compiles and cost in the summary")
    p.add_argument("--usd-per-hour", type=float,
                   help="with --target: your price of the instance per hour, for the modelled cost")
    p.add_argument("--instance", default="trn2.48xlarge",
                   help="with --usd-per-hour: the instance the price is for (docs/target.md)")
    p.add_argument("--data-parallel", type=int, default=1,
                   help="with --target: replicas (one per logical core) for the modelled time and cost")
    p.add_argument("--profile", action="store_true",
                   help="instead of the full run, profile a few training steps with torch.profiler and write "
                        "the explorer's report (OUT/profile/report.html)")
    p.add_argument("--profile-steps", type=int, default=3,
                   help="steps recorded by --profile, after one skipped and one warm-up step")
    return p.parse_args(argv)


def parse_device(name: str) -> torch.device:
    """torch.device(name), exiting with a clear message if it cannot be used."""
    try:
        device = torch.device(name)
        torch.empty(1, device=device)
        return device
    except Exception as e:  # noqa: BLE001 - report any failure the same way
        hint = ""
        if name.split(":")[0] == "neuron":
            hint = ("\nThe torchneuron backend is not installed or not built "
                    "(see README.md), or TORCH_DEVICE_BACKEND_AUTOLOAD=0 is set. "
                    "Use --device cpu to run the demo on the CPU only.")
        sys.exit(f"error: cannot use device {name!r}: {e}{hint}")


def max_rel_diff(a: list[float], b: list[float]) -> float:
    return max((abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b)), default=0.0)


def plot_losses(path: str, runs: list[gm.TrainResult], n_layer: int) -> None:
    """Loss per step (a resumed run includes the checkpoint's history)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    two = len(runs) == 2
    fig, axes = plt.subplots(2 if two else 1, 1, figsize=(8, 6.5 if two else 4.5),
                             sharex=True, squeeze=False,
                             gridspec_kw={"height_ratios": [3, 1]} if two else None)
    ax = axes[0][0]
    styles = [dict(lw=2.0, color="tab:orange"), dict(lw=1.0, ls="--", color="tab:blue")]
    labels = [runs[0].device, "cpu (reference)"]
    for run, style, label in zip(runs, styles, labels):
        steps = range(1, len(run.losses) + 1)
        ax.plot(steps, run.losses, label=f"{label} ({run.tokens_per_s:,.0f} tok/s)", **style)
    ax.set_ylabel("training loss (cross-entropy, nats)")
    ax.set_title("char-level GPT: {} layers, {:,} parameters".format(
        n_layer, runs[0].n_params))
    ax.grid(alpha=0.3)
    ax.legend()
    if two:
        a, b = runs
        rel = [abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a.losses, b.losses)]
        ax2 = axes[1][0]
        steps = range(1, len(rel) + 1)
        ax2.plot(steps, [max(r, 1e-12) for r in rel], color="tab:green", lw=1.0,
                 label="relative difference (0 drawn as 1e-12)")
        ax2.set_yscale("log")
        ax2.axhline(1e-5, color="tab:red", ls=":", lw=1.0, label="1e-5 (test tolerance)")
        ax2.set_ylabel(f"|{a.device} - {b.device}| / {b.device}")
        ax2.legend(loc="center right", fontsize="small")
        ax2.grid(alpha=0.3)
    axes[-1][0].set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def sample_lines(model: gm.GPT, tok: gm.CharTokenizer, n_chars: int, seed: int) -> dict:
    prompt = "ada said: "
    prompt = "".join(c for c in prompt if c in tok.stoi) or tok.chars[0]
    greedy = gm.generate(model, tok.encode(prompt), n_chars, greedy=True)
    g = torch.Generator().manual_seed(seed)
    sampled = gm.generate(model, tok.encode(prompt), n_chars, temperature=0.8, generator=g)
    return {"prompt": prompt, "greedy": tok.decode(greedy), "sampled (T=0.8)": tok.decode(sampled)}


def checkpoint_roundtrip(path: str, model: gm.GPT, tok: gm.CharTokenizer) -> float:
    """Reload the device checkpoint on the CPU (map_location) and compare logits."""
    cpu_model, _, _ = gm.load_checkpoint(path, "cpu")
    cpu_model.eval()
    model.eval()
    device = next(model.parameters()).device
    ids = torch.tensor([tok.encode(gm.make_corpus()[: model.cfg.block_size])], dtype=torch.long)
    with torch.no_grad():
        ref = model(ids.to(device))[0].cpu()
        got = cpu_model(ids)[0]
    model.train()
    return float((ref - got).abs().max())


def release(device: torch.device) -> None:
    gc.collect()
    if device.type != "cpu":
        torch.accelerator.synchronize(device)
        torch.accelerator.empty_cache()


def profile_training(args, device: torch.device, mc: gm.GPTConfig, tc: gm.TrainConfig, text) -> str:
    """Train a few steps under torch.profiler (host operators with their Python
    stacks and memory; device activities on neuron), write the trace and the
    explorer's report of it, and return the report's path."""
    from torch.profiler import ProfilerActivity, profile, schedule

    import torchneuron.explorer

    out_dir = os.path.join(args.out, "profile")
    os.makedirs(out_dir, exist_ok=True)
    trace_path = os.path.join(out_dir, "trace.json")
    activities = [ProfilerActivity.CPU]
    if device.type == "neuron":
        activities.append(ProfilerActivity.PrivateUse1)
    # Step 0 (first calls: meta passes, caches) is skipped, step 1 warms the profiler up.
    tc.steps = 2 + args.profile_steps

    def export(p):
        p.export_chrome_trace(trace_path)
        import torchneuron.target as target

        if target.active():  # the Trainium twin's account of the profiled steps, for the explorer
            target.add_to_trace(trace_path, steps=args.profile_steps)
    with profile(activities=activities, schedule=schedule(skip_first=1, wait=0, warmup=1, active=args.profile_steps, repeat=1),
                 on_trace_ready=lambda p: export(p),
                 record_shapes=True, profile_memory=True, with_stack=True) as prof:
        gm.train(device, seed=args.seed, model_config=mc, train_config=tc, text=text,
                 keep_model=False, on_step=lambda step: prof.step())
    title = f"train_gpt.py on {device}, {args.profile_steps} steps"
    return torchneuron.explorer.report(trace_path, os.path.join(out_dir, "report.html"), title=title)


def main(argv=None) -> int:
    args = parse_args(argv)
    device = parse_device(args.device)
    os.makedirs(args.out, exist_ok=True)

    text = None
    if args.text:
        with open(args.text, encoding="utf-8") as f:
            text = f.read()
    mc = gm.GPTConfig(block_size=args.block_size, n_layer=args.n_layer, n_head=args.n_head,
                      d_model=args.d_model, dropout=args.dropout, attention=args.attention)
    tc = gm.TrainConfig(steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                        warmup_steps=args.warmup_steps, grad_clip=args.grad_clip,
                        optimizer_impl=args.optimizer, compile=args.compile)
    start_step = 0
    if args.resume:
        start_step = torch.load(args.resume, map_location="cpu", weights_only=True)["step"]

    tok, train_ids, val_ids = gm.load_dataset(text)
    print(f"torch {torch.__version__} | device {device} | threads {torch.get_num_threads()} | seed {args.seed}")
    print(f"text: {len(train_ids) + len(val_ids):,} chars ({'file ' + args.text if args.text else 'generated corpus'}), "
          f"vocab {tok.vocab_size}, train/val {len(train_ids):,}/{len(val_ids):,}")
    print(f"model: {mc.n_layer} layers, d_model {mc.d_model}, {mc.n_head} heads, context {mc.block_size}, "
          f"dropout {mc.dropout}, attention {mc.attention}")
    twin = None
    if device.type == "neuron":
        import torchneuron.target as target

        twin = target.enable(args.target) if args.target else target.active()
    if args.profile:
        print(f"profiling {args.profile_steps} training steps x batch {tc.batch_size} x {mc.block_size} "
              f"(after one skipped and one warm-up step)")
        report = profile_training(args, device, mc, tc, text)
        print(f"profile report: {os.path.abspath(report)}")
        return 0
    print(f"training: {tc.steps} steps x batch {tc.batch_size} x {mc.block_size} = "
          f"{tc.steps * tc.batch_size * mc.block_size:,} tokens, AdamW({tc.optimizer_impl}) "
          f"lr {tc.lr} warmup {tc.warmup_steps} + cosine, grad clip {tc.grad_clip}"
          + (f", resuming from {args.resume} (step {start_step})" if args.resume else ""))

    def run(dev: torch.device, tag: str) -> tuple[gm.TrainResult, str]:
        ckpt = os.path.join(args.out, f"gpt_{tag}_step{start_step + tc.steps}.pt")
        return gm.train(dev, seed=args.seed, model_config=mc, train_config=tc, text=text,
                        progress=True, desc=f"train on {dev}", checkpoint_path=ckpt,
                        resume_from=args.resume), ckpt

    # --- device run -----------------------------------------------------------
    with (target.measure(steps=tc.steps) if twin else contextlib.nullcontext()) as window:
        res_dev, ckpt_dev = run(device, device.type)
    print(f"{device}: {res_dev.n_params:,} parameters, final loss {res_dev.losses[-1]:.4f}, "
          f"val loss {res_dev.val_loss:.4f}, {res_dev.elapsed_s:.1f} s; checkpoint {ckpt_dev}")
    dlogits = checkpoint_roundtrip(ckpt_dev, res_dev.model, tok)
    print(f"checkpoint reloaded with torch.load(map_location='cpu'): max |logits difference| = {dlogits:.2e}")
    samples = sample_lines(res_dev.model, tok, args.sample_chars, args.seed)
    res_dev.model = res_dev.optimizer = None
    release(device)

    runs = [res_dev]
    # --- CPU reference ----------------------------------------------------------
    if args.compare_cpu:
        res_cpu, ckpt_cpu = run(torch.device("cpu"), "cpu_reference")
        res_cpu.model = res_cpu.optimizer = None
        print(f"cpu: final loss {res_cpu.losses[-1]:.4f}, val loss {res_cpu.val_loss:.4f}, "
              f"{res_cpu.elapsed_s:.1f} s; checkpoint {ckpt_cpu}")
        runs.append(res_cpu)

    # --- outputs ------------------------------------------------------------------
    png = os.path.join(args.out, "loss_curve.png")
    plot_losses(png, runs, mc.n_layer)

    print()
    print("sampled text from the model trained on", device)
    for k, v in samples.items():
        if k != "prompt":
            print(f"  {k:>15}: {v.replace(chr(10), ' / ')}")

    print()
    names = [r.device for r in runs]
    if len(runs) == 2:
        names[1] = "cpu (reference)"
    rows = [("tokens / s", [f"{r.tokens_per_s:,.0f}" for r in runs]),
            ("wall time", [f"{r.elapsed_s:.1f} s" for r in runs]),
            ("peak memory", [gm.fmt_bytes(r.peak_memory_bytes) for r in runs]),
            ("  (measured as)", [r.peak_memory_kind for r in runs]),
            ("final loss", [f"{r.losses[-1]:.6f}" for r in runs]),
            ("val loss", [f"{r.val_loss:.6f}" for r in runs])]
    gm.print_table(names, rows)
    summary = {
        "torch_version": torch.__version__,
        "threads": torch.get_num_threads(),
        "seed": args.seed,
        "model_config": vars(mc) | {"vocab_size": tok.vocab_size},
        "train_config": {k: v for k, v in vars(tc).items()},
        "start_step": start_step,
        "tokens_per_step": tc.batch_size * mc.block_size,
        "runs": {name: r.summary() for name, r in zip(("device", "cpu_reference"), runs)},
        "samples": samples,
        "checkpoint_roundtrip_max_abs_logit_diff": dlogits,
        "loss_curve_png": png,
    }
    if len(runs) == 2:
        new_dev, new_cpu = runs[0].losses[start_step:], runs[1].losses[start_step:]
        rel = max_rel_diff(new_dev, new_cpu)
        summary["max_relative_loss_difference"] = rel
        print(f"max relative loss difference {runs[0].device} vs cpu over {len(new_dev)} steps: {rel:.2e}")
        if runs[0].tokens_per_s > 0 and runs[1].tokens_per_s > 0:
            print(f"throughput {runs[0].device}/cpu: {runs[0].tokens_per_s / runs[1].tokens_per_s:.2f}x")
    if twin:
        from torchneuron.target import report

        workload = report.workload(window.summary, tokens_per_step=summary["tokens_per_step"],
                                   data_parallel=args.data_parallel, usd_per_hour=args.usd_per_hour,
                                   instance=args.instance if args.usd_per_hour is not None else None)
        summary["target"] = window.summary | {"workload": workload}
        print()
        print(report.render(window.summary, workload))
    js = os.path.join(args.out, "summary.json")
    with open(js, "w") as f:
        json.dump(summary, f, indent=2, default=str)
    print(f"loss curve: {png}\nsummary:    {js}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
