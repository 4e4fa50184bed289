"""NkiTensor: a view of HBM, SBUF or PSUM memory, and the tiles kernels compute with.

One class serves every generation of the language: kernel arguments and
outputs (HBM), on-chip buffers from ``nl.ndarray`` (SBUF/PSUM), the tiles that
beta-1 operations return, and views made by indexing any of them.

A view is either

* *basic*: a NumPy view into the buffer's storage (ints, slices with steps,
  ``nl.ds``, and index grids whose elements form an in-bounds affine lattice,
  as ``nl.arange``/``nl.mgrid`` arithmetic does), which reads and writes
  through with no copy; or
* *gathered*: a flat index array into the (C-contiguous) storage, for other
  index grids (mixed with slices, not affine) and out-of-range accesses.

Out-of-range elements are not an error when the view is made, because beta-1
kernels index past a ragged edge and rely on the ``mask=`` of the instruction
that consumes the view.  The view remembers which elements are outside
(``_oob``); the consuming instruction raises if any of them is not masked off.
"""
from __future__ import annotations

import math
import types
import weakref

import numpy as np

from . import dtypes as _dt
from . import liveness as _liveness
from .context import current
from .instruction import active, instruction, outside_instruction
from .errors import NKIError, NKILimitError, NKIOutOfBoundsError, NKITypeError, kernel_location
from .machine import Allocation, Buffer, TileSize, new_storage, onchip_footprint


class ParDim(int):
    """``nl.par_dim(n)``: marks the partition axis in an on-chip shape."""

    def __repr__(self):
        return f"par_dim({int(self)})"


class DynSlice:
    """``nl.ds(start, size)``: a slice given by start and size (start may be computed)."""

    __slots__ = ("start", "size", "step")

    def __init__(self, start, size, step=1):
        self.start, self.size, self.step = int(start), int(size), int(step)

    def to_slice(self):
        return slice(self.start, self.start + self.size * self.step, self.step)

    def __repr__(self):
        return f"ds({self.start}, {self.size})"


def _check_tile_shape(shape, par, buffer, what, dtype=None, machine=None):
    """Enforce the partition and PSUM free-size limits on an on-chip tile.  A PSUM tile's partition
    fits one 2 KiB bank: 512 four-byte elements, or 1024 two-byte ones on machines that store 2-byte
    types in PSUM at their width (NeuronCore-v4)."""
    if not buffer.on_chip:
        return
    partitions = int(shape[par]) if len(shape) > par else 1
    if partitions > TileSize.pmax:
        raise NKILimitError("nl.tile_size.pmax", partitions, TileSize.pmax,
                            f"partition dimension of {what} {tuple(shape)}")
    if buffer is Buffer.psum:
        free = int(math.prod(shape[par + 1:]))
        limit = TileSize.psum_fmax
        if dtype is not None and machine is not None and machine.bf16_psum and _dt.itemsize(dtype) == 2:
            limit = TileSize.psum_bank_fmax_bytes // 2
        if free > limit:
            raise NKILimitError("nl.tile_size.psum_fmax", free, limit,
                                f"PSUM free size (elements per partition) of {what} {tuple(shape)}")


def _placement(address, shape, par, footprint, buffer, machine, what):
    """The first byte of a kernel-placed on-chip tile (``address=(partition_offset, byte_offset)``),
    checked to lie within the partitions and the buffer's bytes per partition."""
    try:
        first, offset = (int(a) for a in address)
    except (TypeError, ValueError):
        raise NKITypeError(f"address= of {what} must be (partition_offset, byte_offset), got {address!r}") from None
    partitions = int(shape[par]) if len(shape) > par else 1
    if first < 0 or first + partitions > TileSize.pmax:
        raise NKILimitError("nl.tile_size.pmax", first + partitions, TileSize.pmax,
                            f"partitions {first}..{first + partitions - 1} of {what} placed at {address!r}")
    cap = machine.sbuf_bytes_per_partition if buffer is Buffer.sbuf else machine.psum_bytes_per_partition
    if offset < 0 or offset + footprint > cap:
        raise NKILimitError(f"{buffer.value.upper()} capacity ({cap} bytes per partition)",
                            f"{offset + footprint} bytes", f"{cap} bytes",
                            f"the end of {what} ({footprint} bytes per partition) placed at {address!r}")
    return offset


def allocate(shape, dtype, buffer: Buffer, name: str = "", *, values=None, fill=None, address=None):
    """Create a new buffer and return the tensor viewing all of it.  ``address`` places an
    on-chip buffer (see ``_placement``); placed buffers have storage of their own all the same."""
    outside_instruction("allocating a buffer")
    dtype = _dt.normalize(dtype) if dtype is not None else _dt.float32
    state = current()
    par = 0
    clean = []
    for i, s in enumerate(shape):
        if isinstance(s, ParDim):
            par = i
        clean.append(int(s))
    shape = tuple(clean)
    if buffer.on_chip:
        _check_tile_shape(shape, par, buffer, f"{buffer.value} tensor {name}".rstrip(), dtype,
                          state.launch.target)
    if values is not None:
        data = np.ascontiguousarray(_dt.from_compute(np.broadcast_to(values, shape), dtype))
        if data.base is not None or not data.flags.writeable:
            data = data.copy()
    elif fill is not None:
        data = np.full(shape, fill, dtype=_dt.storage(dtype))
    elif buffer is Buffer.shared_hbm and state.launch.hbm_allocator is not None:
        data = state.launch.hbm_allocator(shape, _dt.storage(dtype))
    else:
        data = new_storage(shape, dtype, state.launch.debug)
    alloc = Allocation(data, buffer, dtype, par, name)
    if buffer.on_chip:
        # a replayed program was checked against the capacity when recorded
        live = state.liveness
        if live is not None:
            footprint = onchip_footprint(shape, par, dtype, buffer, state.launch.target)
            if address is not None:
                address = _placement(address, shape, par, footprint, buffer, state.launch.target,
                                     f"{buffer.value} tensor {name}".rstrip())
            live.allocated(alloc, footprint, address)
    if values is not None or fill is not None:
        alloc.written = True
        if alloc.psum_valid is not None:
            alloc.psum_valid[...] = True
    return NkiTensor(alloc, data, None, None, par)


def wrap_host_array(array: np.ndarray, buffer: Buffer = Buffer.hbm, name: str = ""):
    """View a host (or device-aliased) array as an HBM tensor, without copying."""
    if not array.flags.c_contiguous:
        raise NKITypeError("HBM tensors must be C-contiguous; the launcher copies others in and out")
    packed = _dt.packed_type_of(array)
    dtype = packed if packed is not None else _dt.normalize(array.dtype)
    if packed is not None:
        array = array.view(np.ndarray)
    alloc = Allocation(array, buffer, dtype, 0, name)
    alloc.written = True
    return NkiTensor(alloc, array, None, None, 0)


def _reinterpreted(alloc: Allocation, data, dtype, par) -> Allocation:
    """A buffer over ``alloc``'s memory seen as another dtype; its uses keep ``alloc`` live."""
    new = Allocation(data, alloc.buffer, dtype, par, alloc.name)
    new.written = True
    new.owner = alloc.owner if alloc.owner is not None else alloc
    return new


def _ext_coords(shape, lo, hi, k):
    """Zero-copy array whose elements are their own coordinate along axis ``k`` (from lo)."""
    ext = tuple(h - l + 1 for l, h in zip(lo, hi))
    shp = [1] * len(ext)
    shp[k] = ext[k]
    return np.broadcast_to(np.arange(lo[k], hi[k] + 1, dtype=np.int64).reshape(shp), ext)


# The instructions behind the tile operators (``a + b``, ``-a``, ``a += b``, ``a.broadcast_to``):
# ops.py, which builds on this module, registers them (``register_arithmetic``).
_arithmetic = types.SimpleNamespace(binary=None, unary=None, update=None, broadcast_to=None)


def register_arithmetic(*, binary, unary, update, broadcast_to):
    """Called by ops.py with the instructions the tile operators run."""
    _arithmetic.__dict__.update(binary=binary, unary=unary, update=update, broadcast_to=broadcast_to)


# tiles made by comparing tile values (``a < b``): the ones without a truth value in Python conditions
# (by id: tiles compare by value, so they cannot be set members)
_COMPARISON_RESULTS = weakref.WeakValueDictionary()


class NkiTensor:
    """A tensor (or view of one) in HBM, SBUF or PSUM."""

    __slots__ = ("_alloc", "_arr", "_key", "_oob", "_par", "_mask", "__weakref__")
    __array_priority__ = 1000  # make NumPy defer to our operators (np_scalar * tile)

    def __init__(self, alloc: Allocation, arr, key, oob, par, mask=None):
        self._alloc = alloc
        self._arr = arr        # NumPy view (basic) or None
        self._key = key        # flat int64 indices into storage (gathered) or None
        self._oob = oob        # bool array: element outside the indexed tensor
        self._par = par        # partition axis of this view (on-chip)
        self._mask = mask      # predicate of the instruction that produced this tile

    # ------------------------------------------------------------------ info
    @property
    def shape(self):
        return self._arr.shape if self._arr is not None else self._key.shape

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        return int(math.prod(self.shape))

    @property
    def dtype(self):
        return self._alloc.dtype

    @property
    def buffer(self) -> Buffer:
        return self._alloc.buffer

    @property
    def name(self):
        return self._alloc.name

    @property
    def itemsize(self):
        return _dt.itemsize(self.dtype)

    def __len__(self):
        return self.shape[0]

    def __repr__(self):
        return (f"NkiTensor(shape={tuple(self.shape)}, dtype={_dt.name(self.dtype)}, "
                f"buffer={self.buffer.value}{', name=' + self.name if self.name else ''})")

    def __bool__(self):
        # A tensor is an object that exists (``if bias:`` tests an optional argument, as in NKI 0.x);
        # a comparison of tile values has no truth value at trace time.
        if _COMPARISON_RESULTS.get(id(self)) is self:
            raise NKITypeError("a tile comparison has no truth value in the kernel's Python control flow; "
                               "use mask= or nl.where for data-dependent choices")
        return True

    __hash__ = object.__hash__

    def __iter__(self):
        raise NKITypeError("tiles cannot be iterated; index them with slices or nl.arange")

    # --------------------------------------------------------------- access
    def _is_whole(self):
        return self._arr is not None and self._arr is self._alloc.data

    def _reshaped_whole(self):
        """A reshape of the whole tensor (same elements, same order)?"""
        a, data = self._arr, self._alloc.data
        return (a is not None and a.size == data.size and a.flags.c_contiguous
                and a.__array_interface__["data"][0] == data.__array_interface__["data"][0])

    def read(self) -> np.ndarray:
        """Current contents (storage dtype), without bounds checking."""
        outside_instruction("reading tile values")
        if self._arr is not None:
            return self._arr
        return self._alloc.data.reshape(-1)[self._key]

    def check_bounds(self, mask, what: str):
        """Raise if an element outside the tensor is accessed and not masked off."""
        if self._oob is None:
            return
        bad = self._oob if mask is None else (self._oob & np.broadcast_to(mask, self._oob.shape))
        if bad.any():
            pos = tuple(int(i) for i in np.argwhere(bad)[0])
            raise NKIOutOfBoundsError(
                f"{what} out of bounds of {self.buffer.value} tensor "
                f"{self.name or ''}{tuple(self._alloc.data.shape)}: {int(bad.sum())} element(s) "
                f"outside, first at position {pos} of the accessed {tuple(self.shape)} region")

    def compute_values(self, mask=None, what="read") -> np.ndarray:
        """Contents as float32, the engines' internal type (exact for fresh results)."""
        self.check_bounds(mask, what)
        exact = self.exact_values()
        if exact is not None:
            return exact
        return _dt.to_compute(self.read())

    def exact_values(self):
        """Float32 result of the instruction that produced this tile, if unchanged since."""
        outside_instruction("reading tile values")
        if self._alloc.exact is not None and self._is_whole():
            return self._alloc.exact
        return None

    def raw_values(self, mask=None, what="read") -> np.ndarray:
        """Contents as stored (DMA moves bits, engines convert)."""
        self.check_bounds(mask, what)
        return self.read()

    def write(self, values, mask=None, *, exact=True, what="write"):
        """Store ``values`` (any dtype; rounded to ours) where ``mask`` is true."""
        outside_instruction("writing a tile")
        alloc = self._alloc
        if alloc.readonly:
            raise NKITypeError(f"tensor {alloc.name or ''} is a constant and cannot be written")
        self.check_bounds(mask, what)
        shape = self.shape
        vals = align_to(values, shape)
        if vals.dtype != _dt.storage(self.dtype) or self.dtype is _dt.tfloat32:
            vals = _dt.from_compute(vals, self.dtype)
        if mask is not None:
            mask = align_to(mask, shape).astype(bool, copy=False)
        if self._oob is not None:
            keep = ~self._oob if mask is None else (mask & ~self._oob)
            mask = keep
        if self._arr is not None:
            if mask is None:
                self._arr[...] = vals
            else:
                np.copyto(self._arr, vals, where=mask)
        else:
            flat = alloc.data.reshape(-1)
            if mask is None:
                flat[self._key] = vals
            else:
                flat[self._key[mask]] = np.broadcast_to(vals, shape)[mask]
        alloc.written = True
        alloc.stored = True
        if alloc.owner is not None:
            alloc.owner.stored = True
        alloc.exact = None
        if alloc.psum_valid is not None:
            self._mark_psum_valid(mask)

    def _mark_psum_valid(self, mask=None):
        view = self._parallel_view(self._alloc.psum_valid)
        if view is not None:
            if mask is None:
                view[...] = True
            else:
                view |= mask
            return
        flat = self._alloc.psum_valid.reshape(-1)
        flat[self._key if mask is None else self._key[mask]] = True

    def _psum_valid_view(self):
        view = self._parallel_view(self._alloc.psum_valid)
        return view if view is not None else self._alloc.psum_valid.reshape(-1)[self._key]

    def _parallel_view(self, other: np.ndarray):
        """The same elements of ``other`` (an array shaped like our storage) as this
        basic view selects from the storage; None for gathered views."""
        if self._arr is None:
            return None
        if self._is_whole():
            return other
        off, strides = self._offset_strides()
        flat = other.reshape(-1)
        return np.lib.stride_tricks.as_strided(flat[off:], shape=self.shape,
                                               strides=[st * flat.itemsize for st in strides])

    def _flat_key(self):
        """Flat storage index of every element of this view."""
        if self._key is not None:
            return self._key
        off, strides = self._offset_strides()
        key = np.full(self.shape, off, dtype=np.int64)
        for k, (n, s) in enumerate(zip(self.shape, strides)):
            shp = [1] * self.ndim
            shp[k] = n
            key = key + (np.arange(n, dtype=np.int64) * s).reshape(shp)
        return key

    def _offset_strides(self):
        root = self._alloc.data
        isz = root.itemsize
        off = (self._arr.__array_interface__["data"][0] - root.__array_interface__["data"][0]) // isz
        return off, [s // isz for s in self._arr.strides]

    # ------------------------------------------------------------- indexing
    def __getitem__(self, idx):
        return index(self, idx)

    def __setitem__(self, idx, value):
        target = index(self, idx)
        assign(target, value)

    @instruction
    def ap(self, *pattern, offset=0, dtype=None, pattern_kw=None, scalar_offset=None, vector_offset=None,
           indirect_dim=0, **kwargs):
        """Hardware access pattern: ``t.ap([[step, num], ...], offset=0, dtype=None)``.

        The tensor is seen as flat; view element (i0, i1, ...) is storage
        element ``offset + sum(ik * step_k)``.  Also accepts the pairs as
        separate arguments, and ``pattern=`` as a keyword.

        Tensor indirection: ``scalar_offset=`` (a one-element SBUF tile) adds
        its value times the stride of the tensor's axis ``indirect_dim`` to
        every element; ``vector_offset=`` (an SBUF tile of indices, read in
        partition order) replaces the pattern's first dimension: entry ``i0``
        starts at index ``vector_offset[i0]`` of axis ``indirect_dim``.  The
        indices are read when ``.ap()`` is called, so a kernel computes them
        before building the view (a signature that uses indirection is
        interpreted on every call, since its addresses depend on data).
        """
        if "pattern" in kwargs:
            pattern = (kwargs.pop("pattern"),)
        if kwargs:
            raise NKITypeError(f"unsupported .ap() arguments: {sorted(kwargs)}")
        if len(pattern) == 1 and pattern[0] and isinstance(pattern[0][0], (list, tuple)):
            pattern = pattern[0]
        pattern = [(int(s), int(n)) for s, n in pattern]
        if not (self._is_whole() or self._reshaped_whole()):
            if self._arr is None or dtype is not None:
                raise NKIError("cannot specify an access pattern on a gathered or reinterpreted view; call .ap() on "
                               "the tensor itself")
            # a strided view (``t[i].ap(...)``): the pattern starts at the view's first element
            offset = int(offset) + self._offset_strides()[0]
        alloc = self._alloc
        data = alloc.data
        if dtype is not None:
            dtype = _dt.normalize(dtype)
            data = data.reshape(-1).view(_dt.storage(dtype))
            alloc = _reinterpreted(alloc, data, dtype, alloc.par_axis)
        if self.buffer.on_chip and len(pattern) > 0:
            free = int(math.prod(data.shape[1:])) if dtype is None else data.size // self.shape[0]
            if pattern[0][0] != free:
                raise NKIError(f"the partition step of an on-chip access pattern must equal the free size "
                               f"of the tensor ({free}), got {pattern[0][0]}: partitions are read contiguously")
        flat = data.reshape(-1)
        shape = tuple(n for _, n in pattern)
        key = np.full(shape, int(offset), dtype=np.int64)
        indices, stride = self._indirect_indices(scalar_offset, vector_offset, indirect_dim, pattern)
        for k, (s, n) in enumerate(pattern):
            shp = [1] * len(shape)
            shp[k] = n
            if k == 0 and vector_offset is not None:
                key = key + indices.reshape(shp)
            else:
                key = key + (np.arange(n, dtype=np.int64) * s).reshape(shp)
        if scalar_offset is not None:
            key = key + indices
        oob = (key < 0) | (key >= flat.size)
        # out-of-bounds elements (an index read from the offset tile past the tensor, say) are marked:
        # the instruction that reads or writes the view raises, unless it skips them (oob_mode.skip)
        if oob.any():
            return NkiTensor(alloc, None, np.clip(key, 0, flat.size - 1), oob, 0)
        if indices is not None:
            return NkiTensor(alloc, None, key, None, 0)
        if all(s >= 0 for s, _ in pattern):
            view = np.lib.stride_tricks.as_strided(
                flat[int(offset):], shape=shape, strides=[s * flat.itemsize for s, _ in pattern], writeable=True)
            return NkiTensor(alloc, view, None, None, 0)
        return NkiTensor(alloc, None, key, None, 0)

    def _indirect_indices(self, scalar_offset, vector_offset, indirect_dim, pattern):
        """Element offsets of tensor indirection (see ``ap``), read from the offset tile (None without
        it), and the stride of the indirect axis."""
        if scalar_offset is None and vector_offset is None:
            return None, 1
        if scalar_offset is not None and vector_offset is not None:
            raise NKITypeError(".ap(): give at most one of scalar_offset and vector_offset")
        shape = tuple(self.shape)  # the axes of the tensor .ap() is called on (a reshape's, say)
        dim = int(indirect_dim)
        if not 0 <= dim < max(len(shape), len(pattern)):
            raise NKITypeError(f".ap(): indirect_dim {dim} is not an axis of the {len(shape)}-d tensor {shape} "
                               f"or of the {len(pattern)}-d pattern")
        # a tensor of fewer axes than the pattern is seen with leading axes of size one
        padded = (1,) * max(0, dim + 1 - len(shape)) + shape
        stride = int(math.prod(padded[dim + 1:]))
        source = scalar_offset if scalar_offset is not None else vector_offset
        if not isinstance(source, NkiTensor) or not source.buffer.on_chip:
            raise NKITypeError(f".ap(): {'scalar' if scalar_offset is not None else 'vector'}_offset must be an "
                               f"SBUF tile of indices, got {source!r}")
        rec = active()
        if rec is not None:
            rec.poison(f"tensor indirection (.ap() with an offset tile) at {kernel_location()}")
        values = _dt.to_compute(source.raw_values(None, ".ap() offset")).reshape(-1, order="F")
        if scalar_offset is not None:
            if values.size != 1:
                raise NKITypeError(f".ap(): scalar_offset must hold one element, it has {values.size}")
            return np.int64(values[0]) * stride, stride
        # indices in partition order: the (P, n) tile read column by column
        count = pattern[0][1] if pattern else 0
        if values.size < count:
            raise NKITypeError(f".ap(): vector_offset holds {values.size} indices, the pattern's first "
                               f"dimension needs {count}")
        return values[:count].astype(np.int64) * stride, stride

    def reshape(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        shape = tuple(int(s) for s in shape)
        if self._arr is not None:
            try:
                view = self._arr.view()
                view.shape = shape
                return NkiTensor(self._alloc, view, None, None, 0)
            except (AttributeError, ValueError):
                pass
        key = self._flat_key().reshape(shape)
        oob = None if self._oob is None else self._oob.reshape(shape)
        return NkiTensor(self._alloc, None, key, oob, 0)

    def broadcast_to(self, shape):
        """A new tile holding this one broadcast to ``shape`` (partition axis first)."""
        return _arithmetic.broadcast_to(self, shape)

    def expand_dims(self, axis):
        shape = list(self.shape)
        shape.insert(axis if axis >= 0 else len(shape) + axis + 1, 1)
        return self.reshape(tuple(shape))

    def permute(self, *axes):
        if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
            axes = tuple(axes[0])
        if self._arr is not None:
            return NkiTensor(self._alloc, self._arr.transpose(axes), None, None, 0)
        oob = None if self._oob is None else self._oob.transpose(axes)
        return NkiTensor(self._alloc, None, self._key.transpose(axes), oob, 0)

    @instruction
    def view(self, dtype):
        """Reinterpret the bits of a whole tensor as another dtype."""
        if not self._is_whole():
            raise NKIError("view(dtype) needs a whole tensor")
        dtype = _dt.normalize(dtype)
        data = self._alloc.data.view(_dt.storage(dtype))
        alloc = _reinterpreted(self._alloc, data, dtype, self._par)
        return NkiTensor(alloc, data, None, None, self._par)

    # ----------------------------------------------------------- arithmetic
    def _bin(self, f, other, reverse=False):
        return _arithmetic.binary(f, other, self) if reverse else _arithmetic.binary(f, self, other)

    def __add__(self, o): return self._bin(np.add, o)
    def __radd__(self, o): return self._bin(np.add, o, True)
    def __sub__(self, o): return self._bin(np.subtract, o)
    def __rsub__(self, o): return self._bin(np.subtract, o, True)
    def __mul__(self, o): return self._bin(np.multiply, o)
    def __rmul__(self, o): return self._bin(np.multiply, o, True)
    def __truediv__(self, o): return self._bin(np.divide, o)
    def __rtruediv__(self, o): return self._bin(np.divide, o, True)
    def __pow__(self, o): return self._bin(np.power, o)
    def __rpow__(self, o): return self._bin(np.power, o, True)
    def __mod__(self, o): return self._bin(np.fmod, o)
    def __floordiv__(self, o): return self._bin(np.floor_divide, o)
    def _compare(self, f, other):
        result = self._bin(f, other)
        if isinstance(result, NkiTensor):
            _COMPARISON_RESULTS[id(result)] = result
        return result

    def __lt__(self, o): return self._compare(np.less, o)
    def __le__(self, o): return self._compare(np.less_equal, o)
    def __gt__(self, o): return self._compare(np.greater, o)
    def __ge__(self, o): return self._compare(np.greater_equal, o)

    # ``t == None``/``t != None`` test whether an optional tensor was given (as in Python and NKI 0.x)
    def __eq__(self, o): return False if o is None else self._compare(np.equal, o)
    def __ne__(self, o): return True if o is None else self._compare(np.not_equal, o)
    def __and__(self, o): return self._bin(np.bitwise_and, o)
    def __rand__(self, o): return self._bin(np.bitwise_and, o, True)
    def __or__(self, o): return self._bin(np.bitwise_or, o)
    def __ror__(self, o): return self._bin(np.bitwise_or, o, True)
    def __xor__(self, o): return self._bin(np.bitwise_xor, o)

    def __neg__(self):
        return _arithmetic.unary(np.negative, self)

    def __abs__(self):
        return _arithmetic.unary(np.abs, self)

    def __invert__(self):
        return _arithmetic.binary(np.bitwise_xor, self, -1) if _dt.is_int(self.dtype) else _arithmetic.unary(
            lambda v: (v == 0).astype(np.float32), self)

    # In-place forms update this view's memory.  This is how beta-1 kernels
    # accumulate matmul results: ``psum[...] += nl.matmul(...)`` adds in fp32.
    def _inplace(self, f, other):
        _arithmetic.update(self, f, other)
        return self

    def __iadd__(self, o): return self._inplace(np.add, o)
    def __isub__(self, o): return self._inplace(np.subtract, o)
    def __imul__(self, o): return self._inplace(np.multiply, o)
    def __itruediv__(self, o): return self._inplace(np.divide, o)


def align_to(values, shape):
    """Broadcast ``values`` to ``shape`` the NKI way: partition axes line up.

    NumPy aligns trailing axes; NKI tiles align on axis 0 (the partition), so
    a (128,) reduction result combines with a (128, 512) tile per partition.
    """
    shape = tuple(shape)
    if isinstance(values, NkiTensor):
        values = values.read()
    v = np.asarray(values)
    if v.shape == shape:
        return v
    if 0 < v.ndim < len(shape):
        padded = v.reshape(v.shape + (1,) * (len(shape) - v.ndim))
        try:
            return np.broadcast_to(padded, shape)
        except ValueError:
            pass
    try:
        return np.broadcast_to(v, shape)
    except ValueError:
        pass
    if v.size == int(math.prod(shape)):
        # same elements, different unit axes (e.g. (128, 1) written to (128,))
        return v.reshape(shape)
    raise NKITypeError(f"shape mismatch: cannot use a {tuple(v.shape)} value for a {shape} tile")


def pair_shapes(a, b):
    """Partition-aligned broadcast of two operand shapes (see ``align_to``).  Operands that do not
    broadcast but span as many partitions with as many elements in each combine element by element
    in free-axis order, as the engines read them (the ISA's rule for two tiles): the result has the
    first one's shape."""
    a, b = tuple(a), tuple(b)
    if len(a) < len(b) and len(a) > 0:
        a = a + (1,) * (len(b) - len(a))
    elif len(b) < len(a) and len(b) > 0:
        b = b + (1,) * (len(a) - len(b))
    try:
        return np.broadcast_shapes(a, b)
    except ValueError:
        if a and b and a[0] == b[0] and math.prod(a[1:]) == math.prod(b[1:]):
            return a
        raise NKITypeError(f"operand shapes {a} and {b} cannot be combined") from None


# ---------------------------------------------------------------- indexing
def _normalize_components(idx, shape):
    if not isinstance(idx, tuple):
        idx = (idx,)
    comps = []
    for c in idx:
        if isinstance(c, DynSlice):
            c = c.to_slice()
        elif isinstance(c, NkiTensor):
            raise NKITypeError("indexing with a tile (dynamic indexing) is not supported by the emulator")
        elif isinstance(c, (list, tuple)):
            c = np.asarray(c)
        elif isinstance(c, (bool, np.bool_)):
            raise NKITypeError("boolean indices are not supported")
        elif isinstance(c, (int, np.integer)):
            c = int(c)
        elif isinstance(c, np.ndarray):
            if c.dtype == np.bool_ or not np.issubdtype(c.dtype, np.integer):
                raise NKITypeError(f"index arrays must be integer index grids, got {c.dtype}")
            if c.ndim == 0:
                c = int(c)
        elif c is None:
            raise NKITypeError("None (new axis) is not a valid NKI index")
        comps.append(c)
    n_ell = sum(1 for c in comps if c is Ellipsis)
    if n_ell > 1:
        raise NKITypeError("an index can only have a single ellipsis")
    n_real = len(comps) - n_ell
    if n_real > len(shape):
        raise NKIOutOfBoundsError(f"too many indices ({n_real}) for a tensor of rank {len(shape)}")
    if n_ell:
        i = next(k for k, c in enumerate(comps) if c is Ellipsis)
        comps[i:i + 1] = [slice(None)] * (len(shape) - n_real)
    comps += [slice(None)] * (len(shape) - len(comps))
    return comps


def _slice_bounds(s: slice, dim: int):
    """Start/stop/step of a slice without clipping to the axis (so overruns are visible)."""
    step = 1 if s.step is None else int(s.step)
    if step == 0:
        raise NKITypeError("slice step cannot be zero")
    if step < 0:
        start, stop, step = s.indices(dim)
        return start, stop, step, False
    start = 0 if s.start is None else int(s.start)
    stop = dim if s.stop is None else int(s.stop)
    if start < 0:
        start += dim
    if stop < 0:
        stop += dim
    stop = max(stop, start)
    overrun = start < 0 or stop > dim
    return start, stop, step, overrun


def _kept_integer_axes(t: NkiTensor, comps, shape):
    """NKI's rank rule for integer subscripts (no index grids): an on-chip tensor keeps its
    partition axis, at size 1, and stays at least 2-D (partition and one free axis: the last
    integer-indexed free axis is kept at size 1 when dropping them all would leave fewer); an HBM
    tensor drops integer-indexed axes but stays at least 1-D.  Kept axes become one-element slices."""
    ints = [k for k, c in enumerate(comps) if isinstance(c, int)]
    if not ints:
        return comps
    keep = set()
    if t.buffer.on_chip and len(shape) > t._par:
        par = t._par
        if par in ints:
            keep.add(par)
        free_ints = [k for k in ints if k > par]
        free_left = sum(1 for c in comps[par + 1:] if not isinstance(c, int))
        if free_ints and free_left == 0:
            keep.add(free_ints[-1])
    elif len(ints) == len(shape):
        keep.add(ints[-1])
    comps = list(comps)
    for k in keep:
        c = comps[k] + shape[k] if comps[k] < 0 else comps[k]
        if c >= 0:  # an index below the axis stays an integer, found out of bounds below
            comps[k] = slice(c, c + 1, 1)
    return comps


def index(t: NkiTensor, idx) -> NkiTensor:
    shape = t.shape
    comps = _normalize_components(idx, shape)
    if not any(isinstance(c, np.ndarray) for c in comps):
        comps = _kept_integer_axes(t, comps, shape)
    basic = t._arr is not None
    norm = []
    for c, dim in zip(comps, shape):
        if isinstance(c, slice):
            start, stop, step, overrun = _slice_bounds(c, dim)
            basic &= not overrun
            norm.append(slice(start, stop, step))
        elif isinstance(c, int):
            ci = c + dim if c < 0 else c
            basic &= 0 <= ci < dim
            norm.append(ci)
        else:
            basic = False
            norm.append(c)
    if basic:
        par = 0
        if t.buffer.on_chip:
            before = norm[:t._par]
            par = sum(1 for c in before if not isinstance(c, int))
            if len(norm) > t._par and isinstance(norm[t._par], int):
                par = 0
        # the Ellipsis keeps a subscript of integers only a view, never a copied NumPy scalar
        return NkiTensor(t._alloc, t._arr[(*norm, Ellipsis)], None, None, par)
    if t._arr is not None:
        view = _affine_view(t, norm, shape)
        if view is not None:
            return view
    return _gather_index(t, norm, shape)


def _affine_view(t: NkiTensor, norm, shape):
    """Index grids (``nl.arange``/``nl.mgrid`` arithmetic) select an affine lattice: element ``o`` of the
    result is storage element ``base + sum_j o_j * step_j``.  When every component is an integer or
    such a grid and the lattice is in bounds, the result is a strided view (what a gathered view of
    the same elements reads and writes, without index arrays); otherwise None."""
    arrays = [c for c in norm if isinstance(c, np.ndarray)]
    if not arrays or any(isinstance(c, slice) for c in norm):
        return None
    try:
        out_shape = np.broadcast_shapes(*[c.shape for c in arrays])
    except ValueError:
        return None
    nd = len(out_shape)
    elem = t._arr.itemsize
    base_off = t._arr.__array_interface__["data"][0] - t._alloc.data.__array_interface__["data"][0]
    steps = [0] * nd
    offset = base_off
    for c, dim, st in zip(norm, shape, t._arr.strides):
        if isinstance(c, int):
            offset += c * st
            continue
        b = np.broadcast_to(c, out_shape)
        origin = (0,) * nd
        v0 = int(b[origin])
        coef = []
        for j in range(nd):
            axis = j - nd + c.ndim  # c's axis under output axis j (trailing alignment)
            if out_shape[j] > 1 and axis >= 0 and c.shape[axis] != 1:
                unit = list(origin)
                unit[j] = 1
                coef.append(int(b[tuple(unit)]) - v0)
            else:
                coef.append(0)
        lo = v0 + sum(min(0, k * (n - 1)) for k, n in zip(coef, out_shape))
        hi = v0 + sum(max(0, k * (n - 1)) for k, n in zip(coef, out_shape))
        if lo < 0 or hi >= dim:
            return None
        # the grid must be exactly affine (arange/mgrid arithmetic is; an arbitrary array is not)
        expect = v0
        for j, k in enumerate(coef):
            if k:
                shp = [1] * c.ndim
                shp[j - nd + c.ndim] = out_shape[j]
                expect = expect + np.arange(out_shape[j], dtype=np.int64).reshape(shp) * k
        if not np.array_equal(c, np.broadcast_to(expect, c.shape)):
            return None
        offset += v0 * st
        for j, k in enumerate(coef):
            steps[j] += k * st
    data = t._alloc.data
    u = np.dtype(f"u{data.itemsize}")
    try:
        arr = np.ndarray(out_shape, u, data.view(u), offset, tuple(steps)).view(data.dtype)
    except (ValueError, TypeError):
        return None
    if arr.itemsize != elem:
        return None
    return NkiTensor(t._alloc, arr, None, None, 0)


def _gather_index(t: NkiTensor, norm, shape):
    """Index through extended coordinate grids so NumPy's indexing rules apply,
    out-of-range coordinates are detected (not wrapped), and the result is a
    flat index into storage."""
    ndim = len(shape)
    lo, hi = [], []
    for c, dim in zip(norm, shape):
        if isinstance(c, slice):
            last = c.start + max(0, (len(range(c.start, c.stop, c.step)) - 1)) * c.step if c.step > 0 else dim - 1
            lo.append(min(0, c.start if c.step > 0 else 0))
            hi.append(max(dim - 1, last, c.stop - 1 if c.step > 0 else 0))
        elif isinstance(c, int):
            lo.append(min(0, c))
            hi.append(max(dim - 1, c))
        else:
            lo.append(min(0, int(c.min())) if c.size else 0)
            hi.append(max(dim - 1, int(c.max())) if c.size else dim - 1)
    shifted = []
    for c, l in zip(norm, lo):
        if isinstance(c, slice):
            shifted.append(slice(c.start - l, c.stop - l, c.step) if c.step > 0 else c)
        else:
            shifted.append(c - l)
    shifted = tuple(shifted)
    coords = [_ext_coords(shape, lo, hi, k)[shifted] for k in range(ndim)]
    out_shape = coords[0].shape if ndim else ()
    oob = np.zeros(out_shape, dtype=bool)
    for k, dim in enumerate(shape):
        oob |= (coords[k] < 0) | (coords[k] >= dim)
        coords[k] = np.clip(coords[k], 0, dim - 1)
    if t._arr is not None:
        off, strides = t._offset_strides()
        key = np.full(out_shape, off, dtype=np.int64)
        for k in range(ndim):
            key = key + coords[k] * strides[k]
    else:
        key = t._key[tuple(coords)]
    if t._oob is not None:
        oob |= t._oob[tuple(coords)]
    return NkiTensor(t._alloc, None, np.ascontiguousarray(key), oob if oob.any() else None, 0)


def _same_elements(a: NkiTensor, b: NkiTensor) -> bool:
    """Two basic views of the same elements of the same buffer, in the same order?"""
    if a._alloc is not b._alloc or a._arr is None or b._arr is None or a._mask is not None:
        return False
    x, y = a._arr, b._arr
    return (x.shape == y.shape and x.strides == y.strides
            and x.__array_interface__["data"][0] == y.__array_interface__["data"][0])


@instruction
def assign(target: NkiTensor, value):
    """``target[...] = value``: write a tile, scalar or array into a view.

    A fresh instruction result is written from its float32 value (rounded once
    to the target's dtype) and only where its instruction's mask was true.
    """
    if isinstance(value, NkiTensor):
        if value is target or _same_elements(value, target):
            return  # ``t[...] += x`` assigns the updated view back onto itself
        if value.buffer.on_chip is False and target.buffer.on_chip:
            raise NKITypeError("cannot assign an HBM tensor to an on-chip tile; use nl.load or nisa.dma_copy")
        if target.buffer.on_chip is False and value.buffer.on_chip:
            raise NKITypeError("cannot assign a tile to an HBM tensor; use nl.store or nisa.dma_copy")
        mask = value._mask
        vals = value.exact_values()
        if vals is None:
            vals = value.raw_values(mask, "read")
        target.write(vals, mask, what="write")
    else:
        target.write(np.asarray(value), None, what="write")


_liveness.register_tile_type(NkiTensor)  # the liveness count, below this module, sees tiles
