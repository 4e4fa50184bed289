"""Shrinks a failing program to statements that still fail the same way.

Delta debugging over the statement list (inputs are statements too): drop
chunks while the program still shows a mismatch of the class it showed first,
then single statements until none can go. A removed statement whose names a
later one uses makes that one raise NameError on both devices alike, so the
search removes it too or keeps what it needs.
"""
from __future__ import annotations

from . import runner
from .generator import Program


def first_kind(mismatches) -> str | None:
    return mismatches[0].kind if mismatches else None


def minimise(program: Program, kind: str | None = None, budget: int = 400) -> tuple[Program, list]:
    """The smallest program found (within `budget` runs) that still has a mismatch of `kind`
    (by default the first one `program` has), and its mismatches."""
    found = runner.check(program)
    kind = kind or first_kind(found)
    if kind is None:
        return program, found
    runs = 0

    def fails(statements):
        nonlocal runs
        runs += 1
        try:
            m = runner.check(program.with_statements(statements))
        except Exception:  # noqa: BLE001 - a candidate that breaks the runner does not reproduce
            return None
        return m if any(x.kind == kind for x in m) else None

    items, best = list(program.statements), found
    n = 2
    while len(items) >= 2 and runs < budget:
        size = -(-len(items) // n)
        reduced = False
        for start in range(0, len(items), size):
            rest = items[:start] + items[start + size:]
            m = fails(rest) if rest else None
            if m:
                items, best, n, reduced = rest, m, max(n - 1, 2), True
                break
        if not reduced:
            if n >= len(items):
                break
            n = min(len(items), 2 * n)
    i = 0
    while i < len(items) and runs < budget:  # one at a time, until none can go
        rest = items[:i] + items[i + 1:]
        m = fails(rest) if rest else None
        if m:
            items, best = rest, m
        else:
            i += 1
    return program.with_statements(items), best


def report(program: Program, mismatches, original: Program | None = None) -> str:
    """A failure as a human reads it: seed, path, mismatches, and the program to paste."""
    lines = [f"fuzz program: path {program.path}, seed {program.seed}"
             + (f" ({len(original.statements)} statements, minimised to {len(program.statements)})" if original else ""),
             f"rerun: python -m tests.fuzz --path {program.path} --seed {program.seed}"]
    lines += [f"  {m}" for m in mismatches[:8]]
    if len(mismatches) > 8:
        lines.append(f"  ... and {len(mismatches) - 8} more")
    lines.append("# --- the program (run it with dev = 'cpu' too, and compare) ---")
    src = program.source()
    if program.path == "compiled":
        inputs, body = runner.function_source(program)
        src = program.header() + "".join(st.code + "\n" for st in inputs) + body + (
            "print(torch.compile(fuzz_program, backend='neuron')("
            + ", ".join(w for st in inputs for w in st.writes) + "))\n")
    lines.append(src)
    return "\n".join(lines)
