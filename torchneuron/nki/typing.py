"""nki.typing: tensor type annotations, and tensor specs for benchmarking.

``nt.tensor[shape, dtype]`` (or ``nt.tensor[128, 512]``, ``nt.tensor[[8192, 4096], nl.bfloat16]``)
is a ``TensorSpec``.  As an annotation it is not checked.  Passed to
``nki.benchmark``/``nki.profile`` (or ``perf.estimate``) in place of an
array, it stands for a zero-filled input of that shape and dtype, as the
kernel's inputs only matter there for their shapes and dtypes.
"""
from __future__ import annotations

import numpy as np

from . import dtypes as _dt


class TensorSpec:
    """A tensor's shape and dtype (dtype float32 when not given)."""

    __slots__ = ("shape", "dtype", "mutable")

    def __init__(self, shape=None, dtype=None, mutable=False):
        self.shape = None if shape is None else tuple(int(s) for s in shape)
        self.dtype = _dt.normalize(dtype) if dtype is not None else None
        self.mutable = mutable

    def zeros(self) -> np.ndarray:
        if self.shape is None:
            raise TypeError("nki.typing.tensor without a shape cannot stand for an input")
        return np.zeros(self.shape, dtype=_dt.storage(self.dtype or _dt.float32))

    @property
    def ndim(self):
        return None if self.shape is None else len(self.shape)

    def __getitem__(self, item):
        return _spec(item, self.mutable)

    def __call__(self, *args, **kwargs):
        return self

    def __repr__(self):
        kind = "mutable_tensor" if self.mutable else "tensor"
        if self.shape is None:
            return f"nt.{kind}"
        d = _dt.name(self.dtype) if self.dtype is not None else ""
        return f"nt.{kind}[{list(self.shape)}{', ' + d if d else ''}]"

    def __eq__(self, other):
        return (isinstance(other, TensorSpec) and self.shape == other.shape and self.dtype == other.dtype
                and self.mutable == other.mutable)

    def __hash__(self):
        return hash((self.shape, str(self.dtype), self.mutable))


def _is_dtype(v):
    if isinstance(v, (int, np.integer, list, tuple)):
        return False
    try:
        _dt.normalize(v)
        return True
    except TypeError:
        return False


def _spec(item, mutable):
    if not isinstance(item, tuple):
        item = (item,)
    dtype = None
    if len(item) > 1 and _is_dtype(item[-1]):
        dtype, item = item[-1], item[:-1]
    if len(item) == 1 and isinstance(item[0], (list, tuple)):
        item = tuple(item[0])
    return TensorSpec(item, dtype, mutable)


tensor = TensorSpec()
mutable_tensor = TensorSpec(mutable=True)


class _Scalar:
    """``nt.scalar`` annotations: accepted, not checked."""

    def __getitem__(self, item):
        return self

    def __repr__(self):
        return "nt.scalar"


scalar = _Scalar()
