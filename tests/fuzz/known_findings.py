"""Reported findings the random generator keeps out of its programs.

Each entry names a mismatch the fuzzer found on the current main and the
strict xfail regression test that reproduces it (test_regressions.py), and
says how the fuzzer keeps clear of it, in one of three ways:

* `matches`: a predicate over a candidate statement and the CPU values of the
  shadow run; a statement it matches is not drawn;
* `cpu_error`: a pattern over the message of the error the CPU raises for a
  candidate statement; such a statement is not drawn (the finding is that
  neuron raises that error later, or not at all);
* `tolerates`: a predicate over a difference the comparison found (a class
  and the CPU's and neuron's metadata); the difference is not a mismatch.

Every use is counted per finding, and test_fuzz.py prints the counts, so
nothing is hidden silently. When a fix lands, its regression test XPASSes
(strict, so it fails): delete the test's xfail mark and the entry here
together.
"""
from __future__ import annotations

import os
import re
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class Finding:
    name: str
    regression_test: str                 # in tests/fuzz/test_regressions.py
    matches: Callable | None = None      # (statement, {name: CPU value}) -> bool
    cpu_error: str | None = None         # pattern over the CPU's error message
    tolerates: Callable | None = None    # (kind, cpu Entry, neuron Entry) -> bool
    ops: tuple = ()                      # with cpu_error: only statements calling these (or of these kinds)
    paths: tuple = ()                    # only programs of these paths (all when empty)


def _tensors(statement, ns) -> list:
    """The tensors a statement reads, as the shadow run holds them."""
    return [ns[n] for n in statement.operands if isinstance(ns.get(n), torch.Tensor)]


def _degenerate_strides(kind, c, d) -> bool:
    """Strides that differ only where they mean nothing: a zero-size tensor (its storage offset
    too), or dimensions of size 1."""
    if kind not in ("strides", "storage offset") or c.shape != d.shape:
        return False
    if 0 in c.shape:
        return True
    if kind == "storage offset":
        return False
    return all(a == b for a, b, n in zip(c.stride, d.stride, c.shape) if n != 1)


def _as_meta(t: torch.Tensor) -> torch.Tensor:
    """`t` as the executor's meta pass sees it: a meta tensor of its sizes, strides and offset."""
    base = torch.empty(t.untyped_storage().nbytes() // max(t.element_size(), 1) + 1, dtype=t.dtype, device="meta")
    m = base.as_strided(t.shape, t.stride(), t.storage_offset())
    return m.conj() if t.is_conj() else m


def _flat(v) -> list:
    if isinstance(v, torch.Tensor):
        return [v]
    return [x for e in v for x in _flat(e)] if isinstance(v, (tuple, list)) else []


def _meta_layout(statement, ns) -> bool:
    """A result whose strides the meta kernel gives otherwise than the CPU kernel (statements that
    bind new names; their operands not all row-major and of one shape)."""
    m = re.match(r"(\w+(?:, \w+)*) = (.+)$", statement.code, re.S)
    tensors = _tensors(statement, ns)
    if "ldexp" in statement.code and any(not t.is_contiguous() for t in tensors):
        return True  # its composite multiplies by pow(2, other), whose layout the meta kernel gives otherwise
    if not m or statement.kind in ("view", "read", "create") or "out=" in statement.code:
        return False
    if all(t.is_contiguous() for t in tensors) and len({t.shape for t in tensors}) <= 1:
        return False
    cpu = _flat(eval(m.group(2), dict(ns)))  # noqa: S307 - the shadow run's own statement
    on_meta = dict(ns, dev="meta", **{n: _as_meta(ns[n]) for n in statement.operands
                                      if isinstance(ns.get(n), torch.Tensor)})
    meta = _flat(eval(m.group(2), on_meta))  # noqa: S307
    return len(cpu) == len(meta) and any(
        c.shape == d.shape and c.stride() != d.stride() and not _degenerate_strides(
            "strides", _Meta(c), _Meta(d)) for c, d in zip(cpu, meta))


class _Meta:
    """What _degenerate_strides reads of a tensor."""

    def __init__(self, t):
        self.shape, self.stride = tuple(t.shape), tuple(t.stride())


def _out_reshaped(statement, ns, with_elements: bool) -> bool:
    """An out= argument of another shape than the result (with elements, if asked): resized by the call."""
    m = re.search(r"out=(\w+)\)", statement.code)
    if not m or m.group(1) not in ns or not isinstance(ns[m.group(1)], torch.Tensor):
        return False
    out = ns[m.group(1)]
    call = statement.code.replace(f", out={m.group(1)}", "")
    try:
        result = eval(call, dict(ns))  # noqa: S307 - the shadow run's own statement
    except Exception:  # noqa: BLE001 - the call raises: the CPU may have resized the out= before
        return out.numel() > 0 or not with_elements
    return isinstance(result, torch.Tensor) and (out.numel() > 0 or not with_elements) and out.shape != result.shape


def _out_resized(statement, ns) -> bool:
    return _out_reshaped(statement, ns, with_elements=True)


def _out_is_an_operand(statement, ns) -> bool:
    """An out= argument that the call also reads (itself or a view of its memory), and resizes."""
    m = re.search(r"out=(\w+)\)", statement.code)
    if not m or not isinstance(ns.get(m.group(1)), torch.Tensor):
        return False
    out = ns[m.group(1)]
    reads = [ns[n] for n in statement.operands if n != m.group(1) and isinstance(ns.get(n), torch.Tensor)]
    shares = any(t.untyped_storage().data_ptr() == out.untyped_storage().data_ptr() for t in reads)
    return (shares or m.group(1) in statement.code.split("out=")[0]) and _out_reshaped(statement, ns, False)


def _resize_to_own_shape(statement, ns) -> bool:
    m = re.match(r"(\w+)\.resize_\((.*)\)$", statement.code)
    if not m or not isinstance(ns.get(m.group(1)), torch.Tensor):
        return False
    t = ns[m.group(1)]
    size = eval(m.group(2))  # noqa: S307 - a shape literal of the generator's
    size = tuple(size) if isinstance(size, (tuple, list)) else (size,)
    return tuple(t.shape) == size and not t.is_contiguous()


def _copy_onto_the_same_data(statement, ns) -> bool:
    """A copy (copy_ or x[...] = y) whose source is the same memory as its target, which overlaps
    itself."""
    m = re.match(r"(.+)\.copy_\((.+?)(, non_blocking=True)?\)$", statement.code) or re.match(
        r"(.+\[.*\]) = (.+)$", statement.code)
    if not m:
        return False
    dst, src = (eval(e, dict(ns)) for e in (m.group(1), m.group(2)))  # noqa: S307 - the shadow run's own
    if isinstance(dst, torch.Tensor) and isinstance(src, torch.Tensor) and src.shape != dst.shape:
        src = src.expand_as(dst)  # as setitem and copy_ broadcast it
    return (isinstance(dst, torch.Tensor) and isinstance(src, torch.Tensor) and 0 in dst.stride()
            and dst.untyped_storage().data_ptr() == src.untyped_storage().data_ptr()
            and (dst.shape, dst.stride(), dst.storage_offset()) == (src.shape, src.stride(), src.storage_offset()))


def _ldexp_of_integer_exponent(statement, ns) -> bool:
    return "ldexp" in statement.code and any(not (t.is_floating_point() or t.is_complex()) for t in _tensors(statement, ns))


def _memory_format_of_size_1_dims(statement, ns) -> bool:
    """Statements that see the strides of dimensions of size 1 or of zero-size tensors: memory
    format conversions of 4-d and 5-d tensors, and .stride() itself."""
    tensors = _tensors(statement, ns)
    if re.search(r"\.stride\(\)", statement.code):
        return any(1 in t.shape or t.numel() == 0 for t in tensors)
    return re.search(r"memory_format|\.contiguous\(|torch\.(cat|stack|hstack)\(", statement.code) is not None and any(
        t.dim() in (4, 5) and 1 in t.shape for t in tensors)


def _median_of_zero_strides(statement, ns) -> bool:
    return (re.search(r"\.(median|nanmedian|kthvalue|mode)\(|torch\.(median|kthvalue|mode)\(", statement.code)
            is not None and any(0 in t.stride() for t in _tensors(statement, ns)))


def _meta_dtype(statement, ns) -> bool:
    """A result whose dtype the meta kernel gives otherwise than the CPU kernel (statements that bind
    new names, with a Python scalar or a 0-dim operand: where type promotion has its special cases)."""
    m = re.match(r"(\w+(?:, \w+)*) = (.+)$", statement.code, re.S)
    tensors = _tensors(statement, ns)
    scalar = re.search(r"(?<![\w.\[])(True|False|-?\d+(\.\d*)?(e-?\d+)?|\(1\+2j\)|float\('\w+'\))(?![\w\]])",
                       m.group(2) if m else "")
    if not m or statement.kind not in ("unary", "binary", "ternary", "in_place") or not (
            scalar or any(t.dim() == 0 for t in tensors)):
        return False
    cpu = _flat(eval(m.group(2), dict(ns)))  # noqa: S307 - the shadow run's own statement
    tensors = {n: ns[n] for n in statement.operands if isinstance(ns.get(n), torch.Tensor)}
    # as the meta pass sees the call: meta tensors; and with 0-dim device tensors as the Python
    # scalars that Python's argument parser makes of them for a Scalar overload (clamp's min)
    variants = [{n: _as_meta(t) for n, t in tensors.items()},
                {n: (t.item() if t.dim() == 0 else _as_meta(t)) for n, t in tensors.items()}]
    for variant in variants[: 1 + any(t.dim() == 0 for t in tensors.values())]:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                meta = _flat(eval(m.group(2), dict(ns, dev="meta", **variant)))  # noqa: S307
        except Exception:  # noqa: BLE001 - this form does not apply to the call
            continue
        if len(cpu) == len(meta) and any(c.dtype != d.dtype for c, d in zip(cpu, meta)):
            return True
    return False


def _empty_out_of_another_dtype(statement, ns) -> bool:
    """An empty out= argument the call grows, of another dtype than the call computes in."""
    m = re.search(r", out=torch\.empty\(0, dtype=(torch\.\w+), device=dev\)\)$", statement.code)
    if not m:
        return False
    call = statement.code.split(" = ", 1)[1].replace(m.group(0)[:-1], "")
    result = eval(call, dict(ns))  # noqa: S307 - the shadow run's own statement
    return isinstance(result, torch.Tensor) and str(result.dtype) != m.group(1)


def _compiled_argmin_of_8_bit(statement, ns) -> bool:
    return (re.search(r"arg(min|max)|\.max\(|\.min\(|torch\.(max|min)\(|sort|topk|kthvalue|median",
                                                 statement.code) is not None
            and any(t.dtype in (torch.uint8, torch.int8) for t in _tensors(statement, ns)))


def _shift_of_bool(statement, ns) -> bool:
    return re.search(r"<<|>>|shift", statement.code) is not None and any(
        t.dtype == torch.bool for t in _tensors(statement, ns))


def _relu_of_complex(statement, ns) -> bool:
    return re.search(r"relu\(|\.relu_?\(", statement.code) is not None and any(
        t.is_complex() for t in _tensors(statement, ns))


def _set_storage_without_strides(statement, ns) -> bool:
    return re.search(r"\.set_\(\w+\.untyped_storage\(\), [^,]+, \([^)]*\)\)$", statement.code) is not None


FINDINGS: list[Finding] = [
    # A check the CPU kernel makes on a Scalar's value (a complex value for a float tensor, a
    # value out of the dtype's range, a negative power of integers) or on sizes (index_put's
    # value shape, a mask's shape), after the kernel accepted the call's kernel-check signature
    # with other values or sizes: the signature holds dtypes, ranks and flags only, so the call
    # queues, and the error comes at the next synchronisation.
    Finding("kernel checks deferred", "test_value_and_size_checks_raise_at_the_call_after_another_call",
            cpu_error=r"without overflow|negative integer powers|Converting complex Scalar|shape mismatch: value tensor|"
                      r"does not match the shape of the indexed tensor|should be positive|Expected reduction dim"),
    # relu of a complex tensor on the lean path (small, contiguous): the lean path checks bool
    # inputs but not complex ones, so clamp's refusal comes at the next synchronisation.
    Finding("lean relu of complex", "test_lean_relu_of_complex_raises_at_the_call", matches=_relu_of_complex),
    # index_put_ (x[index] = value) with the written tensor's own memory as the value: the CPU
    # refuses any overlap of the two; the executor runs only partial overlaps synchronously, so
    # once the signature was accepted a full overlap queues (and raises at the next
    # synchronisation), and of empty tensors none is seen (empty storages are never shared).
    Finding("index_put_ of its own memory", "test_index_put_of_its_own_memory_raises_at_the_call",
            cpu_error=r"some elements of the input tensor and the written-to tensor refer to a single memory",
            ops=("index_put",)),
    # A copy between shapes that do not broadcast: the device copy has no shape check, the
    # error comes from the task at the next synchronisation (also matmul's copy into a
    # non-contiguous out=, which the CPU refuses with this error).
    Finding("copy_ shape check deferred", "test_copy_shape_check_at_the_call",
            cpu_error=r"must match the size of tensor b|doesn't match the broadcast shape|expand",
            ops=("copy_", "matmul.out")),
    # logical_and_ and its kin (out= calls with self as the out) whose result would have to
    # broadcast `self` to a larger shape: the Python meta kernel resizes `self`, so neuron
    # resizes the tensor and computes where the CPU raises.
    Finding("in-place broadcast resizes self", "test_logical_and_in_place_broadcast_of_self_raises",
            cpu_error=r"output with shape \[.*\] doesn't match the broadcast shape"),
    # A written tensor with internal overlap (expanded), after the kernel accepted the call's
    # signature on a tensor without: the meta pass of most in-place operators does not check.
    Finding("internal overlap check deferred", "test_internal_overlap_check_at_the_call",
            cpu_error=r"more than one element of the written-to tensor refers to a single memory location"),
    # Results whose layout the meta kernel gives otherwise than the CPU kernel; a queued call
    # takes the meta kernel's. copysign, xlogy, floor_divide, div(rounding_mode='floor') and add
    # with alpha of operands in different layouts (their meta kernels are Python decompositions
    # whose first operand is the CPU kernel's second), angle of a complex tensor (the CPU copies
    # a complex result's real part into a row-major one), pow of a Scalar base (the CPU's
    # structured meta makes it row-major), advanced indexing of a permuted tensor. The
    # predicate runs the statement on meta tensors and compares. Inside a composite the other
    # layout of an intermediate changes bits: ldexp multiplies by pow(2, other), and which NaN
    # payload a product of two NaNs keeps follows the operands' layouts.
    Finding("meta kernels' layouts", "test_layouts_the_meta_kernel_gives_otherwise", matches=_meta_layout),
    # An out= argument the call also reads, resized by it: neuron's task sees the resized
    # argument where the CPU's kernel read it before resizing.
    Finding("out= that is also an operand", "test_out_that_is_an_operand_and_resized", matches=_out_is_an_operand),
    # A non-empty out= argument of another shape (resized, with PyTorch's warning) is made
    # row-major; the CPU's structured kernels give it the layout of the inputs. (Also an out=
    # call that raises: the CPU may resize the out= before its kernel refuses, neuron not.)
    Finding("resized out= is row-major", "test_resized_out_takes_the_cpus_strides", matches=_out_resized),
    # Results whose dtype the meta kernel gives otherwise than the CPU kernel; a queued call takes
    # the meta kernel's: bool ** True is int64 (the CPU's is bool); clamp of float16 by a complex
    # Scalar allocates a ComplexHalf result, which the CPU's out= kernel then refuses at the
    # next synchronisation (the CPU computes float16). The predicate runs the statement on meta
    # tensors and compares.
    Finding("meta kernels' dtypes", "test_dtypes_the_meta_kernel_gives_otherwise", matches=_meta_dtype),
    # An empty out= that the call grows, of another dtype than the call computes in (atan2 of
    # int64 into complex64): the first call runs synchronously and the kernel grows the out, as
    # on the CPU; later calls are queued with the out allocated beforehand (the CPU's layout,
    # learnt), and ATen computes a cast result into an out it is given otherwise than into one
    # it grows: 1 ulp in 2 of 56 elements (on the CPU alone too, preallocated against grown).
    Finding("grown out= of another dtype", "test_empty_out_of_another_dtype_grows_as_on_the_cpu",
            matches=_empty_out_of_another_dtype),
    # resize_ to the shape a tensor has: the CPU keeps its strides, neuron makes it row-major.
    Finding("resize_ to its own shape", "test_resize_to_its_own_shape_keeps_strides", matches=_resize_to_own_shape),
    # Copies between tensors of the same memory on the device check overlap before the CPU's
    # early return for the same data: a view of an expanded tensor copied onto itself raises.
    Finding("copy_ onto the same view", "test_copy_onto_the_same_view_of_an_expanded_tensor",
            matches=_copy_onto_the_same_data),
    # ldexp of a floating tensor by an integer one: the CPU takes ATen's exact branch for
    # devices with an ldexp kernel (std::ldexp), neuron the composite's other branch, self *
    # pow(2, other), which overflows and underflows in pow (0 * 2**30000 is NaN, not 0).
    Finding("ldexp takes the composite's other branch", "test_ldexp_of_an_integer_exponent",
            matches=_ldexp_of_integer_exponent),
    # set_(storage, offset, size) without strides: the CPU makes the tensor row-major, the
    # device's set_ refuses the empty strides (and it accepts a negative offset, which the CPU
    # refuses: the tensor then reads memory before its storage).
    Finding("set_ of a storage", "test_set_of_a_storage_as_on_the_cpu", matches=_set_storage_without_strides),
    # Strides of zero-size results (and their storage offsets), and strides of dimensions of
    # size 1, differ (meta kernels and the CPU's TensorIterator choose differently where the
    # choice means nothing).
    Finding("degenerate strides", "test_degenerate_strides", tolerates=_degenerate_strides),
    # What the degenerate strides above change: whether a 4-d tensor with a dimension of size 1
    # is channels_last-like (suggest_memory_format), so whether .to(memory_format=...) copies it
    # or returns it, the layout that clone() and *_like preserve and the layout of cat; and
    # what .stride() returns.
    Finding("degenerate strides decide memory formats", "test_degenerate_strides_decide_memory_formats",
            matches=_memory_format_of_size_1_dims),
    # Upstream, not neuron: Inductor's vectorised argmin of uint8 returns a wrong index (on the
    # CPU and on neuron alike, and not always the same one); the compiled path keeps
    # index-returning reductions of 8-bit integers out.
    Finding("Inductor argmin of 8-bit integers", "test_inductor_argmin_of_uint8", matches=_compiled_argmin_of_8_bit,
            paths=("compiled",)),
    # Upstream, not neuron: the meta kernel of the shifts refuses bool tensors, which eager
    # shifts (as int64), so compiling a shift of a bool tensor fails on the CPU as on neuron.
    Finding("compiled shift of bool", "test_compiled_shift_of_bool", matches=_shift_of_bool, paths=("compiled",)),
    # Upstream, not neuron: the CPU's median/kthvalue/mode over a tensor with zero strides
    # (expanded) read memory they did not write, so the CPU's own result varies run to run.
    Finding("CPU median of expanded input", "test_cpu_median_of_expanded_input_is_deterministic",
            matches=_median_of_zero_strides),
]

used: Counter = Counter()  # finding name -> statements not drawn or differences tolerated
hits: list = []            # the findings met since it was last cleared (python -m tests.fuzz clears it per program)
# TORCHNEURON_FUZZ_RAW=1: findings are counted and listed in `hits` but nothing is left out, so the
# fuzzer shows how often each one makes a program fail (python -m tests.fuzz groups failures by them).
RAW = os.environ.get("TORCHNEURON_FUZZ_RAW") == "1"


def _met(name: str) -> str | None:
    used[name] += 1
    hits.append(name)
    return None if RAW else name


def excluded(statement, ns, path: str) -> str | None:
    """The name of the first finding whose predicate `statement` of a program on `path` matches, or None."""
    for f in FINDINGS:
        if f.matches is None or (f.paths and path not in f.paths):
            continue
        try:
            if f.matches(statement, ns) and _met(f.name):
                return f.name
        except Exception:  # noqa: BLE001 - a predicate that cannot judge a statement does not exclude it
            continue
    return None


def excluded_error(statement, error: BaseException, path: str) -> str | None:
    """The name of the finding that covers the CPU raising `error` for `statement`, or None."""
    message = str(error)
    for f in FINDINGS:
        if f.paths and path not in f.paths:
            continue
        if f.cpu_error and re.search(f.cpu_error, message) and (
                not f.ops or statement.op in f.ops or statement.kind in f.ops) and _met(f.name):
            return f.name
    return None


def tolerated(kind: str, cpu, dev) -> str | None:
    for f in FINDINGS:
        if f.tolerates and f.tolerates(kind, cpu, dev) and _met(f.name):
            return f.name
    return None
