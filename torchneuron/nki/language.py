"""nki.language: tensors, data movement, index grids, loops and tile math.

Covers the beta-1 style (operations return tiles; ``nl.load``/``nl.store``;
``nl.arange``/``nl.mgrid``; ``mask=``) and the names the NKI 0.x style still
uses from this module (``nl.ndarray``, buffers, dtypes, ``tile_size``).
"""
from __future__ import annotations

import math
import ast
import builtins
import inspect
import linecache
import sys

import numpy as np

from . import dtypes as _dt
from . import ops as _ops
from .compiler import AllocSpec
from .context import current, in_kernel as _in_kernel
from .errors import NKIError, NKILimitError, NKITypeError
from .instruction import instruction, instructions
from .machine import Buffer, TileSize, default_target as _default_target
from .tensor import DynSlice, NkiTensor, ParDim, align_to, allocate, pair_shapes


# ------------------------------------------------------------------ tile sizes
class _TileSizeView(TileSize):
    """``nl.tile_size``: the constants, and the SBUF sizes of the machine the kernel runs on."""

    @staticmethod
    def _machine():
        return current().launch.target if _in_kernel() else _default_target()

    @property
    def sbuf_size_bytes(self):
        return self._machine().sbuf_bytes

    @property
    def sbuf_fmax_bytes(self):
        return self._machine().sbuf_bytes_per_partition

    @property
    def sbuf_fmax(self):
        return self._machine().sbuf_bytes_per_partition // 4

    @property
    def total_available_sbuf_size(self):
        return self._machine().sbuf_bytes_per_partition

    def __repr__(self):
        return "nl.tile_size"


tile_size = _TileSizeView()


# ------------------------------------------------------------------ dtypes
bool_ = _dt.bool_
int8, int16, int32 = _dt.int8, _dt.int16, _dt.int32
uint8, uint16, uint32 = _dt.uint8, _dt.uint16, _dt.uint32
float16, float32, bfloat16, tfloat32 = _dt.float16, _dt.float32, _dt.bfloat16, _dt.tfloat32
float8_e4m3, float8_e4m3fn, float8_e5m2 = _dt.float8_e4m3, _dt.float8_e4m3fn, _dt.float8_e5m2
float8_e8m0fnu = _dt.float8_e8m0fnu
float8_e5m2_x4, float8_e4m3fn_x4, float4_e2m1fn_x4 = _dt.float8_e5m2_x4, _dt.float8_e4m3fn_x4, _dt.float4_e2m1fn_x4
fp32 = float32
static_cast = _dt.static_cast

# ----------------------------------------------------------------- buffers
sbuf = Buffer.sbuf
psum = Buffer.psum
hbm = Buffer.hbm
private_hbm = Buffer.private_hbm
shared_hbm = Buffer.shared_hbm


def par_dim(n):
    """Mark the partition axis of an on-chip shape: ``(2, nl.par_dim(128), 512)``."""
    return ParDim(n)


def _buffer(buffer):
    if buffer is None:
        return Buffer.sbuf
    if isinstance(buffer, Buffer):
        return buffer
    if isinstance(buffer, AllocSpec):
        return buffer.buffer
    raise NKITypeError(f"unsupported buffer {buffer!r}: use nl.sbuf, nl.psum, nl.hbm, nl.private_hbm "
                       f"or nl.shared_hbm")


def _shape(shape):
    if isinstance(shape, (int, np.integer)):
        return (shape,)
    return tuple(shape)


# ------------------------------------------------------------ creation
def ndarray(shape, dtype=None, buffer=None, name="", address=None, **kwargs):
    """A new, uninitialised tensor.  ``shared_hbm`` tensors are the kernel's outputs,
    shared by all SPMD instances of a launch.  ``address=(partition_offset, byte_offset)``
    places an on-chip tensor where the kernel says (its capacity counts that byte range)."""
    buffer = _buffer(buffer)
    shape = _shape(shape)
    if buffer is Buffer.shared_hbm:
        return _shared_output(shape, dtype, name)
    return allocate(shape, dtype, buffer, name, address=address if buffer.on_chip else None)


def _shared_output(shape, dtype, name):
    # Each instance runs the same code, so the n-th shared_hbm allocation of
    # every instance is the same tensor.
    state = current()
    launch = state.launch
    i = state.shared_counter
    state.shared_counter += 1
    dtype = _dt.normalize(dtype) if dtype is not None else _dt.float32
    if i < len(launch.shared_outputs):
        t = launch.shared_outputs[i]
        if tuple(t.shape) != tuple(int(s) for s in shape) or t.dtype != dtype:
            raise NKIError(f"SPMD instances disagree on shared_hbm tensor #{i}: {tuple(t.shape)} "
                           f"{_dt.name(t.dtype)} vs {tuple(shape)} {_dt.name(dtype)}")
        return t
    t = allocate(shape, dtype, Buffer.shared_hbm, name)
    launch.shared_outputs.append(t)
    return t


def zeros(shape, dtype=None, buffer=None, name="", **kwargs):
    return full(shape, 0, dtype, buffer, name)


def ones(shape, dtype=None, buffer=None, name="", **kwargs):
    return full(shape, 1, dtype, buffer, name)


def full(shape, fill_value, dtype=None, buffer=None, name="", **kwargs):
    t = ndarray(shape, dtype, buffer, name)
    t.write(np.float32(fill_value) if not isinstance(fill_value, np.ndarray) else fill_value)
    return t


def empty_like(x, dtype=None, buffer=None, **kwargs):
    return ndarray(x.shape, dtype or x.dtype, buffer or x.buffer)


def zeros_like(x, dtype=None, buffer=None, **kwargs):
    return zeros(x.shape, dtype or x.dtype, buffer or (x.buffer if x.buffer.on_chip else Buffer.sbuf))


def ones_like(x, dtype=None, buffer=None, **kwargs):
    return ones(x.shape, dtype or x.dtype, buffer or (x.buffer if x.buffer.on_chip else Buffer.sbuf))


def is_psum(buffer):
    return _buffer_of(buffer) is Buffer.psum


def is_sbuf(buffer):
    return _buffer_of(buffer) is Buffer.sbuf


def is_hbm(buffer):
    return _buffer_of(buffer) in (Buffer.hbm, Buffer.private_hbm, Buffer.shared_hbm)


def is_on_chip(buffer):
    return _buffer_of(buffer).on_chip


def _buffer_of(x):
    return x.buffer if isinstance(x, NkiTensor) else _buffer(x)


def shared_identity_matrix(n, dtype=None, dst=None, **kwargs):
    """An ``n x n`` identity matrix (uint8 by default) in SBUF: a new tile, or written into ``dst``."""
    eye = np.eye(int(n), dtype=np.float32)
    if dst is not None:
        dst.write(eye)
        return dst
    t = allocate(eye.shape, dtype if dtype is not None else _dt.uint8, Buffer.sbuf, "identity")
    t.write(eye)
    return t


def shared_constant(constant, dtype=None, **kwargs):
    """An HBM tensor holding a host constant: an array, or the path of a ``.npy`` file holding one."""
    if isinstance(constant, (str, bytes)) or hasattr(constant, "__fspath__"):
        try:
            constant = np.load(constant, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise NKITypeError(f"nl.shared_constant: cannot read a .npy array from {constant!r}: {e}") from None
    arr = np.asarray(constant)
    dtype = _dt.normalize(dtype) if dtype is not None else _dt.normalize(arr.dtype)
    t = allocate(arr.shape, dtype, Buffer.hbm, "constant", values=arr.astype(np.float32) if not _dt.is_int(dtype) else arr)
    t._alloc.readonly = True
    return t


# ------------------------------------------------------------ index grids
def arange(*args):
    """Index vector for beta-1 index grids: ``nl.arange(128)[:, None]``."""
    return np.arange(*args, dtype=np.int64)


class _IndexGrid(tuple):
    """Result of ``nl.mgrid[...]``: unpacks like a tuple, or ``.p``/``.x``/``.y``/``.z``."""

    p = property(lambda self: self[0])
    x = property(lambda self: self[1])
    y = property(lambda self: self[2])
    z = property(lambda self: self[3])


class _MGrid:
    def __getitem__(self, key):
        if not isinstance(key, tuple):
            key = (key,)
        grids = np.mgrid[key]
        if len(key) == 1:
            grids = grids.reshape(1, -1)
        return _IndexGrid(g.astype(np.int64) for g in grids)


mgrid = _MGrid()


def ds(start, size, step=1):
    """Dynamic slice: ``t[nl.ds(i * 128, 128)]``."""
    return DynSlice(start, size, step)


# ----------------------------------------------------------------- loops
def _range(*args, **kwargs):
    # Loop hints (directives, multi_buffer, ...) only steer the compiler's
    # scheduling; iterations run in order here, which is one legal schedule.
    return builtins.range(*args)


def dynamic_range(start, stop=None, step=1, **kwargs):
    """Loop whose bounds the device reads at run time: integers or virtual registers
    (``nisa.register_alloc``), whose current values are read when the loop starts."""
    if stop is None:
        start, stop = 0, start
    return builtins.range(int(start), int(stop), int(step))


class no_reorder:
    """``with nl.no_reorder():`` keeps its instructions in program order, which is the emulator's only order."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def affine_range(*args, **kwargs):
    """Loop whose iterations carry no dependency (except accumulation into PSUM)."""
    return _range(*args, **kwargs)


def sequential_range(*args, **kwargs):
    """Loop whose iterations depend on each other."""
    return _range(*args, **kwargs)


def range(*args, **kwargs):  # noqa: A001  (upstream's name: ``for i in nl.range(n)``)
    """NKI 0.x's loop range: iterations in order, as every loop kind here."""
    return _range(*args, **kwargs)


def static_range(*args, **kwargs):
    """Loop unrolled by the compiler."""
    return _range(*args, **kwargs)


# ------------------------------------------------------------------ SPMD
def program_id(axis=0):
    pid = current().program_id
    if axis >= len(pid):
        if axis == 0 and not pid:
            return 0
        raise NKIError(f"program_id({axis}) in a launch grid of rank {len(pid)}")
    return pid[axis]


def num_programs(axes=None):
    grid = current().launch.grid
    if axes is None:
        return int(math.prod(grid)) if grid else 1
    if isinstance(axes, (list, tuple)):
        return int(math.prod([grid[a] for a in axes]))
    if axes >= len(grid):
        return 1
    return grid[axes]


def program_ndim():
    return len(current().launch.grid)


class _GridDim(int):
    """A launch-grid dimension built with nl.nc / nl.spmd_dim (runs as its total size)."""


def nc(n):
    """Logical-NeuronCore dimension of a launch grid; the emulator runs its instances in turn."""
    return _GridDim(n)


def spmd_dim(*sizes):
    """A launch-grid dimension made of sub-dimensions (e.g. ``spmd_dim(nl.nc(2), 2)``)."""
    return _GridDim(int(math.prod([int(s) for s in sizes])))


# --------------------------------------------------------- data movement
def _hbm_view(x, what):
    if not isinstance(x, NkiTensor):
        raise NKITypeError(f"{what}: expected a tensor, got {type(x).__name__}")
    if x.buffer.on_chip:
        raise NKITypeError(f"{what}: source/destination must be in HBM, got a {x.buffer.value} tile")
    return x


def _mask(mask, shape):
    if mask is None:
        return None
    if isinstance(mask, (builtins.bool, np.bool_)):
        return np.full(shape, builtins.bool(mask))
    if isinstance(mask, NkiTensor):
        raise NKITypeError("mask= must be a predicate on index grids or program ids, not a tile; use nl.where")
    return align_to(np.asarray(mask, dtype=np.bool_), shape)


def load(src, mask=None, dtype=None, **kwargs):
    """Copy an HBM tensor (view) into a new SBUF tile (partition axis first)."""
    _hbm_view(src, "nl.load")
    shape = src.shape
    m = _mask(mask, shape)
    vals = src.raw_values(m, "nl.load")
    out_dtype = _dt.normalize(dtype) if dtype is not None else src.dtype
    t = allocate(shape if shape else (1,), out_dtype, Buffer.sbuf, "load")
    t.write(vals.reshape(t.shape), m)
    if m is not None:
        t._mask = m
    return t


def store(dst, value, mask=None, **kwargs):
    """Copy a tile (or value) into an HBM tensor (view)."""
    _hbm_view(dst, "nl.store")
    shape = dst.shape
    m = _mask(mask, shape)
    if isinstance(value, NkiTensor):
        if not value.buffer.on_chip:
            raise NKITypeError("nl.store: the value must be an on-chip tile; use nisa.dma_copy for HBM to HBM")
        if value._mask is not None:
            vm = align_to(value._mask, shape)
            m = vm if m is None else (m & vm)
        vals = value.exact_values()
        if vals is None:
            vals = value.raw_values(None, "nl.store")
    else:
        vals = np.asarray(value)
    dst.write(align_to(vals, shape), m, what="nl.store")


def copy(x, mask=None, dtype=None, **kwargs):
    """A copy of a tile (computed on an engine, so float32 in the middle)."""
    return _ops.unary(_ops.UNARY["copy"], x, dtype=dtype, mask=_mask(mask, np.shape(x)) if mask is not None else None)


def load_transpose2d(src, mask=None, dtype=None, **kwargs):
    """Load a 2-D HBM region transposed: partition axis becomes the source's axis 1."""
    _hbm_view(src, "nl.load_transpose2d")
    if len(src.shape) != 2:
        raise NKITypeError("nl.load_transpose2d needs a 2-D source")
    m = _mask(mask, src.shape)
    vals = src.raw_values(m, "nl.load_transpose2d")
    out_dtype = _dt.normalize(dtype) if dtype is not None else src.dtype
    t = allocate(vals.T.shape, out_dtype, Buffer.sbuf, "load_transpose2d")
    t.write(vals.T, None if m is None else m.T)
    return t


# -------------------------------------------------------------- math
def _m(mask, *xs):
    if mask is None:
        return None
    shape = ()
    for x in xs:
        s = tuple(x.shape) if isinstance(x, NkiTensor) else np.shape(x)
        if s:
            shape = pair_shapes(shape, s) if shape else s
    return _mask(mask, shape)


def _binary_fn(name, f, doc):
    def fn(x, y, dtype=None, mask=None, **kwargs):
        return _ops.binary(f, x, y, dtype=dtype, mask=_m(mask, x, y), what=f"nl.{name}")
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = doc
    fn._binary = f
    return fn


def _unary_fn(name, doc):
    f = _ops.UNARY[name]

    def fn(x, dtype=None, mask=None, **kwargs):
        return _ops.unary(f, x, dtype=dtype, mask=_m(mask, x), what=f"nl.{name}")
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = doc
    fn._unary = f
    return fn


def _reduce_fn(name, f, doc):
    def fn(x, axis=None, dtype=None, mask=None, keepdims=False, **kwargs):
        return _ops.reduce(f, x, axis, dtype=dtype, mask=_m(mask, x), keepdims=keepdims, what=f"nl.{name}")
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = doc
    fn._binary = f
    return fn


add = _binary_fn("add", np.add, "x + y")
subtract = _binary_fn("subtract", np.subtract, "x - y")
multiply = _binary_fn("multiply", np.multiply, "x * y")
divide = _binary_fn("divide", np.divide, "x / y")
maximum = _binary_fn("maximum", np.maximum, "element-wise maximum")
minimum = _binary_fn("minimum", np.minimum, "element-wise minimum")
power = _binary_fn("power", np.power, "x ** y")
mod = _binary_fn("mod", np.mod, "x mod y (sign of y)")
fmod = _binary_fn("fmod", np.fmod, "x mod y (sign of x)")
equal = _binary_fn("equal", np.equal, "1 where x == y else 0")
not_equal = _binary_fn("not_equal", np.not_equal, "1 where x != y else 0")
greater = _binary_fn("greater", np.greater, "1 where x > y else 0")
greater_equal = _binary_fn("greater_equal", np.greater_equal, "1 where x >= y else 0")
less = _binary_fn("less", np.less, "1 where x < y else 0")
less_equal = _binary_fn("less_equal", np.less_equal, "1 where x <= y else 0")
logical_and = _binary_fn("logical_and", np.logical_and, "x and y")
logical_or = _binary_fn("logical_or", np.logical_or, "x or y")
logical_xor = _binary_fn("logical_xor", np.logical_xor, "x xor y")
bitwise_and = _binary_fn("bitwise_and", np.bitwise_and, "x & y on integers")
bitwise_or = _binary_fn("bitwise_or", np.bitwise_or, "x | y on integers")
bitwise_xor = _binary_fn("bitwise_xor", np.bitwise_xor, "x ^ y on integers")
left_shift = _binary_fn("left_shift", np.left_shift, "x << y on integers")
right_shift = _binary_fn("right_shift", np.right_shift, "x >> y on integers")

abs_max = _binary_fn("abs_max", _ops._abs_max, "the input of larger magnitude, element-wise (sign kept)")
abs_min = _binary_fn("abs_min", _ops._abs_min, "the input of smaller magnitude, element-wise (sign kept)")
# operator constants: ``bypass`` passes its first operand through (an op0/op1 stage that does nothing)
bypass = _binary_fn("bypass", _ops._bypass, "the first operand, unchanged")
bypass._unary = _ops.UNARY["bypass"]


def invert(x, dtype=None, mask=None, **kwargs):
    """Bitwise NOT of an integer tile (XOR with all ones)."""
    return _ops.binary(np.bitwise_xor, x, -1, dtype=dtype, mask=_m(mask, x), what="nl.invert")


for _name in ("exp", "log", "sqrt", "rsqrt", "reciprocal", "tanh", "sigmoid", "relu", "gelu",
              "gelu_apprx_tanh", "gelu_apprx_sigmoid", "gelu_apprx_sigmoid_dx", "gelu_dx", "silu", "silu_dx",
              "softplus", "mish",
              "erf", "erf_dx", "sin", "cos", "tan", "arctan", "abs", "negative", "sign", "square",
              "floor", "ceil", "trunc", "logical_not"):
    globals()[_name] = _unary_fn(_name, f"element-wise {_name}")
del _name

sum = _reduce_fn("sum", np.add, "sum over the given free axes")  # noqa: A001 (NKI name)
prod = _reduce_fn("prod", np.multiply, "product over the given free axes")
max = _reduce_fn("max", np.maximum, "maximum over the given free axes")  # noqa: A001
min = _reduce_fn("min", np.minimum, "minimum over the given free axes")  # noqa: A001
all = _reduce_fn("all", np.logical_and, "1 if all elements are nonzero")  # noqa: A001
any = _reduce_fn("any", np.logical_or, "1 if any element is nonzero")  # noqa: A001


def mean(x, axis=None, dtype=None, mask=None, keepdims=False, **kwargs):
    """Arithmetic mean over the given free axes (float32)."""
    v, d = _ops.operand(x, "nl.mean")
    axes = _ops.normalize_axis(axis, v.ndim)
    return _ops.result(np.mean(v, axis=axes, keepdims=keepdims, dtype=np.float32),
                       dtype if dtype is not None else d, _ops.reduce_mask(_m(mask, x), v.shape, axes, keepdims))


def var(x, axis=None, dtype=None, mask=None, keepdims=False, **kwargs):
    """Population variance over the given free axes (float32)."""
    v, d = _ops.operand(x, "nl.var")
    axes = _ops.normalize_axis(axis, v.ndim)
    return _ops.result(np.var(v, axis=axes, keepdims=keepdims, dtype=np.float32), dtype if dtype is not None else d,
                       _ops.reduce_mask(_m(mask, x), v.shape, axes, keepdims))


def where(condition, x, y, dtype=None, mask=None, **kwargs):
    """x where condition is nonzero, else y."""
    c, _ = _ops.operand(condition, "nl.where")
    vx, dx = _ops.operand(x, "nl.where")
    vy, dy = _ops.operand(y, "nl.where")
    shape = _ops.out_shape(c, vx, vy)
    r = np.where(align_to(c, shape) != 0, align_to(vx, shape), align_to(vy, shape))
    return _ops.result(r, dtype if dtype is not None else (_dt.promote(dx, dy) or _dt.float32), _m(mask, x))


def transpose(x, dtype=None, mask=None, **kwargs):
    """2-D transpose of a tile (partition and free axis swap), at most 128 x 128."""
    v, d = _ops.operand(x, "nl.transpose")
    if v.ndim != 2:
        raise NKITypeError("nl.transpose needs a 2-D tile")
    if v.shape[1] > TileSize.pmax:
        raise NKILimitError("nl.tile_size.pmax", v.shape[1], TileSize.pmax, "free size of a tile to transpose")
    return _ops.result(np.ascontiguousarray(v.T), dtype if dtype is not None else d)


def matmul(x, y, transpose_x=False, mask=None, **kwargs):
    """x @ y (or x.T @ y with transpose_x=True) on the Tensor Engine; a float32 PSUM tile."""
    xv = x
    if not transpose_x:
        xv = transpose(x)
    r = _ops.matmul_values(xv, y, "nl.matmul", require_sbuf=False)
    return _ops.result(r, _dt.float32, None, Buffer.psum, "matmul")


def rms_norm(x, w, axis, n, epsilon=1e-6, dtype=None, compute_dtype=None, mask=None, **kwargs):
    """``x / sqrt(sum(x**2 along axis) / n + epsilon) * w`` (float32 arithmetic)."""
    v, d = _ops.operand(x, "nl.rms_norm")
    wv, _ = _ops.operand(w, "nl.rms_norm")
    axes = _ops.normalize_axis(axis, v.ndim)
    ms = np.sum(v * v, axis=axes, keepdims=True, dtype=np.float32) / np.float32(n)
    r = v / np.sqrt(ms + np.float32(epsilon)) * (align_to(wv, v.shape) if np.ndim(wv) else wv)
    return _ops.result(r.astype(np.float32), dtype if dtype is not None else d, _m(mask, x))


def softmax(x, axis=-1, dtype=None, mask=None, **kwargs):
    """exp(x - max) / sum(exp(x - max)) along ``axis``."""
    v, d = _ops.operand(x, "nl.softmax")
    axes = _ops.normalize_axis(axis, v.ndim)
    e = np.exp(v - v.max(axis=axes, keepdims=True))
    return _ops.result(e / e.sum(axis=axes, keepdims=True), dtype if dtype is not None else d)


def broadcast_to(x, shape, **kwargs):
    return _ops.broadcast_to(x, shape)


def expand_dims(x, axis):
    return x.expand_dims(axis)


def dropout(x, rate, dtype=None, mask=None, **kwargs):
    """Zero each element with probability ``rate`` (no rescaling, as on the device)."""
    v, d = _ops.operand(x, "nl.dropout")
    r, _ = _ops.operand(rate, "nl.dropout")
    keep = current().rng.random(v.shape, dtype=np.float32) >= r
    return _ops.result(np.where(keep, v, np.float32(0)), dtype if dtype is not None else d)


def random_seed(seed, mask=None, **kwargs):
    """Seed the instance's random generator (used by dropout)."""
    s, _ = _ops.operand(seed, "nl.random_seed")
    current().rng = np.random.default_rng(int(np.asarray(s).reshape(-1)[0]))


def rand(shape, dtype=None, **kwargs):
    st = current()
    return _ops.result(st.rng.random(_shape(shape), dtype=np.float32), dtype)


def device_print(prefix, x, **kwargs):
    """Print a tile from inside a kernel."""
    vals = x.read() if isinstance(x, NkiTensor) else x
    print(prefix, vals, file=sys.stdout)


# ----------------------------------------------------------- loop_reduce
_TARGET_CACHE: dict = {}


def loop_reduce(x, op, loop_indices=None, *, dtype=None, mask=None, **kwargs):
    """``b = nl.loop_reduce(a, op=np.add, loop_indices=[i])``: ``b = op(b, a)`` each iteration.

    The destination is the assignment target, which the compiler reads from
    the source; we do the same: we parse the calling line and look up the
    target's current value in the caller's frame.  Before the target exists,
    the result is ``x`` itself.
    """
    f = _ops.resolve_binary(op)
    frame = sys._getframe(1)
    target = _assignment_target(frame.f_code.co_filename, frame.f_lineno)
    prev = None
    if target is not None:
        try:
            prev = eval(target, frame.f_globals, frame.f_locals)  # noqa: S307 (kernel's own expression)
        except Exception:  # not yet bound: first iteration
            prev = None
    return _loop_reduce_step(f, prev if isinstance(prev, NkiTensor) else None, x, dtype, _m(mask, x))


@instruction  # the frame lookup above runs only while interpreting; this is what replays
def _loop_reduce_step(f, prev, x, dtype, mask):
    if prev is not None:
        return _ops.binary(f, prev, x, dtype=dtype or prev.dtype, mask=mask, what="nl.loop_reduce")
    return _ops.unary(_ops.UNARY["copy"], x, dtype=dtype, mask=mask)


def _assignment_target(filename, lineno):
    key = (filename, lineno)
    if key in _TARGET_CACHE:
        return _TARGET_CACHE[key]
    code = None
    for start in builtins.range(lineno, builtins.max(0, lineno - 5), -1):
        text = "".join(linecache.getline(filename, i) for i in builtins.range(start, lineno + 3)).strip()
        for end in builtins.range(len(text), 0, -1):
            try:
                tree = ast.parse(text[:end])
            except SyntaxError:
                continue
            node = tree.body[0] if tree.body else None
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                code = ast.unparse(node.targets[0])
            break
        if code is not None:
            break
    _TARGET_CACHE[key] = code
    return code


# Everything else a kernel calls touches tiles: one step of a recorded trace
# (see trace.py).  These only compute indices, loop bounds and launch facts.
instructions(globals(), __name__, exclude={
    "par_dim", "arange", "ds", "range", "affine_range", "sequential_range", "static_range", "dynamic_range", "program_id",
    "num_programs", "program_ndim", "nc", "spmd_dim", "static_cast", "expand_dims", "loop_reduce",
    "is_psum", "is_sbuf", "is_hbm", "is_on_chip"})

# upstream names of the memory constants
MemoryRegion = Buffer

# upstream names of types that kernels annotate with or derive from
tensor = NkiTensor
bool = bool_  # noqa: A001  (``nl.bool``, NKI 0.x's name of the boolean dtype)


class _DTypeClass(type):
    def __instancecheck__(cls, obj):
        return isinstance(obj, (np.dtype, _dt.Packed, type(_dt.tfloat32)))


class dtype(metaclass=_DTypeClass):  # noqa: N801  (upstream's name)
    """``nl.dtype``: what kernels annotate dtype parameters with.  A dtype here is a NumPy dtype or
    one of the packed MX types, so ``isinstance(x, nl.dtype)`` accepts both."""


class _NKIObjectClass(type):
    """Construction of NKI objects: the class's own ``__init__`` when the arguments fit it, else
    keyword arguments that set attributes the class declares (an annotation or a class attribute),
    the way NKI's object model builds them.  Library kernels rely on the second form: dataclasses
    whose attributes are unannotated class attributes (``section_idx = None``), which have no
    dataclass fields, and dataclasses built without some of their fields."""

    def __call__(cls, *args, **kwargs):
        if cls.__init__ is not object.__init__ or not (args or kwargs):  # object's takes no arguments
            try:
                inspect.signature(cls.__init__).bind(None, *args, **kwargs)
            except TypeError:
                pass
            else:
                return super().__call__(*args, **kwargs)
        if args:
            raise TypeError(f"{cls.__name__}: positional arguments {args!r} do not fit its __init__; "
                            f"NKI objects take their attributes by keyword")
        declared = set()
        for klass in cls.__mro__:
            declared.update(getattr(klass, "__annotations__", {}))
            declared.update(k for k in vars(klass) if not k.startswith("__"))
        unknown = sorted(set(kwargs) - declared)
        if unknown:
            raise TypeError(f"{cls.__name__} has no attribute(s) {unknown} to set")
        obj = cls.__new__(cls)
        for k, v in kwargs.items():
            object.__setattr__(obj, k, v)
        post_init = getattr(obj, "__post_init__", None)
        if post_init is not None:
            post_init()
        return obj


class NKIObject(metaclass=_NKIObjectClass):
    """Base class of user classes whose instances kernels take as arguments (configuration
    objects, usually dataclasses); the kernel reads their attributes as Python values."""

    __slots__ = ()
