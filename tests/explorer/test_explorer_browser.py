"""The report in a real browser: headless chromium driven by Selenium through
chromium-driver (both Debian packages, installed by scripts/setup_env.sh). The
report of the known program loads with no console errors, the timeline draws
every device row, selecting an operator lists its tasks, and each view is
written as a screenshot to tests/explorer/artifacts/ (EXPLORER_ARTIFACTS)."""
import json
import os
import shutil

import pytest

from conftest import ARTIFACTS
from synthetic_device_rows import add_synthetic_device_rows, synthetic_nki_kernel
import torchneuron.explorer as explorer

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER),
                                reason="chromium and chromium-driver are not installed (scripts/setup_env.sh installs them)")
VIEWS = ("summary", "timeline", "operators", "memory", "nki")


@pytest.fixture(scope="module")
def report(known_trace, tmp_path_factory):
    """The known program's report with device rows: the measured ones, or synthetic ones
    (marked in the report) while the trace has none; plus a synthetic NKI kernel trace."""
    with open(known_trace) as f:
        trace = json.load(f)
    if not explorer.analyze(trace)["summary"]["has_device_rows"]:
        trace = add_synthetic_device_rows(trace)
    trace.setdefault("neuronNkiKernels", [synthetic_nki_kernel()])
    path = str(tmp_path_factory.mktemp("browser") / "report.html")
    explorer.report(trace, path, title="known program")
    return path, explorer.analyze(trace)


@pytest.fixture(scope="module")
def browser(report):
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1000", "--force-device-scale-factor=1"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        driver.get("file://" + report[0])
        yield driver
    finally:
        driver.quit()


def _show(driver, view):
    driver.execute_script("neuronExplorer.showView(arguments[0])", view)


def test_loads_without_console_errors(browser):
    assert browser.execute_script("return window.neuronExplorer && window.neuronExplorer.ready") is True
    for view in VIEWS:
        _show(browser, view)
    errors = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
    assert errors == [] and browser.execute_script("return neuronExplorer.errors") == []


def test_timeline_draws_every_device_row(browser, report):
    data = report[1]
    _show(browser, "timeline")
    rows = browser.execute_script("return neuronExplorer.timelineRows()")
    device = [r for r in rows if r["kind"] == "device"]
    assert [r["label"] for r in device] == [r["label"] for r in data["stream_rows"]]
    # The whole trace is in view: every task drawn once.
    assert sum(r["drawn"] for r in device) == len(data["tasks"]) > 0 and all(r["drawn"] > 0 for r in device)
    assert [r["label"] for r in rows if r["kind"] == "host"] == [r["label"] for r in data["host_rows"]]
    assert any(r["kind"] == "memory" and r["drawn"] > 0 for r in rows)
    # Zooming in on the first half draws fewer tasks.
    browser.execute_script("neuronExplorer.focus(0, arguments[0])", data["summary"]["window_us"] / 4)
    zoomed = browser.execute_script("return neuronExplorer.timelineRows()")
    assert sum(r["drawn"] for r in zoomed if r["kind"] == "device") < len(data["tasks"])
    browser.find_element("id", "tl-reset").click()


def test_selecting_an_operator_shows_its_tasks(browser, report):
    data = report[1]
    op = max((r for r in data["operators"] if r["cat"] == "cpu_op"), key=lambda r: (len(r["tasks"]), r["name"]))
    assert op["tasks"]
    _show(browser, "operators")
    row = browser.find_element("css selector", f'#op-table tbody tr[data-op="{op["name"]}"]')
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", row)
    row.click()
    table = browser.find_element("id", "op-tasks")
    assert int(table.get_attribute("data-count")) == len(op["tasks"])
    listed = table.find_elements("css selector", "tbody tr")
    assert [int(r.get_attribute("data-task")) for r in listed] == op["tasks"][:300]
    assert browser.execute_script("return neuronExplorer.selectedTaskCount()") == len(set(op["tasks"]))
    # Sorting by calls puts the most-called operator first.
    browser.find_element("css selector", '#op-table th[data-key="calls"]').click()
    first = browser.find_element("css selector", "#op-table tbody tr").get_attribute("data-op")
    assert first in {r["name"] for r in data["operators"] if r["calls"] == max(x["calls"] for x in data["operators"])}


def test_nki_instruction_shows_its_source_line(browser, report):
    kernel = report[1]["nki"][0]
    _show(browser, "nki")
    index = next(i for i, ins in enumerate(kernel["instructions"]) if ins["engine"] == "Scalar")
    browser.execute_script("neuronExplorer.nkiShowSource(arguments[0])", index)
    highlighted = browser.find_element("css selector", "#nki-source pre.source div.hl")
    line = int(kernel["instructions"][index]["line"].rsplit(":", 1)[1])
    assert int(highlighted.get_attribute("data-line")) == line
    assert "nl.multiply" in highlighted.text


def test_screenshots_of_every_view(browser, report):
    data = report[1]
    os.makedirs(ARTIFACTS, exist_ok=True)
    top = data["summary"]["top_device_ops"][0]["name"]
    for view in VIEWS:
        _show(browser, view)
        browser.execute_script("neuronExplorer.clearSelection()")
        if view == "timeline":
            browser.find_element("id", "tl-reset").click()
        if view == "operators":
            browser.execute_script("neuronExplorer.selectOperator(arguments[0])", top)
        path = os.path.join(ARTIFACTS, f"explorer_{view}.png")
        assert browser.save_screenshot(path) and os.path.getsize(path) > 10_000


@pytest.mark.parametrize("kind", ["host_only", "empty"])
def test_reports_without_device_rows_load_without_errors(browser, tmp_path, kind):
    from synthetic_device_rows import TraceBuilder
    b = TraceBuilder()
    if kind == "host_only":
        b.python("train.py(1): <module>", 0, 50)
        b.op("aten::mm", 10, 20)
    path = str(tmp_path / f"{kind}.html")
    explorer.report(b.trace(), path)
    browser.get("file://" + path)
    for view in VIEWS:
        _show(browser, view)
    assert browser.execute_script("return neuronExplorer.errors") == []
    assert [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")] == []
    _show(browser, "timeline")
    rows = browser.execute_script("return neuronExplorer.timelineRows()")
    assert [r["kind"] for r in rows] == (["host"] if kind == "host_only" else [])


def test_a_torch_neuronx_profile_shows_its_host_samples_and_account(browser, tmp_path):
    # torch_neuronx.profiling's additions to a trace: host counters and its account of the capture.
    from synthetic_device_rows import TraceBuilder
    b = TraceBuilder()
    b.op("aten::mm", 10, 20)
    trace = b.trace()
    trace["traceEvents"] += [
        {"ph": "C", "cat": "neuron_host", "name": "host CPU utilisation (%)", "pid": 1, "tid": 0, "ts": 15,
         "args": {"all": 40.0, "cpu0": 80.0, "cpu1": 0.0}},
        {"ph": "C", "cat": "neuron_host", "name": "host memory (bytes)", "pid": 1, "tid": 0, "ts": 15,
         "args": {"used": 3 << 30, "process RSS": 1 << 30}}]
    trace["neuronProfile"] = {"rank": 1, "modes": ["DEVICE", "CPU_UTIL"], "files": ["trace.json", "cpu_util.json"],
                              "max_events_per_nc": 10, "dropped_tasks_per_nc": {"0": 4},
                              "not_produced": {"DEVICE": "no .neff here"}}
    path = str(tmp_path / "neuron_profile.html")
    explorer.report(trace, path)
    browser.get("file://" + path)
    _show(browser, "summary")
    assert browser.execute_script("return neuronExplorer.errors") == []
    assert [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")] == []
    host = browser.execute_script("return document.getElementById('card-host').textContent")
    account = browser.execute_script("return document.getElementById('card-neuron-profile').textContent")
    assert "mean 40.0 %" in host and "peak 3.0 GiB, process peak 1.0 GiB" in host
    assert "DEVICE, CPU_UTIL" in account and "4 (max_events_per_nc 10)" in account and "no .neff here" in account


def test_the_trainium_twins_account_shows_in_the_summary(browser, tmp_path):
    # torchneuron.target's account of the profiled work (top-level "neuronTargetModel").
    from synthetic_device_rows import TraceBuilder
    b = TraceBuilder()
    b.op("aten::mm", 10, 20)
    trace = b.trace()
    trace["neuronTargetModel"] = {
        "target": "trn2", "device": "Trainium2", "lnc": 2, "device_s": 0.002, "launches": 120,
        "bound_s": {"launch": 0.0018, "memory": 0.0002}, "engine_s": {"hbm": 0.0002},
        "eager_compiles": 40, "graph_compiles": 1, "compile_s": 60.0, "wide_findings": 1,
        "churn": [{"op": "aten::cat", "site": "gen.py:7"}],
        "top_ops": [{"op": "aten::mm", "count": 10, "seconds": 0.0005, "share": 0.25, "bound": "launch"}],
        "assumptions": {"launch_us": "per-launch cost of an operator or graph (LAUNCH_US)"}}
    path = str(tmp_path / "target.html")
    explorer.report(trace, path)
    browser.get("file://" + path)
    _show(browser, "summary")
    assert browser.execute_script("return neuronExplorer.errors") == []
    assert [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")] == []
    card = browser.execute_script("return document.getElementById('card-target').textContent")
    assert "Modelled on Trainium2 (trn2, LNC=2): not measured" in card, card
    assert "2.00 ms in 120 launches" in card and "40 eager signatures, 1 graphs" in card, card
    assert "1 shape churn site(s), 1 64-bit value(s)" in card and "aten::mm" in card and "25% · launch" in card, card
    assert "Assumed: per-launch cost" in card, card
