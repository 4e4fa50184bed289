"""Parsing and name resolution: what a name or an attribute chain stands for.

The analyser parses with Python's own parser (``ast``), which is several
times faster than LibCST's; LibCST parses only the files ``--fix`` rewrites
(fixer.py), where keeping comments and formatting matters. Positions agree
between the two (both exclude a node's own parentheses); ``ast`` counts
columns in UTF-8 bytes, :func:`char_column` turns them into characters.

Resolution is per scope, in statement order, as the detector walks the
module: an import binds a name to a qualified name (``import torch.cuda as
tc`` binds ``tc`` to ``torch.cuda``; ``from torch import cuda`` binds
``cuda``), an assignment of a name or attribute chain binds an alias
(``c = torch.cuda``), an assignment of anything else binds the value so a
later use can follow it to its literal (``dev = "cuda"``, ``dm = {"": 0}``),
and parameters, loop targets and other bindings shadow a name with an
unknown value. A name is looked up in its own scope, then in the enclosing
function scopes and the module (class scopes are not visible from methods,
as in Python); the latest binding seen wins.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field


@dataclass(eq=False)
class Binding:
    """What a name is bound to: a qualified name, a value, or nothing known."""
    name: str
    line: int
    qualname: str | None = None     # "torch.cuda" for an import or an alias
    value: ast.AST | None = None    # the assigned expression, to follow to a literal
    import_node: ast.AST | None = None   # the Import/ImportFrom statement that made it
    uses: list = field(default_factory=list)   # the findings whose resolution went through it


class Scope:
    def __init__(self, kind: str, parent: Scope | None = None):
        self.kind = kind            # "module", "function" or "class"
        self.parent = parent
        self.bindings: dict[str, Binding] = {}

    def bind(self, binding: Binding) -> None:
        self.bindings[binding.name] = binding

    def bind_unknown(self, name: str, line: int) -> None:
        self.bindings[name] = Binding(name, line)

    def lookup(self, name: str) -> Binding | None:
        scope, own = self, True
        while scope is not None:
            if own or scope.kind != "class":
                b = scope.bindings.get(name)
                if b is not None:
                    return b
            scope, own = scope.parent, False
        return None

    def module(self) -> Scope:
        scope = self
        while scope.parent is not None:
            scope = scope.parent
        return scope


def parse(text: str, path: str) -> ast.Module:
    return ast.parse(text, filename=path, type_comments=False)


def qualname(node: ast.AST, scope: Scope) -> tuple[str | None, Binding | None]:
    """The qualified name an expression stands for (``"torch.cuda.synchronize"``)
    and the binding of its first name; (None, None) for anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None, None
    b = scope.lookup(node.id)
    if b is None or b.qualname is None:
        return None, b
    parts.append(b.qualname)
    return ".".join(reversed(parts)), b


def follow(node: ast.AST, scope: Scope, depth: int = 4) -> ast.AST:
    """The literal a name stands for, through simple assignments (``dev = "cuda"``);
    the node itself when it is not a name with a known value."""
    while depth and isinstance(node, ast.Name):
        b = scope.lookup(node.id)
        if b is None or b.value is None:
            break
        node, depth = b.value, depth - 1
    return node


def bind_import(stmt: ast.Import | ast.ImportFrom, scope: Scope) -> list[Binding]:
    made = []
    if isinstance(stmt, ast.Import):
        for alias in stmt.names:
            if alias.asname:
                b = Binding(alias.asname, stmt.lineno, qualname=alias.name, import_node=stmt)
            else:
                root = alias.name.split(".")[0]
                b = Binding(root, stmt.lineno, qualname=root, import_node=stmt)
            scope.bind(b)
            made.append(b)
    else:
        module = stmt.module or ""
        for alias in stmt.names:
            if alias.name == "*":
                continue
            local = alias.asname or alias.name
            b = Binding(local, stmt.lineno, qualname=None if stmt.level else f"{module}.{alias.name}",
                        import_node=stmt)
            scope.bind(b)
            made.append(b)
    return made


def bind_assign(targets: list[ast.AST], value: ast.AST | None, scope: Scope, line: int) -> None:
    for target in targets:
        if isinstance(target, ast.Name):
            if value is None:
                scope.bind_unknown(target.id, line)
                continue
            q, _ = qualname(value, scope) if isinstance(value, (ast.Name, ast.Attribute)) else (None, None)
            scope.bind(Binding(target.id, line, qualname=q, value=None if q else value))
        else:
            for name in target_names(target):
                scope.bind_unknown(name, line)


def target_names(target: ast.AST) -> list[str]:
    """Names bound by an assignment target, a loop target or a with-item."""
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for elt in target.elts for n in target_names(elt)]
    if isinstance(target, ast.Starred):
        return target_names(target.value)
    return []


def bind_parameters(args: ast.arguments, scope: Scope, line: int) -> None:
    for a in args.posonlyargs + args.args + args.kwonlyargs:
        scope.bind_unknown(a.arg, line)
    for a in (args.vararg, args.kwarg):
        if a is not None:
            scope.bind_unknown(a.arg, line)


class Lines:
    """A text's lines, for byte-to-character columns and for line spans."""

    def __init__(self, text: str):
        self.lines = text.split("\n")

    def char_column(self, line: int, byte_col: int) -> int:
        text = self.lines[line - 1] if 0 < line <= len(self.lines) else ""
        if text.isascii():
            return byte_col
        return len(text.encode("utf-8")[:byte_col].decode("utf-8", errors="ignore"))

    def span(self, node: ast.AST) -> tuple[int, int, int, int]:
        """(line, column, end line, end column), columns in characters, from 0."""
        return (node.lineno, self.char_column(node.lineno, node.col_offset),
                node.end_lineno, self.char_column(node.end_lineno, node.end_col_offset))
