"""The labelled corpus: tests/lockin/corpus/labelled/ (five programs the run
tests train) and corpus/patterns/ (small programs written here, each
reproducing the CUDA patterns of one public project's scripts or notebooks:
nanoGPT, minGPT, pytorch/examples, transformers examples, DiT, x-transformers,
modded-nanogpt, llama, gpt-fast, QLoRA, yolov5, Colab and Jupyter notebooks).
Every tying line is marked ``# ties: RULE`` when it names CUDA, ``# ties-implicit:
RULE`` when it ties without (a Triton kernel, a checkpoint loaded without
map_location). Here: recall and precision of the analysis, the implicit class,
and the share of fixed programs that run where the original ran (CPU-only,
neuron, the CUDA stand-in: test_lockin_settings.py's runs), against the bars
and the figures docs/lockin.md shows; the device-neutral corpus
and the project's own examples and benchmarks: no finding; --fix on the
corpus: the code parses, keeps its comments, and only by-hand lines remain."""
import ast
import json
import os
import shutil

import pytest

from torchneuron.lockin import analyse_file
from torchneuron.lockin.fixer import fix_path
from torchneuron.lockin.source import read_notebook

from lockin_testing import (LABELLED, NEUTRAL, PATTERNS, ROOT, SETTINGS, SETTINGS_DIR, check_run, comments,
                            corpus_files, labels, marked_lines, setting_runs)

#: the project's bars
EXPLICIT_RECALL_MIN, RECALL_MIN, PRECISION_MIN = 0.99, 0.90, 0.99
CORPUS_FILES = corpus_files(LABELLED) + corpus_files(PATTERNS)
#: the projects corpus/patterns/ reproduces, by the file that does it
PROJECTS = {"nanogpt_train.py": "nanoGPT", "nanogpt_sample.py": "nanoGPT", "mingpt_trainer.py": "minGPT",
            "examples_mnist.py": "pytorch/examples", "examples_imagenet.py": "pytorch/examples",
            "examples_dcgan.py": "pytorch/examples", "ddp_tutorial.py": "pytorch/examples",
            "hf_examples_trainer.py": "transformers examples", "dit_train.py": "DiT",
            "xtransformers_attend.py": "x-transformers", "modded_nanogpt.py": "modded-nanogpt",
            "llama_generation.py": "llama", "gpt_fast_generate.py": "gpt-fast", "qlora_finetune.py": "qlora",
            "yolov5_utils.py": "yolov5", "colab_classifier.ipynb": "notebooks", "jupyter_matmul.ipynb": "notebooks"}


def _found(path):
    return {(f.cell, f.line): f for f in analyse_file(path).findings if not f.guarded}


def _rules_by_line(path):
    out = {}
    for f in analyse_file(path).findings:
        if not f.guarded:
            out.setdefault((f.cell, f.line), set()).add(f.rule)
    return out


@pytest.fixture(scope="module")
def labelled():
    return {os.path.basename(p): (marked_lines(p), _rules_by_line(p)) for p in CORPUS_FILES}


def test_corpus_has_the_styles_and_the_projects(labelled):
    assert sorted(os.path.basename(p) for p in corpus_files(LABELLED)) == [
        "amp_loop.py", "classic_train.py", "ddp_launcher.py", "explore.ipynb", "hf_finetune.py"]
    assert sorted(os.path.basename(p) for p in corpus_files(PATTERNS)) == sorted(PROJECTS)
    assert len(set(PROJECTS.values())) == 12
    assert all(marked for marked, _ in labelled.values())


def corpus_figures() -> dict:
    """Recall over the lines that name CUDA and over all tying lines, precision, the
    implicit class, and the fixed programs' runs (filled in by the run test)."""
    marked, found = {}, {}
    for p in CORPUS_FILES:
        name = os.path.basename(p)
        marked.update({(name, *where): implicit for where, (_, implicit) in labels(p).items()})
        for f in analyse_file(p).findings:
            if not f.guarded:
                key = (name, f.cell, f.line)
                found[key] = found.get(key, True) and f.implicit
    explicit = {k for k, implicit in marked.items() if not implicit}
    return {"files": len(CORPUS_FILES), "lines": sum(analyse_file(p).lines for p in CORPUS_FILES),
            "marked": len(marked), "explicit": len(explicit), "implicit": len(marked) - len(explicit),
            "explicit_hit": len(explicit & set(found)), "hit": len(set(marked) & set(found)),
            "found": len(found), "right": len(set(found) & set(marked)),
            "class_right": sum(found[k] == marked[k] for k in set(found) & set(marked)),
            "missed": sorted(set(marked) - set(found), key=str), "wrong": sorted(set(found) - set(marked), key=str)}


def test_recall_precision_and_the_implicit_class():
    f = corpus_figures()
    explicit_recall, recall, precision = f["explicit_hit"] / f["explicit"], f["hit"] / f["marked"], \
        f["right"] / f["found"]
    print(f"explicit recall {f['explicit_hit']}/{f['explicit']}, with implicit {f['hit']}/{f['marked']}, "
          f"precision {f['right']}/{f['found']}; missed {f['missed']}; not ties {f['wrong']}")
    assert explicit_recall >= EXPLICIT_RECALL_MIN and recall >= RECALL_MIN and precision >= PRECISION_MIN
    assert f["implicit"] >= 10, "the corpus holds implicit ties of each kind"
    # each found line is in the class its label says (explicit: it names CUDA)
    assert f["class_right"] == f["right"]


def test_every_finding_is_on_a_marked_line_with_its_rules(labelled):
    for name, (marked, found) in labelled.items():
        assert set(found) <= set(marked), (name, sorted(set(found) - set(marked)))
        for where, rules in found.items():
            assert rules == marked[where], (name, where, rules, marked[where])


def test_rules_the_corpus_covers(labelled):
    covered = {r for _, (_, found) in labelled.items() for rules in found.values() for r in rules}
    assert len(covered) >= 24, sorted(covered)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return setting_runs(tmp_path_factory.getbasetemp() / "setting_runs")[0]


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("name", sorted(PROJECTS))
def test_fixed_pattern_program_runs_where_the_original_ran(runs, setting, name):
    check_run(runs, setting, name)


def run_figures(runs) -> dict:
    """Per setting: (the programs whose original ran, those of them whose fixed program ran)."""
    names = [os.path.basename(p) for p in corpus_files(SETTINGS_DIR) + corpus_files(PATTERNS)]
    out = {}
    for setting in SETTINGS:
        ran = [n for n in names if runs[setting][n]["original"]["exit"] == 0]
        out[setting] = (len(ran), sum(runs[setting][n]["fixed"]["exit"] == 0 for n in ran))
    return out


def test_every_fixed_program_runs_and_the_docs_show_the_figures(runs):
    f, r = corpus_figures(), run_figures(runs)
    programs = len(corpus_files(SETTINGS_DIR) + corpus_files(PATTERNS))
    for setting, (ran, fixed_ran) in r.items():
        assert fixed_ran == ran, setting
    assert r["neuron"][0] == programs   # the run mode runs every original on neuron

    def share(a, b):
        return f"{a} of {b} ({100 * a / b:.1f}%)"

    rows = [f"| programs, lines | {f['files']} programs, {f['lines']:,} lines; {f['marked']} tying lines marked "
            f"({f['explicit']} naming CUDA, {f['implicit']} implicit) |",
            f"| recall, lines that name CUDA | {share(f['explicit_hit'], f['explicit'])} |",
            f"| recall, with implicit ties | {share(f['hit'], f['marked'])} |",
            f"| precision | {share(f['right'], f['found'])} |"]
    rows += [f"| fixed programs that run where the original ran: {label} | {share(r[s][1], r[s][0])} |"
             for s, label in (("cpu", "CPU-only"), ("neuron", "`neuron`"), ("cuda", "CUDA stand-in"))]
    with open(os.path.join(ROOT, "docs", "lockin.md"), encoding="utf-8") as doc:
        text = doc.read()
    missing = [row for row in rows if row not in text]
    assert not missing, "docs/lockin.md's corpus table is stale; its rows are:\n" + "\n".join(rows)


def _neutral_paths():
    return [*corpus_files(NEUTRAL), os.path.join(ROOT, "examples"), os.path.join(ROOT, "benchmarks")]


@pytest.mark.parametrize("path", _neutral_paths(), ids=os.path.basename)
def test_device_neutral_code_has_no_finding(path):
    from torchneuron.lockin.source import python_files
    files = python_files([path])
    assert files
    for f in files:
        result = analyse_file(f)
        assert result.error is None, (f, result.error)
        assert result.findings == [], (f, [(x.line, x.rule, x.message) for x in result.findings])


@pytest.fixture(scope="module")
def fixed_corpus(tmp_path_factory):
    """The labelled corpus copied and fixed in place: {name: (fix result, analysis before)}."""
    folder = tmp_path_factory.mktemp("fixed")
    out = {}
    for path in corpus_files(LABELLED):
        copy = folder / os.path.basename(path)
        shutil.copy(path, copy)
        out[copy.name] = fix_path(str(copy), write=True)
    return folder, out


def _python_of(path):
    return read_notebook(path).text if path.endswith(".ipynb") else open(path, encoding="utf-8").read()


def test_fix_applies_every_rewrite_and_the_result_parses(fixed_corpus):
    folder, fixes = fixed_corpus
    for name, (fix, _) in fixes.items():
        assert fix.not_applied == [], name
        assert fix.applied > 0 and fix.changed, name
        ast.parse(_python_of(str(folder / name)))


def test_fix_keeps_comments(fixed_corpus):
    folder, fixes = fixed_corpus
    for name, (fix, before) in fixes.items():
        original, after = _python_of(os.path.join(LABELLED, name)), _python_of(str(folder / name))
        # an import the rewrite removes whole takes its line's comment with it
        removed = {f.text_line for f in before.findings if f.rule == "TNL005" and f.fixable}
        lines = original.split("\n")
        kept = [c for c in comments(original) if not any(c in lines[i - 1] for i in removed)]
        remaining = comments(after)
        for c in kept:
            assert c in remaining, (name, c)
            remaining.remove(c)


def test_after_fix_only_by_hand_lines_remain(fixed_corpus):
    folder, fixes = fixed_corpus
    for name, (fix, before) in fixes.items():
        after = analyse_file(str(folder / name))
        assert [f for f in after.findings if f.fixable] == [], name
        by_hand = {(f.cell, f.line) for f in before.findings if not f.guarded} - \
            {(f.cell, f.line) for f in before.findings if not f.guarded and f.fixable}
        # the same findings, by their source text (lines move where an import is removed or added)
        assert sorted(f.snippet for f in after.findings if not f.guarded) == \
            sorted(f.snippet for f in before.findings if not f.guarded and not f.fixable), name
        assert len({(f.cell, f.line) for f in after.findings if not f.guarded}) == len(by_hand), name


def test_fixed_notebook_keeps_its_cells(fixed_corpus):
    folder, _ = fixed_corpus
    with open(os.path.join(LABELLED, "explore.ipynb"), encoding="utf-8") as f:
        original = json.load(f)
    with open(folder / "explore.ipynb", encoding="utf-8") as f:
        fixed = json.load(f)
    assert [c["cell_type"] for c in fixed["cells"]] == [c["cell_type"] for c in original["cells"]]
    for a, b in zip(original["cells"], fixed["cells"]):
        if a["cell_type"] != "code" or "".join(a["source"]).startswith("!"):
            assert a == b
    assert {k: v for k, v in fixed.items() if k != "cells"} == {k: v for k, v in original.items() if k != "cells"}
