"""Differential ModuleInfo sweep: every ModuleInfo of PyTorch's ``module_db``
on ``neuron`` against the CPU, the module-level twin of tests/opinfo/.

For each ModuleInfo, each dtype among float32, float64 and bfloat16 that the
ModuleInfo lists (``module_info.dtypes``, its CPU dtypes), and training and
eval mode, the samples of ``module_inputs_func`` are generated on the CPU
(seed 0). Per sample:

* the module is built on the CPU from ``constructor_input`` (seed 0), cast to
  the dtype and put in the mode; a deep copy moved with ``.to("neuron")`` has
  the same parameters and buffers (lazy modules are materialised by a first
  forward on each device, checked for shape, dtype and device, and given the
  CPU's values);
* the forward inputs are copied to ``neuron`` with the same values and layout;
* in eval mode, a forward under ``torch.no_grad()`` runs first (the inference
  paths, e.g. the transformer layers' fused kernels, are taken only there);
* forward: outputs, then every parameter and buffer (running statistics) and
  the forward arguments afterwards are compared;
* backward of ``sum(w_i * out_i)`` (fixed random weights, the same on both
  devices): gradients of every input and parameter that requires grad.

Values are compared exactly (``torch.equal``, NaN equal to NaN); no
tolerance exists (``TOLERANCES`` names none).

Modules whose forward draws random numbers (dropout with 0 < p < 1 in
training, RReLU in training, fractional max pooling without fixed samples) are
compared on shape, dtype and device, with the reason listed in the report; the
same samples in eval mode are compared exactly. ``module_db`` has no such
module, so the sweep adds ModuleInfos for the dropout family and RReLU, whose
training-mode outputs are also checked statistically (`check_random_output`).

Both devices raise: pass ("both raise") if they raise at the same stage and
the device's exception is an instance of the CPU's type (what an ``except``
clause sees). Only one raises, or results differ: fail with the message.

Error inputs (``module_error_inputs_func``, forward errors) run as mode
``errors:float32``: the device must raise what the CPU raises.

To stay within CI time, at most ``max_samples`` samples per (module, dtype,
mode) run, evenly spaced over the sample list (first and last included);
``max_samples=0`` runs all of them.

Run standalone:  python -m tests.moduleinfo.sweep [--max-samples N] [--modules nn.Linear,nn.RNN] [--log]
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import sys
import time
import warnings
from collections import defaultdict
from dataclasses import dataclass, field

import torch

try:  # python -m tests.moduleinfo.sweep: tests is a namespace package
    from ..opinfo import sweep as opinfo
except ImportError:  # pytest puts tests/ itself on sys.path: opinfo is a top-level package
    from opinfo import sweep as opinfo

DEVICE = opinfo.DEVICE
SEED = opinfo.SEED
DTYPES = (torch.float32, torch.float64, torch.bfloat16)
MODES = (True, False)  # training, eval
Mismatch = opinfo.Mismatch
sync = opinfo.sync
to_device = opinfo.to_device
flatten = opinfo.flatten
describe_value = opinfo.describe_value
message = opinfo._msg

FAILURES_LISTED = 12  # distinct failure messages per module in REPORT.md
RANDOM_CHECKED = (torch.nn.modules.dropout._DropoutNd, torch.nn.RReLU)  # check_random_output knows them
TOLERANCES = {}  # named tolerances, name -> why: none (every sample is compared exactly)


def mode_name(training: bool, dtype) -> str:
    return f"{'train' if training else 'eval'}:{str(dtype)[6:]}"


# ----------------------------------------------------------------------------- randomness


def random_reason(module: torch.nn.Module):
    """Why `module`'s forward draws random numbers in its current mode, or None."""
    for name, sub in module.named_modules():
        where = f" ({name})" if name else ""
        if isinstance(sub, torch.nn.modules.dropout._DropoutNd) and sub.training and 0 < sub.p < 1:
            return f"{type(sub).__name__}(p={sub.p}) in training mode{where}"
        if isinstance(sub, torch.nn.RReLU) and sub.training:
            return f"RReLU in training mode{where}"
        if isinstance(sub, torch.nn.MultiheadAttention) and sub.training and sub.dropout > 0:
            return f"MultiheadAttention(dropout={sub.dropout}) in training mode{where}"
        if isinstance(sub, (torch.nn.RNNBase,)) and sub.training and sub.dropout > 0 and sub.num_layers > 1:
            return f"{type(sub).__name__}(dropout={sub.dropout}) in training mode{where}"
        if (isinstance(sub, (torch.nn.FractionalMaxPool2d, torch.nn.FractionalMaxPool3d))
                and getattr(sub, "_random_samples", None) is None):
            return f"{type(sub).__name__} without fixed _random_samples{where}"
    return None


def _extra_module_infos():
    """ModuleInfos for the random modules module_db lacks (the dropout family,
    RReLU), so the sweep covers them: exact in eval mode and with p=0 or 1;
    in training mode shape, dtype and device plus `check_random_output`."""
    from torch.testing._internal.common_modules import FunctionInput, ModuleInfo, ModuleInput

    def inputs(shape, ctor_kwargs):
        def module_inputs(module_info, device, dtype, requires_grad, training, **kwargs):
            return [ModuleInput(constructor_input=FunctionInput(**kw),
                                forward_input=FunctionInput(torch.randn(shape, device=device, dtype=dtype,
                                                                        requires_grad=requires_grad)),
                                desc=",".join(f"{k}={v}" for k, v in kw.items()))
                    for kw in ctor_kwargs]
        return module_inputs

    nn = torch.nn
    dropout = [dict(p=0.5), dict(p=0.2), dict(p=0.0), dict(p=1.0)]
    return [
        ModuleInfo(nn.Dropout, module_inputs_func=inputs((32, 64), dropout), train_and_eval_differ=True),
        ModuleInfo(nn.Dropout1d, module_inputs_func=inputs((4, 128, 6), dropout), train_and_eval_differ=True),
        ModuleInfo(nn.Dropout2d, module_inputs_func=inputs((4, 128, 3, 3), dropout), train_and_eval_differ=True),
        ModuleInfo(nn.Dropout3d, module_inputs_func=inputs((4, 128, 2, 2, 2), dropout), train_and_eval_differ=True),
        ModuleInfo(nn.AlphaDropout, module_inputs_func=inputs((32, 64), dropout), train_and_eval_differ=True),
        ModuleInfo(nn.FeatureAlphaDropout, module_inputs_func=inputs((4, 128, 3, 3), dropout),
                   train_and_eval_differ=True),
        ModuleInfo(nn.RReLU, module_inputs_func=inputs((32, 64), [dict(), dict(lower=0.1, upper=0.2)]),
                   train_and_eval_differ=True),
    ]


def check_random_output(module, x, cpu_out, dev_out):
    """Statistics of a random module's training-mode output on the device, for
    the modules `_extra_module_infos` adds (one input, one output). Dropout:
    the dropped fraction is within 6 standard deviations of p (units: elements,
    or channels for the feature variants), dropped elements hold the CPU's
    dropped value, and elements both devices kept are equal. RReLU: elements
    >= 0 equal the CPU's, negative ones are x times slopes in [lower, upper]
    that look uniform (mean, range). Returns a note; raises Mismatch."""
    d, c, x = dev_out.detach().cpu(), cpu_out.detach(), x.detach()
    if isinstance(module, torch.nn.RReLU):
        pos = x >= 0
        if not torch.equal(d[pos], c[pos]):
            raise Mismatch("RReLU: elements >= 0 differ from the cpu's")
        slope = (d[~pos] / x[~pos]).double()
        lo, hi = module.lower * (1 - 1e-6), module.upper * (1 + 1e-6)
        if slope.numel() and not (bool((slope >= lo).all()) and bool((slope <= hi).all())):
            raise Mismatch(f"RReLU: slopes in [{float(slope.min())}, {float(slope.max())}], "
                           f"outside [{module.lower}, {module.upper}]")
        n, width, middle = slope.numel(), module.upper - module.lower, (module.lower + module.upper) / 2
        # Uniform slopes: their mean is within 6 sd of the middle, and they spread over most of the range.
        if n >= 20 and (abs(float(slope.mean()) - middle) > 6 * width / (12 * n) ** 0.5
                        or float(slope.max() - slope.min()) < 0.5 * width):
            raise Mismatch(f"RReLU: {n} slopes with mean {float(slope.mean()):.4f} and range "
                           f"[{float(slope.min()):.4f}, {float(slope.max()):.4f}] are not uniform on "
                           f"[{module.lower}, {module.upper}]")
        return "RReLU: slopes uniform on [lower, upper] (range and mean); elements >= 0 exact"
    p = module.p
    feature = not isinstance(module, (torch.nn.Dropout, torch.nn.AlphaDropout))
    dropped_c, dropped_d = _dropped(c, feature), _dropped(d, feature)
    units = dropped_d.numel()
    frac = float(dropped_d.double().mean())
    bound = 6 * (p * (1 - p) / units) ** 0.5 + 1 / units
    if abs(frac - p) > bound:
        raise Mismatch(f"{type(module).__name__}: dropped fraction {frac:.4f} on neuron, p={p} "
                       f"(allowed +-{bound:.4f} over {units} units)")
    value_c, value_d = _dropped_value(c, dropped_c, feature), _dropped_value(d, dropped_d, feature)
    if value_c is not None and value_d is not None and not value_c == value_d:
        raise Mismatch(f"{type(module).__name__}: dropped elements are {value_d} on neuron, {value_c} on cpu")
    kept = ~_expand_units(dropped_c, c, feature) & ~_expand_units(dropped_d, d, feature)
    diff = opinfo.exact_difference(c[kept], d[kept])
    if diff is not None:
        raise Mismatch(f"{type(module).__name__}: elements kept on both devices differ: {diff}")
    return (f"{type(module).__name__}: dropped fraction within 6 sd of p over {units} units, "
            f"the cpu's dropped value, kept elements exact")


def _dropped(out, feature):
    """Per unit (element, or channel for feature dropout): dropped? The dropped
    value is the most frequent one (0, or alpha dropout's constant)."""
    values, counts = out.flatten().unique(return_counts=True)
    mark = out == values[counts.argmax()]
    return mark.flatten(2).all(-1) if feature else mark


def _expand_units(dropped, out, feature):
    return dropped.reshape(dropped.shape + (1,) * (out.dim() - 2)).expand(out.shape) if feature else dropped


def _dropped_value(out, dropped, feature):
    mask = _expand_units(dropped, out, feature)
    return float(out[mask][0]) if bool(mask.any()) else None


# ----------------------------------------------------------------------------- building and running


def construct(module_info, module_input, dtype, training):
    """The CPU module of a sample, built with a fixed seed, cast and in its mode."""
    ctor = module_input.constructor_input
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        m = module_info.module_cls(*ctor.args, **ctor.kwargs)
    m.to(dtype)
    m.train(training)
    return m


def move_inputs(fwd, device):
    """(args, kwargs) of a ModuleInput's forward_input copied to `device` with the
    same values and layout; PackedSequence keeps its batch_sizes on the host."""
    def move(x):
        if isinstance(x, torch.nn.utils.rnn.PackedSequence):
            return type(x)(move(x.data), x.batch_sizes, move(x.sorted_indices), move(x.unsorted_indices))
        if isinstance(x, torch.Tensor):
            return to_device(x, device)
        if isinstance(x, list):
            return [move(e) for e in x]
        if isinstance(x, tuple) and not hasattr(x, "_fields"):
            return tuple(move(e) for e in x)
        if isinstance(x, dict):
            return {k: move(v) for k, v in x.items()}
        return x
    return move(tuple(fwd.args)), move(dict(fwd.kwargs))


def comparable(x):
    """Outputs as plain structures: a PackedSequence's batch_sizes (always on the
    host) become a list of ints."""
    if isinstance(x, torch.nn.utils.rnn.PackedSequence):
        return (x.data, x.batch_sizes.tolist(), x.sorted_indices, x.unsorted_indices)
    if isinstance(x, list):
        return [comparable(e) for e in x]
    if isinstance(x, tuple) and not hasattr(x, "_fields"):
        return tuple(comparable(e) for e in x)
    if isinstance(x, dict):
        return {k: comparable(v) for k, v in x.items()}
    return x


def output_tensors(out):
    return [o for o in flatten(comparable(out)) if isinstance(o, torch.Tensor)]


def loss_weights(out):
    """Fixed random weights for the floating outputs that require grad (None elsewhere)."""
    g = torch.Generator().manual_seed(SEED)
    return [torch.rand(o.shape, generator=g, dtype=o.dtype) if o.requires_grad and o.is_floating_point() else None
            for o in output_tensors(out)]


@dataclass
class Run:
    """What one device computed for a sample; `error` names the stage that raised."""
    inference: object = None
    output: object = None
    state: dict = None
    arguments: object = None
    grads: dict = None
    error: tuple = None  # (stage, exception)
    differentiable: bool = True


def execute(module, args, kwargs, weights, on_device: bool, inference_first: bool, backward: bool = True) -> Run:
    """Runs the sample's stages on one device. `weights` (CPU tensors, one per
    output tensor) weight the loss; None: make them from this run's outputs."""
    r = Run()
    wait = sync if on_device else (lambda: None)
    stage = "inference forward"
    try:
        if inference_first:
            with torch.no_grad():
                r.inference = comparable(module(*args, **kwargs))
            wait()
        stage = "forward"
        out = module(*args, **kwargs)
        wait()
        r.output = comparable(out)
        r.state = {k: v.detach() for k, v in module.state_dict(keep_vars=True).items()}
        r.arguments = (args, kwargs)
        if not backward:
            return r
        stage = "backward"
        if weights is None:
            weights = loss_weights(out)
        terms = [(o * w.to(o.device)).sum() for o, w in zip(output_tensors(out), weights) if w is not None]
        inputs = {f"input {i}": t for i, t in enumerate(flatten((args, kwargs)))
                  if isinstance(t, torch.Tensor) and t.requires_grad and t.is_leaf}
        params = {f"param {n}": p for n, p in module.named_parameters() if p.requires_grad}
        targets = {**inputs, **params}
        if not terms or not targets:
            r.differentiable = False
            return r
        grads = torch.autograd.grad(sum(terms), list(targets.values()), allow_unused=True)
        wait()
        r.grads = dict(zip(targets, grads))
    except Mismatch:
        raise
    except Exception as e:  # noqa: BLE001
        if on_device:
            with contextlib.suppress(Exception):
                sync()
            torch.neuron.reset_errors()  # errors are sticky: the next sample starts clean
        r.error = (stage, e)
    return r


def compare_runs(cpu: Run, dev: Run, values: bool):
    """Raises Mismatch where `dev` differs from `cpu`; returns True if both
    raised at the same stage, the device an instance of the CPU's exception type."""
    cmp = lambda c, d, what, **kw: opinfo.compare(c, d, what, values=values, exact=True, **kw)  # noqa: E731
    stages = ["inference forward", "forward", "backward"]
    reached_c = stages.index(cpu.error[0]) if cpu.error else len(stages)
    reached_d = stages.index(dev.error[0]) if dev.error else len(stages)
    # Whatever both computed before either raised must agree.
    if min(reached_c, reached_d) > 0 and cpu.inference is not None:
        cmp(cpu.inference, dev.inference, "inference output")
    if min(reached_c, reached_d) > 1:
        cmp(cpu.output, dev.output, "output")
        for k in cpu.state:
            if k not in dev.state:
                raise Mismatch(f"state {k}: missing on neuron")
            cmp(cpu.state[k], dev.state[k], f"state {k}")
        cmp(cpu.arguments, dev.arguments, "arguments after forward", on_device=False, tensors_only=True)
    if cpu.error and dev.error:
        (sc, ec), (sd, ed) = cpu.error, dev.error
        if sc != sd:
            raise Mismatch(f"cpu raises in {sc} ({message(ec, 200)}), neuron in {sd}: {message(ed)}")
        if not isinstance(ed, type(ec)):
            raise Mismatch(f"both raise in {sc}, but neuron's is not a {type(ec).__name__}: neuron {message(ed)}; "
                           f"cpu {message(ec, 200)}")
        return True
    if dev.error:
        raise Mismatch(f"only neuron raises ({dev.error[0]}): {message(dev.error[1])}")
    if cpu.error:
        raise Mismatch(f"only cpu raises ({cpu.error[0]}): {message(cpu.error[1])}")
    if cpu.grads is not None or dev.grads is not None:
        if cpu.grads is None or dev.grads is None or list(cpu.grads) != list(dev.grads):
            raise Mismatch(f"gradient targets differ: neuron {list(dev.grads or {})}, cpu {list(cpu.grads or {})}")
        for k in cpu.grads:
            cmp(cpu.grads[k], dev.grads[k], f"grad of {k}")
    return False


def prepare(module_info, module_input, dtype, training, with_device: bool = True):
    """(cpu module, device module, cpu inputs, device inputs) of a sample; the
    device ones are None without `with_device`."""
    cpu_m = construct(module_info, module_input, dtype, training)
    dev_m = copy.deepcopy(cpu_m).to(DEVICE) if with_device else None
    cpu_in = move_inputs(module_input.forward_input, "cpu")
    dev_in = move_inputs(module_input.forward_input, DEVICE) if with_device else None
    if module_info.is_lazy:
        # The first forward materialises the parameters, initialised from each
        # device's own generator: check what the device made, then give it the CPU's values.
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(SEED)
            cpu_m(*cpu_in[0], **cpu_in[1])
        if with_device:
            with torch.no_grad():
                dev_m(*dev_in[0], **dev_in[1])
            sync()
            opinfo.compare(cpu_m.state_dict(), dev_m.state_dict(), "materialised lazy parameters", values=False)
            dev_m.load_state_dict(cpu_m.state_dict())
            sync()
    return cpu_m, dev_m, cpu_in, dev_in


def run_sample(module_info, module_input, dtype, training, backward=True):
    """Returns (outcome, note): outcome is 'pass', 'both', 'shape'
    or 'forward-only'; raises Mismatch (or anything else) on failure."""
    cpu_m, dev_m, cpu_in, dev_in = prepare(module_info, module_input, dtype, training)
    randomness = random_reason(cpu_m)
    inference_first = not training
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        cpu = execute(cpu_m, *cpu_in, None, on_device=False, inference_first=inference_first, backward=backward)
    weights = loss_weights(cpu.output) if cpu.error is None and backward else None
    sync()
    dev = execute(dev_m, *dev_in, weights, on_device=True, inference_first=inference_first, backward=backward)
    both = compare_runs(cpu, dev, values=randomness is None)
    if both:
        return "both", f"both raise {type(cpu.error[1]).__name__} in {cpu.error[0]}"
    if randomness is not None:
        if isinstance(cpu_m, RANDOM_CHECKED):
            return "shape", f"{randomness}; {check_random_output(cpu_m, cpu_in[0][0], cpu.output, dev.output)}"
        return "shape", randomness
    if backward and not cpu.differentiable:
        return "forward-only", "no output or input requires grad"
    return "pass", None


# ----------------------------------------------------------------------------- results


@dataclass
class ModuleCounts(opinfo.Counts):
    tolerated: int = 0  # passed within a named tolerance
    forward_only: int = 0  # passed, nothing differentiable to compare


@dataclass
class ModuleSweepResult(opinfo.SweepResult):
    counts: dict = field(default_factory=lambda: defaultdict(ModuleCounts))  # (module, mode) -> counts
    tolerated: list = field(default_factory=list)  # dicts: module, mode, sample, desc, note
    notes: dict = field(default_factory=dict)  # (module, note) -> number of samples
    extra_modules: list = field(default_factory=list)  # ModuleInfos this sweep adds to module_db

    def totals(self, mode=None) -> ModuleCounts:
        total = ModuleCounts()
        for (_, m), c in self.counts.items():
            if mode is None or m == mode:
                total.add(c)
        return total

    def failing_modules(self) -> dict:
        out = defaultdict(int)
        for f in self.failures:
            out[f["module"]] += 1
        return dict(sorted(out.items()))


def describe(module_input) -> str:
    """'desc: (constructor arguments)(forward arguments)' on one line."""
    def d(v):
        return f"{type(v).__name__}(...)" if isinstance(v, torch.nn.Module) else describe_value(v)

    def call(f):
        return "(" + ", ".join([d(a) for a in f.args] + [f"{k}={d(v)}" for k, v in f.kwargs.items()]) + ")"
    try:
        s = call(module_input.constructor_input)
        if module_input.forward_input is not None:
            s += call(module_input.forward_input)
        if module_input.desc:
            s = f"{module_input.desc}: {s}"
    except Exception as e:  # noqa: BLE001
        return f"<undescribable sample: {type(e).__name__}>"
    s = " ".join(s.split())
    return s if len(s) < 200 else s[:197] + "..."


def _error_samples(module_info):
    from torch.testing._internal.common_modules import ModuleErrorEnum
    if module_info.module_error_inputs_func is None:
        return None
    errs = module_info.module_error_inputs_func(module_info, device="cpu", dtype=torch.float32,
                                                requires_grad=False, training=True)
    return [e.module_error_input for e in errs if e.error_on == ModuleErrorEnum.FORWARD_ERROR]


def sweep(modules=None, max_samples: int = 8, progress: bool = True, log=None) -> ModuleSweepResult:
    import torchneuron
    from torch.testing._internal.common_modules import module_db

    res = ModuleSweepResult(max_samples=max_samples)
    extras = _extra_module_infos()
    res.extra_modules = sorted(mi.name for mi in extras)
    selected = [mi for mi in list(module_db) + extras if modules is None or mi.name in modules]
    plan = []  # (module_info, dtype, training or None for error inputs)
    for mi in selected:
        supported = set(mi.supported_dtypes("cpu"))
        for dt in DTYPES:
            if dt not in supported:
                res.skips.append(dict(op=mi.name, mode=str(dt)[6:], reason="dtype not in the ModuleInfo's dtypes"))
                continue
            for training in MODES:
                plan.append((mi, dt, training))
        if mi.module_error_inputs_func is not None:
            plan.append((mi, torch.float32, None))

    try:
        from tqdm import tqdm
        bar = tqdm(total=len(plan), file=sys.stderr, disable=not progress, mininterval=2.0, desc="moduleinfo sweep")
    except ImportError:  # pragma: no cover
        bar = None

    torchneuron.clear_op_tracking()
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for mi, dt, training in plan:
            name = mi.name
            mode = mode_name(training, dt) if training is not None else "errors:float32"
            c = res.counts[(name, mode)]
            if bar is not None:
                bar.set_postfix_str(f"{name} {mode}", refresh=False)
            torch.manual_seed(SEED)
            try:
                if training is None:
                    samples = _error_samples(mi)
                else:
                    samples = list(mi.module_inputs_func(mi, device="cpu", dtype=dt, requires_grad=True,
                                                         training=training))
            except Exception as e:  # noqa: BLE001
                res.skips.append(dict(op=name, mode=mode,
                                      reason=f"sample generation fails on the CPU: {message(e, 200)}"))
                if bar is not None:
                    bar.update()
                continue
            c.total_samples += len(samples)
            chosen = opinfo.pick(samples, max_samples)
            c.skipped += len(samples) - len(chosen)
            for i, sample in enumerate(chosen):
                t0 = time.perf_counter()
                try:
                    outcome, note = run_sample(mi, sample, dt, training if training is not None else True,
                                               backward=training is not None)
                    c.passed += 1
                    if outcome == "both":
                        c.both_raise += 1
                    elif outcome == "shape":
                        c.shape_only += 1
                        res.shape_only.setdefault(name, set()).add(note)
                    elif outcome == "tolerated":
                        c.tolerated += 1
                        res.tolerated.append(dict(module=name, mode=mode, sample=i, desc=describe(sample), note=note))
                    elif outcome == "forward-only":
                        c.forward_only += 1
                    if note and outcome != "tolerated":
                        res.notes[(name, f"{mode}: {note}")] = res.notes.get((name, f"{mode}: {note}"), 0) + 1
                except Exception as e:  # noqa: BLE001
                    with contextlib.suppress(Exception):
                        sync()
                    c.failed += 1
                    res.failures.append(dict(module=name, mode=mode, sample=i, desc=describe(sample),
                                             message=message(e, 700)))
                    if log:
                        print(f"FAIL {name} {mode} #{i}: {message(e, 300)}", file=log, flush=True)
                dt_s = time.perf_counter() - t0
                if log and dt_s > 2.0:
                    print(f"SLOW {name} {mode} #{i}: {dt_s:.1f}s", file=log, flush=True)
            if bar is not None:
                bar.update()
    if bar is not None:
        bar.close()
    res.seconds = time.perf_counter() - start
    res.fallback_ops = dict(torchneuron.get_fallback_ops())
    return res


# ----------------------------------------------------------------------------- report


def write_report(res: ModuleSweepResult, directory: str):
    per_mode = {}
    for mode in sorted({m for _, m in res.counts}):
        t = res.totals(mode)
        per_mode[mode] = dict(vars(t), rate=res.pass_rate(mode))
    total = res.totals()
    modules = sorted({m for m, _ in res.counts})
    data = dict(
        pass_rate=res.pass_rate(), **{k: v for k, v in vars(total).items()},
        seconds=round(res.seconds, 1), max_samples_per_module_dtype_mode=res.max_samples,
        torch_version=torch.__version__, per_mode=per_mode,
        per_module={f"{m} {mode}": vars(c) for (m, mode), c in sorted(res.counts.items())},
        failing_modules=res.failing_modules(), failures=res.failures, tolerated_samples=res.tolerated,
        skips=res.skips, shape_only_modules={m: sorted(r) for m, r in res.shape_only.items()},
        notes=[dict(module=m, note=n, samples=k) for (m, n), k in sorted(res.notes.items())],
        fallback_ops=res.fallback_ops,
    )
    os.makedirs(directory, exist_ok=True)  # OPINFO_REPORT_DIR / MODULEINFO_REPORT_DIR may be new
    with open(os.path.join(directory, "results.json"), "w") as f:
        json.dump(data, f, indent=1)

    L = []
    L.append("# Differential ModuleInfo sweep: `neuron` vs CPU\n")
    L.append("Generated by `tests/moduleinfo/test_moduleinfo_sweep.py` (logic in `tests/moduleinfo/sweep.py`, "
             "method in `NOTES.md`); do not edit by hand. Raw data: `results.json`, written beside it by the run "
             "(not committed).\n")
    L.append(f"- torch {torch.__version__}; {len(modules)} ModuleInfos ({len(modules) - len(res.extra_modules)} of "
             f"`module_db`, and {', '.join(f'`{m}`' for m in res.extra_modules)} added by the sweep: random "
             f"modules `module_db` lacks); runtime {res.seconds:.0f} s")
    L.append(f"- **pass rate {100 * res.pass_rate():.2f}%**: {total.passed} passed (of which "
             f"{total.both_raise} both-raise, {total.shape_only} shape/dtype-only, {total.tolerated} within a named "
             f"tolerance, {total.forward_only} forward only), {total.failed} failed, {total.skipped} samples not run")
    cap = res.max_samples
    L.append(f"- sampling: at most {cap} samples per (module, dtype, mode), evenly spaced over the ModuleInfo's "
             f"sample list (first and last included); {total.total_samples} samples generated, "
             f"{total.passed + total.failed} run; the rest are counted as not run (CI time budget)."
             if cap else "- sampling: every sample run")
    fm = res.failing_modules()
    L.append(f"- failing modules: " + (", ".join(f"`{m}` ({n})" for m, n in fm.items()) if fm else "**none**"))
    fb = res.fallback_ops
    L.append("- operators that used the synchronous fallback (`torchneuron.get_fallback_ops()`): "
             + (", ".join(f"`{k}` ({v})" for k, v in sorted(fb.items())) if fb else "**none**"))
    L.append("")
    L.append("## Per dtype and mode\n")
    L.append("| mode | passed | failed | both raise | shape-only | tolerated | forward only | not run (cap) "
             "| pass rate |")
    L.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for mode, v in per_mode.items():
        L.append(f"| {mode} | {v['passed']} | {v['failed']} | {v['both_raise']} | {v['shape_only']} | "
                 f"{v['tolerated']} | {v['forward_only']} | {v['skipped']} | {100 * v['rate']:.2f}% |")
    L.append("")
    L.append("## Per module\n")
    L.append("Pass, fail and not run (cap) summed over modes; modes not run are listed with their reason under "
             "*Skipped*.\n")
    L.append("| module | passed | failed | not run (cap) | modes | status |")
    L.append("|---|---:|---:|---:|---|---|")
    skipped_modes = defaultdict(list)
    for s in res.skips:
        skipped_modes[s["op"]].append(s["mode"])
    for m in modules:
        cs = [(mode, c) for (mm, mode), c in sorted(res.counts.items()) if mm == m]
        p = sum(c.passed for _, c in cs)
        f_ = sum(c.failed for _, c in cs)
        sk = sum(c.skipped for _, c in cs)
        extras = []
        for attr, label in (("both_raise", "both raise"), ("shape_only", "shape-only"), ("tolerated", "tolerated"),
                            ("forward_only", "forward only")):
            n = sum(getattr(c, attr) for _, c in cs)
            if n:
                extras.append(f"{n} {label}")
        status = "**fail**" if f_ else "pass"
        if m in res.extra_modules:
            extras.append("added by the sweep, not in module_db")
        if extras:
            status += " (" + ", ".join(extras) + ")"
        L.append(f"| `{m}` | {p} | {f_} | {sk} | {', '.join(mode for mode, _ in cs)} | {status} |")
    L.append("")
    L.append("## Failures\n")
    L.append(f"Samples failing with the same message are listed together (sample numbers index the capped "
             f"list), with the first one's description; at most {FAILURES_LISTED} messages per module, every "
             f"failure is in `results.json`.\n")
    if not res.failures:
        L.append("None.\n")
    per_module = defaultdict(lambda: defaultdict(list))  # module -> message -> failures
    for f in res.failures:
        per_module[f["module"]][f["message"][:400]].append(f)
    for m, groups in per_module.items():
        # Round robin over the modes of each group's first sample, so the listed ones span the modes.
        rank, items = defaultdict(int), []
        for order, (msg, fs) in enumerate(groups.items()):
            items.append((rank[fs[0]["mode"]], order, msg, fs))
            rank[fs[0]["mode"]] += 1
        items = [(msg, fs) for _, _, msg, fs in sorted(items, key=lambda t: t[:2])]
        for msg, fs in items[:FAILURES_LISTED]:
            L.append(f"- `{m}` {_sample_ranges(fs)} {fs[0]['desc']}: {msg}")
        rest = sum(len(fs) for _, fs in items[FAILURES_LISTED:])
        if rest:
            L.append(f"- `{m}`: {rest} more failing samples, {len(items) - FAILURES_LISTED} more messages "
                     f"(`results.json`)")
    L.append("")
    L.append("## Within a named tolerance\n")
    for name, why in TOLERANCES.items():
        L.append(f"- `{name}`: {why}.")
    if TOLERANCES:
        L.append("")
    if not res.tolerated:
        L.append("None: every sample is compared exactly.\n" if not TOLERANCES else "No sample needed one.\n")
    for t in res.tolerated:
        L.append(f"- `{t['module']}` {t['mode']} sample {t['sample']} {t['desc']}: {t['note'][:400]}")
    L.append("")
    L.append("## Random forward: shape, dtype and device compared, and statistics where listed\n")
    L.append("The same samples run in eval mode (and with p = 0 or 1) are compared exactly.\n")
    if not res.shape_only:
        L.append("None: no sample's forward draws random numbers.\n")
    for m, reasons in sorted(res.shape_only.items()):
        L.append(f"- `{m}`: " + "; ".join(sorted(reasons)))
    L.append("")
    L.append("## Notes on passing samples\n")
    if not res.notes:
        L.append("None.\n")
    for (m, n), k in sorted(res.notes.items()):
        L.append(f"- `{m}` {n} ({k} sample{'s' if k > 1 else ''})")
    L.append("")
    L.append("## Skipped (module, dtype): neither mode run\n")
    by_reason = defaultdict(list)
    for s in res.skips:
        by_reason[s["reason"]].append(f"{s['op']} {s['mode']}")
    if not by_reason:
        L.append("None.")
    for reason, items in sorted(by_reason.items()):
        L.append(f"- {reason} ({len(items)}): " + ", ".join(f"`{x}`" for x in sorted(items)))
    L.append("")
    L.append("## Per module and mode\n")
    L.append("| module | mode | passed | failed | both raise | shape-only | tolerated | forward only | not run (cap) |")
    L.append("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for (m, mode), c in sorted(res.counts.items()):
        L.append(f"| `{m}` | {mode} | {c.passed} | {c.failed} | {c.both_raise} | {c.shape_only} | {c.tolerated} | "
                 f"{c.forward_only} | {c.skipped} |")
    with open(os.path.join(directory, "REPORT.md"), "w") as f:
        f.write("\n".join(L) + "\n")


def _sample_ranges(failures) -> str:
    """'train:float32 #0-3,7; eval:float32 #2' for a list of failure dicts."""
    by_mode = defaultdict(list)
    for f in failures:
        by_mode[f["mode"]].append(f["sample"])
    parts = []
    for mode, idx in by_mode.items():
        runs, start = [], None
        for i, n in enumerate(idx):
            if start is None:
                start = n
            if i + 1 == len(idx) or idx[i + 1] != n + 1:
                runs.append(f"{start}" if start == n else f"{start}-{n}")
                start = None
        parts.append(f"{mode} #{','.join(runs)}")
    return "; ".join(parts)


def summary_line(res: ModuleSweepResult) -> str:
    t = res.totals()
    return (f"moduleinfo sweep: pass rate {100 * res.pass_rate():.2f}% ({t.passed} passed, {t.failed} failed, "
            f"{t.tolerated} tolerated, {t.skipped} not run), {res.seconds:.0f} s, failing modules: "
            f"{sorted(res.failing_modules()) or 'none'}, fallback ops: {sorted(res.fallback_ops) or 'none'}")


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--max-samples", type=int, default=int(os.environ.get("MODULEINFO_MAX_SAMPLES", 8)))
    p.add_argument("--modules", default=None, help="comma-separated ModuleInfo names (nn.Linear,...)")
    p.add_argument("--report-dir", default=None, help="write REPORT.md/results.json here")
    p.add_argument("--log", action="store_true", help="print failures as they happen")
    a = p.parse_args(argv)
    import faulthandler
    faulthandler.enable()
    res = sweep(modules=set(a.modules.split(",")) if a.modules else None, max_samples=a.max_samples,
                log=sys.stdout if a.log else None)
    if a.report_dir:
        write_report(res, a.report_dir)
    print(summary_line(res))
    for f in res.failures if not a.log else []:
        print(f"FAIL {f['module']} {f['mode']} #{f['sample']}: {f['message'][:300]}")


if __name__ == "__main__":
    main()
