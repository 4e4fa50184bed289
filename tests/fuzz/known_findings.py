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

def _out_read_and_resized(statement, ns) -> bool:
    """An out= argument that the call also reads (itself or a view of its memory) and resizes."""
    m = re.search(r"out=(\w+)\)", statement.code)
    if not m or not isinstance(ns.get(m.group(1)), torch.Tensor):
        return False
    out = ns[m.group(1)]
    reads = [ns[n] for n in statement.operands if n != m.group(1) and isinstance(ns.get(n), torch.Tensor)]
    if not (any(t.untyped_storage().data_ptr() == out.untyped_storage().data_ptr() for t in reads)
            or m.group(1) in statement.code.split("out=")[0]):
        return False
    try:
        result = eval(statement.code.replace(f", out={m.group(1)}", ""), dict(ns))  # noqa: S307 - the shadow run's own
    except Exception:  # noqa: BLE001 - the call raises: the CPU may have resized the out= before
        return True
    return isinstance(result, torch.Tensor) and out.shape != result.shape



def _median_of_zero_strides(statement, ns) -> bool:
    return (re.search(r"\.(median|nanmedian|kthvalue|mode)\(|torch\.(median|kthvalue|mode)\(", statement.code)
            is not None and any(0 in t.stride() for t in _tensors(statement, ns)))


def _compiled_argmin_of_8_bit(statement, ns) -> bool:
    return (re.search(r"arg(min|max)|\.max\(|\.min\(|torch\.(max|min)\(|sort|topk|kthvalue|median",
                                                 statement.code) is not None
            and any(t.dtype in (torch.uint8, torch.int8) for t in _tensors(statement, ns)))


def _shift_of_bool(statement, ns) -> bool:
    return re.search(r"<<|>>|shift", statement.code) is not None and any(
        t.dtype == torch.bool for t in _tensors(statement, ns))


FINDINGS: list[Finding] = [
    # Undefined on the CPU, not neuron: an out= that is also an operand, resized by the call
    # (matmul(x, y, out=x)): the CPU's kernel reads the operand after resizing it, memory that a
    # growing resize left unwritten, and its BLAS writes what it reads, so the CPU's own result
    # depends on the memory allocator and the threads. Neuron runs such calls synchronously on
    # one host view of the tensor, as the CPU does (test_out_that_is_an_operand_and_resized
    # shows one that is defined).
    Finding("CPU out= read after its resize", "test_cpu_out_read_after_its_resize",
            matches=_out_read_and_resized),
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
