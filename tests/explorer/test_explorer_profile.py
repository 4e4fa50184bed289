"""The explorer on a real torch.profiler run of a known program on `neuron`
(conftest.py: known_program): the report's API and command line, and what the
analysis finds in the trace."""
import json
import os
import re
import subprocess
import sys

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import torchneuron.explorer as explorer
from conftest import KNOWN_STEPS, known_program
from neuron_testing import ROOT

DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def _embedded(html):
    m = re.search(r'<script type="application/json" id="explorer-data">(.*?)</script>', html, re.S)
    return json.loads(m.group(1))


def test_report_of_the_known_program(known_trace, tmp_path):
    raw = json.loads(open(known_trace).read())
    out = explorer.report(known_trace, str(tmp_path / "report.html"))
    html = open(out, encoding="utf-8").read()
    # Self-contained: nothing is fetched from anywhere.
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)
    data = _embedded(html)
    assert data == json.loads(json.dumps(explorer.analyze(known_trace)))
    host = ("cpu_op", "user_annotation", *explorer.analysis.RUNTIME_CATS)  # task launches are host ranges too
    ops = [e for e in raw["traceEvents"] if e.get("ph") == "X" and e.get("cat") in host]
    assert data["summary"]["host_ops"] == len(ops)
    names = {r["name"] for r in data["operators"]}
    assert {"aten::addmm", "aten::mse_loss", "aten::item"} <= names
    assert {f"step {i}" for i in range(KNOWN_STEPS)} <= names
    # Every device row in the trace is a task of the report, on its (device, stream).
    device = [e for e in raw["traceEvents"] if e.get("ph") == "X" and e.get("cat") in DEVICE_CATS]
    assert len(data["tasks"]) == len(device)
    rows = {(r["device"], r["stream"]) for r in data["stream_rows"]}
    assert rows == {(int(e["args"].get("device", e["pid"])), int(e["args"].get("stream", e["tid"]))) for e in device}
    # Every memory event is in its device's series.
    memory = [e for e in raw["traceEvents"] if e.get("name") == "[memory]"]
    assert sum(len(m["series"]) for m in data["memory"]) == len(memory) > 0


def test_item_is_found_with_its_python_frame(known_trace):
    s = explorer.analyze(known_trace)["summary"]
    item = [site for site in s["sync_sites"] if site["op"] == "aten::item"]
    assert len(item) == 1 and item[0]["calls"] == KNOWN_STEPS
    # The frame is known_program's, at the line where the function starts.
    code = known_program.__code__
    assert item[0]["frame_label"] == f"known_program (conftest.py:{code.co_firstlineno})"


def test_trace_of_a_neuron_program_has_device_rows(known_trace):
    s = explorer.analyze(known_trace)["summary"]
    assert s["has_device_rows"] and s["cores"][0]["busy_us"] > 0
    launched = {r["name"] for r in s["top_device_ops"]}
    assert {"aten::addmm", "aten::mm"} & launched


def test_report_of_a_profiler_object(tmp_path):
    x = torch.randn(16, 16, device="neuron")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        (x @ x).relu().sum().item()
    out = explorer.report(prof, str(tmp_path / "sub" / "report.html"))
    data = _embedded(open(out, encoding="utf-8").read())
    assert {"aten::mm", "aten::relu", "aten::item"} <= {r["name"] for r in data["operators"]}


def test_command_line(known_trace, tmp_path):
    out = tmp_path / "cli.html"
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = subprocess.run([sys.executable, "-m", "torchneuron.explorer", known_trace, "-o", str(out)],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(out)
    assert _embedded(out.read_text(encoding="utf-8"))["summary"]["host_ops"] > 0
    # Without a trace: argparse's usage error (in-process: the same main()).
    from torchneuron.explorer.__main__ import main
    with pytest.raises(SystemExit) as exit_info:
        main([])
    assert exit_info.value.code == 2
