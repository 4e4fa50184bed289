"""Differential OpInfo sweep: every OpInfo of PyTorch's ``op_db`` on ``neuron``
against the CPU.

For each operator and each dtype it supports on the CPU among float32,
float64, int64, bool and bfloat16, the sample inputs are generated once on the
CPU (fixed seed), copied to ``neuron`` with the same values *and the same
layout* (strides, storage offset), and the operator runs on both devices. The
results are compared:

* integer and bool results exactly; floating results with
  ``torch.testing.assert_close`` default tolerances, NaN equal to NaN;
* tensor arguments the operator mutates are compared as well;
* operators whose outputs are random (own device generator) or uninitialised
  (``empty*``) are compared on shape, dtype and device only, and recorded as
  such.

Backward runs in float32 for operators that support autograd: the gradients of
``sum(w_i * out_i)`` (fixed random weights ``w_i``, the same on both devices)
with respect to every floating input are compared.

Per sample: both devices raise -> pass ("both raise"); only neuron raises,
only the CPU raises, or results differ -> fail with the message. Everything
not run carries a reason.

To stay within CI time, at most ``max_samples`` samples per (operator, dtype,
direction) are run, picked deterministically (evenly spaced over the sample
list, first and last included). ``max_samples=0`` runs all of them.

Run standalone:  python -m tests.opinfo.sweep [--max-samples N] [--ops a,b]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time
import traceback
import warnings
from collections import defaultdict
from dataclasses import dataclass, field

import torch

DEVICE = "neuron"
FORWARD_DTYPES = (torch.float32, torch.float64, torch.int64, torch.bool, torch.bfloat16)
BACKWARD_DTYPE = torch.float32
SEED = 0

# Operators whose results are drawn from a generator: the device has its own
# (counter-based) generator, so values cannot match the CPU's. Matched on the
# OpInfo name (without variant).
RANDOM_OPS = {
    "bernoulli", "normal", "multinomial", "rand_like", "randn_like", "randint_like", "randint", "randn",
    "rand", "uniform", "cauchy", "exponential", "geometric", "log_normal", "random_",
    "nn.functional.dropout", "nn.functional.dropout2d", "nn.functional.dropout3d",
    "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout", "nn.functional.rrelu",
    "nn.functional.fractional_max_pool2d", "nn.functional.fractional_max_pool3d",
    "nn.functional.gumbel_softmax", "nn.functional.multi_head_attention_forward",
    "randperm", "_refs.randn", "torch.ops.aten.rand", "native_dropout",
    # randomized algorithms (random projections drawn from the device generator)
    "svd_lowrank", "pca_lowrank",
}


def is_random(op) -> bool:
    return op.name in RANDOM_OPS or "dropout" in op.name


def sample_is_random(sample) -> bool:
    """Samples of deterministic ops that ask for dropout (attention with dropout_p > 0)."""
    p = sample.kwargs.get("dropout_p", 0.0)
    return isinstance(p, (int, float)) and p > 0


def has_uninitialized_output(op) -> bool:
    return bool(getattr(op, "has_nondeterministic_output", False))


def full_name(op) -> str:
    return op.name + ("." + op.variant_test_name if op.variant_test_name else "")


# ----------------------------------------------------------------------------- moving samples


def to_device(t: torch.Tensor, device=DEVICE) -> torch.Tensor:
    """A copy of `t` on `device` with the same values and the same layout."""
    if not isinstance(t, torch.Tensor):
        return t
    rg = t.requires_grad
    t = t.detach()
    if t.layout != torch.strided:
        out = t.to(device, copy=True)
    elif t.is_contiguous() and t.storage_offset() == 0:
        out = t.to(device, copy=True)
    else:
        # Copy the whole storage, then take the same view: keeps strides,
        # offset and overlap exactly as the sample has them.
        n = t.untyped_storage().nbytes() // t.element_size()
        flat = torch.empty(0, dtype=t.dtype).set_(t.untyped_storage(), 0, (n,), (1,))
        out = flat.to(device).as_strided(t.size(), t.stride(), t.storage_offset())
    if rg:
        out.requires_grad_(True)
    return out


def map_structure(x, fn):
    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, list):
        return [map_structure(e, fn) for e in x]
    if isinstance(x, tuple) and not hasattr(x, "_fields"):
        return tuple(map_structure(e, fn) for e in x)
    if isinstance(x, dict):
        return {k: map_structure(v, fn) for k, v in x.items()}
    return x


def flatten(x, out=None):
    out = [] if out is None else out
    if isinstance(x, (list, tuple)):
        for e in x:
            flatten(e, out)
    elif isinstance(x, dict):
        for k in sorted(x, key=str):
            flatten(x[k], out)
    else:
        out.append(x)
    return out


def _device_arg(v):
    if isinstance(v, torch.device) and v.type == "cpu":
        return torch.device(DEVICE)
    if isinstance(v, str) and (v == "cpu" or v.startswith("cpu:")):
        return DEVICE
    return v


def _leaves(sample):
    return [t for t in flatten((sample.input, tuple(sample.args), sample.kwargs)) if isinstance(t, torch.Tensor)]


def placement(sample, template):
    """Per tensor of `sample`: whether it goes to the device. `template` is the
    same sample generated for the device: the OpInfo knows which arguments must
    stay on the host (tensor_split's indices, ...). None: all go."""
    if template is None:
        return None
    a, b = _leaves(sample), _leaves(template)
    if len(a) != len(b) or any(x.shape != y.shape for x, y in zip(a, b)):
        return None
    return [y.device.type == DEVICE for y in b]


def sample_to_device(sample, place=None):
    """(input, args, kwargs) of a CPU SampleInput, copied to the device (the
    tensors `place` marks; all if None); host tensors are copied on the host."""
    it = iter(place) if place is not None else None

    def move(t):
        return to_device(t, DEVICE if it is None or next(it) else "cpu")

    def arg(v):
        return map_structure(_device_arg(v), move)

    inp = map_structure(sample.input, move)
    args = tuple(arg(v) for v in sample.args)
    kwargs = {k: arg(v) for k, v in sorted(sample.kwargs.items(), key=lambda kv: str(kv[0]))}
    kwargs = {k: kwargs[k] for k in sample.kwargs}
    return inp, args, kwargs


# ----------------------------------------------------------------------------- comparing


class Mismatch(AssertionError):
    pass


def _on_device(fn):
    """Runs ``fn`` and waits for the device: (result, None), or (None, the
    exception it or a later synchronisation raised). Mismatch propagates."""
    try:
        out = fn()
        sync()
        return out, None
    except Mismatch:
        raise
    except Exception as e:  # noqa: BLE001
        with contextlib.suppress(Exception):
            sync()
        torch.neuron.reset_errors()  # errors are sticky: the next sample starts clean
        return None, e


def _raised(cpu_exc, dev_exc) -> bool:
    """True if both sides raised (a pass); raises Mismatch if only one did."""
    if cpu_exc is not None and dev_exc is not None:
        return True
    if dev_exc is not None:
        raise Mismatch(f"only neuron raises: {_msg(dev_exc)}")
    if cpu_exc is not None:
        raise Mismatch(f"only cpu raises: {_msg(cpu_exc)}")
    return False


def _value_equal(a, b):
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def exact_difference(cpu: torch.Tensor, dev: torch.Tensor):
    """None if the floating tensors `dev` and `cpu` (same shape and dtype, on
    the host) are equal as torch.equal sees them with NaN equal to NaN;
    otherwise how they differ: elements, largest absolute and relative
    difference and distance in ulps."""
    same = (dev == cpu) | (torch.isnan(dev) & torch.isnan(cpu))
    if bool(same.all()):
        return None
    bad = ~same
    n = int(bad.sum())
    c, d = cpu[bad].double(), dev[bad].double()
    finite = torch.isfinite(c) & torch.isfinite(d)
    s = f"{n} of {cpu.numel()} elements differ ({cpu.dtype})"
    if bool(finite.any()):
        cf, df = c[finite], d[finite]
        absd = (df - cf).abs()
        i = int(absd.argmax())
        rel = float((absd / cf.abs()).max())
        s += (f"; largest absolute difference {float(absd[i]):.3g} (neuron {float(df[i])!r}, cpu {float(cf[i])!r})"
              f", largest relative {rel:.3g}, at most {ulp_distance(cpu[bad][finite], dev[bad][finite])} ulp")
    if n > int(finite.sum()):
        s += f"; {n - int(finite.sum())} differ in NaN or infinity"
    return s


_INT_OF = {torch.float64: torch.int64, torch.float32: torch.int32, torch.bfloat16: torch.int16,
           torch.float16: torch.int16}


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> int:
    """The largest number of representable floats between elements of `a` and `b`."""
    if a.dtype not in _INT_OF or a.numel() == 0:
        return 0
    def ordered(x):
        bits = x.contiguous().view(_INT_OF[x.dtype]).to(torch.int64)
        magnitude = bits & ((1 << (8 * x.element_size() - 1)) - 1)
        return torch.where(bits < 0, -magnitude, magnitude)
    oa, ob = ordered(a), ordered(b)
    # Exact in int64 when the signs agree; across zero the distance can exceed int64 for float64.
    same_sign = (oa < 0) == (ob < 0)
    near = torch.where(same_sign, (oa - ob).abs(), 0).max()
    far = torch.where(same_sign, 0.0, oa.double().abs() + ob.double().abs()).max()
    return max(int(near), int(far))


def compare(cpu, dev, what: str, values: bool = True, on_device: bool = True, tensors_only: bool = False,
            exact: bool = False):
    """Raises Mismatch if `dev` (neuron results) differs from `cpu`. Floating
    values within ``assert_close``'s default tolerance, or, with `exact`, equal
    (NaN equal to NaN)."""
    fc, fd = flatten(cpu), flatten(dev)
    if tensors_only:
        fc = [x for x in fc if isinstance(x, torch.Tensor)]
        fd = [x for x in fd if isinstance(x, torch.Tensor)]
    if len(fc) != len(fd):
        raise Mismatch(f"{what}: {len(fd)} results on neuron, {len(fc)} on cpu")
    for i, (c, d) in enumerate(zip(fc, fd)):
        where = f"{what}[{i}]" if len(fc) > 1 else what
        if isinstance(c, torch.Tensor):
            if not isinstance(d, torch.Tensor):
                raise Mismatch(f"{where}: neuron returned {type(d).__name__}, cpu a tensor")
            if on_device and c.device.type == "cpu" and d.device.type != DEVICE and c.numel() > 0 and c.dim() > 0:
                # Results computed from device inputs belong on the device.
                raise Mismatch(f"{where}: result on {d.device}, expected {DEVICE}")
            if c.dtype != d.dtype:
                raise Mismatch(f"{where}: dtype {d.dtype} on neuron, {c.dtype} on cpu")
            if c.shape != d.shape:
                raise Mismatch(f"{where}: shape {tuple(d.shape)} on neuron, {tuple(c.shape)} on cpu")
            if c.layout != torch.strided:
                c, d = c.to_dense(), d.to_dense()
            if not values:
                continue
            dh = d.detach().cpu()
            c = c.detach()
            if exact and c.is_floating_point():
                diff = exact_difference(c, dh)
                if diff is not None:
                    raise Mismatch(f"{where}: {diff}")
            elif c.is_floating_point() or c.is_complex():
                try:
                    torch.testing.assert_close(dh, c, equal_nan=True, check_device=False, check_stride=False)
                except AssertionError as e:
                    raise Mismatch(f"{where}: {e}") from None
            else:
                if not torch.equal(dh, c):
                    n = int((dh != c).sum())
                    raise Mismatch(f"{where}: {n} of {c.numel()} elements differ (exact dtype {c.dtype})")
        elif isinstance(d, torch.Tensor):
            raise Mismatch(f"{where}: neuron returned a tensor, cpu {type(c).__name__}")
        elif values and not _value_equal(c, d):
            raise Mismatch(f"{where}: {d!r} on neuron, {c!r} on cpu")


def sync():
    torch.neuron.synchronize()


# ----------------------------------------------------------------------------- results


@dataclass
class Counts:
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    both_raise: int = 0
    shape_only: int = 0
    total_samples: int = 0  # samples the OpInfo generates (before the cap)

    def add(self, other: "Counts"):
        for k in self.__dataclass_fields__:
            setattr(self, k, getattr(self, k) + getattr(other, k))


@dataclass
class SweepResult:
    counts: dict = field(default_factory=lambda: defaultdict(Counts))  # (op, mode) -> Counts
    failures: list = field(default_factory=list)  # dicts
    skips: list = field(default_factory=list)  # dicts: op, mode, reason, samples
    shape_only: dict = field(default_factory=dict)  # op -> reason
    fallback_ops: dict = field(default_factory=dict)
    seconds: float = 0.0
    max_samples: int = 0

    def totals(self, mode=None) -> Counts:
        total = Counts()
        for (op, m), c in self.counts.items():
            if mode is None or m == mode:
                total.add(c)
        return total

    def pass_rate(self, mode=None) -> float:
        t = self.totals(mode)
        run = t.passed + t.failed
        return t.passed / run if run else 1.0


def _msg(e: BaseException, limit=400) -> str:
    s = f"{type(e).__name__}: {e}".strip().replace("\n", " | ")
    return s if len(s) <= limit else s[: limit - 3] + "..."


def pick(samples: list, cap: int) -> list:
    if cap <= 0 or len(samples) <= cap:
        return samples
    if cap == 1:
        return samples[:1]
    idx = sorted({round(i * (len(samples) - 1) / (cap - 1)) for i in range(cap)})
    return [samples[i] for i in idx]


def _call(op, inp, args, kwargs):
    return op(inp, *args, **kwargs)


def run_forward(op, sample, values: bool, place=None):
    """Returns None (pass), 'both' (both raise) or raises Mismatch/other."""
    dev_in, dev_args, dev_kwargs = sample_to_device(sample, place)
    sync()
    cpu_exc = dev_exc = None
    try:
        cpu_out = _call(op, sample.input, sample.args, sample.kwargs)
    except Exception as e:  # noqa: BLE001
        cpu_exc = e
    dev_out, dev_exc = _on_device(lambda: _call(op, dev_in, dev_args, dev_kwargs))
    if _raised(cpu_exc, dev_exc):
        return "both"
    # Factories called without a device argument legitimately return CPU tensors.
    on_device = any(isinstance(t, torch.Tensor) and t.device.type == DEVICE
                    for t in flatten((dev_in, dev_args, dev_kwargs))) or "device" in dev_kwargs
    compare(cpu_out, dev_out, "output", values, on_device)
    # Arguments the op mutated (in-place variants, out=) must agree too.
    compare((sample.input, tuple(sample.args), sample.kwargs), (dev_in, dev_args, dev_kwargs), "arguments", values, False,
            tensors_only=True)
    return None


def _grad_inputs(inp, args, kwargs):
    return [t for t in flatten((inp, args, kwargs)) if isinstance(t, torch.Tensor) and t.requires_grad]


def _loss(out, weights):
    terms = []
    for o, w in zip([o for o in flatten(out) if isinstance(o, torch.Tensor)], weights):
        if w is not None:
            terms.append((o * w).sum())
    return sum(terms) if terms else None


def run_backward(op, sample, values: bool, place=None):
    dev_in, dev_args, dev_kwargs = sample_to_device(sample, place)
    sync()
    cpu_exc = dev_exc = None
    cpu_grads = dev_grads = None
    weights = None
    try:
        cpu_out = sample.output_process_fn_grad(
            op.gradcheck_wrapper(op.get_op(), sample.input, *sample.args, **sample.kwargs))
        outs = [o for o in flatten(cpu_out) if isinstance(o, torch.Tensor)]
        g = torch.Generator().manual_seed(SEED)
        weights = [torch.rand(o.shape, generator=g, dtype=o.dtype) if o.requires_grad and o.is_floating_point()
                   else None for o in outs]
        loss = _loss(cpu_out, weights)
        if loss is None:
            return "no-grad"
        cpu_inputs = _grad_inputs(sample.input, sample.args, sample.kwargs)
        cpu_grads = torch.autograd.grad(loss, cpu_inputs, allow_unused=True)
    except Exception as e:  # noqa: BLE001
        cpu_exc = e
    def device_grads():
        nonlocal weights
        dev_out = sample.output_process_fn_grad(op.gradcheck_wrapper(op.get_op(), dev_in, *dev_args, **dev_kwargs))
        if weights is None:
            outs = [o for o in flatten(dev_out) if isinstance(o, torch.Tensor)]
            weights = [torch.rand(o.shape, dtype=o.dtype) if o.requires_grad else None for o in outs]
        dev_w = [w.to(DEVICE) if w is not None else None for w in weights]
        loss = _loss(dev_out, dev_w)
        if loss is None:
            raise Mismatch("no differentiable output on neuron")
        return torch.autograd.grad(loss, _grad_inputs(dev_in, dev_args, dev_kwargs), allow_unused=True)

    dev_grads, dev_exc = _on_device(device_grads)
    if _raised(cpu_exc, dev_exc):
        return "both"
    compare(cpu_grads, dev_grads, "grad", values)
    return None


def sweep(ops=None, max_samples: int = 6, progress: bool = True, log=None, start_at: int = 0) -> SweepResult:
    import torchneuron
    from torch.testing._internal.common_methods_invocations import op_db

    res = SweepResult(max_samples=max_samples)
    selected = [op for op in op_db[start_at:] if ops is None or op.name in ops or full_name(op) in ops]
    plan = []
    for op in selected:
        supported = op.supported_dtypes("cpu")
        for dt in FORWARD_DTYPES:
            if dt in supported:
                plan.append((op, dt, "fwd"))
            else:
                res.skips.append(dict(op=full_name(op), mode=f"fwd:{str(dt)[6:]}",
                                      reason="dtype not supported by the op on the CPU"))
        if op.supports_autograd and BACKWARD_DTYPE in op.supported_backward_dtypes("cpu"):
            plan.append((op, BACKWARD_DTYPE, "bwd"))
        elif op.supports_autograd:
            res.skips.append(dict(op=full_name(op), mode="bwd:float32",
                                  reason="float32 not among the op's backward dtypes on the CPU"))
        else:
            res.skips.append(dict(op=full_name(op), mode="bwd:float32", reason="op does not support autograd"))

    try:
        from tqdm import tqdm
        bar = tqdm(total=len(plan), file=sys.stderr, disable=not progress, mininterval=2.0, desc="opinfo sweep")
    except ImportError:  # pragma: no cover
        bar = None

    torchneuron.clear_op_tracking()
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for op, dt, direction in plan:
            name = full_name(op)
            mode = f"{direction}:{str(dt)[6:]}"
            c = res.counts[(name, mode)]
            if bar is not None:
                bar.set_postfix_str(f"{name} {mode}", refresh=False)
            torch.manual_seed(SEED)
            try:
                samples = list(op.sample_inputs("cpu", dt, requires_grad=direction == "bwd"))
            except Exception as e:  # noqa: BLE001
                res.skips.append(dict(op=name, mode=mode, reason=f"sample generation fails on the CPU: {_msg(e, 200)}"))
                if bar is not None:
                    bar.update()
                continue
            c.total_samples += len(samples)
            chosen = pick(samples, max_samples)
            # The same samples generated for the device only tell which
            # arguments the OpInfo keeps on the host; values come from the CPU.
            places = [None] * len(chosen)
            try:
                torch.manual_seed(SEED)
                templates = pick(list(op.sample_inputs(DEVICE, dt, requires_grad=direction == "bwd")),
                                 max_samples)
                if len(templates) == len(chosen):
                    places = [placement(s_, t_) for s_, t_ in zip(chosen, templates)]
                del templates
            except Exception:  # noqa: BLE001
                pass
            with contextlib.suppress(Exception):
                sync()
            if len(chosen) < len(samples):
                c.skipped += len(samples) - len(chosen)
            shape_only = None
            if is_random(op):
                shape_only = "random op: the device has its own generator; shape, dtype and device compared"
            elif has_uninitialized_output(op):
                shape_only = "uninitialised output (empty*): shape, dtype and device compared"
            if shape_only:
                res.shape_only[name] = shape_only
            for i, sample in enumerate(chosen):
                t0 = time.perf_counter()
                if os.environ.get("OPINFO_TRACE"):
                    print(f"RUN {name} {mode} #{i}", file=sys.stderr, flush=True)
                try:
                    with torch.random.fork_rng(devices=[]):
                        torch.manual_seed(SEED)
                        values = shape_only is None
                        if values and sample_is_random(sample):
                            values = False
                            res.shape_only[f"{name} (samples with dropout_p > 0)"] = (
                                "dropout inside the op draws from the device generator; shape, dtype and device compared")
                        if direction == "fwd":
                            r = run_forward(op, sample, values=values, place=places[i])
                        else:
                            r = run_backward(op, sample, values=values, place=places[i])
                    if r == "no-grad":
                        c.skipped += 1
                        res.skips.append(dict(op=name, mode=mode, reason="sample has no differentiable output",
                                              sample=i))
                        continue
                    c.passed += 1
                    if r == "both":
                        c.both_raise += 1
                    elif not values:
                        c.shape_only += 1
                except Exception as e:  # noqa: BLE001
                    c.failed += 1
                    res.failures.append(dict(op=name, mode=mode, sample=i, desc=_describe(sample),
                                             message=_msg(e, 600)))
                    if log:
                        print(f"FAIL {name} {mode} #{i}: {_msg(e, 300)}", file=log, flush=True)
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


def _describe(sample) -> str:
    try:
        return _describe_unsafe(sample)
    except Exception as e:  # noqa: BLE001
        return f"<undescribable sample: {type(e).__name__}>"


def describe_value(x) -> str:
    """A short description of an argument: tensors by shape (layout, strides
    when not contiguous), sequences element-wise, other values by repr."""
    if isinstance(x, torch.Tensor):
        s = f"T{list(x.shape)}"
        if x.layout != torch.strided:
            s += f"({x.layout})"
        elif x.dim() and not x.is_contiguous():
            s += f"s{list(x.stride())}"
        return s
    if isinstance(x, (list, tuple)):
        return "[" + ",".join(describe_value(e) for e in x) + "]"
    r = repr(x)
    return r if len(r) < 40 else r[:37] + "..."


def _describe_unsafe(sample) -> str:
    d = describe_value
    s = d(sample.input)
    if sample.args:
        s += ", " + ", ".join(d(a) for a in sample.args)
    if sample.kwargs:
        s += ", " + ", ".join(f"{k}={d(v)}" for k, v in sample.kwargs.items())
    return s if len(s) < 200 else s[:197] + "..."


# ----------------------------------------------------------------------------- report


def write_report(res: SweepResult, directory: str):
    per_dtype = {}
    for mode in sorted({m for _, m in res.counts}):
        t = res.totals(mode)
        per_dtype[mode] = dict(passed=t.passed, failed=t.failed, skipped=t.skipped, both_raise=t.both_raise,
                               shape_only=t.shape_only, rate=res.pass_rate(mode))
    total = res.totals()
    data = dict(
        pass_rate=res.pass_rate(),
        passed=total.passed, failed=total.failed, skipped=total.skipped, both_raise=total.both_raise,
        shape_only=total.shape_only, samples_generated=total.total_samples,
        seconds=round(res.seconds, 1), max_samples_per_op_dtype=res.max_samples,
        torch_version=torch.__version__, per_mode=per_dtype,
        per_op={f"{op} {m}": vars(c) for (op, m), c in sorted(res.counts.items())},
        failures=res.failures, skips=res.skips, shape_only_ops=res.shape_only,
        fallback_ops=res.fallback_ops,
    )
    os.makedirs(directory, exist_ok=True)  # OPINFO_REPORT_DIR / MODULEINFO_REPORT_DIR may be new
    with open(os.path.join(directory, "results.json"), "w") as f:
        json.dump(data, f, indent=1, sort_keys=False)

    L = []
    L.append("# Differential OpInfo sweep: `neuron` vs CPU\n")
    L.append("Generated by `tests/opinfo/test_opinfo_sweep.py` (logic in `tests/opinfo/sweep.py`); "
             "do not edit by hand. Raw data: `results.json`, written beside it by the run (not committed).\n")
    L.append(f"- torch {torch.__version__}; {len({op for op, _ in res.counts})} OpInfos; "
             f"runtime {res.seconds:.0f} s")
    L.append(f"- **pass rate {100 * res.pass_rate():.2f}%**: {total.passed} passed "
             f"(of which {total.both_raise} both-raise and {total.shape_only} shape/dtype-only), "
             f"{total.failed} failed, {total.skipped} samples not run")
    cap = res.max_samples
    L.append(f"- sampling: at most {cap} samples per (operator, dtype, direction), evenly spaced over the "
             f"OpInfo's sample list (first and last included); {total.total_samples} samples generated, "
             f"{total.passed + total.failed} run. Samples beyond the cap are counted as skipped "
             f"(reason: CI time budget)." if cap else "- sampling: every sample run")
    fb = res.fallback_ops
    L.append(f"- operators that used the synchronous fallback (`torchneuron.get_fallback_ops()`): "
             + (", ".join(f"`{k}` ({v})" for k, v in sorted(fb.items())) if fb else "**none**"))
    L.append("")
    L.append("## Per dtype and direction\n")
    L.append("| mode | passed | failed | both raise | shape-only | not run (cap) | pass rate |")
    L.append("|---|---:|---:|---:|---:|---:|---:|")
    for mode, v in per_dtype.items():
        L.append(f"| {mode} | {v['passed']} | {v['failed']} | {v['both_raise']} | {v['shape_only']} | "
                 f"{v['skipped']} | {100 * v['rate']:.2f}% |")
    L.append("")
    L.append("## Failures\n")
    if not res.failures:
        L.append("None.\n")
    for f in res.failures:
        L.append(f"- `{f['op']}` {f['mode']} sample {f['sample']} ({f['desc']}): {f['message'][:300]}")
    L.append("")
    L.append("## Compared on shape, dtype and device only\n")
    for op, reason in sorted(res.shape_only.items()):
        L.append(f"- `{op}`: {reason}")
    L.append("")
    L.append("## Skipped (operator, mode) pairs\n")
    by_reason = defaultdict(list)
    for s in res.skips:
        if "sample" in s:
            continue
        by_reason[s["reason"]].append(f"{s['op']} {s['mode']}")
    for reason, items in sorted(by_reason.items()):
        L.append(f"- {reason} ({len(items)}): " + ", ".join(f"`{x}`" for x in sorted(items)))
    sample_skips = [s for s in res.skips if "sample" in s]
    if sample_skips:
        L.append("")
        L.append("Individual samples skipped:\n")
        for s in sample_skips:
            L.append(f"- `{s['op']}` {s['mode']} sample {s['sample']}: {s['reason']}")
    L.append("")
    L.append("## Per operator\n")
    L.append("| operator | mode | passed | failed | both raise | shape-only | not run (cap) |")
    L.append("|---|---|---:|---:|---:|---:|---:|")
    for (op, m), c in sorted(res.counts.items()):
        L.append(f"| `{op}` | {m} | {c.passed} | {c.failed} | {c.both_raise} | {c.shape_only} | {c.skipped} |")
    with open(os.path.join(directory, "REPORT.md"), "w") as f:
        f.write("\n".join(L) + "\n")


def summary_line(res: SweepResult) -> str:
    t = res.totals()
    return (f"opinfo sweep: pass rate {100 * res.pass_rate():.2f}% ({t.passed} passed, {t.failed} failed, "
            f"{t.skipped} not run), {res.seconds:.0f} s, fallback ops: {sorted(res.fallback_ops) or 'none'}")


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--max-samples", type=int, default=int(os.environ.get("OPINFO_MAX_SAMPLES", 6)))
    p.add_argument("--ops", default=None, help="comma-separated OpInfo names")
    p.add_argument("--report-dir", default=None, help="write REPORT.md/results.json here")
    p.add_argument("--log", action="store_true", help="print failures as they happen")
    p.add_argument("--start-at", type=int, default=0, help="index into op_db to start at (debugging)")
    a = p.parse_args(argv)
    import faulthandler
    faulthandler.enable()
    res = sweep(ops=set(a.ops.split(",")) if a.ops else None, max_samples=a.max_samples,
                log=sys.stdout if a.log else None, start_at=a.start_at)
    if a.report_dir:
        write_report(res, a.report_dir)
    print(summary_line(res))
    for f in res.failures if not a.log else []:
        print(f"FAIL {f['op']} {f['mode']} #{f['sample']}: {f['message'][:300]}")


if __name__ == "__main__":
    main()
