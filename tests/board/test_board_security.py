"""The board under attack (issue 29), over real sockets on loopback: links out of the runs folder, FIFOs and
``/dev/zero`` in a run folder, over-long metric lines, foreign ``Host`` and ``Origin`` headers (DNS
rebinding), the access token of a board bound beyond loopback, and 200 idle connections."""

from __future__ import annotations

import http.client
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest

from fedarena.board import BoardServer, folders
from fedarena.board.access import Access, is_loopback
from fedarena.board.server import access_token

from .conftest import write_config, write_status

SECRET = "secret-" + secrets.token_hex(8)


def _request(server: BoardServer, path: str, headers: dict[str, str] | None = None,
             method: str = "GET") -> tuple[int, bytes, http.client.HTTPMessage]:
    host, port = server.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=60)
    try:
        hdrs = {"Host": f"127.0.0.1:{port}", **(headers or {})}
        conn.putrequest(method, path, skip_host=True)
        for k, v in hdrs.items():
            conn.putheader(k, v)
        conn.endheaders()
        r = conn.getresponse()
        return r.status, r.read(), r.headers
    finally:
        conn.close()


@pytest.fixture()
def serve():
    started = []

    def start(root: Path, **kw) -> BoardServer:
        server = BoardServer(root, "127.0.0.1", 0, **kw)
        server.start()
        started.append(server)
        return server

    yield start
    for s in started:
        s.shutdown()
        s.server_close()


def _png(marker: str) -> bytes:
    return b"\x89PNG\r\n\x1a\n" + marker.encode() * 4


@pytest.fixture()
def hostile_root(tmp_path) -> tuple[Path, Path]:
    """A runs folder whose run folders link every file the board reads to files outside it (holding SECRET)."""
    outside = tmp_path / "outside"
    (outside / "report").mkdir(parents=True)
    (outside / "profile").mkdir()
    (outside / "secret.txt").write_text(SECRET + "\n")
    (outside / "config.yaml").write_text(f"kind: ppo\nname: {SECRET}\n")
    (outside / "status.json").write_text(json.dumps({"state": "failed", "error": SECRET, "summary": {SECRET: 1.0}}))
    (outside / "metrics.jsonl").write_text(json.dumps({"step": 1, SECRET: 1.0}) + "\n")
    (outside / "report" / "fig.png").write_bytes(_png(SECRET))
    (outside / "report" / "index.html").write_text(f"<p>{SECRET}</p>")
    profile = {"format": 1, "name": "p", "equations": [{"primitive": SECRET, "seconds": 1.0}]}
    (outside / "profile" / "p.json").write_text(json.dumps(profile))
    (outside / "profile" / "p.trace.json").write_text(json.dumps({"traceEvents": [], "x": SECRET}))
    (outside / "payoff.json").write_text(json.dumps({"players": [SECRET, "b"], "win_rate": [[0.5, 0.5], [0.5, 0.5]]}))
    (outside / "ratings.jsonl").write_text(json.dumps({"step": 1, SECRET: 1.0}) + "\n")
    (outside / "group.json").write_text(json.dumps({"kind": "ppo", "seeds": [0], "runs": {"0": "../../outside"}}))

    root = tmp_path / "runs"
    links = root / "links"
    links.mkdir(parents=True)
    write_status(links, {"state": "running", "kind": "ppo"})  # a genuine marker, so the folder is a run
    for name in ("config.yaml", "metrics.jsonl", "run.log", "payoff.json", "ratings.jsonl", "label_histogram.npy"):
        (links / name).symlink_to(outside / ("secret.txt" if name == "run.log" else name))
    (links / "report").mkdir()
    (links / "report" / "fig.png").symlink_to(outside / "report" / "fig.png")
    (links / "report" / "index.html").symlink_to(outside / "report" / "index.html")
    (links / "profile").symlink_to(outside / "profile")  # a linked folder

    hard = root / "hard-links"  # hard links to the secret files (same file system)
    hard.mkdir()
    os.link(outside / "status.json", hard / "status.json")
    os.link(outside / "secret.txt", hard / "run.log")
    os.link(outside / "config.yaml", hard / "config.yaml")
    only_links = root / "only-links"  # every marker a link: not a readable run at all
    only_links.mkdir()
    (only_links / "status.json").symlink_to(outside / "status.json")

    (root / "linked-run").symlink_to(outside)  # a run folder that is itself a link
    group = root / "group"
    (group / "seed-0").mkdir(parents=True)
    (group / "group.json").write_text(json.dumps({"kind": "ppo", "seeds": [0, 1],
                                                  "runs": {"0": "seed-0", "1": "../../outside"}}))
    (group / "seed-0" / "metrics.jsonl").symlink_to(outside / "metrics.jsonl")
    write_status(group / "seed-0", {"state": "completed"})
    (group / "report").symlink_to(outside / "report")
    return root, outside


def test_no_file_outside_the_runs_folder_is_served(hostile_root, serve):
    root, outside = hostile_root
    server = serve(root)
    ids = ["links", "hard-links", "only-links", "linked-run", "group/seed-0", "group/seed-1", "group", "../outside",
           "links/../../outside", "group/seed-0/../../../outside", str(outside)]
    paths = ["/", "/api/runs", "/api/groups", "/lineage?kind=ppo", "/compare?" + "&".join(f"id={i}" for i in ids)]
    for i in ids:
        q = urllib.parse.quote(i, safe="")
        for route in ("/run", "/api/run", "/api/metrics", "/api/fl", "/api/league", "/profile"):
            paths.append(f"{route}?id={q}")
        paths += [f"/profile?id={q}&name=p", f"/trace?id={q}&name=p", f"/file?id={q}&path=report/fig.png",
                  f"/file?id={q}&path=report/../../outside/report/fig.png", f"/api/groups?id={q}",
                  f"/runs/{q}/report/index.html", f"/runs/{q}/report/fig.png",
                  f"/runs/{i}/report/index.html", f"/runs/{i}/report/fig.png"]
    paths += ["/runs/group/report/index.html", "/runs/group/seed-1/report/index.html", "/static/../../x",
              "/runs/links/report/../../../outside/report/index.html"]
    served = 0
    for path in paths:
        code, body, _ = _request(server, path)
        assert SECRET.encode() not in body, path
        assert code in (200, 404), (path, code)
        served += code == 200
    assert served > 20  # the pages themselves still work
    # the linked files are reported as unavailable, the run's genuine status is shown
    run = json.loads(_request(server, "/api/run?id=links")[1])
    assert run["state"] == "running" and run["log"] == ""
    page = _request(server, "/run?id=links")[1].decode()
    assert "config.yaml unavailable" in page


def test_a_link_swapped_in_after_listing_is_not_followed(tmp_path):
    """The reader opens each component with O_NOFOLLOW: a file replaced by a link between two reads is refused."""
    from fedarena.board.confined import Unreadable, read_bytes

    run = tmp_path / "run"
    run.mkdir()
    (tmp_path / "secret").write_text(SECRET)
    (run / "run.log").write_text("fine")
    assert read_bytes(run, "run.log", 100) == b"fine"
    (run / "run.log").unlink()
    (run / "run.log").symlink_to(tmp_path / "secret")
    with pytest.raises(Unreadable):
        read_bytes(run, "run.log", 100)
    with pytest.raises(Unreadable):
        read_bytes(run, "../secret", 100)
    (run / "big").write_bytes(b"x" * 101)
    with pytest.raises(Unreadable):
        read_bytes(run, "big", 100)


def _dos_root(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    zero = root / "zero-metrics"
    write_config(zero, {"kind": "ppo", "name": "zero"})
    (zero / "metrics.jsonl").symlink_to("/dev/zero")
    (zero / "run.log").symlink_to("/dev/zero")
    fifo = root / "fifo-log"
    write_config(fifo, {"kind": "ppo", "name": "fifo"})
    os.mkfifo(fifo / "run.log")
    os.mkfifo(fifo / "metrics.jsonl")
    os.mkfifo(fifo / "status.json")
    fifo_cfg = root / "fifo-config"
    fifo_cfg.mkdir()
    os.mkfifo(fifo_cfg / "config.yaml")
    long_line = root / "long-line"
    write_config(long_line, {"kind": "ppo", "name": "long"})
    with open(long_line / "metrics.jsonl", "wb") as f:
        f.write(b'{"step": 1, "a": 1.0}\n')
        f.write(b'{"step": 2, "a": "' + b"x" * (20 * 1024 * 1024) + b'"}\n')
        f.write(b'{"step": 3, "a": 3.0}\n')
    bomb = root / "yaml-bomb"
    bomb.mkdir()
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [*a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}]"
              for i in range(1, 9)]
    (bomb / "config.yaml").write_text("kind: ppo\n" + "\n".join(lines) + "\n")
    good = root / "good-20260101T000000Z-abcdef"
    write_config(good, {"kind": "ppo", "name": "good"})
    (good / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "eval_return": float(s), "env_steps": 8 * s})
                                                + "\n" for s in range(1, 4)))
    write_status(good, {"state": "completed", "kind": "ppo"})
    return root


def test_fifos_devices_and_long_lines_are_refused_without_blocking(tmp_path, serve):
    root = _dos_root(tmp_path)
    server = serve(root)
    for rid in ("zero-metrics", "fifo-log", "long-line", "yaml-bomb", "good-20260101T000000Z-abcdef"):
        for route in ("/run", "/api/run", "/api/metrics", "/api/league", "/api/fl", "/profile"):
            code, body, _ = _request(server, f"{route}?id={rid}")
            assert code == 200, (route, rid, body[:300])
    assert json.loads(_request(server, "/api/metrics?id=zero-metrics")[1])["rows"] == []
    assert json.loads(_request(server, "/api/run?id=fifo-log")[1])["log"] == ""
    # the 20 MB line is skipped unparsed, counted once; the rows around it are read
    offset, fid, rows, malformed = 0, "", [], 0
    for _ in range(100):
        d = json.loads(_request(server, f"/api/metrics?id=long-line&offset={offset}&file={fid}")[1])
        rows += d["rows"]
        malformed += d["malformed"]
        offset, fid = d["offset"], d["file"]
        if not d["more"]:
            break
    assert [r["step"] for r in rows] == [1, 3] and malformed == 1
    assert "expands to more than" in _request(server, "/run?id=yaml-bomb")[1].decode()
    runs = {r["id"]: r for r in json.loads(_request(server, "/api/runs")[1])}
    assert set(runs) == {"zero-metrics", "fifo-log", "fifo-config", "long-line", "yaml-bomb",
                         "good-20260101T000000Z-abcdef"}
    assert runs["good-20260101T000000Z-abcdef"]["state"] == "finished"


def test_metrics_are_paged(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"step": s, "loss": 1.0 / s, "pad": "p" * 100} for s in range(1, 3001)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = (run / "metrics.jsonl").read_bytes()
    chunk = folders.read_metrics_since(run, 0, "", limit=10_000)
    assert chunk.more and 9_000 < chunk.offset <= 10_000 and data[chunk.offset - 1:chunk.offset] == b"\n"
    assert [r["step"] for r in chunk.rows] == list(range(1, data[:chunk.offset].count(b"\n") + 1))
    nxt = folders.read_metrics_since(run, chunk.offset, chunk.file_id, limit=10_000)
    assert nxt.rows[0]["step"] == chunk.rows[-1]["step"] + 1 and not nxt.reset
    assert [r["step"] for r in folders.iter_metrics(run)] == list(range(1, 3001))
    tiny = folders.read_metrics_since(run, 0, "", limit=10)  # smaller than a line: the line is still read
    assert tiny.rows[0]["step"] == 1 and tiny.malformed == 0 and data[tiny.offset - 1:tiny.offset] == b"\n"
    assert [r["step"] for r in tiny.rows] == list(range(1, data[:tiny.offset].count(b"\n") + 1))


def test_one_broken_run_does_not_break_the_list(tmp_path, serve, monkeypatch):
    root = _dos_root(tmp_path)
    real = folders.run_info

    def failing(root_, run_dir):
        if run_dir.name == "long-line":
            raise RuntimeError("simulated reader failure")
        return real(root_, run_dir)

    monkeypatch.setattr(folders, "run_info", failing)
    server = serve(root)
    code, body, _ = _request(server, "/")
    assert code == 200 and b"simulated reader failure" in body and b"good-20260101T000000Z-abcdef" in body
    runs = {r["id"]: r for r in json.loads(_request(server, "/api/runs")[1])}
    assert runs["long-line"]["state"] == "error" and runs["good-20260101T000000Z-abcdef"]["state"] == "finished"


def test_foreign_host_and_origin_are_refused(tmp_path, serve):
    root = _dos_root(tmp_path)
    server = serve(root, allow_hosts=("board.lan",))
    port = server.server_address[1]
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", f"board.lan:{port}", f"LOCALHOST:{port}"):
        assert _request(server, "/", {"Host": host})[0] == 200, host
    for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1:{port + 1}", f"127.0.0.1.evil.example:{port}",
                 f"localhost:{port}@evil.example", ""):
        for path in ("/", "/api/runs", "/static/board.js", "/api/metrics?id=good-20260101T000000Z-abcdef"):
            code, body, _ = _request(server, path, {"Host": host})
            assert code == 403 and b"eval_return" not in body, (host, path)
    ok = f"http://127.0.0.1:{port}"
    assert _request(server, "/api/runs", {"Origin": ok})[0] == 200
    for origin in ("http://evil.example", "null", f"https://127.0.0.1:{port}", f"http://evil.example:{port}"):
        assert _request(server, "/api/runs", {"Origin": origin})[0] == 403, origin


def test_token_is_required_when_set_and_becomes_a_cookie(tmp_path, serve):
    root = _dos_root(tmp_path)
    token = "t0ken-" + secrets.token_urlsafe(16)
    server = serve(root, token=token)
    assert server.token_url.endswith("?token=" + token)
    for path in ("/", "/api/runs", "/static/board.js", "/run?id=good-20260101T000000Z-abcdef"):
        code, body, _ = _request(server, path)
        assert code == 403 and b"access token" in body, path
    assert _request(server, "/?token=wrong")[0] == 403
    assert _request(server, "/?token=" + token[:-1])[0] == 403
    code, body, headers = _request(server, "/?token=" + urllib.parse.quote(token))
    assert code == 200 and b"good-20260101T000000Z-abcdef" in body
    cookie = headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    jar = cookie.split(";")[0]
    assert _request(server, "/api/runs", {"Cookie": jar})[0] == 200
    assert _request(server, "/api/runs", {"Cookie": jar + "x"})[0] == 403
    assert _request(server, "/api/runs", {"Authorization": "token " + token})[0] == 200
    # the token does not lift the Host rule
    assert _request(server, "/api/runs", {"Cookie": jar, "Host": f"evil.example:{server.server_address[1]}"})[0] == 403


def test_who_needs_a_token():
    assert access_token("127.0.0.1") is None and access_token("localhost") is None and access_token("::1") is None
    generated = access_token("0.0.0.0")
    assert generated is not None and len(generated) >= 40 and access_token("0.0.0.0") != generated
    assert access_token("0.0.0.0", no_token=True) is None
    assert access_token("127.0.0.1", token="given-token") == "given-token"
    assert not is_loopback("0.0.0.0") and not is_loopback("::") and not is_loopback("192.0.2.1")
    a = Access.for_binding("0.0.0.0", 8050, None, ("My-Box",))
    assert a.host_allowed("my-box:8050") and not a.host_allowed("0.0.0.0:8050")


def test_cli_beyond_loopback_prints_a_token_url_and_requires_it(tmp_path):
    root = _dos_root(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                         os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "fedarena", "board", str(root), "--host", "0.0.0.0", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        line = proc.stdout.readline()
        m = re.search(r"at http://127\.0\.0\.1:(\d+)/\?token=([A-Za-z0-9_-]+) ", line)
        assert m, line
        port, token = int(m.group(1)), m.group(2)

        def get(path: str) -> int:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            try:
                conn.request("GET", path)
                return conn.getresponse().status
            finally:
                conn.close()

        assert get("/") == 403 and get("/?token=" + token) == 200
    finally:
        proc.terminate()
        proc.wait(10)


def _rss_peak_mb(pid: int) -> float | None:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    m = re.search(r"VmHWM:\s+(\d+) kB", text)
    return int(m.group(1)) / 1024 if m else None


def test_idle_connections_and_hostile_files_leave_the_board_answering(tmp_path):
    """A real ``fedarena board`` process: 200 idle connections held open, then every hostile run requested;
    ``/`` still answers and the process's peak resident memory stays under 300 MB."""
    root = _dos_root(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                         os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "fedarena", "board", str(root), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    idle: list[socket.socket] = []
    try:
        line = proc.stdout.readline()
        m = re.search(r"at http://127\.0\.0\.1:(\d+)/", line)
        assert m, line
        port = int(m.group(1))
        for _ in range(200):
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
            idle.append(s)
        idle[0].sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1")  # and one that stops mid-header

        def get(path: str) -> tuple[int, bytes]:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            try:
                conn.request("GET", path)
                r = conn.getresponse()
                return r.status, r.read()
            finally:
                conn.close()

        for rid in ("zero-metrics", "fifo-log", "fifo-config", "long-line", "yaml-bomb"):
            for route in ("/run", "/api/metrics", "/api/run", "/api/league"):
                get(f"{route}?id={rid}")
        code, body = get("/")
        assert code == 200 and b"good-20260101T000000Z-abcdef" in body
        threads = re.search(r"Threads:\s+(\d+)", Path(f"/proc/{proc.pid}/status").read_text()) \
            if Path(f"/proc/{proc.pid}/status").exists() else None
        if threads:  # a bounded pool, not a thread per connection
            assert int(threads.group(1)) < 40, threads.group(0)
        peak = _rss_peak_mb(proc.pid)
        if peak is not None:
            assert peak < 300, f"peak RSS {peak:.0f} MB"
    finally:
        for s in idle:
            s.close()
        proc.terminate()
        proc.wait(10)


def test_an_idle_connection_is_closed_after_the_head_timeout(tmp_path, serve):
    root = _dos_root(tmp_path)
    server = serve(root, head_timeout=1.0)
    s = socket.create_connection(server.server_address[:2], timeout=60)
    try:
        s.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1")  # never finished
        assert s.recv(1) == b""  # the board hung up (the 60 s socket timeout would raise instead)
    finally:
        s.close()
    # keep-alive: two requests on one connection, then the idle connection is closed as well
    conn = http.client.HTTPConnection(*server.server_address[:2], timeout=60)
    try:
        for _ in range(2):
            conn.request("GET", "/api/runs")
            r = conn.getresponse()
            assert r.status == 200 and json.loads(r.read())
        assert conn.sock is not None and conn.sock.recv(1) == b""
    finally:
        conn.close()


def test_cli_refuses_a_short_token(tmp_path, capsys):
    from fedarena.platform.cli import _parser, main

    args = _parser().parse_args(["board", "--allow-host", "a.lan", "--allow-host", "b.lan", "--no-token"])
    assert args.allow_hosts == ["a.lan", "b.lan"] and args.no_token and args.token is None
    assert main(["board", str(tmp_path), "--token", "short"]) == 2
    assert "--token" in capsys.readouterr().err


def test_clients_that_never_read_their_responses_hold_no_worker(tmp_path, serve):
    """12 clients ask for plotly.min.js (megabytes) and never read: more than the 8 workers, yet / answers."""
    root = _dos_root(tmp_path)
    server = serve(root)
    host, port = server.server_address[:2]
    stalled = []
    try:
        for _ in range(12):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.settimeout(30)
            s.connect((host, port))
            s.sendall(f"GET /static/plotly.min.js HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
            stalled.append(s)
        for _ in range(3):
            code, body, _ = _request(server, "/")
            assert code == 200 and b"good-20260101T000000Z-abcdef" in body
        assert server._buffered > 0  # the unread responses wait in the selector thread, not in workers
    finally:
        for s in stalled:
            s.close()
