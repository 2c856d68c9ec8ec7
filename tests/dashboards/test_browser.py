"""Headless Chromium (Debian's chromium + chromium-driver, driven by Selenium) against the real MLflow server
holding a real sweep: the runs page lists the trials with their metrics, and the report renders its plots,
opened as a file and inside the MLflow UI. Screenshots go to test-artifacts/."""

from __future__ import annotations

from pathlib import Path

import pytest
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

from orchestrator import store
from tests.conftest import ROOT

SHOTS = ROOT / "test-artifacts"
WAIT = 120  # seconds: the React app loads its bundles from the server on a busy two-core machine


@pytest.fixture(autouse=True)
def _shots_folder():
    SHOTS.mkdir(exist_ok=True)


def _wait(driver, condition, what: str, timeout: float = WAIT):
    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.5).until(condition)
    except TimeoutException:
        shot = SHOTS / f"timeout-{what.replace(' ', '_')}.png"
        driver.save_screenshot(str(shot))
        pytest.fail(f"waited {timeout} s for {what}; screenshot {shot}", pytrace=False)


def _show_metric_column(driver, name: str) -> None:
    """The runs table shows no metric columns by default: tick the metric in the Columns menu."""
    driver.find_element(By.CSS_SELECTOR, "button[data-testid=column-selection-dropdown]").click()
    search = _wait(driver, lambda d: d.find_element(By.CSS_SELECTOR, "input[placeholder='Search columns']"),
                   "the column search box", 30)
    search.send_keys(name)
    entry = _wait(driver, lambda d: next((e for e in d.find_elements(By.CSS_SELECTOR, ".du-bois-light-tree-title")
                                          if e.text.strip() == name), None), f"the {name} column entry", 30)
    entry.click()
    driver.find_element(By.TAG_NAME, "body").send_keys(Keys.ESCAPE)


def test_runs_page_lists_the_trials_with_their_metrics(browser, served_sweep, mlflow_server):
    c = store.client(mlflow_server["uri"])
    children = store.child_runs(c, c.get_run(served_sweep["parent_run_id"]))
    assert len(children) == 3
    browser.get(f"{mlflow_server['uri']}/#/experiments/{served_sweep['experiment_id']}/runs")
    _wait(browser, lambda d: served_sweep["sweep_id"] in d.page_source, "the sweep's parent run")
    for close in browser.find_elements(By.CSS_SELECTOR, "button[aria-label=Close]"):  # the assistant side panel
        close.click()
    # the trials are nested under the sweep's parent run: expand it
    browser.find_element(By.CSS_SELECTOR, "button[data-component-id*=runnamecellrenderer]").click()
    names = [r.info.run_name for r in children]
    _wait(browser, lambda d: all(n in d.page_source for n in names), "the trial run names")
    _show_metric_column(browser, "accuracy")
    cells = _wait(browser, lambda d: [e.text for e in d.find_elements(By.CSS_SELECTOR, ".ag-cell[col-id='metrics.`accuracy`']")
                                      if e.text.strip() not in ("", "-")] or None, "the accuracy column")
    browser.save_screenshot(str(SHOTS / "mlflow_runs_page.png"))
    # what the UI shows is what MLflow holds (the cells may be cut to 10 characters)
    shown = sorted(t.rstrip(".") for t in cells)
    held = sorted(str(r.data.metrics["accuracy"]) for r in children)
    assert len(shown) == 3 and all(h.startswith(s[:8]) for s, h in zip(shown, held)), (shown, held)


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
    browser.switch_to.frame(frame)
    try:
        _wait(browser, lambda d: _plots(d)[0] == 4, "the report's figures inside the MLflow UI")
    finally:
        browser.switch_to.default_content()
    browser.save_screenshot(str(SHOTS / "report_in_mlflow_ui.png"))
