"""Run folders for the board's tests, made by real runs (two few-round fedsim runs, an engine profile of a real
training step) and by writing the files the platform writes (a live run, a failed run, hostile and
malformed contents); a board server over them; a headless Chromium driven by Selenium."""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
import yaml

from fedarena.platform.checkpoint import write_atomic

ROOT = Path(__file__).resolve().parents[2]
FEDSIM = {"data.num_clients": 20, "clients.per_round": 5, "rounds": 4, "model.hidden": [16]}
XSS = "<script>window.__xss = 1</script><img src=x onerror=\"window.__xss = 2\">"
# the form of engine.NonFiniteError's message (engine.debug_nans): primitive, output, source line, equation, inputs
NAN_MESSAGE = ("log produced 4 Inf in 4 elements at experiments/train.py:41 (equation 7 of its compiled graph); "
               "inputs: #0 float32[4] min=0 max=0 mean=0 nan=0 inf=0")


def write_status(run_dir: Path, status: dict) -> None:
    """``status.json`` as :func:`fedarena.platform.runs._write_status` writes it."""
    write_atomic(run_dir / "status.json", json.dumps(status, indent=2).encode())


def write_config(run_dir: Path, config: dict) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")


def train_step():
    """A real engine training step (MLP, cross-entropy, Adam) and its arguments."""
    from fedarena import engine
    from fedarena.engine import nn, ops, optim

    mlp = nn.MLP([8, 32, 32, 4], activation="tanh")
    opt = optim.adam(1e-3)

    def step(p, s, x, y):
        loss, g = engine.value_and_grad(lambda p: ops.cross_entropy(mlp.apply(p, x), y))(p)
        p, s = opt.update(g, s, p)
        return p, s, loss

    p = mlp.init(0)
    rng = np.random.default_rng(0)
    return step, (p, opt.init(p), rng.standard_normal((16, 8)).astype(np.float32), rng.integers(0, 4, 16))


@pytest.fixture(scope="session")
def runs_root(tmp_path_factory) -> Path:
    """A runs folder: fedsim iid (with report, personalization and an engine profile), fedsim Dirichlet(0.3),
    a failed run with the NaN debugger's message, a run with markup in its name/config/metric names, and a
    run with malformed metric lines."""
    import fedarena
    from fedarena.board.record import record_profile

    root = tmp_path_factory.mktemp("runs")
    cfg = ROOT / "experiments" / "fedsim_digits.yaml"
    fedarena.run(cfg, {**FEDSIM, "name": "iid", "data.partition": "iid", "evaluation.personalize_epochs": 1},
                 out=root / "fedsim-iid-20260101T000000Z-aaaaaa")
    fedarena.run(cfg, {**FEDSIM, "name": "dirichlet", "data.partition": "dirichlet", "data.alpha": 0.3,
                       "evaluation.personalize_epochs": 0},
                 out=root / "fedsim-dirichlet-20260101T000100Z-bbbbbb", report=False)
    step, args = train_step()
    record_profile(root / "fedsim-iid-20260101T000000Z-aaaaaa", step, *args, name="train_step", repeat=2)

    failed = root / "ppo-diverged-20260101T000200Z-cccccc"
    write_config(failed, {"kind": "ppo", "name": "diverged", "seed": 0, "total_steps": 1000})
    with open(failed / "metrics.jsonl", "w") as f:
        for s in range(1, 4):
            f.write(json.dumps({"step": s, "loss": 1.0 / s, "wall_time": 0.1 * s}) + "\n")
    (failed / "run.log").write_text("2026-01-01 00:02:00 INFO starting run in x\n"
                                    "2026-01-01 00:02:01 DEBUG run failed: " + NAN_MESSAGE + "\n"
                                    "Traceback (most recent call last):\n  ...\nNonFiniteError: " + NAN_MESSAGE + "\n")
    write_status(failed, {"state": "failed", "kind": "ppo", "seed": 0, "error": NAN_MESSAGE,
                          "error_type": "NonFiniteError", "user_error": True, "last_step": 3,
                          "last_checkpoint_step": None})

    hostile = root / "hostile"
    write_config(hostile, {"kind": "cfr", "name": XSS, "seed": 0, "game": XSS, "iterations": 3})
    with open(hostile / "metrics.jsonl", "w") as f:
        for s in range(1, 4):
            f.write(json.dumps({"step": s, XSS: float(s), "wall_time": 0.1 * s}) + "\n")
    (hostile / "run.log").write_text(XSS + "\n")
    write_status(hostile, {"state": "completed", "kind": "cfr", "seed": 0, "summary": {XSS: 3.0}})

    # the league kind's files (fedarena/marl/league/experiment.py): elo/<player> and trueskill/<player> per
    # iteration, payoff.json with players, win_rate, games and ratings
    lg = root / "league-rps-20260101T000500Z-ffffff"
    players = ["main-0", "main_exploiter-0", "league_exploiter-0"]
    write_config(lg, {"kind": "league", "name": "rps", "seed": 0, "game": "rps", "iterations": 6})
    with open(lg / "metrics.jsonl", "w") as f:
        for it in range(1, 7):
            row = {"step": it, "league_size": 3 + it // 2, "elo": [1500.0 + 10 * it * k for k in range(3)]}
            row.update({f"elo/{p}": 1500.0 + 10 * it * k for k, p in enumerate(players)})
            row.update({f"trueskill/{p}": 25.0 + it * k for k, p in enumerate(players)})
            f.write(json.dumps({**row, "wall_time": 0.5 * it}) + "\n")
    (lg / "payoff.json").write_text(json.dumps({
        "players": players, "win_rate": [[0.5, 0.4, 0.5], [0.6, 0.5, 0.7], [0.5, 0.3, 0.5]],
        "games": [[10, 20, 0], [20, 0, 5], [0, 5, 0]], "ratings": {p: {"elo": 1500.0} for p in players}}))
    write_status(lg, {"state": "completed", "kind": "league", "seed": 0, "summary": {"league_size": 6}})

    broken = root / "malformed"
    write_config(broken, {"kind": "xfp", "name": "malformed", "seed": 0, "iterations": 10})
    good = [{"step": s, "exploitability": 1.0 / s, "wall_time": 0.01 * s} for s in range(1, 6)]
    lines = [json.dumps(good[0]), "{not json", json.dumps(good[1]), "[1, 2, 3]", json.dumps({"no_step": 1}),
             json.dumps(good[2]), "\x00\xff garbage", json.dumps(good[3]), json.dumps(good[4]),
             '{"step": 6, "exploitability": 0.1']  # the last line torn mid-write
    (broken / "metrics.jsonl").write_text("\n".join(lines), encoding="utf-8")
    write_status(broken, {"state": "running", "kind": "xfp", "seed": 0})
    return root


class LiveRun:
    """A run being written: a background thread appends metric rows (each written in two pieces, so the board
    also sees torn lines) until stopped."""

    def __init__(self, run_dir: Path, interval: float = 0.25):
        self.dir, self.interval = run_dir, interval
        self.stop = threading.Event()
        self.rows = 0
        write_config(run_dir, {"kind": "ppo", "name": "live", "seed": 0, "total_steps": 400})
        write_status(run_dir, {"state": "running", "kind": "ppo", "seed": 0})
        (run_dir / "run.log").write_text("INFO starting run\n", encoding="utf-8")
        self.thread = threading.Thread(target=self._write, daemon=True)

    def _write(self) -> None:
        step = 0
        with open(self.dir / "metrics.jsonl", "a", encoding="utf-8") as f:
            while not self.stop.is_set() and step < 400:
                step += 1
                line = json.dumps({"step": step, "loss": 2.0 * 0.97 ** step, "return": float(step), "wall_time": 0.5 * step})
                f.write(line[:10])
                f.flush()
                self.stop.wait(self.interval / 2)
                f.write(line[10:] + "\n")
                f.flush()
                self.rows = step
                self.stop.wait(self.interval / 2)

    def __enter__(self) -> "LiveRun":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(5)
        write_status(self.dir, {"state": "completed", "kind": "ppo", "seed": 0, "summary": {"return": float(self.rows)}})


@pytest.fixture()
def live_run(runs_root):
    run_dir = runs_root / "ppo-live-20260101T000300Z-dddddd"
    run_dir.mkdir()
    with LiveRun(run_dir) as live:
        yield live
    shutil.rmtree(run_dir)


@pytest.fixture(scope="session")
def board(runs_root):
    from fedarena.board import BoardServer

    server = BoardServer(runs_root, "127.0.0.1", 0, poll_seconds=0.25)
    server.start()
    yield server
    server.shutdown()
    server.server_close()


def _browser_paths() -> tuple[str | None, str | None]:
    chromium = next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")) if p), None)
    driver = shutil.which("chromedriver")
    return chromium, driver


@pytest.fixture(scope="session")
def browser():
    """Headless Chromium (Debian's ``chromium`` + ``chromium-driver``); skips when either is missing."""
    chromium, driver_path = _browser_paths()
    if chromium is None or driver_path is None:
        pytest.skip("no chromium / chromedriver on PATH (apt-get install -y chromium chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1400,1000",
                "--enable-unsafe-swiftshader", "--use-angle=swiftshader"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=opts)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory) -> Path:
    """Where screenshots go: ``$FEDARENA_ARTIFACTS`` if set (CI keeps it), else a pytest temporary folder."""
    given = os.environ.get("FEDARENA_ARTIFACTS")
    path = Path(given) / "board" if given else tmp_path_factory.mktemp("board-screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path
