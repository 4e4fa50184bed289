"""Random programs as Python source.

A program is a list of statements over named tensors: inputs ``x1, x2, ...``
made on the CPU from one seeded generator ``g`` and moved to ``dev`` in some
layout, then statements ``v5 = torch.add(x1, x2)``, ``x2[1:] += x1[:-1]``,
``v7, v8 = v5.max(1)`` (names are numbered in the order they are drawn). The same source runs with ``dev = "cpu"`` and
``dev = "neuron"`` (runner.py), and prints as a script a human can paste.

Statements are drawn by executing them on the CPU while the program grows
(the shadow run): every statement sees the real shapes and dtypes of what it
uses, and one that raises is kept only now and then (error semantics are
compared too) and otherwise drawn again. Statements that a reported finding
would make fail are not drawn: known_findings.py lists them, each with its
regression test.

A profile per path sets sizes, layouts, the mix of statements and whether the
neuron run synchronises after each statement (to tell at which call an error
is raised) or runs ahead of the device (queues, fuses):

  lean      tiny tensors (the lean path's + - * /, relu, sum, cat, x[index], mm),
            running ahead of the device
  generic   small tensors of every layout and dtype, every kind of statement,
            synchronised after each statement
  fused     tensors large enough to fuse (32K elements and more), chains of
            element-wise statements queued behind busy work
  compiled  small programs without errors, run under torch.compile(backend="neuron")
"""
from __future__ import annotations

import math
import random
import re
import warnings
from dataclasses import dataclass, field

import torch

from . import known_findings

DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64, torch.complex64]
NAME = re.compile(r"\b([xv]\d+)\b")


def dtype_src(dtype: torch.dtype) -> str:
    return str(dtype)  # "torch.float32"


def shape_src(shape) -> str:
    shape = tuple(shape)
    return f"({shape[0]},)" if len(shape) == 1 else str(shape)


@dataclass
class Statement:
    code: str                      # Python source (an input may take several lines)
    writes: tuple = ()             # names it binds, or whose memory it writes in place
    kind: str = "input"            # the family: input, unary, binary, reduction, ...
    op: str = ""                   # what it calls, for exclusions and figures
    operands: tuple = ()           # tensor names it reads, for exclusions
    data_error: bool = False       # may raise an error that depends on values (an index out of range)
    uninitialised: tuple = ()      # names whose values are undefined after it (empty_like)

    @property
    def reads(self) -> set:
        return set(NAME.findall(self.code)) - {w for w in self.writes if self.kind == "input"}


@dataclass
class Program:
    seed: int
    path: str
    statements: list = field(default_factory=list)

    def with_statements(self, statements) -> "Program":
        return Program(self.seed, self.path, list(statements))

    def header(self, device: str = "neuron") -> str:
        return (f"import torch\nimport torchneuron\nF = torch.nn.functional\n"
                f"dev = {device!r}\ng = torch.Generator().manual_seed({self.seed})\n")

    def source(self, device: str = "neuron") -> str:
        lines = [self.header(device)]
        if self.path == "fused":
            lines.append("torchneuron._C._set_min_fusable_numel(1 << 15)  # fuse from 32K elements\n")
        busy = self.path == "fused"
        for st in self.statements:
            if busy and st.kind != "input":
                lines.append("a = torch.ones(384, 384, device=dev)  # busy work: what follows waits and fuses\n"
                             "for _ in range(2):\n    a = a @ a / 384\n")
                busy = False
            lines.append(st.code + "\n")
        return "".join(lines)


@dataclass(frozen=True)
class Profile:
    name: str
    statements: tuple              # (min, max) statements after the inputs
    inputs: tuple                  # (min, max) inputs drawn up front
    max_numel: int
    weights: dict                  # family -> weight
    layouts: dict                  # layout -> weight
    sync_each: bool                # neuron run synchronises after every statement
    keep_error: float              # chance to keep a statement that raises on the CPU
    zero_size: float = 0.05        # chance of a zero-size input
    specials: float = 0.2          # chance of NaN, infinities, -0 among a float input's values
    large: bool = False            # fused: shapes of 32K elements and more


ALL_FAMILIES = dict(unary=10, binary=14, ternary=3, reduction=8, matmul=4, index=6, index_put=5, view=10,
                    in_place=9, overlap=2, out=5, copy=5, cat=3, create=2, read=2)

PROFILES = {
    "lean": Profile(
        "lean", statements=(3, 10), inputs=(2, 4), max_numel=64,
        weights=dict(ALL_FAMILIES, binary=24, unary=8, reduction=8, matmul=5, cat=5, index=6),
        layouts=dict(contiguous=8, transposed=1, strided=1, expanded=1, overlapping=0.5, offset=0.5,
                     channels_last=0.5, conj=2),
        sync_each=False, keep_error=0.15),
    "generic": Profile(
        "generic", statements=(4, 12), inputs=(2, 4), max_numel=720,
        weights=ALL_FAMILIES,
        layouts=dict(contiguous=4, transposed=2, strided=2, expanded=1.5, overlapping=1, offset=1,
                     channels_last=1.5, conj=3),
        sync_each=True, keep_error=0.2, zero_size=0.08),
    "fused": Profile(
        "fused", statements=(4, 12), inputs=(2, 4), max_numel=1 << 17,
        weights=dict(unary=14, binary=20, ternary=4, reduction=3, in_place=8, copy=3, view=3, out=2,
                     index=1, index_put=1, cat=1, read=0.5),
        layouts=dict(contiguous=10, transposed=1, strided=1, expanded=1, offset=1, channels_last=0.5, conj=1),
        sync_each=False, keep_error=0.1, zero_size=0.0, specials=0.3, large=True),
    "compiled": Profile(
        "compiled", statements=(3, 8), inputs=(2, 3), max_numel=240,
        weights=dict(ALL_FAMILIES, overlap=0, read=0, create=1),
        layouts=dict(contiguous=6, transposed=2, strided=1, expanded=1, offset=1, channels_last=1),
        sync_each=False, keep_error=0.0, zero_size=0.03, specials=0.1),
}

LARGE_SHAPES = [(256, 128), (128, 256), (2, 128, 128), (1 << 15,), (64, 512), (2, 4, 64, 128)]
DATA_DEPENDENT_ERRORS = re.compile(r"out of (\w+ )?bounds|out of range|ZeroDivisionError|index .* is out of|"
                                   r"must be (non-?negative|in range)|nonnegative", re.I)

UNARY = ["abs", "neg", "exp", "log", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid", "relu", "floor", "ceil",
         "round", "trunc", "frac", "sign", "sgn", "reciprocal", "erf", "expm1", "log1p", "log2", "bitwise_not",
         "logical_not", "isnan", "isinf", "isfinite", "square", "exp2", "signbit", "angle", "positive", "atan",
         "asinh", "atanh", "conj_physical", "nan_to_num", "deg2rad", "erfinv", "sinc", "lgamma"]
UNARY_F = ["F.gelu({a})", "F.gelu({a}, approximate='tanh')", "F.silu({a})", "F.softplus({a})", "F.elu({a})",
           "F.leaky_relu({a}, 0.1)", "F.hardtanh({a})", "F.mish({a})", "F.relu6({a})", "F.hardswish({a})",
           "F.logsigmoid({a})", "F.tanhshrink({a})"]
UNARY_ARGS = ["torch.clamp({a}, min={s})", "torch.clamp({a}, {s}, {t})", "{a}.clamp(max={s})",
              "torch.round({a}, decimals=1)", "torch.pow({a}, 2)", "{a} ** {s}", "torch.nan_to_num({a}, nan=0.5)",
              "-{a}", "~{a}", "{a}.float()", "{a}.double()", "{a}.half()", "{a}.bfloat16()", "{a}.int()",
              "{a}.long()", "{a}.bool()", "{a}.byte()", "{a}.char()", "{a}.to(torch.complex64)"]
BINARY = ["add", "sub", "mul", "div", "true_divide", "floor_divide", "remainder", "fmod", "pow", "maximum",
          "minimum", "fmax", "fmin", "atan2", "hypot", "copysign", "eq", "ne", "lt", "le", "gt", "ge",
          "logical_and", "logical_or", "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor",
          "bitwise_left_shift", "bitwise_right_shift", "xlogy", "heaviside", "ldexp", "nextafter"]
BINARY_OPERATORS = ["+", "-", "*", "/", "//", "%", "**", "&", "|", "^", "<<", ">>", "==", "!=", "<", "<=", ">",
                    ">="]
BINARY_ARGS = ["torch.add({a}, {b}, alpha={s})", "torch.sub({a}, {b}, alpha={s})",
               "torch.div({a}, {b}, rounding_mode='floor')", "torch.div({a}, {b}, rounding_mode='trunc')",
               "torch.lerp({a}, {b}, 0.25)", "torch.isclose({a}, {b})", "torch.where({a} > {b}, {a}, {b})",
               "torch.where({a} != 0, {b}, {s})"]
TERNARY = ["torch.addcmul({a}, {b}, {c}, value={s})", "torch.addcdiv({a}, {b}, {c}, value=0.5)",
           "torch.where({c} > 0, {a}, {b})", "torch.lerp({a}, {b}, {c})", "torch.clamp({a}, {b}, {c})"]
IN_PLACE_UNARY = ["abs_", "neg_", "exp_", "sqrt_", "sigmoid_", "relu_", "floor_", "round_", "zero_", "tanh_",
                  "reciprocal_", "logical_not_", "bitwise_not_", "sin_", "trunc_", "sign_", "square_"]
IN_PLACE_BINARY = ["add_", "sub_", "mul_", "div_", "copy_", "maximum", "pow_", "bitwise_and_", "logical_and_",
                   "remainder_", "fmod_", "lerp_", "clamp_min_", "clamp_max_", "atan2_", "hypot_",
                   "copysign_", "floor_divide_", "eq_", "lt_"]
OUT_UNARY = ["abs", "neg", "exp", "sin", "sqrt", "sigmoid", "logical_not", "sign", "floor", "reciprocal", "tanh",
             "bitwise_not", "isnan", "square", "angle"]
OUT_BINARY = ["add", "mul", "sub", "div", "maximum", "eq", "lt", "logical_and", "copysign", "xlogy", "heaviside",
              "ldexp", "bitwise_and", "remainder", "atan2", "pow", "where"]


class _Generator:
    def __init__(self, seed: int, profile: Profile):
        self.rng = random.Random(f"{profile.name}:{seed}")
        self.profile = profile
        self.program = Program(seed, profile.name)
        self.count = 0             # names are numbered in order: x3 is an input, v4 a statement's result
        self.host = set()          # 0-dim CPU tensors among the inputs (scalars beside device tensors)
        self._reset_shadow()
        r = self.rng
        self.main_dtype = r.choices(DTYPES, [1, 1, 1, 1, 1.5, 2, 1.5, 1.5, 5, 2, 1])[0]
        if profile.large:
            self.main_dtype = r.choices(DTYPES, [0.5, 0.3, 0.3, 0.3, 0.6, 1, 2, 2, 6, 2, 0.5])[0]
            self.base = r.choice(LARGE_SHAPES)
        else:
            self.base = self._small_shape(r.randint(1, 4))

    # -- the shadow run ------------------------------------------------------------------------------
    def _reset_shadow(self):
        self.ns = {"torch": torch, "F": torch.nn.functional, "dev": "cpu",
                   "g": torch.Generator().manual_seed(self.program.seed)}

    def _exec(self, st: Statement):
        exec(compile(st.code, "<fuzz>", "exec"), self.ns)

    def _replay(self):
        self._reset_shadow()
        for st in self.program.statements:
            try:
                self._exec(st)
            except Exception:  # noqa: BLE001 - kept statements may raise; the shadow follows the program
                pass

    def _try(self, st: Statement) -> bool:
        """Runs `st` on the shadow; whether it is kept."""
        if known_findings.excluded(st, self.ns, self.profile.name):
            return False
        try:
            self._exec(st)
        except Exception as e:  # noqa: BLE001 - whether to keep a raising statement
            data = bool(DATA_DEPENDENT_ERRORS.search(str(e)))
            keep = self.rng.random() < self.profile.keep_error and (not data or self.profile.sync_each)
            if keep and known_findings.excluded_error(st, e, self.profile.name):
                keep = False
            if keep:
                st.data_error = data
                self.program.statements.append(st)
            self._replay()  # it may have written part of something
            return keep
        if any(isinstance(v, torch.Tensor) and v.numel() > 16 * self.profile.max_numel
               for w in st.writes for v in _flat(self.ns.get(w))):
            self._replay()  # a broadcast blew it up: gigabytes the CPU may hold and the device not
            return False
        self.program.statements.append(st)
        return True

    # -- what the program holds -----------------------------------------------------------------------
    def tensors(self, pred=None) -> list:
        names = [n for n, v in self.ns.items() if NAME.fullmatch(n) and isinstance(v, torch.Tensor)]
        return [n for n in names if pred is None or pred(self.ns[n])]

    def pick(self, pred=None, host_ok=False):
        """A tensor of the program; 0-dim CPU tensors only with `host_ok` (as operands of element-wise
        operators, which accept them beside device tensors as CUDA does)."""
        names = [n for n in self.tensors(pred) if host_ok or n not in self.host]
        if not names:
            return None
        weights = [1 + 2 * (i >= len(names) - 3) for i in range(len(names))]  # recent ones more often
        return self.rng.choices(names, weights)[0]

    def t(self, name) -> torch.Tensor:
        return self.ns[name]

    def fills_on_the_cpu_only(self, a, b) -> bool:
        """Whether `a[...] = b` differs by device where nothing is wrong: Python's setitem fills
        from a 0-dim value on the CPU and copies one on a device, and a copy from memory that the
        target shares raises (on neuron as on CUDA)."""
        ta, tb = self.t(a), self.t(b)
        return tb.dim() == 0 and b not in self.host and ta.untyped_storage().data_ptr() == tb.untyped_storage().data_ptr()

    def fresh(self) -> str:
        self.count += 1
        return f"v{self.count}"

    # -- shapes and scalars --------------------------------------------------------------------------
    def _small_shape(self, ndim):
        r, cap = self.rng, self.profile.max_numel
        while True:
            shape = tuple(r.choice([1, 2, 2, 3, 3, 4, 5, 6, 7]) for _ in range(ndim))
            if math.prod(shape) <= cap:
                return shape

    def input_shape(self):
        r, base = self.rng.random(), self.base
        if r < 0.45:
            return base
        if r < 0.68:  # broadcasts against the base: leading dimensions dropped, others made 1
            lead = self.rng.randint(0, len(base))
            return tuple(1 if self.rng.random() < 0.4 else d for d in base[lead:])
        if r < 0.74:
            return ()
        if r < 0.74 + self.profile.zero_size and base:
            d = self.rng.randrange(len(base))
            return base[:d] + (0,) + base[d + 1:]
        if r < 0.9:
            return tuple(reversed(base))
        if self.profile.large:
            return self.rng.choice(LARGE_SHAPES)
        return self._small_shape(self.rng.randint(0, 4))

    def scalar(self, dtype=None) -> str:
        r = self.rng
        if dtype is not None and dtype == torch.bool and r.random() < 0.5:
            return r.choice(["True", "False"])
        if dtype is not None and not (dtype.is_floating_point or dtype.is_complex) and r.random() < 0.7:
            return str(r.choice([0, 1, 2, 3, -1, -2, 5, 7, 100]))
        return r.choice(["0.5", "-1.25", "2", "3", "-1", "1.5", "0", "1e-3", "2.5", "-0.0", "float('inf')",
                         "float('nan')", "True", "(1+2j)", "255", "1e4"])

    # -- inputs --------------------------------------------------------------------------------------
    def new_input(self, shape=None, dtype=None, layout=None) -> str:
        r, p = self.rng, self.profile
        self.count += 1
        name = f"x{self.count}"
        shape = tuple(self.input_shape() if shape is None else shape)
        if dtype is None:
            dtype = self.main_dtype if r.random() < 0.6 else r.choice(DTYPES)
        if layout is None:
            layout = r.choices(list(p.layouts), list(p.layouts.values()))[0]
        n, base, suffix = len(shape), shape, ""
        if layout == "conj" and not dtype.is_complex:
            layout = "contiguous"
        if layout == "channels_last" and n not in (4, 5):
            layout = "transposed"
        elif n in (4, 5) and layout in ("contiguous", "transposed") and r.random() < 0.3 and "channels_last" in p.layouts:
            layout = "channels_last"  # the layout of 4-d (5-d) tensors that matters most
        if layout == "transposed" and n < 2:
            layout = "contiguous"
        if layout in ("overlapping", "offset") and math.prod(shape) == 0:
            layout = "contiguous"
        if layout == "transposed":
            perm = list(range(n))
            while perm == list(range(n)):
                r.shuffle(perm)
            base = [0] * n
            for i, q in enumerate(perm):
                base[q] = shape[i]
            if n == 2:
                suffix = r.choice([".t()", ".mT", ".transpose(0, 1)"])
            else:
                suffix = f".permute{tuple(perm)}"
        elif layout == "channels_last":
            fmt = "channels_last" if n == 4 else "channels_last_3d"
            suffix = f".contiguous(memory_format=torch.{fmt})"
        elif layout == "strided" and n:
            base, parts = [], []
            for d in shape:
                if r.random() < 0.6:
                    start, step = r.randint(0, 1), r.randint(2, 3)
                    base.append(start + step * d)
                    parts.append(f"{start or ''}::{step}")
                else:
                    base.append(d)
                    parts.append(":")
            if all(p_ == ":" for p_ in parts):
                base[0] += 1
                parts[0] = "1:"
            suffix = f"[{', '.join(parts)}]"
        elif layout == "offset":
            k = r.randint(1, 3)
            base = (math.prod(shape) + k,)
            suffix = f"[{k}:].view({shape_src(shape)})"
        elif layout == "expanded" and n:
            lead = r.randint(0, min(2, n))
            base = [1 if (r.random() < 0.5 or d == 0) else d for d in shape[lead:]]
            if all(b == d for b, d in zip(base, shape[lead:])) and not lead:
                base[r.randrange(len(base))] = 1
            suffix = f".expand{shape_src(shape)}" if n > 1 else f".expand({shape[0]})"
        elif layout == "overlapping" and n:
            strides = [r.choice([0, 1, 1, 2]) for _ in shape]
            offset = r.randint(0, 2)
            length = offset + 1 + sum((d - 1) * s for d, s in zip(shape, strides))
            base = (length,)
            suffix = f".as_strided({shape_src(shape)}, {shape_src(strides)}, {offset})"
        elif layout == "conj":
            suffix = ".conj()"
        lines = [f"{name} = {self._random_values(base, dtype)}"]
        if (dtype.is_floating_point or dtype.is_complex) and r.random() < p.specials and math.prod(base):
            total = math.prod(base)
            k = min(total, r.randint(1, 4))
            at = sorted(r.sample(range(total), k))
            values = [r.choice(["float('nan')", "float('inf')", "float('-inf')", "-0.0", "0.0", "1e-40",
                                "65504.0", "3e38"]) for _ in at]
            lines.append(f"{name}.view(-1)[{at}] = torch.tensor([{', '.join(values)}]).to({dtype_src(dtype)})")
        host_scalar = n == 0 and layout == "contiguous" and r.random() < 0.3 and not p.large
        if host_scalar:  # a 0-dim CPU tensor: allowed beside device tensors, as a scalar
            self.host.add(name)
        else:
            lines.append(f"{name} = {name}.to(dev, copy=True){suffix}")
        st = Statement("\n".join(lines), (name,), "input", f"input:{layout}")
        self._exec(st)
        self.program.statements.append(st)
        return name

    def _random_values(self, shape, dtype) -> str:
        s = shape_src(shape)
        if dtype == torch.bool:
            return f"torch.rand({s}, generator=g) < 0.5"
        if dtype == torch.uint8:
            return f"torch.randint(0, {self.rng.choice([8, 256])}, {s}, generator=g, dtype=torch.uint8)"
        if not (dtype.is_floating_point or dtype.is_complex):
            lo = self.rng.choice([8, 100]) if dtype == torch.int8 else self.rng.choice([8, 1000, 1 << 15])
            return f"torch.randint({-lo}, {lo}, {s}, generator=g, dtype={dtype_src(dtype)})"
        scale = self.rng.choice(["", "", "", " * 4", " * 300"])
        return f"torch.randn({s}, generator=g, dtype={dtype_src(dtype)}){scale}"

    def index_values(self, size, k=None, unique=False, negative=True):
        r = self.rng
        if size == 0:
            return []
        k = r.randint(1, 4) if k is None else k
        if unique:
            vals = r.sample(range(size), min(k, size))
        else:
            vals = [r.randrange(size) for _ in range(k)]
        return [v - size if negative and r.random() < 0.2 else v for v in vals]

    def index_src(self, values, host_ok=False) -> str:
        """An index tensor; with `host_ok` also a list or a CPU tensor (indexing accepts them)."""
        r = self.rng.random()
        if host_ok and r < 0.15:
            return str(list(values))
        dtype = ", dtype=torch.int32" if self.rng.random() < 0.1 else ""
        device = "" if host_ok and r < 0.25 else ", device=dev"
        return f"torch.tensor({list(values)}{device}{dtype})" if values else f"torch.tensor([], dtype=torch.long{device})"

    def new_operand(self, shape, dtype):
        """A fresh input for a statement that needs an operand of this shape (a weight, a source)."""
        layout = self.rng.choice(["contiguous", "contiguous", "transposed", "strided"])
        return self.new_input(shape, dtype, layout)

    # -- statements ----------------------------------------------------------------------------------
    def stmt(self, code, kind, op, operands, writes=None, **kw) -> Statement:
        return Statement(code, tuple(writes or ()), kind, op, tuple(o for o in operands if o), **kw)

    def assign(self, expr, kind, op, operands, n_results=1, **kw):
        names = [self.fresh() for _ in range(n_results)]
        return self.stmt(f"{', '.join(names)} = {expr}", kind, op, operands, names, **kw)

    def partner(self, a):
        """A second operand of an element-wise `a`: mostly a tensor that broadcasts with it (a 0-dim
        CPU tensor too), or a Python scalar."""
        r = self.rng.random()
        ta = self.t(a)
        if r < 0.15:
            return self.scalar(ta.dtype), None
        fits = self.tensors(lambda t: _broadcasts(t.shape, ta.shape))
        if r < 0.93 and fits:
            same = [n for n in fits if self.t(n).shape == ta.shape and n != a]
            name = self.rng.choice(same if same and self.rng.random() < 0.5 else fits)
        else:
            name = self.pick(host_ok=True)
        return name, name

    def unary(self):
        a = self.pick()
        if a is None:
            return None
        r = self.rng.random()
        if r < 0.6:
            f = self.rng.choice(UNARY)
            expr = self.rng.choice([f"torch.{f}({a})", f"{a}.{f}()"]) if f not in ("nan_to_num",) else f"torch.{f}({a})"
        elif r < 0.8:
            f = self.rng.choice(UNARY_F)
            expr = f.format(a=a)
        else:
            f = self.rng.choice(UNARY_ARGS)
            expr = f.format(a=a, s=self.scalar(self.t(a).dtype), t=self.scalar(self.t(a).dtype))
        return self.assign(expr, "unary", _op_name(expr), [a])

    def binary(self):
        a = self.pick()
        if a is None:
            return None
        b_src, b = self.partner(a)
        r = self.rng.random()
        if r < 0.45:
            f = self.rng.choice(BINARY)
            expr = f"torch.{f}({a}, {b_src})" if self.rng.random() < 0.7 or b is None else f"{a}.{f}({b_src})"
            op = f
        elif r < 0.8:
            o = self.rng.choice(BINARY_OPERATORS)
            expr = f"{a} {o} {b_src}" if self.rng.random() < 0.8 else f"{b_src} {o} {a}"
            op = o
        else:
            f = self.rng.choice(BINARY_ARGS)
            expr = f.format(a=a, b=b_src, s=self.scalar(self.t(a).dtype))
            op = _op_name(expr)
        return self.assign(expr, "binary", op, [a, b])

    def ternary(self):
        a = self.pick()
        if a is None:
            return None
        b_src, b = self.partner(a)
        c_src, c = self.partner(a)
        f = self.rng.choice(TERNARY)
        if "{c} > 0" in f and c is None:
            c_src, c = a, a
        expr = f.format(a=a, b=b_src, c=c_src, s=self.scalar(self.t(a).dtype))
        return self.assign(expr, "ternary", _op_name(expr), [a, b, c])

    def reduction(self):
        a = self.pick()
        if a is None:
            return None
        t, r = self.t(a), self.rng
        nd = t.dim()
        d = r.randrange(-nd, nd) if nd else r.choice([0, -1])
        if self.profile.large and r.random() < 0.6:
            d = -1
        kd = r.choice(["True", "False"])
        n = 1
        choices = [
            f"torch.sum({a})", f"{a}.sum({d}, keepdim={kd})", f"{a}.sum(dtype=torch.float64)",
            f"{a}.prod({d})", f"{a}.mean({d}, keepdim={kd})", f"{a}.mean()", f"{a}.nansum({d})",
            f"{a}.amax({d})", f"{a}.amin({d}, keepdim={kd})", f"{a}.max()", f"{a}.argmax({d}, keepdim={kd})",
            f"{a}.argmin()", f"{a}.all({d})", f"{a}.any()", f"{a}.std({d})", f"{a}.var({d}, correction=0)",
            f"torch.logsumexp({a}, {d})", f"{a}.norm()", f"torch.linalg.vector_norm({a}, {r.choice([1, 2, 3])})",
            f"{a}.cumsum({d})", f"{a}.cumprod({d})", f"torch.softmax({a}, {d})", f"F.log_softmax({a}, {d})",
            f"{a}.count_nonzero({d})", f"{a}.argsort({d})", f"torch.msort({a})",
        ]
        if nd >= 2:
            choices += [f"{a}.sum(({0}, {nd - 1}))", f"{a}.amax(({0}, {1}), keepdim={kd})"]
        tuples = [f"torch.max({a}, {d})", f"{a}.min({d}, keepdim={kd})", f"torch.sort({a}, {d})",
                  f"torch.unique({a}, return_inverse=True)", f"{a}.unique(sorted=True, return_counts=True)",
                  f"{a}.sort({d}, descending=True, stable=True)", f"torch.aminmax({a})", f"{a}.cummax({d})",
                  f"torch.var_mean({a}, {d})", f"{a}.median({d})"]
        if nd and t.shape[d]:
            k = r.randint(1, t.shape[d])
            tuples += [f"{a}.topk({k}, {d})", f"torch.kthvalue({a}, {k}, {d})"]
        if r.random() < 0.25:
            expr, n = r.choice(tuples), 2
        else:
            expr = r.choice(choices)
        return self.assign(expr, "reduction", _op_name(expr), [a], n_results=n)

    def matmul(self):
        r = self.rng
        a = self.pick(lambda t: t.dim() >= 1)
        if a is None:
            return None
        t = self.t(a)
        dtype = t.dtype if r.random() < 0.85 else r.choice(DTYPES)
        k, n = t.shape[-1], r.choice([1, 2, 3, 4, 5]) if not self.profile.large else r.choice([64, 128])
        form = r.random()
        if t.dim() == 1:
            w = self.new_operand((k, n) if form < 0.5 else (k,), dtype)
            expr = r.choice([f"torch.matmul({a}, {w})", f"{a} @ {w}"] + ([f"torch.dot({a}, {w})", f"torch.outer({a}, {w})"] if form >= 0.5 else []))
        elif form < 0.3:
            w = self.new_operand((n, k), dtype)
            bias = self.new_operand((n,), dtype) if r.random() < 0.6 else None
            expr = f"F.linear({a}, {w}, {bias})" if bias else f"F.linear({a}, {w})"
        elif form < 0.55 or t.dim() != 2:
            w = self.new_operand((k, n) if t.dim() <= 2 or r.random() < 0.5 else t.shape[:-2] + (k, n), dtype)
            expr = r.choice([f"torch.matmul({a}, {w})", f"{a} @ {w}"])
            if t.dim() == 3 and self.t(w).dim() == 3:
                expr = r.choice([expr, f"torch.bmm({a}, {w})"])
        elif form < 0.75:
            w = self.new_operand((k, n), dtype)
            expr = f"torch.mm({a}, {w})"
        elif form < 0.9:
            w = self.new_operand((k, n), dtype)
            c = self.new_operand(r.choice([(t.shape[0], n), (n,)]), dtype)
            beta = r.choice(["", ", beta=0.5", ", alpha=2", ", beta=0"])
            expr = f"torch.addmm({c}, {a}, {w}{beta})"
        else:
            w = self.new_operand((k,), dtype)
            expr = f"torch.mv({a}, {w})"
        operands = NAME.findall(expr)
        return self.assign(expr, "matmul", _op_name(expr), operands)

    def _index_expr(self, a):
        """A basic or advanced index of `a`, as source."""
        t, r = self.t(a), self.rng
        if t.dim() == 0:
            return r.choice(["[()]", "[None]", "[...]", "[True]"]), False
        parts, advanced = [], False
        for d in range(r.randint(1, t.dim())):
            size = t.shape[d]
            c = r.random()
            if c < 0.2 and size:
                parts.append(str(r.randrange(-size, size)))
            elif c < 0.5:
                start, stop, step = r.randint(0, max(size - 1, 0)), r.choice(["", str(size), "-1"]), r.choice(["", ":2", ":3"])
                parts.append(f"{start or ''}:{stop}{step}")
            elif c < 0.62:
                parts.append(":")
            elif c < 0.85 and not advanced:
                parts.append(self.index_src(self.index_values(size), host_ok=True) if size else "[]")
                advanced = True
            elif c < 0.92:
                parts.append("None")
            elif not advanced and size:
                mask = [r.random() < 0.5 for _ in range(size)]
                parts.append(f"torch.tensor({mask}, device=dev)")
                advanced = True
            else:
                parts.append("...")
                break
        return "[" + ", ".join(parts) + "]", advanced

    def index(self):
        a = self.pick()
        if a is None:
            return None
        t, r = self.t(a), self.rng
        nd = t.dim()
        c = r.random()
        if c < 0.5 or nd == 0:
            ix, _ = self._index_expr(a)
            return self.assign(f"{a}{ix}", "index", "getitem", [a])
        d = r.randrange(nd)
        size = t.shape[d]
        if c < 0.6:
            expr = f"torch.index_select({a}, {d}, {self.index_src(self.index_values(size, negative=False))})"
        elif c < 0.72 and size:
            shape = [min(r.randint(1, s), 3) if s else 0 for s in t.shape]
            shape[d] = r.randint(1, 4)
            vals = torch.randint(0, size, shape, generator=torch.Generator().manual_seed(r.randrange(1 << 30)))
            expr = f"torch.gather({a}, {d}, torch.tensor({vals.tolist()}, device=dev))"
        elif c < 0.8 and t.numel():
            vals = [r.randrange(-t.numel(), t.numel()) for _ in range(r.randint(1, 5))]
            expr = f"torch.take({a}, torch.tensor({vals}, device=dev))"
        elif c < 0.88:
            expr = r.choice([f"{a}[{a} > 0]", f"torch.masked_select({a}, {a} != 0)", f"{a}.nonzero()",
                             f"torch.argwhere({a})", f"torch.unique({a})", f"torch.unique_consecutive({a})"])
        elif c < 0.94:  # data-dependent: an index out of range (raised at the call on the CPU)
            if not self.profile.sync_each:
                return None
            bad = size + r.randint(0, 3)
            expr = r.choice([f"{a}[torch.tensor([{bad}], device=dev)]",
                             f"torch.index_select({a}, {d}, torch.tensor([{bad}], device=dev))"])
        else:
            expr = f"{a}.diagonal()" if nd >= 2 else f"{a}.flip(0)"
        return self.assign(expr, "index", _op_name(expr), [a])

    def index_put(self):
        a = self.pick()
        if a is None:
            return None
        t, r = self.t(a), self.rng
        nd = t.dim()
        if nd == 0:
            return self.stmt(f"{a}[()] = {self.scalar(t.dtype)}", "index_put", "setitem", [a], [a])
        d = r.randrange(nd)
        size = t.shape[d]
        c = r.random()
        other = list(t.shape)
        if c < 0.3:
            ix, advanced = self._index_expr(a)
            value = self.scalar(t.dtype)
            if r.random() < 0.5:
                value = self.pick(host_ok=True) or value
            if NAME.fullmatch(value) and self.fills_on_the_cpu_only(a, value):
                value = self.scalar(t.dtype)
            code = f"{a}{ix} = {value}"
            op = "index_put_" if advanced else "setitem"
            return self.stmt(code, "index_put", op, [a, value if NAME.fullmatch(value) else None], [a])
        if c < 0.45 and size:
            idx = self.index_values(size, unique=r.random() < 0.7)
            other[d] = len(idx)
            src = self.new_operand(tuple(other[d:]), t.dtype)
            acc = r.choice(["True", "False"])
            if acc == "False":
                idx = list(dict.fromkeys(i % size for i in idx))
                other[d] = len(idx)
                src = self.new_operand(tuple(other[d:]), t.dtype)
            lead = "slice(None), " * d
            code = f"{a}.index_put_(({lead}{self.index_src(idx)},), {src}, accumulate={acc})"
            return self.stmt(code, "index_put", "index_put_", [a, src], [a])
        if c < 0.55:
            mask = f"{a} > 0" if t.dtype != torch.complex64 else f"{a}.real > 0"
            code = r.choice([f"{a}[{mask}] = {self.scalar(t.dtype)}", f"{a}.masked_fill_({mask}, {self.scalar(t.dtype)})"])
            return self.stmt(code, "index_put", "masked_fill_", [a], [a])
        if c < 0.65 and size:
            idx = self.index_values(size, unique=True, negative=False)
            code = f"{a}.index_fill_({d}, {self.index_src(idx)}, {self.scalar(t.dtype)})"
            return self.stmt(code, "index_put", "index_fill_", [a], [a])
        if c < 0.8 and size:
            unique = r.random() < 0.5
            idx = self.index_values(size, unique=True, negative=False) if unique else self.index_values(size, negative=False)
            other[d] = len(idx)
            src = self.new_operand(tuple(other), t.dtype)
            f = "index_copy_" if unique else "index_add_"
            code = f"{a}.{f}({d}, {self.index_src(idx)}, {src})"
            return self.stmt(code, "index_put", f, [a, src], [a])
        if c < 0.92 and size and t.numel():
            shape = [min(r.randint(1, s), 3) if s else 0 for s in t.shape]
            vals = torch.randint(0, size, shape, generator=torch.Generator().manual_seed(r.randrange(1 << 30)))
            src = self.new_operand(tuple(shape), t.dtype)
            f = r.choice(["scatter_add_", "scatter_add_", "scatter_"])
            if f == "scatter_":  # one writer per element: distinct indices along d
                rows = []
                for _ in range(math.prod(shape) // max(shape[d], 1)):
                    rows.append(r.sample(range(size), min(shape[d], size)))
                shape[d] = min(shape[d], size)
                vals = torch.tensor(rows).reshape([*shape[:d], *shape[d + 1:], shape[d]]).movedim(-1, d)
                src = self.new_operand(tuple(shape), t.dtype)
            code = f"{a}.{f}({d}, torch.tensor({vals.tolist()}, device=dev), {src})"
            return self.stmt(code, "index_put", f, [a, src], [a])
        if c < 0.96 and t.numel():
            idx = r.sample(range(t.numel()), min(3, t.numel()))
            src = self.new_operand((len(idx),), t.dtype)
            code = f"{a}.put_(torch.tensor({idx}, device=dev), {src}, accumulate={r.choice(['True', 'False'])})"
            return self.stmt(code, "index_put", "put_", [a, src], [a])
        if t.numel():
            src = self.new_operand(tuple(t.shape), t.dtype)
            mask = f"{a} > 0" if not t.is_complex() else f"{a}.real > 0"
            if size and r.random() < 0.5:
                idx = self.index_values(size, negative=False)
                other[d] = len(idx)
                src = self.new_operand(tuple(other), t.dtype)
                f = r.choice(["'prod'", "'mean'", "'amax'", "'amin'"])
                code = (f"{a}.index_reduce_({d}, {self.index_src(idx)}, {src}, {f}, "
                        f"include_self={r.choice(['True', 'False'])})")
                return self.stmt(code, "index_put", "index_reduce_", [a, src], [a])
            code = f"{a}.masked_scatter_({mask}, {src})"
            return self.stmt(code, "index_put", "masked_scatter_", [a, src], [a])
        return None

    def view(self):
        a = self.pick()
        if a is None:
            return None
        t, r = self.t(a), self.rng
        nd, shape = t.dim(), list(t.shape)
        c = [f"{a}.unsqueeze({r.randint(-nd - 1, nd)})", f"{a}.detach()", f"{a}.flatten()", f"{a}.view(-1)",
             f"{a}.reshape(-1)", f"{a}[...]", f"{a}.conj()", f"{a}.view_as({a})"]
        if nd >= 1:
            d = r.randrange(nd)
            size = shape[d]
            c += [f"{a}.transpose({d}, {r.randrange(nd)})", f"{a}.permute{tuple(r.sample(range(nd), nd))}",
                  f"{a}.narrow({d}, {min(1, size)}, {max(size - 1, 0)})", f"{a}[{':, ' * d}::2]",
                  f"{a}.squeeze({d})", f"{a}.movedim({d}, {r.randrange(nd)})",
                  f"{a}.unfold({d}, {max(1, min(2, size))}, 1)", f"{a}.select({d}, {r.randrange(size)})" if size else f"{a}.flatten()",
                  f"{a}.expand({shape_src([r.choice([2, 3])] + shape)})",
                  f"{a}.expand({shape_src([r.choice([2, 3]) if s == 1 else s for s in shape])})",
                  f"{a}.view({shape_src(shape[::-1])})", f"{a}.reshape({shape_src(shape[::-1])})",
                  f"{a}.view({shape_src(shape[:d] + [1] + shape[d:])})",
                  f"{a}.view({dtype_src(r.choice(DTYPES))})", f"{a}.unflatten(0, (1, {shape[0]}))",
                  f"{a}.mT" if nd >= 2 else f"{a}.t()"]
            if nd >= 2:
                c += [f"{a}.t()" if nd == 2 else f"{a}.transpose(0, 1)", f"{a}.diagonal()",
                      f"{a}.view({shape_src([shape[0] * shape[1]] + shape[2:])})"]
        storage = t.untyped_storage().nbytes() // max(t.element_size(), 1)
        if storage:  # as_strided within the storage: overlapping windows, zero strides
            size = [r.randint(0, 3) for _ in range(r.randint(1, 3))]
            stride = [r.choice([0, 1, 2, 3]) for _ in size]
            offset = r.randint(0, 2)
            need = offset + 1 + sum((s - 1) * st for s, st in zip(size, stride) if s)
            if need <= storage:
                c.append(f"{a}.as_strided({shape_src(size)}, {shape_src(stride)}, {offset})")
        n = 1
        if t.dtype.is_complex:
            c += [f"torch.view_as_real({a})", f"{a}.real", f"{a}.imag"]
        elif t.dtype == torch.float32 and nd and shape[-1] == 2:
            c.append(f"torch.view_as_complex({a})")
        expr = r.choice(c)
        if nd >= 1 and r.random() < 0.12:
            d = r.randrange(nd)
            k = r.randint(1, 3)
            expr = r.choice([f"{a}.chunk({k}, {d})", f"{a}.split({k}, {d})", f"{a}.unbind({d})"])
            count = len(eval(expr, dict(self.ns)))
            if not count or count > 4:
                return None
            n = count
        return self.assign(expr, "view", _op_name(expr), [a], n_results=n)

    def in_place(self):
        a = self.pick()
        if a is None:
            return None
        t, r = self.t(a), self.rng
        c = r.random()
        if c < 0.3:
            f = r.choice(IN_PLACE_UNARY)
            code = f"{a}.{f}()"
        elif c < 0.75:
            f = r.choice(IN_PLACE_BINARY)
            b_src, b = self.partner(a)
            if f == "maximum":
                code = f"torch.maximum({a}, {b_src}, out={a})"
            elif f == "lerp_":
                code = f"{a}.lerp_({b_src}, 0.5)"
            else:
                code = f"{a}.{f}({b_src})"
            return self.stmt(code, "in_place", f, [a, b], [a])
        elif c < 0.85:
            o = r.choice(["+=", "-=", "*=", "/=", "//=", "&=", "|="])
            b_src, b = self.partner(a)
            ix = r.choice(["", "[...]", "[0]" if t.dim() else "[()]"]) if t.dim() or r.random() < 0.5 else ""
            code = f"{a}{ix} {o} {b_src}"
            return self.stmt(code, "in_place", o, [a, b], [a])
        elif c < 0.92:
            f = r.choice([f"clamp_({self.scalar(t.dtype)}, {self.scalar(t.dtype)})", f"fill_({self.scalar(t.dtype)})",
                          f"addcmul_({a}, {a}, value=0.5)", f"mul_({self.scalar(t.dtype)})", "pow_(2)"])
            code = f"{a}.{f}"
        else:  # metadata changes in place
            nd = t.dim()
            other = self.pick(lambda u: u.dtype == t.dtype) or a
            f = r.choice(["t_()" if nd <= 2 else "transpose_(0, 1)", "unsqueeze_(0)", "squeeze_()",
                          f"resize_({shape_src(tuple(reversed(t.shape)))})", f"resize_({max(t.numel() - 1, 0)},)",
                          f"as_strided_({shape_src(t.shape)}, {shape_src(t.stride())})", f"set_({other})",
                          f"set_({other}.untyped_storage(), 0, ({self.t(other).untyped_storage().nbytes() // max(t.element_size(), 1)},))"])
            code = f"{a}.{f}"
            return self.stmt(code, "in_place", _op_name(code), [a, other], [a])
        return self.stmt(code, "in_place", _op_name(code), [a], [a])

    def overlap(self):
        """In-place writes whose source shares memory with the target (the CPU raises for partial overlap)."""
        a = self.pick(lambda t: t.dim() >= 1 and t.shape[0] >= 2)
        if a is None:
            return None
        t, r = self.t(a), self.rng
        k = r.randint(1, max(1, t.shape[0] - 1))
        code = r.choice([f"{a}[{k}:].add_({a}[:-{k}])", f"{a}[{k}:] = {a}[:-{k}]", f"{a}[:-{k}].copy_({a}[{k}:])",
                         f"torch.add({a}[:-{k}], 1, out={a}[{k}:])", f"torch.exp({a}[:-{k}], out={a}[{k}:])",
                         f"{a}.mul_({a}[0])", f"{a}.add_({a}.flip(0))", f"{a}[::2].copy_({a}[1::2])",
                         f"{a}.copy_({a}.t())" if t.dim() == 2 else f"{a}.sub_({a}[-1:])",
                         f"{a}[0].mul_({a}[1])", f"{a}.add_({a})", f"{a}[1:].copy_({a}[1:])",
                         f"{a}.clamp_(min={a}[:1])", f"{a}[{k}:] += {a}[:-{k}]"])
        return self.stmt(code, "overlap", _op_name(code), [a], [a])

    def out(self):
        r = self.rng
        a = self.pick()
        if a is None:
            return None
        t = self.t(a)
        c = r.random()
        b = None
        if c < 0.35:
            f = r.choice(OUT_UNARY)
            call = f"torch.{f}({a}, out={{o}})"
        elif c < 0.7:
            f = r.choice(OUT_BINARY)
            b_src, b = self.partner(a)
            call = f"torch.{f}({a}, {b_src}, out={{o}})" if f != "where" else f"torch.where({a} > 0, {a}, {b_src}, out={{o}})"
        elif c < 0.8:
            d = r.randrange(t.dim()) if t.dim() else 0
            f = r.choice(["sum", "mean", "amax", "cumsum", "prod"])
            call = f"torch.{f}({a}, {d}, out={{o}})"
        elif c < 0.88 and t.dim() >= 1:
            d = r.randrange(t.dim())
            b = self.pick() or a
            f = r.choice(["cat", "stack"])
            call = f"torch.{f}([{a}, {b}], {d}, out={{o}})"
        elif c < 0.94 and t.dim() >= 1:
            d = r.randrange(t.dim())
            f = r.choice(["max", "min", "sort"])
            v, i = self.fresh(), self.fresh()
            dt = dtype_src(t.dtype)
            code = (f"{v}, {i} = torch.{f}({a}, {d}, out=(torch.empty(0, dtype={dt}, device=dev), "
                    f"torch.empty(0, dtype=torch.long, device=dev)))")
            return self.stmt(code, "out", f"{f}.out", [a], [v, i])
        else:
            f = "matmul"
            w = self.new_operand((t.shape[-1] if t.dim() else 1, r.randint(1, 4)), t.dtype)
            b = w
            call = f"torch.matmul({a}, {w}, out={{o}})"
        target = r.random()
        if target < 0.45:  # an empty out= argument, grown by the call
            dt = t.dtype if r.random() < 0.8 else r.choice(DTYPES)
            o = self.fresh()
            code = f"{o} = " + call.format(o=f"torch.empty(0, dtype={dtype_src(dt)}, device=dev)")
            return self.stmt(code, "out", f"{f}.out", [a, b], [o], uninitialised=())
        if target < 0.65:  # an out= argument of the result's shape, in another layout
            o = self.fresh()
            try:
                ref = eval(call.replace(", out={o}", ""), dict(self.ns))
            except Exception:  # noqa: BLE001 - then any out will do: the call raises on both devices
                ref = t
            if not isinstance(ref, torch.Tensor):
                return None
            layout = r.choice(["t", "strided", "contiguous"])
            shape, dt = list(ref.shape), dtype_src(ref.dtype)
            # zeros, not empty: views of the out's storage may reach elements the call does not write
            if layout == "t" and len(shape) == 2:
                make = f"torch.zeros({shape_src(shape[::-1])}, dtype={dt}, device=dev).t()"
            elif layout == "strided" and shape:
                big = [2 * s for s in shape[:1]] + shape[1:]
                make = f"torch.zeros({shape_src(big)}, dtype={dt}, device=dev)[::2]"
            else:
                make = f"torch.zeros({shape_src(shape)}, dtype={dt}, device=dev)"
            code = f"{o} = " + call.format(o=make)
            return self.stmt(code, "out", f"{f}.out", [a, b], [o])
        o = self.pick()  # an existing tensor (resized with a warning, or itself an operand)
        return self.stmt(call.format(o=o), "out", f"{f}.out", [a, b, o], [o])

    def copy(self):
        a = self.pick()
        if a is None:
            return None
        t, r = self.t(a), self.rng
        c = r.random()
        if c < 0.3:
            b_src, b = self.partner(a)
            if b is None:
                b_src, b = a, a
            forms = [f"{a}.copy_({b_src})", f"{a}.copy_({b_src}, non_blocking=True)"]
            if not self.fills_on_the_cpu_only(a, b):
                forms.append(f"{a}[...] = {b_src}")
            code = r.choice(forms)
            return self.stmt(code, "copy", "copy_", [a, b], [a])
        dt = dtype_src(r.choice(DTYPES))
        expr = r.choice([f"{a}.clone()", f"{a}.clone(memory_format=torch.contiguous_format)", f"{a}.contiguous()",
                         f"{a}.to({dt})", f"{a}.to({dt}, copy=True)", f"{a}.type_as({self.pick() or a})",
                         f"{a}.clone(memory_format=torch.channels_last)" if t.dim() == 4 else f"{a}.clone(memory_format=torch.preserve_format)",
                         f"{a}.to(memory_format=torch.channels_last)" if t.dim() == 4 else f"{a}.contiguous()",
                         f"torch.empty_like({a}).copy_({a})", f"{a}.repeat({', '.join(['2'] + ['1'] * max(t.dim() - 1, 0))})" if t.dim() else f"{a}.repeat(2)",
                         f"{a}.flip({r.randrange(t.dim())})" if t.dim() else f"{a}.clone()",
                         f"{a}.roll(1)", f"torch.tril({a})" if t.dim() >= 2 else f"{a}.abs()",
                         f"{a}.repeat_interleave(2)", f"torch.zeros_like({a})", f"torch.ones_like({a}, dtype={dt})",
                         f"torch.full_like({a}, {self.scalar(t.dtype)})", f"{a}.new_zeros(3)",
                         f"{a}.to(dev, {dt})", f"F.pad({a}, (1, 2))" if t.dim() else f"{a}.clone()",
                         f"F.pad({a}, (0, 1, 1, 0), value={self.scalar(t.dtype)})" if t.dim() >= 2 else f"{a}.clone()"])
        return self.assign(expr, "copy", _op_name(expr), [a])

    def cat(self):
        a = self.pick()
        if a is None:
            return None
        t, r = self.t(a), self.rng
        nd = t.dim()
        d = r.randrange(-nd, nd) if nd else 0
        fits = self.tensors(lambda u: u.dim() == nd and all(x == y for i, (x, y) in enumerate(zip(u.shape, t.shape))
                                                          if i != d % max(nd, 1)) and u.dim())
        fits = [n for n in fits if n not in self.host]
        others = [r.choice(fits) if fits and r.random() < 0.85 else (self.pick() or a) for _ in range(r.randint(1, 2))]
        parts = ", ".join([a] + others)
        expr = r.choice([f"torch.cat([{parts}], {d})", f"torch.cat(({parts}), dim={d})",
                         f"torch.stack([{parts}], {d})", f"torch.cat([{a}])", f"torch.hstack([{parts}])",
                         f"torch.cat([{parts}, torch.empty(0, dtype={dtype_src(t.dtype)}, device=dev)], {d})"])
        return self.assign(expr, "cat", _op_name(expr), [a] + others)

    def create(self):
        r = self.rng
        dt = dtype_src(r.choice(DTYPES))
        shape = shape_src(self.input_shape())
        expr = r.choice([f"torch.zeros({shape}, dtype={dt}, device=dev)", f"torch.ones({shape}, device=dev)",
                         f"torch.full({shape}, {self.scalar()}, device=dev)", f"torch.arange({r.randint(0, 12)}, device=dev)",
                         f"torch.arange(0, 3, 0.5, device=dev, dtype={dt})", f"torch.linspace(0, 1, {r.randint(1, 7)}, device=dev)",
                         f"torch.eye({r.randint(1, 4)}, device=dev, dtype={dt})", f"torch.tensor({self.scalar()}, device=dev)",
                         f"torch.tensor([1, 2, 3], dtype={dt}, device=dev)", f"torch.empty({shape}, device=dev).fill_(2)"])
        return self.assign(expr, "create", _op_name(expr), [])

    def read(self):
        """Reads to the host: they synchronise."""
        a = self.pick()
        if a is None:
            return None
        r = self.rng
        b = self.pick() or a
        expr = r.choice([f"{a}.sum().item()", f"{a}.tolist()", f"bool(({a} != 0).any())", f"torch.equal({a}, {b})",
                         f"{a}.is_contiguous()", f"{a}.flatten()[0].item()", f"int({a}.count_nonzero())",
                         f"{a}.stride()", f"float({a}.float().mean())", f"{a}.max().item()"])
        return self.assign(expr, "read", _op_name(expr), [a, b])

    def generate(self) -> Program:
        p, r = self.profile, self.rng
        for _ in range(r.randint(*p.inputs)):
            self.new_input()
        families, weights = list(p.weights), list(p.weights.values())
        target = r.randint(*p.statements)
        kept = attempts = 0
        while kept < target and attempts < 4 * target:
            attempts += 1
            family = r.choices(families, weights)[0]
            try:
                st = getattr(self, family)()
            except Exception:  # noqa: BLE001 - a proposal that cannot be formed (odd shapes): draw again
                st = None
            if st is not None and self._try(st):
                kept += 1
        return self.program


def _flat(v) -> list:
    if isinstance(v, (tuple, list)):
        return [x for e in v for x in _flat(e)]
    return [v]


def _broadcasts(a, b) -> bool:
    try:
        torch.broadcast_shapes(a, b)
        return True
    except RuntimeError:
        return False


def _op_name(expr: str) -> str:
    m = re.search(r"(?:torch\.|F\.|\.)([a-z_0-9]+)\(", expr)
    return m.group(1) if m else expr.split()[1] if len(expr.split()) > 2 else expr


def generate(seed: int, path: str) -> Program:
    """The program of this seed on this path."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # resized out= arguments, deprecated forms: the programs mean them
        return _Generator(seed, PROFILES[path]).generate()
