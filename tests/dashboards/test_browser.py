"""Headless Chromium (Debian's chromium + chromium-driver, driven by Selenium) against the real MLflow server
holding a real sweep: the sweep's view (the URL `fractune ui --sweep` prints) lists the trials with their settings
and objectives and charts every trial, and the report renders its plots, opened as a file and inside the MLflow
UI. Screenshots go to test-artifacts/."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from results import store
from tests.conftest import ROOT

SHOTS = ROOT / "test-artifacts"
WAIT = 120  # seconds: the React app loads its bundles from the server on a busy two-core machine


@pytest.fixture(autouse=True)
def _shots_folder():
    SHOTS.mkdir(exist_ok=True)


def _wait(driver, condition, what: str, timeout: float = WAIT):
    # React replaces elements as the page renders: one found a moment before may be gone when its text is read,
    # which is a reason to poll again, not a failure of the page.
    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.5,
                             ignored_exceptions=(StaleElementReferenceException,)).until(condition)
    except TimeoutException:
        shot = SHOTS / f"timeout-{what.replace(' ', '_')}.png"
        driver.save_screenshot(str(shot))
        pytest.fail(f"waited {timeout} s for {what}; screenshot {shot}", pytrace=False)


def _click(driver, find, what: str) -> None:
    """Click the element `find` returns once it is there, finding it again if React replaced it before the click."""
    def click(d):
        element = find(d)
        if element is None:
            return False
        element.click()
        return True
    _wait(driver, click, what)


def _texts(driver, css: str) -> list[str]:
    return [e.text.strip() for e in driver.find_elements(By.CSS_SELECTOR, css)]


def _run_names(driver) -> list[str]:
    """The run names of the table's rows, top to bottom (by the grid's row index, not the DOM's order)."""
    names = {}
    for link in driver.find_elements(By.CSS_SELECTOR, ".ag-cell[col-id='attributes.`Run Name`'] a"):
        row = link.find_element(By.XPATH, "./ancestor::div[@role='row'][1]")
        names[int(row.get_attribute("row-index"))] = link.text.strip()
    return [names[i] for i in sorted(names)]


@pytest.mark.slow
def test_the_sweeps_view_shows_its_trials_and_charts(browser, served_sweep, mlflow_server):
    """The URL `fractune ui --sweep` prints: the model-training mode, one row per trial with its readable name,
    sorted by accuracy, its duration, the objectives and cp as columns to four figures; its chart view draws
    every trial, FP32 apart from the quantized trials on a log cost axis."""
    from tests.conftest import run_main

    code, _, urls = run_main("ui", "--tracking-uri", mlflow_server["uri"], "--sweep", "served_sweep", "--json")
    assert code == 0
    c = store.client(mlflow_server["uri"])
    children = store.child_runs(c, c.get_run(served_sweep["parent_run_id"]))
    by_accuracy = [r.info.run_name for r in sorted(children, key=lambda r: -r.data.metrics["accuracy"])]
    browser.get(urls["url"])
    _wait(browser, lambda d: _run_names(d) == by_accuracy, "one row per trial, sorted by accuracy")
    for close in browser.find_elements(By.CSS_SELECTOR, "button[aria-label=Close]"):  # the assistant side panel
        close.click()
    # the model-training mode: its runs page and side bar, not the GenAI overview
    assert browser.find_element(By.TAG_NAME, "h2").text == "Runs"
    side = " ".join(_texts(browser, "nav a, nav li"))
    assert "Models" in side and "Judges" not in side and "Overview" not in side
    headers = {e.get_attribute("data-testid")[len("sort-header-"):]
               for e in browser.find_elements(By.CSS_SELECTOR, "[data-testid^=sort-header-]")}
    assert {"Run Name", "Duration", "accuracy", "train_tbitops", "cp_pct", "cp_gated_pct"} <= headers, headers
    # every trial's run has ended with its end time: the Duration column holds a value in every row
    durations = _texts(browser, ".ag-center-cols-container .ag-cell[col-id='duration']")
    assert len(durations) == len(children) and all(re.fullmatch(r"[\d.]+\s?(ms|s|min|h)", d) for d in durations), \
        durations
    # the readable companions: four significant figures, not the exact value's sixteen
    for column in ("train_tbitops", "cp_pct", "cp_gated_pct"):  # cp_gated_pct: the DFQ trial's ("-" elsewhere)
        cells = _texts(browser, f".ag-center-cols-container .ag-cell[col-id='metrics.`{column}`']")
        shown = [c for c in cells if c != "-"]
        assert len(cells) == len(children) and shown and all(len(c.replace(".", "").lstrip("0")) <= 4 for c in shown), \
            (column, cells)
    browser.save_screenshot(str(SHOTS / "mlflow_view_table.png"))

    browser.get(urls["charts_url"])
    cards = "[data-testid=experiment-view-compare-runs-card]"

    def scatter_points(d) -> int | None:
        first = next(iter(d.find_elements(By.CSS_SELECTOR, cards)), None)  # accuracy vs training BitOPs
        n = len(first.find_elements(By.CSS_SELECTOR, ".scatterlayer .point")) if first is not None else 0
        return n or None

    assert _wait(browser, scatter_points, "the scatter chart of every trial") == len(children)
    titles = " ".join(_texts(browser, cards))
    assert "train_bitops_log10" in titles and "Parallel Coordinates" in titles and "accuracy" in titles
    # on the log cost axis FP32 stands apart, dearest, and the quantized trials are spread out, not squeezed
    # against the axis: a fair part of the axis between them, and no two of them within a few pixels
    points = browser.find_element(By.CSS_SELECTOR, cards).find_elements(By.CSS_SELECTOR, ".scatterlayer .point")
    xy = sorted(tuple(map(float, re.fullmatch(r"translate\(([-\d.e]+),\s?([-\d.e]+)\)",
                                              p.get_attribute("transform")).groups())) for p in points)
    *quantized, fp32 = xy
    spread = (quantized[-1][0] - quantized[0][0]) / (fp32[0] - quantized[0][0])
    assert spread > 0.1, xy  # a linear axis leaves them under 5 % of it
    assert all(math.dist(a, b) > 5 for i, a in enumerate(quantized) for b in quantized[i + 1:]), xy
    browser.save_screenshot(str(SHOTS / "mlflow_view_charts.png"))


def _full_page_shot(driver, name: str) -> None:
    """The whole page, not just the viewport: grow the window to the document's height, then restore it."""
    size = driver.get_window_size()
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(size["width"], min(int(height) + 100, 16000))
    driver.save_screenshot(str(SHOTS / name))
    driver.set_window_size(size["width"], size["height"])


def _plots(driver) -> tuple[int, int]:
    return (len(driver.find_elements(By.CSS_SELECTOR, ".plot-container")),
            len(driver.find_elements(By.CSS_SELECTOR, ".main-svg")))


def test_report_renders_its_plots(browser, served_sweep):
    report = Path(served_sweep["report"])
    browser.get(report.as_uri())
    _wait(browser, lambda d: _plots(d)[0] == 5, "five rendered plotly figures")
    containers, svgs = _plots(browser)
    assert svgs >= 2 * containers  # plotly draws each figure on two stacked svg layers (at least)
    headings = [h.text for h in browser.find_elements(By.TAG_NAME, "h2")]
    assert headings == ["Trials", "Accuracy vs training BitOPs", "Parameters and objectives", "Parameter importance",
                        "Precision over training", "DFQ bit allocation"]
    # the front's stars are drawn: a Pareto-front legend entry in the first figure
    assert "Pareto front" in browser.find_elements(By.CSS_SELECTOR, ".plot-container")[0].text
    _full_page_shot(browser, "report.png")


def test_report_opens_inside_the_mlflow_ui(browser, served_sweep, mlflow_server):
    url = (f"{mlflow_server['uri']}/#/experiments/{served_sweep['experiment_id']}/runs/"
           f"{served_sweep['parent_run_id']}/artifacts/report/report.html")
    browser.get(url)
    frame = _wait(browser, lambda d: next(iter(d.find_elements(By.TAG_NAME, "iframe")), None),
                  "the artifact viewer's frame")
    figures = Path(served_sweep["report"]).read_text().count('class="plotly-graph-div"')  # the file MLflow serves
    assert figures == 5
    browser.switch_to.frame(frame)
    try:  # every figure, not a count passed on the way (plotly draws them one after another)
        _wait(browser, lambda d: _plots(d)[0] == figures, "the report's figures inside the MLflow UI")
    finally:
        browser.switch_to.default_content()
    browser.save_screenshot(str(SHOTS / "report_in_mlflow_ui.png"))


WORKFLOW_KEY = "mlflow.workflowType_v1"  # where MLflow 3.17's UI keeps the GenAI / Model training switch


def _open_from_experiment_list(driver, base: str, experiment_id: str) -> str:
    """Click the experiment's name in MLflow's own experiment list; the page it lands on, once drawn."""
    driver.get(f"{base}/#/experiments")
    driver.refresh()  # a new page: the UI reads the switch from local storage once, when it starts
    _click(driver, lambda d: next((a for a in d.find_elements(By.CSS_SELECTOR, "a[href]")
                                   if a.get_attribute("href").endswith(f"/experiments/{experiment_id}")), None),
           "the experiment in MLflow's experiment list")
    _wait(driver, lambda d: any(e.text in ("Runs", "Overview") for e in d.find_elements(By.TAG_NAME, "h2")),
          "the experiment's first page")
    return driver.current_url


@pytest.mark.slow
def test_an_experiment_opened_from_mlflows_list_shows_its_runs_in_model_training_mode(browser, served_sweep,
                                                                                        mlflow_server):
    """MLflow 3.17.2 picks an experiment's first page from the UI's GenAI / Model training switch (the URL's
    workflowType, else the browser's last choice, GenAI at first), not from the experiment's kind tag, which
    fractune sets all the same: a browser that never chose lands in the GenAI overview; once a person picks
    "Model training" (one click, kept by the browser), the list opens fractune's experiments on their runs."""
    base, exp_id = mlflow_server["uri"], served_sweep["experiment_id"]
    assert store.client(base).get_experiment(exp_id).tags[store.KIND_TAG] == store.TRAINING_KIND
    browser.get(f"{base}/#/experiments")
    browser.execute_script(f"window.localStorage.removeItem('{WORKFLOW_KEY}')")
    try:
        landed = _open_from_experiment_list(browser, base, exp_id)
        # if this fails, MLflow reads the kind tag again: docs/usage.md's note on the switch can go
        assert "/overview" in landed and "workflowType=genai" in landed, landed
        browser.get(f"{base}/#/experiments")
        _click(browser, lambda d: next((e for e in d.find_elements(By.XPATH, "//*[text()='Model training']")
                                        if e.is_displayed()), None), "the Model training switch")
        assert browser.execute_script(f"return window.localStorage.getItem('{WORKFLOW_KEY}')") == '"machine_learning"'
        landed = _open_from_experiment_list(browser, base, exp_id)
        assert f"/experiments/{exp_id}/runs" in landed and "workflowType=machine_learning" in landed, landed
        assert browser.find_element(By.TAG_NAME, "h2").text == "Runs"
        browser.save_screenshot(str(SHOTS / "experiment_from_list.png"))
    finally:
        browser.execute_script(f"window.localStorage.removeItem('{WORKFLOW_KEY}')")
