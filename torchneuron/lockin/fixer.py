"""``--fix`` and ``--diff``: rewrites every fixable finding with LibCST, which
keeps everything else of the file (comments, blank lines, quotes, layout) as
it was.

Each finding's :class:`~torchneuron.lockin.detect.FixSpec` names a node by
its kind and position; the transformer finds the node by the same position
(LibCST's PositionProvider) and rewrites it. ``{torch}`` in a rewrite is the
module's own name for torch; when the module has none (``import torch.cuda as
tc`` only, or ``from torch import nn``), ``import torch`` is added after the
docstring and the ``__future__`` imports.
"""
from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from .detect import FileResult, FixSpec, analyse_source
from .notebook_text import rewrite_cells
from .source import Source, cell_source, read, split_cells

#: the accelerator's device type, "cpu" on a machine without one (where
#: ``current_accelerator()`` is None, or names a device that is not there): a
#: device built from it runs where the original's CPU branch ran
ACCELERATOR_TYPE = ('{torch}.accelerator.current_accelerator().type if {torch}.accelerator.is_available() '
                    'else {q}cpu{q}')
#: the same for a comparison with a device's type: None where there is no accelerator, so
#: ``x.device.type == ...`` stays False for a CPU tensor, as ``x.is_cuda`` and ``== "cuda"`` were
ACCELERATOR_TYPE_OR_NONE = '{torch}.accelerator.current_accelerator().type if {torch}.accelerator.is_available() else None'
AVAILABLE = "{torch}.accelerator.is_available()"
#: the accelerator's type where the code runs only with one (under ``if torch.cuda.is_available():``,
#: ``x if x.is_cuda else ...``): the test already says what the fallback would
ACCELERATOR_TYPE_THERE = "{torch}.accelerator.current_accelerator().type"
#: parents under which a conditional expression needs no parentheses
_NO_PARENS = (cst.Arg, cst.Assign, cst.AnnAssign, cst.Param, cst.Return, cst.Element, cst.DictElement,
              cst.FormattedStringExpression, cst.Expr, cst.Index)
#: torch.cuda.amp.autocast's positional parameters, which torch.autocast takes by keyword
_AUTOCAST_POSITIONAL = ("enabled", "dtype", "cache_enabled")


@dataclass
class FixResult:
    path: str
    original: str
    fixed: str
    applied: int = 0
    not_applied: list[FixSpec] = field(default_factory=list)   # a node the rewriter did not find

    @property
    def changed(self) -> bool:
        return self.original != self.fixed


def _key(node_type: str, r) -> tuple:
    return node_type, (r.start.line, r.start.column, r.end.line, r.end.column)


def _quote(string: cst.SimpleString) -> tuple[str, str]:
    """(prefix, quote) of a string literal."""
    value = string.value
    i = 0
    while value[i] not in "'\"":
        i += 1
    quote = value[i:i + 3] if value[i:i + 3] in ('"""', "'''") else value[i]
    return value[:i], quote


class _Rewriter(cst.CSTTransformer):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, specs: list[FixSpec], torch_name: str):
        super().__init__()
        self.specs = {(s.node_type, s.span): s for s in specs}
        self.torch = torch_name
        self.applied: set[int] = set()
        self.names_torch = False   # whether a rewrite refers to torch
        self.stack: list[cst.CSTNode] = []   # the nodes being visited, for a rewrite's parent
        self.available = False   # the rewrite being made is under a test that a device is there

    def code(self, template: str, quote: str = '"') -> cst.BaseExpression:
        self.names_torch = self.names_torch or "{torch}" in template
        return cst.parse_expression(template.format(torch=self.torch, q=quote))

    def text(self, template: str, quote: str = '"') -> str:
        self.names_torch = self.names_torch or "{torch}" in template
        return template.format(torch=self.torch, q=quote)

    def parent(self) -> cst.CSTNode | None:
        return self.stack[-1] if self.stack else None

    def parenthesized(self, expr: cst.BaseExpression, node: cst.CSTNode) -> cst.BaseExpression:
        """``expr`` (a conditional) in place of ``node``: in parentheses unless where it
        stands (an argument, an assigned value, an element) needs none."""
        if getattr(node, "lpar", None):
            return expr.with_changes(lpar=node.lpar, rpar=node.rpar)
        if isinstance(self.parent(), _NO_PARENS):
            return expr
        return expr.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])

    def type_template(self, compare: bool = False) -> str:
        if self.available:
            return ACCELERATOR_TYPE_THERE
        return ACCELERATOR_TYPE_OR_NONE if compare else ACCELERATOR_TYPE

    def accelerator_type(self, node: cst.CSTNode | None = None, compare: bool = False) -> cst.BaseExpression:
        expr = self.code(self.type_template(compare))
        if self.available:
            return expr.with_changes(lpar=node.lpar, rpar=node.rpar) if node is not None else expr
        return self.parenthesized(expr, node) if node is not None else expr

    def spec_of(self, node: cst.CSTNode) -> FixSpec | None:
        if not self.specs:
            return None
        r = self.get_metadata(PositionProvider, node, None)
        if r is None:
            return None
        return self.specs.get(_key(type(node).__name__, r))

    def done(self, spec: FixSpec) -> None:
        self.applied.add(id(spec))

    def on_visit(self, node) -> bool:
        self.stack.append(node)
        return True

    def on_leave(self, original, updated):
        self.stack.pop()
        spec = self.spec_of(original)
        if spec is not None and spec.kind != "drop_arg":
            self.available = spec.params.get("available", False)
            new = getattr(self, "fix_" + spec.kind)(updated, spec)
            self.done(spec)
            updated = new
        if isinstance(original, cst.Call) and isinstance(updated, cst.Call):
            updated = self.drop_args(original, updated)
        if isinstance(updated, cst.SimpleStatementLine):
            updated = self.guarded_statement(original, updated)
        return updated

    @staticmethod
    def guarded_statement(original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine):
        """A call made a statement of its own, rewritten to ``call if available else None``
        (fix_call_replace), reads as the ``if`` statement it means."""
        if len(updated.body) != 1 or not isinstance(updated.body[0], cst.Expr):
            return updated
        expr, before = updated.body[0].value, original.body[0].value
        if (not isinstance(expr, cst.IfExp) or isinstance(before, cst.IfExp)
                or not (isinstance(expr.orelse, cst.Name) and expr.orelse.value == "None")):
            return updated
        call = cst.SimpleStatementLine(body=[cst.Expr(expr.body)], trailing_whitespace=updated.trailing_whitespace)
        return cst.If(test=expr.test.with_changes(lpar=[], rpar=[]), body=cst.IndentedBlock(body=[call]),
                      leading_lines=updated.leading_lines)

    # -- the rewrites, one per FixSpec kind ----------------------------------------------------

    def fix_replace(self, node, spec):
        return self.code(spec.params["code"]).with_changes(lpar=node.lpar, rpar=node.rpar)

    def fix_call_replace(self, node: cst.Call, spec):
        args = list(node.args)
        if spec.params.get("positional"):   # torch.accelerator's functions take no keywords
            args = [a.with_changes(keyword=None, equal=cst.MaybeSentinel.DEFAULT) for a in args]
        call = node.with_changes(func=self.code(spec.params["code"]), args=args)
        cpu_value = spec.params.get("cpu_value")
        if cpu_value is None or self.available:
            return call
        # torch.cuda's call was a no-op (or a constant) without CUDA; the neutral one raises
        # without an accelerator: call it only where there is one
        expr = cst.IfExp(test=self.code(AVAILABLE), body=call.with_changes(lpar=[], rpar=[]),
                         orelse=cst.parse_expression(cpu_value))
        return self.parenthesized(expr, node)

    def fix_device_string(self, node: cst.SimpleString, spec):
        value = node.evaluated_value
        template = self.type_template(spec.params.get("compare", False))
        if value == "cuda":
            return self.accelerator_type(node, spec.params.get("compare", False))
        prefix, quote = _quote(node)
        rest = value[len("cuda"):].replace("{", "{{").replace("}", "}}")
        inner = "'" if '"' in quote else '"'
        text = f"f{quote}{{{self.text(template, inner)}}}{rest}{quote}"
        return cst.parse_expression(text).with_changes(lpar=node.lpar, rpar=node.rpar)

    def fix_device_in(self, node: cst.Comparison, spec):
        """``"cuda" in device`` -> ``torch.accelerator.is_available() and <its type> in device``."""
        test = cst.Comparison(left=self.code(ACCELERATOR_TYPE_THERE), comparisons=[
            cst.ComparisonTarget(operator=cst.In(), comparator=node.comparisons[0].comparator)])
        if not self.available:
            test = cst.BooleanOperation(left=self.code(AVAILABLE), operator=cst.And(), right=test)
        if spec.params.get("negate"):
            test = cst.UnaryOperation(operator=cst.Not(), expression=test.with_changes(
                lpar=[cst.LeftParen()], rpar=[cst.RightParen()]) if not self.available else test)
        if isinstance(test, cst.Comparison) and not node.lpar:
            return test
        return self.parenthesized(test, node)

    def fix_device_fstring(self, node: cst.FormattedString, spec):
        first = node.parts[0]
        rest = first.value[len("cuda"):]
        inner = "'" if '"' in node.end else '"'
        head = [cst.FormattedStringExpression(expression=self.code(self.type_template(), inner))]
        if rest:
            head.append(cst.FormattedStringText(rest))
        return node.with_changes(parts=[*head, *node.parts[1:]])

    def fix_is_cuda(self, node: cst.Attribute, spec):
        left = cst.Attribute(value=cst.Attribute(value=node.value, attr=cst.Name("device")), attr=cst.Name("type"))
        right = self.code(self.type_template(compare=True))
        if not self.available:
            right = right.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        comparison = cst.Comparison(left=left, comparisons=[cst.ComparisonTarget(
            operator=cst.Equal(), comparator=right)])
        if spec.params.get("paren"):
            comparison = comparison.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        return comparison.with_changes(lpar=[*comparison.lpar, *node.lpar], rpar=[*node.rpar, *comparison.rpar])

    def fix_cuda_method(self, node: cst.Call, spec):
        func = node.func.with_changes(attr=cst.Name("to"))
        args = list(node.args)
        device_at = next((i for i, a in enumerate(args) if a.keyword is None or a.keyword.value == "device"), None)
        if device_at is None:
            comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")) if args else cst.MaybeSentinel.DEFAULT
            args.insert(0, cst.Arg(self.accelerator_type(), comma=comma))
        # .cuda(d): an index, a torch.device or a device string; since PyTorch 2.5 ``.to(d)``
        # takes an index as one of the current accelerator's devices, and the others as they are
        return node.with_changes(func=func, args=args)

    def enabled_guard(self, node: cst.Call, at: int | None = None) -> cst.Call:
        """``node`` (autocast or a GradScaler) enabled only where there is an accelerator, as
        torch.cuda's disabled themselves without CUDA; ``at``: the positional index of ``enabled``."""
        if self.available:
            return node
        args = list(node.args)
        i = next((i for i, a in enumerate(args) if a.keyword is not None and a.keyword.value == "enabled"), None)
        if i is None and at is not None and len(args) > at and all(a.keyword is None for a in args[:at + 1]):
            i = at
        if i is not None:
            value = args[i].value
            if isinstance(value, (cst.IfExp, cst.BooleanOperation, cst.Lambda, cst.NamedExpr)) and not value.lpar:
                value = value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
            guarded = cst.BooleanOperation(left=self.code(AVAILABLE), operator=cst.And(), right=value)
            args[i] = args[i].with_changes(value=guarded)
            return node.with_changes(args=args)
        if args:
            args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        args.append(cst.Arg(self.code(AVAILABLE), keyword=cst.Name("enabled"), equal=_equal()))
        return node.with_changes(args=args)

    def fix_amp_enabled(self, node: cst.Call, spec):
        return self.enabled_guard(node, spec.params.get("at"))

    def fix_amp_autocast(self, node: cst.Call, spec):
        converted = []
        for i, a in enumerate(node.args):
            if a.keyword is None and a.star == "" and i < len(_AUTOCAST_POSITIONAL):
                a = a.with_changes(keyword=cst.Name(_AUTOCAST_POSITIONAL[i]), equal=_equal())
            converted.append(a)
        comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
        head = [cst.Arg(self.accelerator_type(), keyword=cst.Name("device_type"), equal=_equal(),
                        comma=comma)]
        if not any(a.keyword is not None and a.keyword.value == "dtype" for a in converted):
            # torch.cuda.amp.autocast's default; torch.autocast's would be the device's own
            head.append(cst.Arg(self.code("{torch}.float16"), keyword=cst.Name("dtype"), equal=_equal(),
                                comma=comma))
        if not converted:
            head[-1] = head[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        call = node.with_changes(func=self.code("{torch}.autocast"), args=[*head, *converted])
        return self.enabled_guard(call)

    def fix_amp_grad_scaler(self, node: cst.Call, spec):
        return self.fix_grad_scaler_device(node.with_changes(func=self.code("{torch}.amp.GradScaler")), spec)

    def fix_grad_scaler_device(self, node: cst.Call, spec):
        comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")) if node.args else cst.MaybeSentinel.DEFAULT
        call = node.with_changes(args=[cst.Arg(self.accelerator_type(), comma=comma), *node.args])
        # torch.amp.GradScaler(device, init_scale, growth_factor, backoff_factor, growth_interval, enabled)
        return self.enabled_guard(call, 5)

    def fix_amp_custom_decorator(self, node, spec):
        func = self.code("{torch}.amp." + spec.params["member"])
        device_type = cst.Arg(self.accelerator_type(), keyword=cst.Name("device_type"), equal=_equal())
        if isinstance(node, cst.Call):
            args = list(node.args)
            if args:
                args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
            return node.with_changes(func=func, args=[*args, device_type])
        return cst.Call(func=func, args=[device_type])

    def fix_int_device(self, node: cst.Integer, spec):
        return self.code("{torch}.device(" + self.type_template() + ", " + node.value + ")")

    def fix_string_value(self, node: cst.SimpleString, spec):
        prefix, quote = _quote(node)
        return node.with_changes(value=f"{prefix}{quote}{spec.params['value']}{quote}")

    def fix_matmul_precision(self, node: cst.Assign, spec):
        return cst.Expr(self.code('{torch}.set_float32_matmul_precision("' + spec.params["precision"] + '")'))

    def fix_import_remove(self, node, spec):
        drop = set(spec.params["names"])
        if isinstance(node, cst.Import):
            aliases, has_torch = [], any(_dotted(a.name) == "torch" and a.asname is None for a in node.names)
            for a in node.names:
                name = _dotted(a.name)
                if name in spec.params["modules"]:
                    if a.asname is not None or has_torch:
                        continue
                    a, has_torch = a.with_changes(name=cst.Name("torch")), True
                aliases.append(a)
        else:
            aliases = [a for a in node.names if _local(a) not in drop]
        if not aliases:
            return cst.RemoveFromParent()
        aliases[-1] = aliases[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return node.with_changes(names=aliases)

    def drop_args(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        dropped = set()
        for i, a in enumerate(original.args):
            for n in (a, a.value):
                spec = self.spec_of(n)
                if spec is not None and spec.kind == "drop_arg":
                    dropped.add(i)
                    self.done(spec)
        if not dropped:
            return updated
        args = [a for i, a in enumerate(updated.args) if i not in dropped]
        if args and original.args[-1].comma is cst.MaybeSentinel.DEFAULT:
            args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return updated.with_changes(args=args)


def _equal() -> cst.AssignEqual:
    return cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))


def _dotted(node: cst.BaseExpression) -> str:
    if isinstance(node, cst.Name):
        return node.value
    return _dotted(node.value) + "." + node.attr.value


def _local(alias: cst.ImportAlias) -> str:
    if alias.asname is not None:
        return alias.asname.name.value
    return _dotted(alias.name).split(".")[0]


def _with_torch_import(module: cst.Module) -> cst.Module:
    """``import torch`` after the docstring and ``__future__`` imports."""
    body = list(module.body)
    at = 0
    while at < len(body):
        stmt = body[at]
        first = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) and stmt.body else None
        is_docstring = at == 0 and isinstance(first, cst.Expr) and isinstance(first.value, cst.SimpleString)
        is_future = isinstance(first, cst.ImportFrom) and isinstance(first.module, cst.Name) and \
            first.module.value == "__future__"
        if not (is_docstring or is_future):
            break
        at += 1
    body.insert(at, cst.parse_statement("import torch\n"))
    return module.with_changes(body=body)


def fix_text(text: str, result: FileResult, path: str = "<text>") -> FixResult:
    """``text`` with every fixable finding of ``result`` rewritten."""
    specs = [f.fix for f in result.findings if f.fixable and f.fix is not None]
    specs += [also for s in specs for also in s.params.get("also", ())]   # a second node the rewrite changes
    if not specs:
        return FixResult(path, text, text)
    torch_name = result.torch_name or "torch"
    wrapper = MetadataWrapper(cst.parse_module(text))
    rewriter = _Rewriter(specs, torch_name)
    module = wrapper.visit(rewriter)
    if result.torch_name is None and rewriter.names_torch:
        module = _with_torch_import(module)
    not_applied = [s for s in specs if id(s) not in rewriter.applied]
    return FixResult(path, text, module.code, len(specs) - len(not_applied), not_applied)


def fix_source(source: Source, result: FileResult) -> FixResult:
    return fix_text(source.text, result, source.path)


def notebook_with_cells(source: Source, fixed_text: str) -> dict:
    """The notebook's JSON with its code cells' sources taken from ``fixed_text``
    (a list of lines where the notebook had one)."""
    import copy

    cells = split_cells(source, fixed_text)
    notebook = copy.deepcopy(source.notebook)
    added = cells.pop(0, "")
    first_code = True
    for index, cell in enumerate(notebook["cells"], start=1):
        if cell.get("cell_type") != "code" or index in source.skipped_cells:
            continue
        text = cells.get(index, cell_source(cell))
        if first_code and added.strip():
            text = added + "\n" + text
        first_code = False
        cell["source"] = text.splitlines(keepends=True) if isinstance(cell.get("source"), list) else text
    return notebook


def fix_path(path: str, write: bool) -> tuple[FixResult, FileResult]:
    """Rewrites one file (``write``: in place); returns the rewrite and the analysis it came from."""
    source = read(path)
    original_text = _file_text(path)
    result = analyse_source(source)
    fixed = fix_source(source, result)
    if source.is_notebook:
        new_text = original_text
        if fixed.changed:
            cells = notebook_with_cells(source, fixed.fixed)["cells"]
            changed = {i: cell_source(c) for i, (c, before) in enumerate(zip(cells, source.notebook["cells"]), start=1)
                       if cell_source(c) != cell_source(before)}
            new_text = rewrite_cells(original_text, changed)
    else:
        new_text = fixed.fixed
    out = FixResult(path, original_text, new_text, fixed.applied, fixed.not_applied)
    if write and out.changed:
        with open(path, "w", encoding="utf-8") as f:
            f.write(new_text)
    return out, result


def _file_text(path: str) -> str:
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        return f.read()


def unified_diff(fix: FixResult) -> str:
    name = os.path.relpath(fix.path) if os.path.isabs(fix.path) else fix.path
    lines = difflib.unified_diff(fix.original.splitlines(keepends=True), fix.fixed.splitlines(keepends=True),
                                 fromfile=f"a/{name}", tofile=f"b/{name}")
    # a last line without a newline (Colab's notebooks end so) is marked as diff marks it
    return "".join(ln if ln.endswith("\n") else ln + "\n\\ No newline at end of file\n" for ln in lines)
