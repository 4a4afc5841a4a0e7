"""The board end to end in headless Chromium (Selenium): every page renders what the run folders hold, the run
page's curve gains points while a run writes metrics, markup from a run folder shows as text, malformed metric
lines are skipped.  A screenshot of each page is kept (``$FEDARENA_ARTIFACTS/board/`` or pytest's temp dir)."""

from __future__ import annotations

import json
import time
from urllib.parse import quote

import pytest

from fedarena.board import folders

from fedarena.platform.checkpoint import write_atomic

from .conftest import NAN_MESSAGE, XSS, write_status

pytest.importorskip("selenium")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

IID, DIR = "fedsim-iid-20260101T000000Z-aaaaaa", "fedsim-dirichlet-20260101T000100Z-bbbbbb"
WAIT = 30


def _open(browser, board, path: str):
    browser.get(board.url.rstrip("/") + path)
    WebDriverWait(browser, WAIT).until(lambda d: d.execute_script("return document.readyState") == "complete")


def _wait(browser, css: str, count: int = 1):
    WebDriverWait(browser, WAIT).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, css)) >= count)
    return browser.find_elements(By.CSS_SELECTOR, css)


def _shot(browser, artifacts, name: str) -> None:
    height = browser.execute_script("return document.body.scrollHeight")
    browser.set_window_size(1400, min(max(int(height), 800), 4000))
    path = artifacts / f"{name}.png"
    browser.save_screenshot(str(path))
    browser.set_window_size(1400, 1000)
    assert path.stat().st_size > 10_000


def test_runs_list_shows_filters_and_sorts(browser, board, runs_root, artifacts):
    _open(browser, board, "/")
    rows = browser.find_elements(By.CSS_SELECTOR, "#runs tbody tr")
    assert len(rows) == len(folders.list_runs(runs_root)) == 6
    iid = browser.find_element(By.CSS_SELECTOR, f'tr[data-id="{IID}"]')
    assert "finished" in iid.text and "step 4 / 4" in iid.text and "test_acc" in iid.text
    failed = browser.find_element(By.CSS_SELECTOR, 'tr[data-state="failed"]')
    assert "log produced 4 Inf" in failed.text
    _shot(browser, artifacts, "runs")
    browser.find_element(By.ID, "filter").send_keys("dirichlet")
    visible = [r for r in browser.find_elements(By.CSS_SELECTOR, "#runs tbody tr") if r.is_displayed()]
    assert [r.get_attribute("data-id") for r in visible] == [DIR]
    assert browser.find_element(By.ID, "shown-count").text == "1 of 6 shown"
    browser.find_element(By.ID, "filter").clear()
    browser.execute_script("document.getElementById('filter').dispatchEvent(new Event('input'))")
    browser.find_element(By.CSS_SELECTOR, 'th[data-key="name"]').click()
    names = [r.get_attribute("data-name") for r in browser.find_elements(By.CSS_SELECTOR, "#runs tbody tr")]
    assert names == sorted(names)
    browser.find_element(By.CSS_SELECTOR, 'th[data-key="name"]').click()
    names = [r.get_attribute("data-name") for r in browser.find_elements(By.CSS_SELECTOR, "#runs tbody tr")]
    assert names == sorted(names, reverse=True)
    # the list refreshes statuses without a reload: the running run finishes on disk, its badge follows
    run = runs_root / "malformed"
    saved = (run / "status.json").read_bytes()
    write_status(run, {"state": "completed", "kind": "xfp", "seed": 0, "summary": {"exploitability": 0.2}})
    try:
        badge = browser.find_element(By.CSS_SELECTOR, 'tr[data-id="malformed"] .state')
        WebDriverWait(browser, WAIT).until(lambda d: badge.text == "finished")
    finally:
        write_atomic(run / "status.json", saved)


def test_run_page_shows_curves_config_figures_checkpoints_log_and_fl_views(browser, board, runs_root, artifacts):
    _open(browser, board, "/run?id=" + quote(IID))
    rows = folders.read_metrics_since(runs_root / IID).rows
    charts = _wait(browser, "#charts .metric-chart .scatterlayer .trace")
    # every drawn curve has one marker per metric row
    for chart in browser.find_elements(By.CSS_SELECTOR, "#charts .metric-chart"):
        metric = chart.get_attribute("data-metric")
        want = sum(1 for r in rows if metric in r)
        assert len(chart.find_elements(By.CSS_SELECTOR, ".scatterlayer .point")) == want == 4, metric
    assert charts
    assert "num_clients: 20" in browser.find_element(By.ID, "config").text  # inside the data section
    figures = browser.find_elements(By.CSS_SELECTOR, ".figures img")
    assert len(figures) == len(folders.figures(runs_root / IID)) >= 3
    assert all(browser.execute_script("return arguments[0].naturalWidth", img) > 100 for img in figures)
    assert "ckpt-000000004.fdck" in browser.find_element(By.ID, "checkpoints").text
    assert "starting run" in browser.find_element(By.ID, "log").text
    assert not browser.find_element(By.ID, "failure").is_displayed()
    # FL views: accuracy per round (4 curves x 4 rounds), bytes per round, per-client histogram, label histogram
    _wait(browser, "#fl-accuracy .scatterlayer .trace", 4)
    assert len(browser.find_elements(By.CSS_SELECTOR, "#fl-bytes .barlayer .trace")) == 2
    _wait(browser, "#fl-labels .barlayer .trace", 10)  # one stacked trace per digit class
    _wait(browser, "#fl-clients .barlayer .trace", 2)   # global model / after fine-tuning
    time.sleep(0.5)
    _shot(browser, artifacts, "run")


def test_run_page_curve_gains_points_while_the_run_writes(browser, board, live_run, artifacts):
    _open(browser, board, "/run?id=" + quote(live_run.dir.name))
    css = '#charts .metric-chart[data-metric="loss"] .scatterlayer .point'
    first = len(_wait(browser, css))
    url = browser.current_url
    WebDriverWait(browser, WAIT).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, css)) >= first + 4)
    assert browser.current_url == url and browser.execute_script("return performance.navigation.type") == 0
    assert browser.find_element(By.ID, "live-indicator").is_displayed()
    # every point on the chart is a complete row the writer had finished
    assert len(browser.find_elements(By.CSS_SELECTOR, css)) <= live_run.rows
    _shot(browser, artifacts, "run_live")


def test_league_views_show_ratings_over_time_and_the_payoff_heat_map(browser, board, artifacts):
    _open(browser, board, "/run?id=league-rps-20260101T000500Z-ffffff")
    _wait(browser, ".league-rating-chart .scatterlayer .trace", 6)
    systems = [c.get_attribute("data-system") for c in browser.find_elements(By.CSS_SELECTOR, ".league-rating-chart")]
    assert systems == ["Elo", "TrueSkill mu"]
    elo = browser.find_element(By.CSS_SELECTOR, '.league-rating-chart[data-system="Elo"]')
    assert len(elo.find_elements(By.CSS_SELECTOR, ".scatterlayer .point")) == 3 * 6  # 3 players x 6 iterations
    assert {"main-0", "main_exploiter-0", "league_exploiter-0"} <= set(elo.find_element(By.CSS_SELECTOR, ".legend").text.split("\n"))
    _wait(browser, "#league-payoff .hm")
    ticks = [t.text for t in browser.find_elements(By.CSS_SELECTOR, "#league-payoff .xtick text")]
    assert ticks == ["main-0", "main_exploiter-0", "league_exploiter-0"]
    assert browser.find_element(By.ID, "league-problems").text == ""
    _shot(browser, artifacts, "run_league")


def test_failed_run_shows_the_nan_debugger_message(browser, board, artifacts):
    _open(browser, board, "/run?id=ppo-diverged-20260101T000200Z-cccccc")
    panel = browser.find_element(By.ID, "failure")
    assert panel.is_displayed()
    assert browser.find_element(By.ID, "failure-message").text == NAN_MESSAGE
    assert browser.find_element(By.ID, "failure-type").text == "NonFiniteError"
    assert "last step 3" in panel.text
    _shot(browser, artifacts, "run_failed")


def test_compare_overlays_two_runs_and_diffs_their_configs(browser, board, artifacts):
    _open(browser, board, f"/compare?id={quote(IID)}&id={quote(DIR)}")
    _wait(browser, "#compare-step .scatterlayer .trace", 2)
    _wait(browser, "#compare-wall .scatterlayer .trace", 2)
    for div in ("compare-step", "compare-wall"):
        assert browser.find_element(By.ID, div).get_attribute("data-traces") == "2"
        assert len(browser.find_elements(By.CSS_SELECTOR, f"#{div} .scatterlayer .point")) == 8
    legend = browser.find_element(By.CSS_SELECTOR, "#compare-step .legend").text
    assert IID in legend and DIR in legend
    diff = {r.find_element(By.TAG_NAME, "th").text: [td.text for td in r.find_elements(By.TAG_NAME, "td")]
            for r in browser.find_elements(By.CSS_SELECTOR, "#config-diff tbody tr")}
    assert diff == {"name": ["iid", "dirichlet"], "data.partition": ["iid", "dirichlet"], "data.alpha": ["0.5", "0.3"],
                    "evaluation.personalize_epochs": ["1", "0"]}
    _shot(browser, artifacts, "compare")


def test_lineage_plots_config_values_against_final_metrics(browser, board, runs_root, artifacts):
    _open(browser, board, "/lineage?kind=fedsim")
    _wait(browser, "#parcoords .parcoords .y-axis", 3)
    titles = [t.text for t in browser.find_elements(By.CSS_SELECTOR, "#parcoords .axis-title")]
    # the axes where the two runs differ: the overridden settings and the final numbers (num_clients is equal)
    assert {"data.partition", "data.alpha", "evaluation.personalize_epochs", "test_acc", "test_loss"} <= set(titles)
    assert "data.num_clients" not in titles
    assert len(titles) == int(browser.find_element(By.ID, "parcoords").get_attribute("data-dimensions"))
    table = browser.find_elements(By.CSS_SELECTOR, "#lineage-table tbody tr")
    assert len(table) == 2
    heads = [th.text for th in browser.find_elements(By.CSS_SELECTOR, "#lineage-table thead th")]
    assert {"data.partition", "data.alpha", "data.num_clients", "clients.per_round"} <= set(heads)  # FL data settings
    status = json.loads((runs_root / DIR / "status.json").read_text())
    assert f"{status['summary']['test_acc']:.4g}" in table[1].text and "dirichlet" in table[1].text
    _shot(browser, artifacts, "lineage")


def test_profile_page_shows_primitives_memory_plan_and_trace(browser, board, runs_root, artifacts):
    _open(browser, board, "/profile?id=" + quote(IID))
    from fedarena.board.profiles import read_profiles

    (doc,) = read_profiles(runs_root / IID)
    bars = _wait(browser, "#by-primitive .barlayer .point")
    assert len(bars) == min(15, len(doc["by_primitive"]))
    labels = [t.text for t in browser.find_elements(By.CSS_SELECTOR, "#by-primitive .ytick text")]
    assert next(iter(doc["by_primitive"])) in labels  # the slowest primitive is drawn
    blocks = [b for b in doc["memory"]["blocks"] if b["offset"] is not None]
    assert len(_wait(browser, "#memory-plan .barlayer .point")) == len(blocks) > 5
    top = browser.find_elements(By.CSS_SELECTOR, "#top-equations tbody tr")
    slowest = max(doc["equations"], key=lambda e: e["seconds"])
    assert len(top) == min(25, len(doc["equations"]))
    assert top[0].find_element(By.CSS_SELECTOR, ".primitive").text == slowest["primitive"]
    assert browser.find_element(By.ID, "memory-report").text == doc["memory"]["report"]
    link = browser.find_element(By.ID, "trace-download").get_attribute("href")
    trace = browser.execute_script("return fetch(arguments[0]).then(r => r.json())", link)
    assert sum(e["cat"] == "equation" for e in trace["traceEvents"]) == len(doc["equations"])
    _shot(browser, artifacts, "profile")


def test_markup_from_a_run_folder_is_shown_as_text(browser, board, artifacts):
    for path in ("/", "/run?id=hostile", "/lineage?kind=cfr", "/compare?id=hostile&id=malformed"):
        _open(browser, board, path)
        time.sleep(0.3)
        assert browser.execute_script("return window.__xss") is None, path
        assert not browser.find_elements(By.CSS_SELECTOR, "main img[src=x]"), path
        assert len(browser.find_elements(By.TAG_NAME, "script")) == 3, path  # plotly, board.js, the JSON block
    _open(browser, board, "/run?id=hostile")
    assert browser.find_element(By.ID, "run-title").text.startswith(XSS)
    assert XSS in browser.find_element(By.ID, "config").text
    chart = _wait(browser, "#charts .metric-chart .gtitle")[0]
    assert chart.text == XSS  # a metric named with markup: Plotly's title shows it as text
    assert browser.find_element(By.ID, "log").text == XSS
    assert browser.execute_script("return window.__xss") is None
    _shot(browser, artifacts, "xss")


def test_malformed_metric_lines_are_skipped(browser, board, artifacts):
    _open(browser, board, "/run?id=malformed")
    points = _wait(browser, '#charts .metric-chart[data-metric="exploitability"] .scatterlayer .point', 5)
    time.sleep(1.5)  # a few more polls: the torn last line stays out
    points = browser.find_elements(By.CSS_SELECTOR, '#charts .metric-chart[data-metric="exploitability"] .scatterlayer .point')
    assert len(points) == 5
    assert browser.find_element(By.ID, "rows-info").text == "(5 rows, 4 malformed lines skipped)"
    _shot(browser, artifacts, "malformed")


def test_failure_panel_shows_a_real_nan_debugger_error(browser, board, runs_root):
    """With the engine's NaN debugger (``engine.debug_nans``, issue 22): a deliberate log(0) in a jitted step fails,
    the platform's status.json records the one-line message, and the run page shows it verbatim."""
    from fedarena import engine
    from fedarena.engine import ops
    from fedarena.platform.errors import is_user_error, one_line

    from .conftest import write_config, write_status

    if not hasattr(engine, "debug_nans"):
        pytest.skip("this engine has no NaN debugger yet (engine.debug_nans lands with the engine2 branch)")
    import numpy as np

    def step(x):
        return ops.sum(ops.log(x * 0.0))  # log(0) = -inf

    with engine.debug_nans(True):
        with pytest.raises(Exception) as caught:
            engine.jit(step)(np.ones(4, np.float32))
    message = one_line(caught.value)
    assert "log" in message and "test_board_browser.py" in message
    run_dir = runs_root / "nan-20260101T000400Z-eeeeee"
    write_config(run_dir, {"kind": "ppo", "name": "nan", "seed": 0})
    write_status(run_dir, {"state": "failed", "kind": "ppo", "seed": 0, "error": message,
                           "error_type": type(caught.value).__name__, "user_error": is_user_error(caught.value),
                           "last_step": None, "last_checkpoint_step": None})
    try:
        _open(browser, board, "/run?id=" + run_dir.name)
        assert browser.find_element(By.ID, "failure-message").text == message
        assert browser.find_element(By.ID, "failure-type").text == type(caught.value).__name__
    finally:
        import shutil

        shutil.rmtree(run_dir)
