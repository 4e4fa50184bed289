"""The report: the number first, then per file and per rule, then every
finding; as a terminal table, JSON, or SARIF 2.1.0 for code-scanning tools.

The number is the count of lines that tie the program to one vendor: a line
counts once however many findings it holds, and counts as fixable
automatically when ``--fix`` rewrites every finding on it, else as by hand.
Guarded findings (detect.py) are listed and not counted. Implicit ties (a
Triton kernel, a CUDA-only package, a checkpoint loaded without
``map_location``: code that ties without naming CUDA) count as tying lines
and are also counted as their own class: a line is implicit when every
finding on it is. Run-time findings
(redirect.py) add the lines that needed redirection and hold no static
finding; a static finding whose line was also redirected is marked as seen
at run time.
"""
from __future__ import annotations

import json
import os
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from .detect import FileResult, Finding
from .rules import RULES

TOOL = "torchneuron-lockin"
VERSION = "0.1.0"
SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"


@dataclass
class Report:
    files: list[FileResult]
    elapsed_s: float = 0.0
    runtime_findings: list[Finding] = field(default_factory=list)   # lines only the run found
    library_sites: list[dict] = field(default_factory=list)         # redirections inside libraries
    runtime_confirmed: set = field(default_factory=set)             # (path, cell, line) seen at run time too
    runtime_sites: list[dict] = field(default_factory=list)         # every record, as redirect.py made it

    # -- the counts ---------------------------------------------------------------------------

    def findings(self) -> list[Finding]:
        return [f for r in self.files for f in r.findings] + self.runtime_findings

    def counted(self) -> list[Finding]:
        return [f for f in self.findings() if not f.guarded]

    def line_fixability(self) -> dict[tuple, bool]:
        """(path, cell, line) -> True when every finding on the line is fixable."""
        lines: dict[tuple, bool] = {}
        for f in self.counted():
            key = (f.path, f.cell, f.line)
            lines[key] = lines.get(key, True) and f.fixable
        return lines

    def implicit_lines(self) -> set[tuple]:
        """(path, cell, line) of the counted lines whose every finding is an implicit tie."""
        explicit = {(f.path, f.cell, f.line) for f in self.counted() if not f.implicit}
        return {(f.path, f.cell, f.line) for f in self.counted() if f.implicit} - explicit

    def summary(self) -> dict:
        lines = self.line_fixability()
        fixable = sum(lines.values())
        implicit = len(self.implicit_lines())
        guarded_lines = {(f.path, f.cell, f.line) for f in self.findings() if f.guarded} - set(lines)
        analysed = sum(r.lines for r in self.files)
        return {"tying_lines": len(lines), "fixable_lines": fixable, "by_hand_lines": len(lines) - fixable,
                "explicit_lines": len(lines) - implicit, "implicit_lines": implicit,
                "findings": len(self.counted()), "guarded_lines": len(guarded_lines),
                "runtime_only_lines": len({(f.path, f.cell, f.line) for f in self.runtime_findings}),
                "files": len(self.files), "files_parsed": sum(r.parsed for r in self.files),
                "files_with_findings": len({k[0] for k in lines}),
                "lines_analysed": analysed, "elapsed_s": self.elapsed_s,
                "lines_per_second": analysed / self.elapsed_s if self.elapsed_s > 0 else None,
                "errors": sum(1 for r in self.files if r.error),
                "vendors": sorted({f.vendor for f in self.counted()})}

    def per_file(self) -> list[dict]:
        lines = self.line_fixability()
        by_file: dict[str, list[bool]] = defaultdict(list)
        for (path, _, _), ok in lines.items():
            by_file[path].append(ok)
        implicit = Counter(path for path, _, _ in self.implicit_lines())
        sizes = {r.path: r.lines for r in self.files}
        rows = [{"path": p, "lines": sizes.get(p), "tying_lines": len(v), "fixable_lines": sum(v),
                 "by_hand_lines": len(v) - sum(v), "implicit_lines": implicit[p]} for p, v in by_file.items()]
        return sorted(rows, key=lambda r: (-r["tying_lines"], r["path"]))

    def per_rule(self) -> list[dict]:
        findings = Counter(f.rule for f in self.counted())
        fixable = Counter(f.rule for f in self.counted() if f.fixable)
        lines = defaultdict(set)
        for f in self.counted():
            lines[f.rule].add((f.path, f.cell, f.line))
        return [{"rule": rid, "name": RULES[rid].name, "findings": findings[rid], "fixable": fixable[rid],
                 "lines": len(lines[rid]), "ties": RULES[rid].ties, "vendor": RULES[rid].vendor,
                 "implicit": RULES[rid].implicit}
                for rid in sorted(findings)]

    # -- run-time findings ----------------------------------------------------------------------

    def merge_runtime(self, sites: list[dict]) -> None:
        """Adds redirect.py's records: each is a dict with path, line, rule, what,
        the redirected value, and library_path/library_line when the redirected
        call was inside a library.

        A record on a line with a static finding confirms it. A device string
        redirected on another line is explained by the static findings when
        they hold that literal (``dev = "cuda"`` found, ``x.to(dev)`` redirected:
        the assignment is the line to change); only the others, built at run
        time or reached through a library, add lines."""
        static = {}
        literals = set()
        for r in self.files:
            for f in r.findings:
                static.setdefault((os.path.realpath(f.path), f.cell, f.line), f)
                if f.literal:
                    literals.add(f.literal)
        seen = set()
        for site in sites:
            self.runtime_sites.append(site)
            if site.get("path") is None:
                self.library_sites.append(site)
                continue
            key = (os.path.realpath(site["path"]), site.get("cell"), site["line"])
            if key in static:
                self.runtime_confirmed.add(key)
                continue
            value = site.get("value")
            if isinstance(value, str) and (value in literals or ("cuda:" in literals and value.startswith("cuda:"))):
                site["explained_by_static"] = True
                continue
            if key in seen:
                continue
            seen.add(key)
            rule = RULES[site["rule"]]
            via = f" (inside {site['library_path']}:{site['library_line']})" if site.get("library_path") else ""
            self.runtime_findings.append(Finding(
                site["path"], site["line"], 1, site["rule"], f"needed redirection at run time: {site['what']}{via}",
                rule.rewrite.replace("`", ""), False, rule.guard, cell=site.get("cell"), origin="runtime",
                snippet=site.get("snippet", "")))
        if self.library_sites:
            unique = {(s["library_path"], s["library_line"], s["what"]): s for s in self.library_sites}
            self.library_sites = list(unique.values())

    def finding_dicts(self) -> list[dict]:
        out = []
        for f in sorted(self.findings(), key=lambda f: (f.path, f.cell or 0, f.line, f.column)):
            d = f.to_dict()
            d["seen_at_runtime"] = f.origin == "runtime" or \
                (os.path.realpath(f.path), f.cell, f.line) in self.runtime_confirmed
            out.append(d)
        return out


# -- renderers ------------------------------------------------------------------------------------

def _where(f: dict) -> str:
    cell = f"[cell {f['cell']}]" if f.get("cell") else ""
    return f"{f['path']}{cell}:{f['line']}:{f['column']}"


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def headline(report: Report) -> str:
    s = report.summary()
    vendors = ", ".join(s["vendors"]) or "none"
    implicit = f" ({s['implicit_lines']} of them implicit ties, naming no CUDA)" if s["implicit_lines"] else ""
    return (f"{s['tying_lines']} lines tie this code to one vendor ({vendors}): "
            f"{s['fixable_lines']} fixable automatically, {s['by_hand_lines']} by hand{implicit}")


def render_table(report: Report, list_findings: bool = True) -> str:
    s = report.summary()
    out = [headline(report)]
    # a rate over a fraction of a second measures start-up costs, not the analysis
    rate = f", {s['lines_per_second']:,.0f} lines/s" if s["elapsed_s"] >= 0.5 else ""
    notes = [f"{_count(s['files'], 'file')}, {_count(s['lines_analysed'], 'line')} analysed in "
             f"{s['elapsed_s']:.2f} s{rate}"]
    if s["guarded_lines"]:
        notes.append(f"{_count(s['guarded_lines'], 'guarded line')} not counted")
    if s["runtime_only_lines"]:
        notes.append(f"{_count(s['runtime_only_lines'], 'line')} found only at run time")
    if s["errors"]:
        notes.append(f"{_count(s['errors'], 'file')} not parsed")
    out.append("  (" + "; ".join(notes) + ")")
    files = report.per_file()
    if files:
        width = max(len("file"), *(len(r["path"]) for r in files))
        out += ["", f"{'file':<{width}}  {'lines':>6}  {'fixable':>7}  {'by hand':>7}  {'implicit':>8}"]
        out += [f"{r['path']:<{width}}  {r['tying_lines']:>6}  {r['fixable_lines']:>7}  {r['by_hand_lines']:>7}  "
                f"{r['implicit_lines']:>8}" for r in files]
    rules = report.per_rule()
    if rules:
        out += ["", f"{'rule':<30}  {'lines':>6}  {'findings':>8}  {'fixable':>7}"]
        out += [f"{r['rule'] + ' ' + r['name']:<30}  {r['lines']:>6}  {r['findings']:>8}  {r['fixable']:>7}"
                + ("  implicit" if r["implicit"] else "") for r in rules]
    errors = [r for r in report.files if r.error]
    if errors:
        out += ["", "not parsed:"] + [f"  {r.path}: {r.error}" for r in errors]
    if list_findings and report.findings():
        out += ["", "findings (fix: --fix rewrites it; hand: see the guard; guarded: not counted; "
                    "implicit: ties without naming CUDA):"]
        for f in report.finding_dicts():
            mark = ("guarded" if f["guarded"] else "fix" if f["fixable"] else "hand") + \
                (" implicit" if f["implicit"] else "")
            run = " [run time]" if f["seen_at_runtime"] else ""
            out.append(f"  {_where(f)}  {f['rule']} {mark}{run}  {f['message']}")
            out.append(f"      {f['snippet']}")
            out.append(f"      -> {f['rewrite']}" if f["fixable"] else f"      -> {f['rewrite']}; guard: {f['guard']}")
    redirected = [x for x in report.runtime_sites if x.get("to")]
    if redirected:
        out += ["", "redirected at run time (what -> to; where):"]
        for x in redirected:
            where = f"{x['path']}:{x['line']}" if x.get("path") else \
                f"{x.get('library_path')}:{x.get('library_line')}"
            out.append(f"  {x['rule']}  {x['what']} -> {x['to']}  ({where})")
    if report.library_sites:
        out += ["", "redirected inside libraries (no line of the program on the stack):"]
        out += [f"  {s['library_path']}:{s['library_line']}  {s['rule']}  {s['what']}" for s in report.library_sites]
    return "\n".join(out) + "\n"


def render_json(report: Report) -> str:
    return json.dumps({"tool": TOOL, "version": VERSION, "summary": report.summary(), "files": report.per_file(),
                       "rules": report.per_rule(), "findings": report.finding_dicts(),
                       "library_sites": report.library_sites, "runtime_sites": report.runtime_sites,
                       "not_parsed": [{"path": r.path, "error": r.error} for r in report.files if r.error]},
                      indent=1) + "\n"


def render_sarif(report: Report, root: str | None = None) -> str:
    root = os.path.abspath(root or os.getcwd())
    rule_ids = sorted(RULES)
    rules = [{"id": rid, "name": RULES[rid].name,
              "shortDescription": {"text": RULES[rid].ties.replace("`", "")},
              "fullDescription": {"text": f"{RULES[rid].ties} ({RULES[rid].vendor}). "
                                          f"Device-neutral form: {RULES[rid].rewrite}.".replace("`", "")},
              "help": {"text": f"Rewrite: {RULES[rid].rewrite}. Otherwise: {RULES[rid].guard}.".replace("`", ""),
                       "markdown": f"Rewrite: {RULES[rid].rewrite}. Otherwise: {RULES[rid].guard}."},
              "defaultConfiguration": {"level": "warning"},
              "properties": {"vendor": RULES[rid].vendor, "fixable": RULES[rid].fixable,
                             "implicit": RULES[rid].implicit}}
             for rid in rule_ids]
    results = []
    for f in report.finding_dicts():
        path = os.path.abspath(f["path"])
        uri = os.path.relpath(path, root).replace(os.sep, "/") if path.startswith(root + os.sep) else \
            "file://" + path
        location = {"physicalLocation": {"artifactLocation": {"uri": uri}, "region": {
            "startLine": f["line"], "startColumn": f["column"], "snippet": {"text": f["snippet"]}}}}
        if not uri.startswith("file:"):
            location["physicalLocation"]["artifactLocation"]["uriBaseId"] = "SRCROOT"
        if f["cell"]:
            location["message"] = {"text": f"notebook cell {f['cell']}, line {f['line']}"}
        results.append({"ruleId": f["rule"], "ruleIndex": rule_ids.index(f["rule"]),
                        "level": "note" if f["guarded"] else "warning",
                        "message": {"text": f"{f['message']}. Device-neutral: {f['rewrite']}"
                                    + ("" if f["fixable"] else f". By hand: {f['guard']}")},
                        "locations": [location],
                        "properties": {"fixable": f["fixable"], "guarded": f["guarded"], "implicit": f["implicit"],
                                       "cell": f["cell"],
                                       "origin": f["origin"], "seenAtRuntime": f["seen_at_runtime"]}})
    s = report.summary()
    run = {"tool": {"driver": {"name": TOOL, "version": VERSION, "informationUri": "https://pytorch.org/docs/stable/"
                                                                                   "accelerator.html",
                               "rules": rules}},
           "originalUriBaseIds": {"SRCROOT": {"uri": "file://" + root.rstrip("/") + "/"}},
           "results": results,
           "properties": {"tyingLines": s["tying_lines"], "fixableLines": s["fixable_lines"],
                          "byHandLines": s["by_hand_lines"], "implicitLines": s["implicit_lines"],
                          "linesAnalysed": s["lines_analysed"]}}
    return json.dumps({"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": [run]}, indent=1) + "\n"


RENDERERS = {"table": render_table, "json": render_json, "sarif": render_sarif}


# -- --ci ----------------------------------------------------------------------------------------

def ci_failures(report: Report, max_lines: int | None, baseline: dict | None) -> list[str]:
    """Why ``--ci`` fails: above the threshold, or above the baseline (a JSON report) in total or in a file."""
    s = report.summary()
    why = []
    if max_lines is not None and s["tying_lines"] > max_lines:
        why.append(f"{s['tying_lines']} tying lines, above the threshold of {max_lines}")
    if baseline is not None:
        before = baseline["summary"]["tying_lines"]
        if s["tying_lines"] > before:
            why.append(f"{s['tying_lines']} tying lines, above the baseline's {before}")
        old = {r["path"]: r["tying_lines"] for r in baseline.get("files", [])}
        for r in report.per_file():
            if r["tying_lines"] > old.get(r["path"], 0):
                why.append(f"{r['path']}: {r['tying_lines']} tying lines, baseline {old.get(r['path'], 0)}")
    return why
