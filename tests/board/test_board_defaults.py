"""Default curves by kind and multi-seed group rows (issue 30 item 7), on real runs: a two-seed PPO group on
CartPole (returns against environment steps) and an XFP run on Kuhn poker (exploitability); the band is
checked against a closed form and against the seeds' own metric files."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from fedarena.board import BoardServer, curves, folders

from .conftest import ROOT, write_config, write_status

PPO = {"total_steps": 1024, "eval.every": 512, "eval.episodes": 2, "target_return": None}
GROUP = "ppo-group"


def _get(server: BoardServer, path: str) -> tuple[int, bytes, dict]:
    try:
        with urllib.request.urlopen(server.url.rstrip("/") + path, timeout=60) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def real_root(tmp_path_factory) -> Path:
    import fedarena

    from fedarena.platform.groups import render_group, seed_dir

    root = tmp_path_factory.mktemp("defaults")
    # a seed group as fedarena.platform.groups writes it (group.json, seed-<s>/, report/), its seed runs made
    # in this process rather than by one subprocess each (the same runs, without two interpreter start-ups)
    group = root / GROUP
    for s in (0, 1):
        fedarena.run(ROOT / "experiments" / "ppo_cartpole.yaml", {**PPO, "seed": s}, out=seed_dir(group, s), report=False)
    (group / "config.yaml").write_text((seed_dir(group, 0) / "config.yaml").read_text())
    (group / "group.json").write_text(json.dumps({"kind": "ppo", "seeds": [0, 1], "runs": {"0": "seed-0", "1": "seed-1"},
                                                  "state": "completed"}))
    render_group(group)
    fedarena.run(ROOT / "experiments" / "kuhn_xfp.yaml", {"iterations": 5}, out=root / "xfp-kuhn", report=False)
    return root


@pytest.fixture(scope="module")
def server(real_root):
    s = BoardServer(real_root, "127.0.0.1", 0, poll_seconds=0.25)
    s.start()
    yield s
    s.shutdown()
    s.server_close()


def test_default_curve_picks_the_names_the_kinds_log():
    assert curves.for_kind("ppo").pick(["loss", "episode_return", "env_steps", "eval_return"]) == \
        ["eval_return", "episode_return"]
    assert curves.for_kind("psro").pick(["nash/exploitability", "uniform/exploitability", "nash/solver_time"]) == \
        ["nash/exploitability", "uniform/exploitability"]
    assert curves.for_kind("nfsp").pick(["seed0/exploitability", "seed0/episodes"]) == ["seed0/exploitability"]
    assert curves.for_kind("fedavg_table").pick(["rounds_to_target", "final_test_acc"]) == ["final_test_acc"]
    assert curves.for_kind("fedsim").pick(["bytes_up", "test_acc", "client_acc_mean"]) == ["test_acc"]
    assert curves.for_kind("league") is None
    assert {k for k, c in curves.BY_KIND.items() if c is curves.RETURNS} == {"ppo", "dqn", "impala"}
    assert {k for k, c in curves.BY_KIND.items() if c is curves.EXPLOITABILITY} == {"xfp", "cfr", "psro", "nfsp",
                                                                                     "psro_rl"}
    assert {k for k, c in curves.BY_KIND.items() if c is curves.ACCURACY} == {"fedsim", "fedavg_grpc", "fedavg_table"}


def test_band_of_linear_curves_matches_the_closed_form(tmp_path):
    """Seeds logging eval_return = a_s * env_steps: the band is mean(a) x, min(a) x, max(a) x at every x."""
    slopes = [0.5, 1.0, 2.5]
    dirs = []
    for s, a in enumerate(slopes):
        d = tmp_path / f"seed-{s}"
        write_config(d, {"kind": "ppo", "seed": s})
        (d / "metrics.jsonl").write_text("".join(json.dumps({"step": i, "env_steps": 100 * i, "eval_return": a * 100 * i,
                                                             "loss": 1.0}) + "\n" for i in range(1, 11)))
        dirs.append(d)
    b = curves.group_band(dirs, "ppo")
    assert b.metric == "eval_return" and b.x == "env_steps" and b.seeds == 3
    grid = np.asarray(b.grid)
    assert grid[0] == 100 and grid[-1] == 1000
    np.testing.assert_allclose(b.mean, np.mean(slopes) * grid, rtol=1e-12)
    np.testing.assert_allclose(b.low, min(slopes) * grid, rtol=1e-12)
    np.testing.assert_allclose(b.high, max(slopes) * grid, rtol=1e-12)


def test_group_row_has_the_band_of_returns_over_seeds_and_its_report(server, real_root):
    (g,) = json.loads(_get(server, "/api/groups")[1])
    assert g["id"] == GROUP and g["kind"] == "ppo" and g["state"] == "finished"
    assert [s["id"] for s in g["seeds"]] == [f"{GROUP}/seed-0", f"{GROUP}/seed-1"]
    band = g["band"]
    assert band["metric"] == "eval_return" and band["x"] == "env_steps" and band["seeds"] == 2
    # oracle: every seed ends at the same env_steps, so the band's last point is the seeds' last eval_return
    finals = [[r for r in _rows(real_root / GROUP / f"seed-{s}") if "eval_return" in r][-1] for s in (0, 1)]
    assert {r["env_steps"] for r in finals} == {band["grid"][-1]}
    vals = [r["eval_return"] for r in finals]
    assert band["final"] == pytest.approx({"mean": np.mean(vals), "min": min(vals), "max": max(vals)})
    assert band["svg"]["band"] and band["svg"]["mean"]
    code, body, headers = _get(server, g["report"])
    assert code == 200 and b"seeds.png" in body and headers["Content-Security-Policy"].startswith("sandbox")
    code, body, _ = _get(server, f"/runs/{GROUP}/report/seeds.png")
    assert code == 200 and body[:8] == b"\x89PNG\r\n\x1a\n"
    page = _get(server, "/")[1].decode()
    assert f'data-id="{GROUP}"' in page and f"/runs/{GROUP}/report/index.html" in page
    runs = {r["id"]: r for r in json.loads(_get(server, "/api/runs")[1])}
    seed0 = runs[f"{GROUP}/seed-0"]
    assert seed0["group"] == GROUP and seed0["env_steps"] == 1024 and seed0["progress_text"].startswith("1024 / 1024")


def test_run_pages_default_to_the_kinds_curve(server):
    page = _get(server, f"/run?id={GROUP}/seed-0")[1].decode()
    data = json.loads(page.split('id="board-data">', 1)[1].split("</script>", 1)[0])
    assert data["curve"]["x"] == "env_steps" and data["curve"]["names"][:2] == ["eval_return", "episode_return"]
    assert 'value="env_steps" checked' in page
    page = _get(server, "/run?id=xfp-kuhn")[1].decode()
    data = json.loads(page.split('id="board-data">', 1)[1].split("</script>", 1)[0])
    assert data["curve"]["quantity"] == "exploitability" and 'value="step" checked' in page
    cmp = _get(server, f"/compare?id={GROUP}/seed-0&id={GROUP}/seed-1")[1].decode()
    data = json.loads(cmp.split('id="board-data">', 1)[1].split("</script>", 1)[0])
    assert data["curve"]["x"] == "env_steps"
    mixed = _get(server, f"/compare?id={GROUP}/seed-0&id=xfp-kuhn")[1].decode()
    assert json.loads(mixed.split('id="board-data">', 1)[1].split("</script>", 1)[0])["curve"] is None


def test_browser_shows_the_band_and_the_default_curves(browser, server, artifacts):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, 60)
    browser.get(server.url)
    poly = wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, f'#groups tr[data-id="{GROUP}"] svg polygon'))
    assert len(poly[0].get_attribute("points").split()) > 10
    cell = browser.find_element(By.CSS_SELECTOR, f'#groups tr[data-id="{GROUP}"] .band')
    assert cell.get_attribute("data-metric") == "eval_return" and "environment steps" in cell.text
    browser.save_screenshot(str(artifacts / "groups.png"))
    browser.get(server.url + f"run?id={GROUP}/seed-0")
    charts = wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".metric-chart .main-svg")) >= 2
                        and d.find_elements(By.CSS_SELECTOR, ".metric-chart"))
    assert {c.get_attribute("data-metric") for c in charts} == {"eval_return", "episode_return"}
    assert "environment steps" in charts[0].text
    browser.save_screenshot(str(artifacts / "run-ppo.png"))
    browser.get(server.url + f"compare?id={GROUP}/seed-0&id={GROUP}/seed-1")
    wait.until(lambda d: d.find_element(By.ID, "compare-step").get_attribute("data-x"))
    div = browser.find_element(By.ID, "compare-step")
    assert div.get_attribute("data-x") == "env_steps" and div.get_attribute("data-metric") == "eval_return"
    assert div.get_attribute("data-traces") == "2"


def test_a_group_with_an_unreadable_seed_still_lists(tmp_path):
    group = tmp_path / "g"
    for s in (0, 1):
        write_config(group / f"seed-{s}", {"kind": "xfp", "seed": s})
        write_status(group / f"seed-{s}", {"state": "completed"})
    (group / "seed-0" / "metrics.jsonl").write_text('{"step": 1, "exploitability": 0.5}\n{"step": 2, "exploitability": 0.25}\n')
    (group / "seed-1" / "metrics.jsonl").symlink_to("/dev/zero")
    (group / "group.json").write_text(json.dumps({"kind": "xfp", "seeds": [0, 1], "runs": {"0": "seed-0", "1": "seed-1"},
                                                  "state": "completed"}))
    (g,) = folders.list_groups(tmp_path)
    b = curves.group_band([d for _, d in g.seeds], g.kind)
    assert b.metric == "exploitability" and b.seeds == 1 and b.final() == (0.25, 0.25, 0.25)
