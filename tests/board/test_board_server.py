"""The board without a browser: run-folder readers on torn / malformed / replaced metrics, lineage and config diff
against the overrides that made the runs, the HTTP endpoints (escaping, path safety, read-only), the CLI."""

from __future__ import annotations

import hashlib
import json
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from fedarena.board import folders, lineage, profiles
from fedarena.platform.checkpoint import write_atomic
from fedarena.platform.cli import _parser, main

from .conftest import NAN_MESSAGE, XSS

IID, DIR = "fedsim-iid-20260101T000000Z-aaaaaa", "fedsim-dirichlet-20260101T000100Z-bbbbbb"


def _get(board, path: str) -> tuple[int, bytes, dict]:
    try:
        with urllib.request.urlopen(board.url.rstrip("/") + path, timeout=30) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


def _tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() + f":{p.stat().st_mtime_ns}"
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.quick
def test_metrics_reader_skips_malformed_lines_and_waits_for_a_torn_one(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "a": 1.0}\nnot json\n[1]\n{"a": 2}\n{"step": true}\n{"step": 2, "a": NaN}\n{"step": 3, "a"')
    c = folders.read_metrics_since(tmp_path)
    assert [r["step"] for r in c.rows] == [1, 2] and c.malformed == 4
    assert c.offset == path.read_bytes().rfind(b"\n") + 1  # the torn line is read again next time
    with open(path, "a") as f:
        f.write(': 3.0}\n{"step": 4, "a": 4.0}\n')
    c2 = folders.read_metrics_since(tmp_path, c.offset, c.file_id)
    assert [r["step"] for r in c2.rows] == [3, 4] and c2.malformed == 0 and not c2.reset
    # a resumed run rewrites the file (atomically, shorter): the reader starts over
    write_atomic(path, b'{"step": 1, "a": 1.0}\n')
    c3 = folders.read_metrics_since(tmp_path, c2.offset, c2.file_id)
    assert c3.reset and [r["step"] for r in c3.rows] == [1]
    assert folders.finite_or_none([float("nan"), {"x": float("inf")}, 1.5]) == [None, {"x": None}, 1.5]


def test_runs_list_reads_real_runs(runs_root):
    runs = {r.id: r for r in folders.list_runs(runs_root)}
    iid = runs[IID]
    status = json.loads((runs_root / IID / "status.json").read_text())
    assert iid.kind == "fedsim" and iid.name == "iid" and iid.state == "finished" and iid.progress == 1.0
    assert iid.step == 4 and iid.total == 4 and iid.started == "2026-01-01 00:00:00"
    assert iid.metrics["test_acc"] == status["summary"]["test_acc"]
    assert runs["malformed"].state == "running" and runs["malformed"].step == 5 and runs["malformed"].total == 10
    failed = runs["ppo-diverged-20260101T000200Z-cccccc"]
    assert failed.state == "failed" and failed.error == NAN_MESSAGE and failed.progress == pytest.approx(3 / 1000)


def test_lineage_and_diff_name_exactly_the_overridden_settings(runs_root):
    configs = [folders.read_config(runs_root / d)[0] for d in (IID, DIR)]
    diff = dict(lineage.config_diff(configs))
    # the two runs were made from one config with name / partition / alpha / personalize_epochs overridden
    assert set(diff) == {"name", "data.partition", "data.alpha", "evaluation.personalize_epochs"}
    assert diff["data.partition"] == ["iid", "dirichlet"] and diff["data.alpha"] == [0.5, 0.3]
    runs = [r for r in folders.list_runs(runs_root) if r.kind == "fedsim"]
    lin = lineage.lineage("fedsim", [(r.id, r.name, r.state, folders.read_config(r.path)[0], r.metrics) for r in runs])
    assert set(lin.params) == {"data.partition", "data.alpha", "evaluation.personalize_epochs"}
    assert lin.data_params == ["data.dataset", "data.partition", "data.alpha", "data.shards_per_client", "data.beta",
                               "data.num_clients", "clients.per_round"]
    dims = {d["label"]: d for d in lin.dimensions()}
    assert dims["data.partition"]["ticktext"] == ["dirichlet", "iid"]
    assert sorted(dims["data.alpha"]["values"]) == [0.3, 0.5] and "test_acc" in dims
    assert "data.num_clients" not in dims and "data.dataset" not in dims  # equal in both runs: table only
    by_id = {r.id: r for r in runs}
    assert dims["test_acc"]["values"] == [by_id[i].metrics["test_acc"] for i in lin.plotted_runs()]


def test_profile_file_matches_the_engine_profile(runs_root):
    from fedarena import engine

    from .conftest import train_step

    (doc,) = profiles.read_profiles(runs_root / IID)
    step, args = train_step()
    graph = engine.jit(step).graph(*args)
    assert [e["primitive"] for e in doc["equations"]] == [e.prim.name for e in graph.eqns]
    plan = engine.jit(step).memory(*args)
    assert doc["memory"]["planned_bytes"] == plan.planned_bytes and doc["memory"]["report"] == plan.report()
    # no two blocks that share arena bytes are live at the same equation, unless one overwrites the other in place
    blocks = doc["memory"]["blocks"]
    for a in blocks:
        for b in blocks:
            if a is b or a["buffer"] == b["buffer"] or a["offset"] is None or b["offset"] is None:
                continue
            bytes_overlap = a["offset"] < b["offset"] + b["bytes"] and b["offset"] < a["offset"] + a["bytes"]
            assert not (bytes_overlap and a["first"] <= b["last"] and b["first"] <= a["last"]), (a, b)
    trace = json.loads((runs_root / IID / "profile" / "train_step.trace.json").read_text())
    assert sum(e["cat"] == "equation" for e in trace["traceEvents"]) == len(doc["equations"])


def test_endpoints_escape_refuse_traversal_and_never_write(board, runs_root):
    before = _tree_digest(runs_root)
    code, body, headers = _get(board, "/run?id=hostile")
    assert code == 200 and b"<script>window.__xss" not in body and b"&lt;script&gt;window.__xss" in body
    assert "script-src 'self'" in headers["Content-Security-Policy"]
    code, body, _ = _get(board, "/")
    assert code == 200 and b"<img src=x" not in body and b"&lt;img src=x" in body
    for path in ("/lineage?kind=cfr", "/compare?id=hostile&id=malformed", "/profile?id=hostile"):
        code, body, _ = _get(board, path)
        assert code == 200 and b"<script>window" not in body and b"<img src=x" not in body, path
    runs = {r["id"]: r for r in json.loads(_get(board, "/api/runs")[1])}
    assert runs["hostile"]["name"] == XSS and XSS in runs["hostile"]["metrics"]  # data kept exactly; escaped when drawn
    code, body, _ = _get(board, "/api/metrics?id=malformed")
    chunk = json.loads(body)
    assert [r["step"] for r in chunk["rows"]] == [1, 2, 3, 4, 5] and chunk["malformed"] == 4
    for bad in ("/run?id=../..", "/run?id=%2Fetc", "/file?id=" + IID + "&path=../status.json",
                "/file?id=" + IID + "&path=report/../config.yaml", "/trace?id=" + IID + "&name=../status",
                "/static/../server.py", "/nope"):
        assert _get(board, bad)[0] == 404, bad
    code, body, headers = _get(board, f"/trace?id={IID}&name=train_step")
    assert code == 200 and "attachment" in headers["Content-Disposition"] and "traceEvents" in json.loads(body)
    code, body, _ = _get(board, f"/file?id={IID}&path=report/fedsim.png")
    assert code == 200 and body[:8] == b"\x89PNG\r\n\x1a\n"
    for run in folders.list_runs(runs_root):  # every page and endpoint of every run
        for route in ("/run", "/profile", "/api/metrics", "/api/run", "/api/fl", "/api/league", "/compare"):
            assert _get(board, f"{route}?id={urllib.parse.quote(run.id)}")[0] == 200, (route, run.id)
        assert _get(board, f"/lineage?kind={urllib.parse.quote(run.kind)}")[0] == 200
    req = urllib.request.Request(board.url + "api/runs", data=b"{}", method="POST")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 405
    assert _tree_digest(runs_root) == before  # the board wrote nothing into any run folder


def test_api_fl_reads_the_arrays_the_run_saved(board, runs_root):
    import numpy as np

    d = json.loads(_get(board, f"/api/fl?id={IID}")[1])
    hist = np.load(runs_root / IID / "label_histogram.npy")
    assert np.array_equal(np.asarray(d["label_histogram"]), hist) and d["clients"] == 20
    before = np.load(runs_root / IID / "personalization.npy")[0]
    assert np.allclose([np.nan if v is None else v for v in d["personalization"]["before"]], before, equal_nan=True)


@pytest.mark.quick
def test_league_reader_accepts_its_layouts(tmp_path):
    from fedarena.board.league import league_data

    (tmp_path / "ratings.jsonl").write_text(
        '{"step": 1, "ratings": {"main": 1200, "exploiter": {"mu": 25.0, "sigma": 8}}}\n'
        '{"step": 2, "player": "main", "elo": 1250}\nbroken\n{"step": 3, "main": 1300, "exploiter": 1100}\n{"step": 4')
    (tmp_path / "payoff.json").write_text(json.dumps({"players": ["main", "exploiter"], "win_rate": [[0.5, 0.7], [0.3, 0.5]]}))
    d = league_data(tmp_path)
    assert d["ratings"] == {"rating": {"main": [[1.0, 1200.0], [2.0, 1250.0], [3.0, 1300.0]],
                                       "exploiter": [[1.0, 25.0], [3.0, 1100.0]]}}
    assert d["payoff"] == {"players": ["main", "exploiter"], "matrix": [[0.5, 0.7], [0.3, 0.5]], "label": "win rate",
                           "games": None}
    # the league kind's layout: elo/<player> and trueskill/<player> metric columns, payoff.json with extras
    (tmp_path / "ratings.jsonl").unlink()
    rows = [{"step": 1, "elo/main-0": 1000.0, "trueskill/main-0": 25.0, "elo": [1000.0]},
            {"step": 2, "elo/main-0": 1010.0, "elo/exploiter-0": 990.0, "trueskill/main-0": 26.0}]
    (tmp_path / "payoff.json").write_text(json.dumps({"players": ["main-0", "exploiter-0"], "win_rate": [[0.5, 0.6], [0.4, 0.5]],
                                                      "games": [[0, 3], [3, 0]], "ratings": {}}))
    d = league_data(tmp_path, rows)
    assert d["ratings"] == {"Elo": {"main-0": [[1.0, 1000.0], [2.0, 1010.0]], "exploiter-0": [[2.0, 990.0]]},
                            "TrueSkill mu": {"main-0": [[1.0, 25.0], [2.0, 26.0]]}}
    assert d["ratings_source"] == "metrics.jsonl" and d["payoff"]["players"] == ["main-0", "exploiter-0"]
    assert d["payoff"]["matrix"] == [[None, 0.6], [0.4, None]]  # no games on the diagonal: blank, not 0.5
    (tmp_path / "payoff.json").write_text('{"win_rate": [[0.5, 0.7]]}')
    assert league_data(tmp_path)["problems"] == ["payoff.json: the matrix is not a square table of numbers"]


def test_cli_board_defaults_to_localhost_and_rejects_a_missing_folder(tmp_path, capsys):
    args = _parser().parse_args(["board"])
    assert args.host == "127.0.0.1" and args.runs_dir == "runs"
    assert main(["board", str(tmp_path / "missing")]) == 2
    assert "not a folder" in capsys.readouterr().err


def test_seed_groups_list_their_seed_runs(tmp_path):
    group = tmp_path / "fedsim-sweep-20260101T000000Z-123456"
    (group / "logs").mkdir(parents=True)
    (group / "group.json").write_text(json.dumps({"kind": "fedsim", "seeds": [0, 1], "state": "completed"}))
    (group / "config.yaml").write_text("kind: fedsim\nseeds: [0, 1]\n")
    for s in (0, 1):
        (group / f"seed-{s}").mkdir()
        (group / f"seed-{s}" / "config.yaml").write_text(f"kind: fedsim\nseed: {s}\nrounds: 2\n")
        (group / f"seed-{s}" / "status.json").write_text('{"state": "completed", "summary": {"test_acc": 0.5}}')
    runs = folders.list_runs(tmp_path)
    assert sorted(r.id for r in runs) == [f"{group.name}/seed-0", f"{group.name}/seed-1"]
    assert all(r.group == group.name and r.state == "finished" for r in runs)
    assert folders.resolve_run(tmp_path, f"{group.name}/seed-1") == (group / "seed-1").resolve()


def test_fedarena_board_command_serves_the_runs_folder(runs_root):
    """The real command in a subprocess: it prints where it listens (port 0: a free one) and serves the list."""
    import re
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "fedarena", "board", str(runs_root), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = proc.stdout.readline()
        m = re.search(r"at (http://127\.0\.0\.1:\d+/)", line)
        assert m, line
        with urllib.request.urlopen(m.group(1), timeout=30) as r:
            page = r.read().decode()
        assert r.status == 200 and IID in page and DIR in page
    finally:
        proc.terminate()
        proc.wait(10)
