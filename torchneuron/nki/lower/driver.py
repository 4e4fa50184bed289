"""Lowering a recorded program (``lower``) and running it (``replay``): each step
through its family's lowering, the closures of an instance chained, the view
table split between preallocated on-chip buffers and per-launch HBM."""
from __future__ import annotations

import os

from .. import isa as _isa
from .. import language as _nl
from ..errors import NKIError
from ..tensor import NkiTensor as _NkiTensor, assign as _assign_op
from ..trace import View, _Nested, _WHOLE, _STRIDED
# the instruction families register their lowerings when imported
from . import allocation, arithmetic, engines, matmul, movement  # noqa: F401
from .lowerer import Decline, Lowerer, _LOWERINGS, instruction_of
from .matmul import chain_gemms
from .program import FastProgram


def lower(program, slot_meta, debug):
    """The FastProgram for ``program``; raises Decline if a step is not covered."""
    lw = Lowerer(program, slot_meta)
    lw.debug = debug
    lw.slot_views = {}
    lw.read_only = _read_only_inputs(program)
    for s in range(program.n_inputs):
        lw.exact[s] = False
    instances, locations = [], []
    for _, steps in program.instances:
        steps_out = []  # (closure or None, frees, kernel line)
        lw.product = None  # (step index, slot, taken, stable) of the last matmul into a new PSUM tile (_product)
        for lw.step_index, step in enumerate(steps):
            g = _LOWERINGS.get(step.fn)
            name = getattr(step.fn, "__name__", step.fn)
            if g is None:
                raise Decline(f"instruction {name}")
            try:
                op = g(lw, step)
            except Decline as e:
                raise Decline(f"{name}: {e}") from None
            except NKIError as e:  # (an argument the interpreter reads otherwise: replay generically)
                raise Decline(f"{name}: {type(e).__name__}: {e}") from None
            for s in step.frees:
                lw.release(s)
            if op is not None or step.frees:
                steps_out.append((op, step.frees, step.location))
        ops, locs = chain_gemms(steps_out)
        instances.append(ops)
        locations.append(locs)
    # which view-table entries are over HBM (per launch) and which over preallocated buffers
    input_views, onchip, hbm_vids = {}, [], []
    for vid, (slot, kind, shape, off, strides) in enumerate(lw.view_specs):
        entry = (vid, kind, shape, off, strides)
        if slot in lw.phys_of_all:
            onchip.append((vid, lw.phys_of_all[slot], kind, shape, off, strides))
        elif slot < program.n_inputs:
            input_views.setdefault(slot, []).append(entry)
            hbm_vids.append(vid)
        elif slot in lw.slot_views:
            lw.slot_views[slot].append(entry)
            hbm_vids.append(vid)
        else:
            raise Decline("view of an unknown buffer")
    for c in lw.cover.values():
        c.append(bool(c[0].all()) and not c[1])
    _check_result(program.result, lw)
    return FastProgram(program.n_slots, len(lw.view_specs), instances, sorted(input_views.items()), onchip,
                       lw.phys, program.result, hbm_vids, locations)


_HBM_WRITERS = None


def _read_only_inputs(program):
    """Kernel arguments known to stay as they are during a launch: all of them if no
    step writes one (only the DMA instructions and assignment can write HBM), else none."""
    global _HBM_WRITERS
    if _HBM_WRITERS is None:
        _HBM_WRITERS = {instruction_of(f) for f in (_nl.store, _isa.dma_copy, _isa.dma_transpose, _isa.dma_compute,
                                                     _assign_op)}
    reinterpreting = {instruction_of(_NkiTensor.ap), instruction_of(_NkiTensor.view)}
    root, written = {}, set()  # (a write through a reinterpretation writes the memory it views)
    for _, steps in program.instances:
        for step in steps:
            if step.fn in reinterpreting and step.binds and step.args and isinstance(step.args[0], View):
                root[step.binds[0][1]] = root.get(step.args[0].slot, step.args[0].slot)
            elif step.fn in _HBM_WRITERS:
                dst = step.kwargs.get("dst", step.args[0] if step.args else None)
                if isinstance(dst, View):
                    written.add(root.get(dst.slot, dst.slot))
                elif isinstance(dst, _Nested) or dst is None:
                    written.update(range(program.n_inputs))
    # a written argument may share memory with any other (the caller's arrays
    # can overlap), so then no argument is known to stay as it is
    return set() if written & set(range(program.n_inputs)) else set(range(program.n_inputs))


def _check_result(t, lw):
    if isinstance(t, View):
        if t.kind not in (_WHOLE, _STRIDED) or t.mask is not None or t.slot not in lw.hbm_slots:
            raise Decline("result")
    elif isinstance(t, _Nested):
        for x in t.items:
            _check_result(x[1] if t.kind is dict else x, lw)


# ------------------------------------------------------------------ replay
def fast_replay() -> bool:
    """Replay lowered programs when possible?  TORCHNEURON_NKI_FAST_REPLAY=0 turns it off."""
    return os.environ.get("TORCHNEURON_NKI_FAST_REPLAY", "1").lower() not in ("0", "false", "no", "off")


def lowered(program, launch):
    """The lowered form of a recorded ``trace.Program`` (built at its first replay), or None."""
    fast = program.fast
    if fast is None:
        try:
            fast = lower(program, program.slot_meta, launch.debug)
        except Decline as e:
            fast, program.fast_declined = False, str(e)
        program.fast = fast
    return fast or None


def replay(program, launch, inputs):
    """Run a recorded program on new input tensors (in argument order): lowered where it
    can be, else step by step; returns the kernel's result."""
    if fast_replay():
        fast = lowered(program, launch)
        if fast is not None:
            return fast.replay(launch, inputs, program.slot_meta)
    return program.replay(launch, inputs)
