"""The reports (table, JSON, SARIF 2.1.0), --ci's exit status, --diff and --fix
through the command line's entry point."""
import json
import os
import shutil

import pytest

from torchneuron.lockin.__main__ import main
from torchneuron.lockin.rules import RULES

from lockin_testing import LABELLED, corpus_files

ACC = 'torch.accelerator.current_accelerator().type if torch.accelerator.is_available() else "cpu"'
CODE = """import os
import torch

torch.backends.cudnn.benchmark = True
model = torch.nn.Linear(2, 2).cuda()
if torch.backends.cudnn.is_available():
    torch.backends.cudnn.deterministic = True
os.environ["NCCL_DEBUG"] = "INFO"
"""


@pytest.fixture
def program(tmp_path):
    path = tmp_path / "prog.py"
    path.write_text(CODE)
    return path


def _json(path, capsys, *args):
    assert main([str(path), "--format", "json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_number_comes_first(program, capsys):
    assert main([str(program)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("3 lines tie this code to one vendor (NVIDIA): 1 fixable automatically, 2 by hand\n")
    assert "1 guarded line not counted" in out
    assert "prog.py:5:9  TNL001 fix" in out and "prog.py:7:5  TNL007 guarded" in out


def test_json_summary_per_file_and_per_rule(program, capsys):
    r = _json(program, capsys)
    s = r["summary"]
    assert (s["tying_lines"], s["fixable_lines"], s["by_hand_lines"], s["guarded_lines"]) == (3, 1, 2, 1)
    assert r["files"] == [{"path": str(program), "lines": 8, "tying_lines": 3, "fixable_lines": 1,
                           "by_hand_lines": 2, "implicit_lines": 0}]
    assert [(x["rule"], x["lines"], x["fixable"]) for x in r["rules"]] == [("TNL001", 1, 1), ("TNL007", 1, 0),
                                                                            ("TNL011", 1, 0)]
    assert [(f["line"], f["rule"], f["guarded"]) for f in r["findings"]] == [
        (4, "TNL007", False), (5, "TNL001", False), (7, "TNL007", True), (8, "TNL011", False)]
    assert all(f["vendor"] == "NVIDIA" and f["rewrite"] and f["guard"] for f in r["findings"])


def test_implicit_ties_are_their_own_class(tmp_path, capsys):
    """Ties that name no CUDA count as tying lines, and as implicit ones: in the
    headline, per file, per rule and per finding."""
    path = tmp_path / "kernels.py"
    path.write_text("import torch\nimport triton\n\n\n@triton.jit\ndef add(x_ptr):\n    pass\n\n\n"
                    "state = torch.load('ck.pt')\nx = torch.ones(1).cuda()\nimport pycuda\n")
    assert main([str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("5 lines tie this code to one vendor (NVIDIA): 1 fixable automatically, 4 by hand "
                          "(3 of them implicit ties, naming no CUDA)\n"), out
    assert "kernels.py:5:2  TNL028 hand implicit" in out and "kernels.py:11:5  TNL001 fix " in out
    r = _json(path, capsys)
    assert (r["summary"]["explicit_lines"], r["summary"]["implicit_lines"]) == (2, 3)
    assert r["files"][0]["implicit_lines"] == 3
    assert {x["rule"]: x["implicit"] for x in r["rules"]} == {"TNL001": False, "TNL018": True, "TNL024": True,
                                                               "TNL028": True}
    # pycuda's import names CUDA: its finding is explicit though its rule holds implicit ties
    assert [(f["line"], f["implicit"]) for f in r["findings"]] == [(2, True), (5, True), (10, True), (11, False),
                                                                    (12, False)]


def _check_sarif(doc):
    """The structure SARIF 2.1.0 requires of what this report writes (sarif-schema-2.1.0)."""
    assert doc["version"] == "2.1.0" and doc["$schema"].endswith("sarif-2.1.0.json")
    assert isinstance(doc["runs"], list) and len(doc["runs"]) == 1
    run = doc["runs"][0]
    driver = run["tool"]["driver"]
    assert isinstance(driver["name"], str) and driver["name"]
    rule_ids = [r["id"] for r in driver["rules"]]
    assert len(set(rule_ids)) == len(rule_ids)
    for r in driver["rules"]:
        assert isinstance(r["shortDescription"]["text"], str)
        assert r["defaultConfiguration"]["level"] in ("none", "note", "warning", "error")
    for base in run.get("originalUriBaseIds", {}).values():
        assert base["uri"].startswith("file://") and base["uri"].endswith("/")
    for result in run["results"]:
        assert isinstance(result["message"]["text"], str) and result["message"]["text"]
        assert result["level"] in ("none", "note", "warning", "error")
        assert rule_ids[result["ruleIndex"]] == result["ruleId"]
        for loc in result["locations"]:
            physical = loc["physicalLocation"]
            assert isinstance(physical["artifactLocation"]["uri"], str)
            if "uriBaseId" in physical["artifactLocation"]:
                assert physical["artifactLocation"]["uriBaseId"] in run["originalUriBaseIds"]
            region = physical["region"]
            assert isinstance(region["startLine"], int) and region["startLine"] >= 1
            assert isinstance(region["startColumn"], int) and region["startColumn"] >= 1
        assert isinstance(result.get("properties", {}), dict)
    return run


def test_sarif_structure(tmp_path, capsys):
    corpus = tmp_path / "corpus"
    shutil.copytree(LABELLED, corpus)
    out = tmp_path / "r.sarif"
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert main([str(corpus), "--format", "sarif", "-o", str(out)]) == 0
    finally:
        os.chdir(cwd)
    run = _check_sarif(json.loads(out.read_text()))
    assert {r["id"] for r in run["tool"]["driver"]["rules"]} == set(RULES)
    assert len(run["results"]) > 40
    uris = {r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in run["results"]}
    assert "corpus/classic_train.py" in uris
    cells = [r for r in run["results"] if r["properties"]["cell"]]
    assert cells and all(r["locations"][0]["message"]["text"].startswith("notebook cell") for r in cells)


def test_ci_threshold_and_baseline(program, tmp_path, capsys):
    assert main([str(program), "--ci"]) == 1                      # any tying line fails by default
    assert main([str(program), "--ci", "--max-lines", "3"]) == 0
    assert main([str(program), "--ci", "--max-lines", "2"]) == 1
    baseline = tmp_path / "baseline.json"
    assert main([str(program), "--format", "json", "-o", str(baseline)]) == 0
    assert main([str(program), "--ci", "--baseline", str(baseline)]) == 0
    program.write_text(CODE + 'torch.cuda.synchronize()\n')
    assert main([str(program), "--ci", "--baseline", str(baseline)]) == 1
    err = capsys.readouterr().err
    assert "above the baseline's 3" in err and "prog.py: 4 tying lines, baseline 3" in err
    program.write_text(CODE.replace("model = torch.nn.Linear(2, 2).cuda()\n", ""))
    assert main([str(program), "--ci", "--baseline", str(baseline)]) == 0


def test_diff_changes_nothing_and_fix_rewrites(program, capsys):
    assert main([str(program), "--diff"]) == 0
    captured = capsys.readouterr()
    assert "-model = torch.nn.Linear(2, 2).cuda()\n+model = torch.nn.Linear(2, 2).to(" + ACC + ")\n" in captured.out
    assert program.read_text() == CODE
    assert main([str(program), "--fix"]) == 0
    err = capsys.readouterr().err
    assert "before: 3 lines" in err and "after:  2 lines tie this code to one vendor (NVIDIA): 0 fixable" in err
    assert program.read_text() == CODE.replace(".cuda()", ".to(" + ACC + ")")


def test_usage_errors_exit_2(tmp_path):
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path / "missing.py")])
    assert e.value.code == 2


def test_every_corpus_file_renders_in_every_format(capsys):
    for fmt in ("table", "json", "sarif"):
        assert main([*corpus_files(LABELLED), "--format", fmt]) == 0
        assert capsys.readouterr().out
