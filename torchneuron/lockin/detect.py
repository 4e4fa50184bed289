"""The analyser: finds every node that ties a program to CUDA, by the rules of rules.py.

It walks a module statement by statement, resolving names as it goes
(names.py). Only statements whose lines mention something a rule looks for
(:data:`TRIGGER`, or a name bound to such a thing earlier in the file) have
their expressions walked: every finding's node contains one of those words or
names, so the others cannot hold one, and most of a large library is skipped
at the cost of one regular-expression pass.

Each :class:`Finding` carries a :class:`FixSpec` when ``--fix`` can rewrite
it: the kind of rewrite, the node's kind and position, and its parameters;
fixer.py applies it with LibCST.

Guards: code under a capability test (``if torch.backends.cudnn.is_available():``
and the others in :data:`rules.CAPABILITY_GUARDS`) runs only where that piece
of CUDA exists, and an import of a CUDA-only package inside ``try: ... except
ImportError`` or under ``if is_<package>_available():`` is optional: such
findings are reported as guarded and not counted. A test that picks CUDA
(``torch.cuda.is_available()``, ``x.device.type == "cuda"``) is rewritten to
the accelerator's, unless the block under it holds code only CUDA has; then
it is left for a person to turn into a capability test.
"""
from __future__ import annotations

import ast
import bisect
import re
from dataclasses import dataclass, field

from . import names
from .names import Binding, Lines, Scope
from .rules import (AMP_DEVICE_CALLS, AVAILABILITY_CALLS, CAPABILITY_GUARDS, CUDA_AMP, CUDA_API,
                    CUDA_GRAPH_COMPILE_MODES, CUDA_GRAPH_NAMES, CUDA_ONLY_HINTS, CUDA_ONLY_PACKAGES, CUDA_TENSOR_TYPES,
                    DATA_PARALLEL, DEVICE_COUNT_CALLS, FLASH_ATTENTION_IMPLEMENTATIONS, MATMUL_PRECISION,
                    PROCESS_GROUP_CALLS, PROFILER_CALLS, PROFILER_CUDA, RULES, TRITON_KERNEL_DECORATORS)
from .source import Source

#: words that every finding's node contains (or a name bound on a line with one)
TRIGGER = re.compile(r"cuda|CUDA|nccl|NCCL|cudnn|device_map|pin_memory_device|reduce-overhead|max-autotune|"
                     r"cudagraphs|flash_attention|GradScaler|Backend|nvidia-smi|\bload\(|barrier|DataParallel|data_parallel|"
                     r"_scaled_mm|triton|CUBLAS|CUDNN")

#: what a file needs to hold for any finding: TRIGGER, or an import of a CUDA-only package
FILE_TRIGGER = re.compile(TRIGGER.pattern + r"|\b(?:import|from)\s+(?:" +
                          "|".join(sorted(p.replace(".", r"\.") for p in CUDA_ONLY_PACKAGES)) + r")\b")

DEVICE_STRING = re.compile(r"^cuda(:[\w{}%]*)?$")
NCCL_STRING = re.compile(r"(^|[,:])nccl($|,)")
CUDA_ENV = re.compile(r"^(?:[A-Z0-9]+_)*CUDA(?:_[A-Z0-9]+)+$|^(?:[A-Z0-9]+_)+CUDA$|^(?:CUBLAS|CUBLASLT|CUDNN)_[A-Z0-9_]+$")
CUDA_TENSOR_STRING = re.compile(r"^torch\.cuda\.\w*Tensor$")
_AVAILABLE_NAME = re.compile(r"(?i)^(is_|has_)?\w*_available$")
_IMPORT_ERRORS = frozenset({"ImportError", "ModuleNotFoundError", "Exception", "BaseException"})
#: by-hand findings whose code runs on any device as it is (DataParallel passes through without
#: devices and replicates over the accelerator's): a CUDA test around them can still be rewritten
_RUNS_ANYWHERE = frozenset({"TNL026"})
#: what makes a line name CUDA; an implicit rule's finding on code that does is explicit
NAMES_CUDA = re.compile(r"(?i)cuda|nccl|cudnn")
#: a count of GPUs, tested before DataParallel
_GPU_COUNT_NAME = re.compile(r"(?i)^n_?gpus?$|^num_gpus$|^gpu_count$|^world_size$")
#: calls that only report: a branch made of them changes nothing a program computes
_REPORTING = frozenset({"print", "info", "warning", "warn", "debug", "log", "write", "print0", "log0",
                        "set_postfix", "set_description"})


@dataclass
class FixSpec:
    """What fixer.py rewrites: ``kind`` on the node of ``node_type`` at ``span``
    ((line, column, end line, end column) in the analysed text, columns in
    characters from 0)."""
    kind: str
    node_type: str
    span: tuple[int, int, int, int]
    params: dict = field(default_factory=dict)


@dataclass
class Finding:
    path: str
    line: int                 # in the file; for a notebook, in the cell
    column: int               # from 1
    rule: str
    message: str              # what ties, and through which name
    rewrite: str              # the device-neutral form
    fixable: bool
    guard: str                # what to do by hand
    cell: int | None = None   # notebook cell, from 1
    guarded: bool = False     # under a capability or import guard: reported, not counted
    implicit: bool = False    # the tie names no CUDA (rules.Rule.implicit): a class of its own in the report
    origin: str = "static"    # or "runtime" (redirect.py)
    snippet: str = ""
    literal: str | None = None   # a device string's value ("cuda:" for one built on a "cuda:" prefix)
    text_line: int = 0        # the line in the analysed text (differs from ``line`` in notebooks)
    fix: FixSpec | None = None
    # the If statements around it and the one whose test it is in (post-pass only)
    enclosing: tuple = ()
    test_of: int | None = None

    @property
    def vendor(self) -> str:
        return RULES[self.rule].vendor

    def to_dict(self) -> dict:
        return {"path": self.path, "cell": self.cell, "line": self.line, "column": self.column,
                "rule": self.rule, "name": RULES[self.rule].name, "vendor": self.vendor, "message": self.message,
                "rewrite": self.rewrite, "fixable": self.fixable, "guard": self.guard, "guarded": self.guarded,
                "implicit": self.implicit, "origin": self.origin, "snippet": self.snippet}


@dataclass
class FileResult:
    path: str
    lines: int
    findings: list[Finding]
    parsed: bool = True                  # False: nothing in it can hold a finding, not parsed
    error: str | None = None             # a syntax error, with its line
    torch_name: str | None = None        # the module's name for torch (fixer.py)
    skipped_cells: list[int] = field(default_factory=list)


def _node_type(node: ast.AST) -> str:
    if isinstance(node, ast.Constant):
        return "Integer" if isinstance(node.value, int) else "SimpleString"
    if isinstance(node, ast.JoinedStr):
        return "FormattedString"
    if isinstance(node, ast.keyword):
        return "Arg"
    if isinstance(node, ast.Compare):
        return "Comparison"
    return type(node).__name__


class Detector:
    def __init__(self, source: Source):
        self.source = source
        self.lines = Lines(source.text)
        self.findings: list[Finding] = []
        self.reported: set[int] = set()          # id() of nodes a finding is on, or that a rule consumed
        self.guards: list[tuple[str, int]] = []  # (kind, id of the If/Try) around the current statement
        self.test_of: int | None = None
        self.test_if: ast.If | None = None        # the If whose test is being walked
        self.if_tests: list[tuple[ast.AST, bool]] = []   # (test, in its body) of the Ifs around the statement
        # where the code runs only with a device: under a test of CUDA's (or the accelerator's)
        # availability; id() of nodes under such a conditional expression
        self.available_depth = 0
        self.available_nodes: set[int] = set()
        self.count_guarded_nodes: set[int] = set()
        self.triton_kernels: set[str] = set()     # names of functions made Triton kernels
        self.alias_names: set[str] = set()
        self._alias_re: re.Pattern | None = None
        self.parent: dict[int, ast.AST] = {}
        # id() of a "cuda" device type given to autocast or a GradScaler -> the call's enabled= guard
        self.amp_device: dict[int, FixSpec] = {}
        starts = [0]
        for m in re.finditer("\n", source.text):
            starts.append(m.end())
        self.trigger_lines = sorted({bisect.bisect_right(starts, m.start()) for m in TRIGGER.finditer(source.text)})
        self.import_findings: list[tuple[Finding, list[Binding]]] = []
        self.module_scope = Scope("module")

    # -- where to look ---------------------------------------------------------------------

    def hot(self, first: int, last: int) -> bool:
        i = bisect.bisect_left(self.trigger_lines, first)
        if i < len(self.trigger_lines) and self.trigger_lines[i] <= last:
            return True
        if self.alias_names:
            if self._alias_re is None:
                self._alias_re = re.compile(r"\b(?:" + "|".join(sorted(map(re.escape, self.alias_names))) + r")\b")
            return any(self._alias_re.search(self.lines.lines[i - 1]) for i in range(first, last + 1))
        return False

    def add_alias(self, name: str) -> None:
        if name not in self.alias_names:
            self.alias_names.add(name)
            self._alias_re = None

    # -- findings --------------------------------------------------------------------------

    def report(self, node: ast.AST, rule: str, message: str, rewrite: str = "", fix: FixSpec | None = None,
               fixable: bool | None = None, binding: Binding | None = None) -> Finding | None:
        if id(node) in self.reported:
            return None
        self.reported.add(id(node))
        r = RULES[rule]
        fixable = (fix is not None) if fixable is None else (fixable and fix is not None)
        line = node.lineno
        cell, cell_line = self.source.location(line)
        enclosing = tuple(g for _, g in self.guards)
        guarded = any(kind == "capability" for kind, _ in self.guards) or (
            rule == "TNL018" and any(kind in ("package", "try-import") for kind, _ in self.guards))
        implicit = r.implicit and not NAMES_CUDA.search(ast.unparse(node))
        if fixable and (self.available_depth or id(node) in self.available_nodes):
            # under a test that a device is there: the rewrite needs no fallback for a machine without
            for s in (fix, *fix.params.get("also", ())):
                s.params["available"] = True
        f = Finding(self.source.path, cell_line, self.lines.char_column(line, node.col_offset) + 1, rule, message,
                    rewrite or r.rewrite.replace("`", ""), fixable, r.guard, cell, guarded,
                    snippet=self.lines.lines[line - 1].strip(), text_line=line, fix=fix if fixable else None,
                    enclosing=enclosing, test_of=self.test_of, implicit=implicit)
        self.findings.append(f)
        if binding is not None and binding.import_node is not None:
            binding.uses.append(f)
        return f

    def spec(self, kind: str, node: ast.AST, **params) -> FixSpec:
        return FixSpec(kind, _node_type(node), self.lines.span(node), params)

    # -- statements ------------------------------------------------------------------------

    def run(self, tree: ast.Module) -> None:
        self.block(tree.body, self.module_scope)
        self.post_pass()

    def block(self, stmts: list[ast.stmt], scope: Scope) -> None:
        for stmt in stmts:
            self.statement(stmt, scope)

    def header_hot(self, stmt: ast.stmt, first: int | None = None) -> bool:
        body = getattr(stmt, "body", None)
        last = body[0].lineno - 1 if body and not isinstance(body, ast.AST) else stmt.end_lineno
        return self.hot(first or stmt.lineno, max(last, first or stmt.lineno))

    def statement(self, stmt: ast.stmt, scope: Scope) -> None:
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            self.imports(stmt, scope)
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([d.lineno for d in stmt.decorator_list] + [stmt.lineno])
            if self.header_hot(stmt, first):
                for d in stmt.decorator_list:
                    self.expr(d, scope, decorator=True)
                args = stmt.args
                annotations = [a.annotation for a in args.posonlyargs + args.args + args.kwonlyargs
                               + [args.vararg, args.kwarg] if a is not None and a.annotation is not None]
                for e in [*args.defaults, *[d for d in args.kw_defaults if d is not None], *annotations,
                          *([stmt.returns] if stmt.returns is not None else [])]:
                    self.expr(e, scope)
            scope.bind_unknown(stmt.name, stmt.lineno)
            if any(names.qualname(d.func if isinstance(d, ast.Call) else d, scope)[0] in TRITON_KERNEL_DECORATORS
                   for d in stmt.decorator_list):
                self.triton_kernels.add(stmt.name)
                self.add_alias(stmt.name)
            inner = Scope("function", scope)
            names.bind_parameters(stmt.args, inner, stmt.lineno)
            self.block(stmt.body, inner)
        elif isinstance(stmt, ast.ClassDef):
            first = min([d.lineno for d in stmt.decorator_list] + [stmt.lineno])
            if self.header_hot(stmt, first):
                for e in [*stmt.decorator_list, *stmt.bases, *[k.value for k in stmt.keywords]]:
                    self.expr(e, scope)
            scope.bind_unknown(stmt.name, stmt.lineno)
            self.block(stmt.body, Scope("class", scope))
        elif isinstance(stmt, ast.If):
            self.if_statement(stmt, scope)
        elif isinstance(stmt, (ast.For, ast.AsyncFor)):
            if self.header_hot(stmt):
                self.expr(stmt.iter, scope)
            for n in names.target_names(stmt.target):
                scope.bind_unknown(n, stmt.lineno)
            self.block(stmt.body, scope)
            self.block(stmt.orelse, scope)
        elif isinstance(stmt, ast.While):
            if self.header_hot(stmt):
                self.expr(stmt.test, scope)
            self.block(stmt.body, scope)
            self.block(stmt.orelse, scope)
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            if self.header_hot(stmt):
                for item in stmt.items:
                    self.expr(item.context_expr, scope)
            for item in stmt.items:
                if item.optional_vars is not None:
                    for n in names.target_names(item.optional_vars):
                        scope.bind_unknown(n, stmt.lineno)
            self.block(stmt.body, scope)
        elif isinstance(stmt, (ast.Try, getattr(ast, "TryStar", ast.Try))):
            self.try_statement(stmt, scope)
        elif isinstance(stmt, ast.Match):
            if self.header_hot(stmt):
                self.expr(stmt.subject, scope)
            for case in stmt.cases:
                if self.hot(case.pattern.lineno, case.pattern.end_lineno):
                    for n in ast.walk(case.pattern):
                        if isinstance(n, ast.MatchValue):
                            self.expr(n.value, scope, fixable=False)
                self.block(case.body, scope)
        elif isinstance(stmt, ast.Expr):
            if isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
                return   # a docstring or a bare string
            if self.hot(stmt.lineno, stmt.end_lineno):
                self.expr(stmt.value, scope)
        elif isinstance(stmt, ast.Assign):
            hot = self.hot(stmt.lineno, stmt.end_lineno)
            if hot:
                self.assignment(stmt, stmt.targets, stmt.value, scope)
            names.bind_assign(stmt.targets, stmt.value, scope, stmt.lineno)
            if hot:
                for t in stmt.targets:
                    for n in names.target_names(t):
                        self.add_alias(n)
        elif isinstance(stmt, ast.AnnAssign):
            hot = self.hot(stmt.lineno, stmt.end_lineno)
            if hot:
                self.expr(stmt.annotation, scope)
                if stmt.value is not None:
                    self.assignment(stmt, [stmt.target], stmt.value, scope)
            names.bind_assign([stmt.target], stmt.value, scope, stmt.lineno)
            if hot:
                for n in names.target_names(stmt.target):
                    self.add_alias(n)
        elif isinstance(stmt, ast.AugAssign):
            if self.hot(stmt.lineno, stmt.end_lineno):
                self.expr(stmt.target, scope)
                self.expr(stmt.value, scope)
            for n in names.target_names(stmt.target):
                scope.bind_unknown(n, stmt.lineno)
        elif isinstance(stmt, (ast.Global, ast.Nonlocal, ast.Pass, ast.Break, ast.Continue)):
            return
        elif self.hot(stmt.lineno, stmt.end_lineno):
            for child in ast.iter_child_nodes(stmt):
                if isinstance(child, ast.expr):
                    self.expr(child, scope)

    def assignment(self, stmt: ast.stmt, targets: list[ast.AST], value: ast.AST, scope: Scope) -> None:
        for t in targets:
            q, _ = names.qualname(t, scope) if isinstance(t, ast.Attribute) else (None, None)
            if q == "torch.backends.cuda.matmul.allow_tf32" and isinstance(value, ast.Constant) \
                    and isinstance(value.value, bool) and len(targets) == 1:
                precision = MATMUL_PRECISION[value.value]
                self.report(stmt, "TNL008", "sets CUDA's TF32 matmul flag (torch.backends.cuda.matmul.allow_tf32)",
                            f'torch.set_float32_matmul_precision("{precision}")',
                            self.spec("matmul_precision", stmt, precision=precision))
                self.reported.update((id(t), id(value)))
            elif q == "torch._inductor.config.triton.cudagraphs":
                self.report(t, "TNL016", "turns on CUDA graphs in Inductor (torch._inductor.config.triton.cudagraphs)",
                            "leave CUDA graphs to the device's compile backend")
        for t in targets:
            self.expr(t, scope)
        self.expr(value, scope)

    def imports(self, stmt: ast.Import | ast.ImportFrom, scope: Scope) -> None:
        made = names.bind_import(stmt, scope)
        cuda_bindings, cuda_names, packages = [], [], []
        if isinstance(stmt, ast.Import):
            for alias, b in zip(stmt.names, made):
                if _is_cuda_module(alias.name):
                    if alias.asname:
                        self.add_alias(b.name)
                    if not _imports_everywhere(alias.name):
                        cuda_names.append(alias.name)
                        if alias.asname:
                            cuda_bindings.append(b)
                if _is_cuda_only_package(alias.name):
                    packages.append(alias.name)
        elif not stmt.level:
            module = stmt.module or ""
            for alias, b in zip([a for a in stmt.names if a.name != "*"], made):
                full = f"{module}.{alias.name}"
                if _is_cuda_module(full) or _is_cuda_module(module):
                    self.add_alias(b.name)
                    if not _imports_everywhere(full):
                        cuda_names.append(full)
                        cuda_bindings.append(b)
                elif full in TRITON_KERNEL_DECORATORS:
                    self.add_alias(b.name)
                elif full in ("torch.utils.cpp_extension.CUDAExtension", "torch.utils.cpp_extension.CUDA_HOME"):
                    self.add_alias(b.name)
                    self.report(stmt, "TNL017", f"imports {full}")
                if _is_cuda_only_package(module) or _is_cuda_only_package(full):
                    packages.append(full if _is_cuda_only_package(full) and not _is_cuda_only_package(module)
                                    else module)
            if any(a.name == "*" for a in stmt.names) and _is_cuda_module(module) and \
                    not _imports_everywhere(module):
                cuda_names.append(module + ".*")
        if cuda_names:
            f = self.report(stmt, "TNL005", "imports " + ", ".join(cuda_names),
                            "import torch and use the neutral names",
                            self.spec("import_remove", stmt, names=[b.name for b in cuda_bindings],
                                      modules=cuda_names), fixable=not any(n.endswith(".*") for n in cuda_names))
            if f is not None:
                self.import_findings.append((f, cuda_bindings))
        if packages:
            self.reported.discard(id(stmt))   # one import statement can hold both kinds
            self.report(stmt, "TNL018", "imports " + ", ".join(sorted(set(packages))) + ", which runs only on "
                        "NVIDIA GPUs")

    def if_statement(self, stmt: ast.If, scope: Scope) -> None:
        kind = self.guard_kind(stmt.test, scope)
        available = self.implies_device(stmt.test, scope)
        if self.hot(stmt.test.lineno, stmt.test.end_lineno):
            self.test_of, self.test_if = id(stmt), stmt
            self.expr(stmt.test, scope)
            self.test_of = self.test_if = None
        self.guards.append((kind or "test", id(stmt)))
        self.if_tests.append((stmt.test, True))
        self.available_depth += available
        self.block(stmt.body, scope)
        self.available_depth -= available
        self.guards[-1] = ("test", id(stmt))
        self.if_tests[-1] = (stmt.test, False)
        self.block(stmt.orelse, scope)
        self.if_tests.pop()
        self.guards.pop()

    def implies_device(self, test: ast.AST, scope: Scope, depth: int = 3) -> bool:
        """Whether ``test`` is true only where there is a CUDA device (after --fix: an
        accelerator): CUDA's availability or a device count above zero, a ``"cuda"``
        device type compared equal, ``.is_cuda``; a name bound to one of them."""
        if isinstance(test, ast.Name) and depth:
            value = names.follow(test, scope, depth=1)
            return value is not test and self.implies_device(value, scope, depth - 1)
        if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
            return any(self.implies_device(v, scope, depth) for v in test.values)
        if isinstance(test, ast.Call):
            return names.qualname(test.func, scope)[0] in AVAILABILITY_CALLS
        if isinstance(test, ast.Attribute):
            return test.attr == "is_cuda"
        if isinstance(test, ast.Compare) and len(test.ops) == 1:
            op, left, right = test.ops[0], test.left, test.comparators[0]
            if isinstance(op, ast.Eq) and any(isinstance(n, ast.Constant) and n.value == "cuda" for n in (left, right)):
                return True
            if isinstance(op, ast.In) and isinstance(left, ast.Constant) and left.value == "cuda":
                return True
            if isinstance(left, ast.Call) and names.qualname(left.func, scope)[0] in DEVICE_COUNT_CALLS and \
                    isinstance(right, ast.Constant) and type(right.value) is int:
                return (isinstance(op, ast.Gt) and right.value >= 0) or (isinstance(op, ast.GtE) and right.value >= 1)
        return False

    def tests_gpu_count(self, test: ast.AST, scope: Scope) -> bool:
        """Whether ``test`` looks at how many GPUs there are (or whether there is one)."""
        if self.implies_device(test, scope):
            return True
        for n in ast.walk(test):
            if isinstance(n, ast.Call) and names.qualname(n.func, scope)[0] in DEVICE_COUNT_CALLS:
                return True
            if isinstance(n, (ast.Name, ast.Attribute)) and \
                    _GPU_COUNT_NAME.match(n.id if isinstance(n, ast.Name) else n.attr):
                return True
        return False

    def uses_cuda(self, stmt: ast.stmt) -> bool:
        """Whether ``stmt`` calls or reads something of CUDA's (a message naming it does not)."""
        scope = self.module_scope
        for n in ast.walk(stmt):
            if isinstance(n, ast.Attribute) and n.attr in ("cuda", "is_cuda"):
                return True
            if isinstance(n, (ast.Name, ast.Attribute)):
                q, _ = names.qualname(n, scope)
                if q is not None and _tracked(q):
                    return True
        return False

    def only_reports(self, stmt: ast.If) -> bool:
        """Whether both branches of ``stmt`` only print or log, and what they print names
        nothing of CUDA's (else the test guards CUDA-only code)."""
        body = [*stmt.body, *stmt.orelse]
        for s in body:
            if isinstance(s, ast.Pass):
                continue
            if self.hot(s.lineno, s.end_lineno) and self.uses_cuda(s):
                return False
            if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Call)):
                return False
            func = s.value.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if name not in _REPORTING:
                return False
        return True

    def try_statement(self, stmt: ast.Try, scope: Scope) -> None:
        # an import is optional when a handler of its ImportError goes on without it
        catches_import = any((h.type is None or any(
            isinstance(n, ast.Name) and n.id in _IMPORT_ERRORS for n in ast.walk(h.type))) and not _ends(h.body)
            for h in stmt.handlers)
        self.guards.append(("try-import" if catches_import else "try", id(stmt)))
        self.block(stmt.body, scope)
        self.guards.pop()
        for h in stmt.handlers:
            if h.type is not None and self.hot(h.type.lineno, h.type.end_lineno):
                self.expr(h.type, scope)
            if h.name:
                scope.bind_unknown(h.name, h.lineno)
            self.block(h.body, scope)
        self.block(stmt.orelse, scope)
        self.block(stmt.finalbody, scope)

    def guard_kind(self, test: ast.AST, scope: Scope) -> str | None:
        """"capability", "package" or None for an If's test."""
        parts = test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else [test]
        for part in parts:
            if isinstance(part, ast.Call):
                q, _ = names.qualname(part.func, scope)
                if q in CAPABILITY_GUARDS or (q == "shutil.which" and _names_nvidia_smi(part)):
                    return "capability"
                name = part.func.attr if isinstance(part.func, ast.Attribute) else \
                    part.func.id if isinstance(part.func, ast.Name) else ""
                if q == "importlib.util.find_spec" or _AVAILABLE_NAME.match(name):
                    return "package"
            if isinstance(part, ast.Name) and _AVAILABLE_NAME.match(part.id):
                return "package"
            if self.accelerator_is_cuda(part, scope):
                return "capability"
            if isinstance(part, ast.Compare) and isinstance(part.left, ast.Call):
                q, _ = names.qualname(part.left.func, scope)
                if q == "importlib.util.find_spec":
                    return "package"
        return None

    def accelerator_is_cuda(self, node: ast.AST, scope: Scope) -> bool:
        """``torch.accelerator.current_accelerator().type == "cuda"``: an explicit CUDA-only branch."""
        if not (isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.Eq)):
            return False
        left, right = node.left, node.comparators[0]
        if not (isinstance(right, ast.Constant) and right.value == "cuda" and isinstance(left, ast.Attribute)
                and left.attr == "type" and isinstance(left.value, ast.Call)):
            return False
        q, _ = names.qualname(left.value.func, scope)
        if q == "torch.accelerator.current_accelerator":
            self.reported.add(id(right))
            return True
        return False

    # -- expressions -----------------------------------------------------------------------

    def expr(self, root: ast.AST, scope: Scope, decorator: bool = False, fixable: bool = True) -> None:
        stack = [(root, None)]
        while stack:
            node, parent = stack.pop()
            if id(node) in self.reported:
                continue
            if self.check(node, parent, scope, decorator and node is root, fixable):
                for child in ast.iter_child_nodes(node):
                    self.parent[id(child)] = node
                    stack.append((child, node))

    def check(self, node: ast.AST, parent: ast.AST | None, scope: Scope, decorator: bool, fixable: bool) -> bool:
        """Reports what ``node`` ties; False when its children need no look."""
        if isinstance(node, (ast.Attribute, ast.Name)):
            q, binding = names.qualname(node, scope)
            if q is not None and _tracked(q):
                self.reference(node, q, binding, parent, scope, decorator)
                return False
            if isinstance(node, ast.Attribute) and q is None:
                if node.attr == "is_cuda" and isinstance(node.ctx, ast.Load):
                    # a comparison needs parentheses where it is an operand or the object of an attribute
                    paren = parent is not None and not isinstance(parent, (
                        ast.IfExp, ast.BoolOp, ast.keyword, ast.Call, ast.UnaryOp, ast.List, ast.Tuple))
                    self.report(node, "TNL002", "reads .is_cuda", fix=self.spec("is_cuda", node, paren=paren))
            return True
        if isinstance(node, ast.Call):
            self.call(node, scope)
            return True
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if not isinstance(parent, ast.JoinedStr):
                self.string(node, scope, fixable)
            return False
        if isinstance(node, ast.JoinedStr):
            first = node.values[0] if node.values else None
            if isinstance(first, ast.Constant) and isinstance(first.value, str) and \
                    (first.value.startswith("cuda:") or (first.value == "cuda" and len(node.values) > 1)):
                f = self.report(node, "TNL003", "builds a CUDA device string", "f\"{torch.accelerator."
                                "current_accelerator().type}:...\"", self.spec("device_fstring", node), fixable)
                if f is not None:
                    f.literal = "cuda:"
            return True
        if isinstance(node, ast.Compare):
            self.accelerator_is_cuda(node, scope)
            return True
        if isinstance(node, ast.IfExp):
            if self.implies_device(node.test, scope):
                self.available_nodes.update(id(n) for n in ast.walk(node.body))
            if self.tests_gpu_count(node.test, scope):
                self.count_guarded_nodes.update(id(n) for n in ast.walk(node.body))
        elif isinstance(node, ast.BoolOp) and isinstance(node.op, ast.And):
            for i, v in enumerate(node.values[:-1]):
                if self.implies_device(v, scope):
                    self.available_nodes.update(id(n) for w in node.values[i + 1:] for n in ast.walk(w))
                    break
        return True

    def reference(self, node: ast.AST, q: str, binding: Binding | None, parent: ast.AST | None, scope: Scope,
                  decorator: bool) -> None:
        """A name or attribute chain that resolves to something CUDA's (``q``)."""
        if q in CAPABILITY_GUARDS:
            return   # a capability test is how code says it runs only where CUDA is
        if q in PROFILER_CUDA:
            return self.report(node, "TNL023", f"profiles CUDA kernels ({q})", fixable=False, binding=binding)
        if q in TRITON_KERNEL_DECORATORS:
            return self.report(node, "TNL028", f"makes a Triton kernel ({q})", fixable=False, binding=binding)
        parts = q.split(".")
        called = isinstance(parent, ast.Call) and parent.func is node
        store = isinstance(getattr(node, "ctx", None), (ast.Store, ast.Del))

        def say(rule, message, rewrite="", fix=None, fixable=True, at=node):
            self.report(at, rule, message, rewrite, fix, fixable and not store, binding)

        if q == "torch.cuda":
            return say("TNL004", "uses the torch.cuda module", "torch.get_device_module()",
                       self.spec("replace", node, code="{torch}.get_device_module()"))
        if parts[:3] == ["torch", "cuda", "amp"]:
            member = parts[3] if len(parts) > 3 else None
            kind = CUDA_AMP.get(member) if len(parts) == 4 else None
            if kind and called:
                return say("TNL006", f"calls {q}", _amp_rewrite(member), self.spec(kind, parent, member=member))
            if kind and decorator:
                return say("TNL006", f"decorates with {q}", _amp_rewrite(member),
                           self.spec(kind, node, member=member))
            return say("TNL006", f"uses {q}", _amp_rewrite(member or ""), fixable=False)
        if parts[:2] == ["torch", "cuda"]:
            member = parts[2]
            if member in CUDA_GRAPH_NAMES:
                return say("TNL009", f"uses CUDA graphs ({q})", fixable=False)
            if member in CUDA_TENSOR_TYPES:
                return say("TNL021", f"uses the CUDA tensor type {q}", fixable=False)
            depth = 3
            if member == "memory" and len(parts) > 3:
                member, depth = parts[3], 4
            neutral = CUDA_API.get(member)
            if neutral is None or len(parts) < depth:
                hint = CUDA_ONLY_HINTS.get(member, f"torch.get_device_module().{member}, where the device "
                                                   "module has it")
                return say("TNL004", f"uses {q}, which only CUDA has", hint, fixable=False)
            at = node
            for _ in range(len(parts) - depth):
                at = at.value
            target = neutral.target
            shown = target.format(torch="torch")
            at_called = at is node and called
            if at_called:
                call = parent
                if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
                    return say("TNL004", f"calls {q}", shown + "(...)", fixable=False, at=at)
                if (neutral.positional_only and (len(call.keywords) > 1 or (call.keywords and call.args))) or \
                        (neutral.max_positional is not None and len(call.args) > neutral.max_positional):
                    return say("TNL004", f"calls {q} with arguments {shown} takes otherwise", shown + "(...)",
                               fixable=False, at=at)
                return say("TNL004", f"calls {q}", shown + "(...)",
                           self.spec("call_replace", call, code=target, positional=neutral.positional_only,
                                     cpu_value=neutral.cpu_value), at=at)
            return say("TNL004", f"uses {q}", shown, self.spec("replace", at, code=target), at=at)
        if parts[:3] == ["torch", "backends", "cudnn"]:
            return say("TNL007", f"uses {q}", "none", fixable=False)
        if parts[:3] == ["torch", "backends", "cuda"]:
            rewrite = "torch.nn.attention.sdpa_kernel(...)" if len(parts) > 3 and "sdp" in parts[3] else \
                "torch.set_float32_matmul_precision(...)" if parts[3:4] == ["matmul"] else "none"
            return say("TNL008", f"uses {q}", rewrite, fixable=False)
        if q == "torch.version.cuda":
            return say("TNL020", "reads torch.version.cuda", fixable=False)
        if q in ("torch.Tensor.cuda", "torch.nn.Module.cuda"):
            return say("TNL001", f"uses {q}", fixable=False)
        if q == "torch.Tensor.is_cuda":
            return say("TNL002", f"uses {q}", fixable=False)
        if q == "torch.distributed.Backend.NCCL":
            return say("TNL010", "names the NCCL backend", "no backend argument", fixable=False)
        if q in ("torch.utils.cpp_extension.CUDAExtension", "torch.utils.cpp_extension.CUDA_HOME"):
            return say("TNL017", f"uses {q}", fixable=False)
        if q == "torch._inductor.config.triton.cudagraphs":
            return say("TNL016", "uses Inductor's CUDA graphs setting", fixable=False)

    def call(self, call: ast.Call, scope: Scope) -> None:
        func = call.func
        q, _ = names.qualname(func, scope)
        if isinstance(func, ast.Subscript) and isinstance(func.value, ast.Name) and \
                func.value.id in self.triton_kernels:
            self.report(call, "TNL028", f"launches the Triton kernel {func.value.id}")
        if isinstance(func, ast.Attribute) and func.attr == "cuda" and q is None:
            ok = not any(isinstance(a, ast.Starred) for a in call.args) and len(call.args) <= 1 and \
                all(k.arg in ("device", "non_blocking", "memory_format") for k in call.keywords)
            self.report(call, "TNL001", "calls .cuda()", "x.to(torch.accelerator.current_accelerator())",
                        self.spec("cuda_method", call), ok)
        if q == "torch.amp.GradScaler" and not call.args and not any(k.arg == "device" for k in call.keywords):
            self.report(call, "TNL006", "torch.amp.GradScaler() takes the CUDA device by default",
                        "torch.amp.GradScaler(torch.accelerator.current_accelerator().type)",
                        self.spec("grad_scaler_device", call))
        if q in AMP_DEVICE_CALLS:
            device = call.args[0] if call.args else \
                next((k.value for k in call.keywords if k.arg in ("device_type", "device")), None)
            if isinstance(device, ast.Constant) and device.value == "cuda":
                # without CUDA, torch.cuda's autocast and GradScaler disabled themselves; the CPU's are
                # real ones: the rewrite enables them only where there is an accelerator
                self.amp_device[id(device)] = self.spec("amp_enabled", call, at=AMP_DEVICE_CALLS[q])
        if q in PROCESS_GROUP_CALLS:
            self.process_group(call, q)
        if q == "torch.load" and len(call.args) < 2 and \
                not any(k.arg in ("map_location", None) for k in call.keywords):
            self.report(call, "TNL024", "loads without map_location: tensors saved on CUDA come back on CUDA")
        if q in ("torch.distributed.barrier", "torch.distributed.distributed_c10d.barrier"):
            for k in call.keywords:
                if k.arg == "device_ids":
                    self.report(k, "TNL025", "passes device_ids to barrier, which only NCCL takes", "dist.barrier()",
                                self.spec("drop_arg", k))
        if q in DATA_PARALLEL and id(call) not in self.count_guarded_nodes and \
                not any(in_body and self.tests_gpu_count(t, scope) for t, in_body in self.if_tests):
            self.report(call, "TNL026", f"wraps the model in {q.rsplit('.', 1)[-1]} on every run")
        if q == "torch._scaled_mm":
            self.report(call, "TNL027", "multiplies in fp8 (torch._scaled_mm)")
        if q in PROFILER_CALLS:
            for k in call.keywords:
                if k.arg == "use_cuda":
                    self.report(k, "TNL023", "profiles CUDA kernels (use_cuda=)")
        if q == "torch.compile" or (q is None and isinstance(func, ast.Attribute) and func.attr == "compile"
                                    and any(k.arg == "mode" for k in call.keywords)):
            self.compile_call(call, scope)
        if q in ("torch.utils.cpp_extension.load", "torch.utils.cpp_extension.load_inline"):
            for k in call.keywords:
                if k.arg in ("extra_cuda_cflags", "cuda_sources", "with_cuda"):
                    self.report(k, "TNL017", f"builds CUDA sources ({k.arg}=)")
        for k in call.keywords:
            if k.arg == "pin_memory_device":
                self.report(k, "TNL014", "pins memory for a named device type (pin_memory_device=)",
                            "drop pin_memory_device=", self.spec("drop_arg", k))
                self.reported.add(id(k.value))
            elif k.arg == "device_map":
                self.device_map(k.value, scope)
            elif k.arg == "attn_implementation":
                value = names.follow(k.value, scope)
                if isinstance(value, ast.Constant) and value.value in FLASH_ATTENTION_IMPLEMENTATIONS:
                    self.report(value, "TNL019", f"asks for {value.value}, which needs flash_attn's CUDA kernels",
                                '"sdpa"', self.spec("string_value", value, value="sdpa"))

    def process_group(self, call: ast.Call, q: str) -> None:
        for k in call.keywords:
            if k.arg == "backend" and self.is_nccl_choice(k.value):
                self.report(k, "TNL010", "asks for the NCCL backend", "no backend argument",
                            self.spec("drop_arg", k))
                self.reported.update(id(n) for n in ast.walk(k.value) if isinstance(n, ast.Constant))
        if call.args and q.endswith("init_process_group") and self.is_nccl_choice(call.args[0]):
            arg = call.args[0]
            self.report(arg, "TNL010", "asks for the NCCL backend", "no backend argument",
                        self.spec("drop_arg", arg, index=0), fixable=len(call.args) == 1)
            self.reported.update(id(n) for n in ast.walk(arg) if isinstance(n, ast.Constant))

    @staticmethod
    def is_nccl_choice(node: ast.AST) -> bool:
        """"nccl", Backend.NCCL, or a conditional between "nccl" and "gloo": what no argument picks anyway."""
        if isinstance(node, ast.Constant):
            return node.value == "nccl"
        if isinstance(node, ast.Attribute):
            return node.attr == "NCCL"
        if isinstance(node, ast.IfExp):
            values = {n.value for n in (node.body, node.orelse) if isinstance(n, ast.Constant)}
            return "nccl" in values and values <= {"nccl", "gloo"} and \
                all(isinstance(n, ast.Constant) for n in (node.body, node.orelse))
        return False

    def compile_call(self, call: ast.Call, scope: Scope) -> None:
        keywords = {k.arg: k for k in call.keywords}
        backend = keywords.get("backend")
        if backend is not None:
            value = names.follow(backend.value, scope)
            if isinstance(value, ast.Constant) and value.value == "cudagraphs":
                self.report(value, "TNL016", "compiles with the CUDA graphs backend",
                            "the device's compile backend")
                return
            if not (isinstance(value, ast.Constant) and value.value == "inductor"):
                return   # another backend decides what its modes mean
        mode = keywords.get("mode")
        if mode is not None:
            value = names.follow(mode.value, scope)
            if isinstance(value, ast.Constant) and value.value in CUDA_GRAPH_COMPILE_MODES:
                neutral = CUDA_GRAPH_COMPILE_MODES[value.value]
                self.report(value, "TNL016", f"compiles with mode {value.value!r}, which captures CUDA graphs "
                            "under Inductor", f'"{neutral}"' if neutral else "the device's compile backend",
                            self.spec("string_value", value, value=neutral) if neutral else None)
        options = keywords.get("options")
        if options is not None and isinstance(options.value, ast.Dict):
            for key in options.value.keys:
                if isinstance(key, ast.Constant) and key.value == "triton.cudagraphs":
                    self.report(key, "TNL016", "turns on CUDA graphs (options triton.cudagraphs)",
                                "leave it to the device's compile backend")

    def device_map(self, value: ast.AST, scope: Scope) -> None:
        value = names.follow(value, scope)
        candidates = [value]
        if isinstance(value, ast.IfExp):
            candidates = [names.follow(v, scope) for v in (value.body, value.orelse)]
        for v in list(candidates):
            if isinstance(v, ast.Dict):
                candidates += [names.follow(x, scope) for x in v.values]
        for v in candidates:
            if isinstance(v, ast.Constant) and type(v.value) is int:
                self.report(v, "TNL015", f"places the model on GPU {v.value} (an integer device_map)",
                            f"torch.device(torch.accelerator.current_accelerator().type, {v.value})",
                            self.spec("int_device", v, index=v.value))

    def string(self, node: ast.Constant, scope: Scope, fixable: bool) -> None:
        v = node.value
        if len(v) > 80:
            return
        parent = self.parent.get(id(node))
        if isinstance(parent, ast.Call) and names.qualname(parent.func, scope)[0] == "shutil.which":
            return   # looking for a tool is how code says it runs only where the tool is
        if isinstance(parent, ast.Compare) and self.test_if is not None and self.only_reports(self.test_if) and \
                (v == "nccl" or DEVICE_STRING.match(v)):
            return   # a backend or device name compared only to say which one runs
        if NCCL_STRING.search(v):
            self.report(node, "TNL010", f"names the NCCL backend ({v!r})", "no backend argument")
        elif DEVICE_STRING.match(v):
            fixable = fixable and not self.in_literal_type(node)
            compare = isinstance(parent, ast.Compare)
            also = [self.amp_device[id(node)]] if id(node) in self.amp_device else []
            spec = self.spec("device_string", node, compare=compare, also=also)
            if compare and parent.left is node and len(parent.ops) == 1 and \
                    isinstance(parent.ops[0], (ast.In, ast.NotIn)):
                # "cuda" in device: False without an accelerator, as it was on a machine without CUDA
                spec = self.spec("device_in", parent, negate=isinstance(parent.ops[0], ast.NotIn))
            f = self.report(node, "TNL003", f"names the CUDA device ({v!r})",
                            "torch.accelerator.current_accelerator().type" + ("" if v == "cuda" else " + ':...'"),
                            spec, fixable)
            if f is not None:
                f.literal = v if v == "cuda" or v[5:].isdigit() else "cuda:"
        elif v.startswith("NCCL_"):
            self.report(node, "TNL011", f"uses the NCCL environment variable {v}")
        elif v == "CUDA_VISIBLE_DEVICES":
            self.report(node, "TNL012", "selects devices through CUDA_VISIBLE_DEVICES")
        elif CUDA_ENV.match(v):
            self.report(node, "TNL013", f"uses the CUDA environment variable {v}")
        elif CUDA_TENSOR_STRING.match(v):
            self.report(node, "TNL021", f"names the CUDA tensor type {v}")
        elif v in FLASH_ATTENTION_IMPLEMENTATIONS:
            self.report(node, "TNL019", f"names the {v} attention implementation")
        elif "nvidia-smi" in v:
            self.report(node, "TNL022", "runs nvidia-smi")

    def in_literal_type(self, node: ast.AST) -> bool:
        """Inside ``Literal[...]``, where an expression cannot stand."""
        p = self.parent.get(id(node))
        for _ in range(3):
            if p is None:
                return False
            if isinstance(p, ast.Subscript) and (isinstance(p.value, ast.Name) and p.value.id == "Literal" or
                                                 isinstance(p.value, ast.Attribute) and p.value.attr == "Literal"):
                return True
            p = self.parent.get(id(p))
        return False

    # -- after the walk --------------------------------------------------------------------

    def post_pass(self) -> None:
        # a test that picks CUDA stays when what it guards has no neutral form
        changed = True
        while changed:
            changed = False
            by_hand_under = {g for f in self.findings if not f.fixable and not f.guarded
                             and f.rule not in _RUNS_ANYWHERE for g in f.enclosing}
            for f in self.findings:
                if f.fixable and f.test_of in by_hand_under:
                    f.fixable, f.fix = False, None
                    f.message += "; it guards code only CUDA has: test for that with a capability check " \
                                 "(torch.backends.cuda.is_built()) instead"
                    changed = True
        # an import of torch.cuda names goes when every use of them is rewritten
        for f, bindings in self.import_findings:
            uses = [u for b in bindings for u in b.uses]
            if f.fixable and any(not u.fixable for u in uses):
                f.fixable, f.fix = False, None
                f.message += "; some of its uses have no neutral form"
        self.findings.sort(key=lambda f: (f.text_line, f.column))


    def magics(self) -> None:
        """A notebook's shell lines (``!nvidia-smi``), which the parser saw as ``pass``."""
        if not any("nvidia-smi" in m for m in self.source.magics):
            return
        for at, text in enumerate(self.lines.lines, start=1):
            m = re.search(r"# lockin-magic (\d+)$", text)
            if m and "nvidia-smi" in self.source.magics[int(m.group(1))]:
                cell, cell_line = self.source.location(at)
                rule = RULES["TNL022"]
                self.findings.append(Finding(self.source.path, cell_line, 1, rule.id, "runs nvidia-smi",
                                             rule.rewrite.replace("`", ""), False, rule.guard, cell,
                                             snippet=self.source.magics[int(m.group(1))].strip(), text_line=at))
        self.findings.sort(key=lambda f: (f.text_line, f.column))


def _amp_rewrite(member: str) -> str:
    return {"autocast": "torch.autocast(device_type=torch.accelerator.current_accelerator().type, "
                        "dtype=torch.float16)",
            "GradScaler": "torch.amp.GradScaler(torch.accelerator.current_accelerator().type)",
            "custom_fwd": "torch.amp.custom_fwd(device_type=torch.accelerator.current_accelerator().type)",
            "custom_bwd": "torch.amp.custom_bwd(device_type=torch.accelerator.current_accelerator().type)",
            }.get(member, "torch.autocast / torch.amp")


def _tracked(q: str) -> bool:
    return q.startswith(("torch.cuda", "torch.backends.cudnn", "torch.backends.cuda", "torch.version.cuda",
                         "torch.utils.cpp_extension.CUDA", "torch._inductor.config.triton.cudagraphs")) or \
        q in ("torch.Tensor.cuda", "torch.nn.Module.cuda", "torch.Tensor.is_cuda", "torch.distributed.Backend.NCCL") \
        or q in PROFILER_CUDA or q in TRITON_KERNEL_DECORATORS


def _imports_everywhere(name: str) -> bool:
    """``torch.backends.cudnn`` and ``torch.backends.cuda`` import on every machine: only
    their settings tie, and those are found through the import's name."""
    return name.startswith("torch.backends.")


def _names_nvidia_smi(call: ast.Call) -> bool:
    return any(isinstance(a, ast.Constant) and a.value == "nvidia-smi" for a in call.args)


def _ends(body: list[ast.stmt]) -> bool:
    """Whether a handler's block re-raises or exits: the program stops without the import."""
    for s in body:
        if isinstance(s, ast.Raise):
            return True
        if isinstance(s, ast.Expr) and isinstance(s.value, ast.Call):
            func = s.value.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if name in ("exit", "quit", "_exit"):
                return True
    return False


def _is_cuda_module(name: str) -> bool:
    return name == "torch.cuda" or name.startswith("torch.cuda.") or \
        name in ("torch.backends.cudnn", "torch.backends.cuda") or name.startswith("torch.backends.cudnn.")


def _is_cuda_only_package(name: str) -> bool:
    if not name:
        return False
    return name.split(".")[0] in CUDA_ONLY_PACKAGES or name in CUDA_ONLY_PACKAGES or \
        ".".join(name.split(".")[:2]) in CUDA_ONLY_PACKAGES


def _torch_name(scope: Scope) -> str | None:
    for name, b in scope.bindings.items():
        if b.qualname == "torch":
            return name
    return None


def analyse_source(source: Source) -> FileResult:
    """The findings of one file or notebook."""
    text = source.text
    line_count = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
    if source.is_notebook:
        line_count = sum(c.line_count for c in source.cells)
    if not FILE_TRIGGER.search(text):
        return FileResult(source.path, line_count, [], parsed=False)
    while True:
        try:
            tree = names.parse(source.text, source.path)
            break
        except SyntaxError as e:
            cell, line = source.location(e.lineno or 0)
            if source.is_notebook and cell is not None and cell not in source.skipped_cells:
                from .source import blank_cell
                blank_cell(source, cell)
                continue
            where = f"cell {cell}, line {line}" if cell else f"line {e.lineno}"
            return FileResult(source.path, line_count, [], error=f"{where}: {e.msg}")
    detector = Detector(source)
    detector.run(tree)
    detector.magics()
    return FileResult(source.path, line_count, detector.findings,
                      torch_name=_torch_name(detector.module_scope), skipped_cells=list(source.skipped_cells))


def analyse_file(path: str) -> FileResult:
    from .source import read
    try:
        source = read(path)
    except (OSError, ValueError) as e:
        return FileResult(path, 0, [], parsed=False, error=f"unreadable: {e}")
    return analyse_source(source)


def analyse_text(text: str, path: str = "<text>") -> FileResult:
    return analyse_source(Source(path, text))
