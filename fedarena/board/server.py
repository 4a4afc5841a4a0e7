"""The board's HTTP server: HTML pages (Jinja2, autoescaped) and JSON endpoints over a folder of runs.

Built on the standard library's ``ThreadingHTTPServer``; every request only reads the run folders
(:mod:`fedarena.board.folders`), so the board may watch runs that are being written.  Pages:

``/``                     runs list (kind, name, state, progress, start time, final numbers; filter and sort)
``/run?id=RUN``           one run: live curves, failure panel, config, report figures, checkpoints, log tail,
                          and the FL or league views when the run has their data
``/compare?id=A&id=B``    curves of several runs overlaid by step and by wall time, and their config diff
``/lineage?kind=K``       config values vs final metrics over the runs of a kind (table, parallel coordinates)
``/profile?id=RUN``       the engine profiles recorded in a run (:mod:`fedarena.board.profiles`)

JSON: ``/api/runs``, ``/api/metrics?id=&offset=&file=`` (rows appended since ``offset``), ``/api/run?id=``
(status and log tail), ``/api/fl?id=``, ``/api/league?id=``; files: ``/file?id=&path=report/...`` (report
figures), ``/trace?id=&name=`` (a profile's Chrome trace, as a download), ``/static/...`` (the board's script,
style sheet and Plotly's own ``plotly.min.js`` from the ``plotly`` package, so no CDN is needed).

Everything taken from a run folder reaches the page through Jinja2's autoescaping or as JSON in a
``<script type="application/json">`` block (``tojson`` escapes ``<``, ``>``, ``&`` and ``'``), and the
Content-Security-Policy allows no inline script.
"""

from __future__ import annotations

import json
import logging
import math
import mimetypes
import re
import threading
from functools import cached_property
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable
from urllib.parse import parse_qs, urlsplit

import jinja2

from fedarena.board import fl, folders, league, lineage, profiles

STATIC = Path(__file__).with_name("static")
TEMPLATES = Path(__file__).with_name("templates")
CSP = ("default-src 'self'; script-src 'self' 'unsafe-eval'; style-src 'self' 'unsafe-inline'; "
       "img-src 'self' data: blob:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'")
# 'unsafe-eval': plotly.js builds its WebGL shaders (parcoords) with Function(); no inline script is allowed
MAX_COMPARE = 12
logger = logging.getLogger("fedarena.board")


def plotly_js() -> Path:
    """``plotly.min.js`` shipped inside the ``plotly`` Python package."""
    import plotly

    path = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: plotly.min.js is missing from the plotly package")
    return path


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}" if math.isfinite(v) else str(v)
    return str(v)


def _bytes(n: Any) -> str:
    if not folders.is_number(n):
        return "-"
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000.0
    return str(n)


class NotFound(Exception):
    pass


class Board:
    """The pages and endpoints over one runs folder; :class:`BoardServer` serves it over HTTP."""

    def __init__(self, root: str | Path, poll_seconds: float = 1.0):
        root = Path(root).resolve()
        self.root = root
        self.poll_seconds = float(poll_seconds)
        """how often a live page asks for new rows (the runs list: 5 times as long)"""
        self.env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=True,
                                      undefined=jinja2.StrictUndefined)
        self.env.filters["fmt"] = _fmt
        self.env.filters["bytes"] = _bytes
        self.env.policies["json.dumps_kwargs"] = {"sort_keys": False, "allow_nan": False}

    # -- helpers
    def _run(self, q: dict[str, list[str]]) -> tuple[str, Path]:
        run_id = (q.get("id") or [""])[0]
        try:
            return run_id, folders.resolve_run(self.root, run_id)
        except folders.RunNotFound as exc:
            raise NotFound(str(exc)) from None

    def page(self, template: str, data: Any, **context: Any) -> str:
        """Render ``template``; ``data`` goes to the page's script as JSON (NaN and infinities as null)."""
        data = {**folders.finite_or_none(data), "poll_ms": int(self.poll_seconds * 1000)}
        return self.env.get_template(template).render(root=str(self.root), data=data, **context)

    # -- pages
    def runs_page(self, q: dict[str, list[str]]) -> str:
        runs = folders.list_runs(self.root)
        kinds = sorted({r.kind for r in runs})
        return self.page("runs.html", runs=runs, kinds=kinds, profiled={r.id for r in runs if profiles.has_profiles(r.path)},
                         data={"runs": len(runs)})

    def run_page(self, q: dict[str, list[str]]) -> str:
        run_id, path = self._run(q)
        info = folders.run_info(self.root, path)
        config, config_text, config_problem = folders.read_config(path)
        status = folders.status(path)
        data = {"id": run_id, "state": info.state, "fl": fl.is_fl_run(path, info.kind),
                "league": league.has_league_files(path, info.kind),
                "summary_keys": [k for k, v in (status.get("summary") or {}).items() if folders.is_number(v)]
                if isinstance(status.get("summary"), dict) else []}
        return self.page("run.html", run=info, status=status, config_text=config_text, config_problem=config_problem,
                         figures=folders.figures(path), checkpoints=folders.checkpoints(path),
                         log=folders.log_tail(path), profiles=profiles.read_profiles(path), data=data)

    def compare_page(self, q: dict[str, list[str]]) -> str:
        ids = list(dict.fromkeys(q.get("id", [])))[:MAX_COMPARE]
        infos, configs, missing = [], [], []
        for run_id in ids:
            try:
                path = folders.resolve_run(self.root, run_id)
            except folders.RunNotFound:
                missing.append(run_id)
                continue
            infos.append(folders.run_info(self.root, path))
            configs.append(folders.read_config(path)[0])
        diff = [(k, [lineage.display(v) for v in vals]) for k, vals in lineage.config_diff(configs)] if infos else []
        data = {"runs": [{"id": r.id, "label": f"{r.name or r.kind} ({r.id})", "state": r.state,
                          "summary_keys": list(r.metrics)} for r in infos]}
        return self.page("compare.html", runs=infos, diff=diff, missing=missing, all_runs=folders.list_runs(self.root),
                         data=data)

    def lineage_page(self, q: dict[str, list[str]]) -> str:
        runs = folders.list_runs(self.root)
        kinds = sorted({r.kind for r in runs})
        kind = (q.get("kind") or [""])[0] or (kinds[0] if kinds else "")
        of_kind = sorted((r for r in runs if r.kind == kind), key=lambda r: (r.started_ts, r.id))
        lin = lineage.lineage(kind, [(r.id, r.name, r.state, folders.read_config(r.path)[0], r.metrics)
                                     for r in of_kind])
        data = {"kind": kind, "dimensions": lin.dimensions(), "runs": lin.plotted_runs(),
                "color": lin.metrics[0] if lin.metrics else None}
        return self.page("lineage.html", kinds=kinds, kind=kind, lin=lin, display=lineage.display,
                         missing=lineage.MISSING, data=data)

    def profile_page(self, q: dict[str, list[str]]) -> str:
        run_id, path = self._run(q)
        found = profiles.read_profiles(path)
        name = (q.get("name") or [""])[0] or (found[0]["name"] if found else "")
        chosen = next((p for p in found if p["name"] == name), None)
        info = folders.run_info(self.root, path)
        data = {"id": run_id, "profile": chosen and {k: chosen.get(k) for k in ("by_primitive", "memory", "lines")}}
        top = sorted(chosen["equations"], key=lambda e: -e["seconds"])[:25] if chosen else []
        total = sum(e["seconds"] for e in chosen["equations"]) if chosen else 0.0
        lines = sorted(chosen.get("lines") or [], key=lambda kv: -kv[1])[:15] if chosen else []
        return self.page("profile.html", run=info, profiles=found, chosen=chosen, top=top, total=total or 1e-30,
                         lines=lines, data=data)

    # -- JSON
    def api_runs(self, q: dict[str, list[str]]) -> Any:
        return [{"id": r.id, "kind": r.kind, "name": r.name, "state": r.state, "step": r.step, "total": r.total,
                 "progress": r.progress, "started": r.started, "metrics": folders.finite_or_none(r.metrics),
                 "error": r.error} for r in folders.list_runs(self.root)]

    def api_metrics(self, q: dict[str, list[str]]) -> Any:
        _, path = self._run(q)
        try:
            offset = max(0, int((q.get("offset") or ["0"])[0]))
        except ValueError:
            offset = 0
        chunk = folders.read_metrics_since(path, offset, (q.get("file") or [""])[0])
        return {"rows": folders.finite_or_none(chunk.rows), "offset": chunk.offset, "file": chunk.file_id,
                "malformed": chunk.malformed, "reset": chunk.reset}

    def api_run(self, q: dict[str, list[str]]) -> Any:
        run_id, path = self._run(q)
        info = folders.run_info(self.root, path)
        status = folders.status(path)
        return {"id": run_id, "state": info.state, "step": info.step, "total": info.total, "progress": info.progress,
                "error": status.get("error"), "error_type": status.get("error_type"),
                "log": folders.log_tail(path), "checkpoints": folders.checkpoints(path)}

    def api_fl(self, q: dict[str, list[str]]) -> Any:
        return fl.fl_data(self._run(q)[1])

    def api_league(self, q: dict[str, list[str]]) -> Any:
        _, path = self._run(q)
        rows = folders.read_metrics_since(path).rows
        return league.league_data(path, rows)

    # -- files
    def run_file(self, q: dict[str, list[str]]) -> tuple[Path, str, str | None]:
        _, path = self._run(q)
        try:
            f = folders.file_in(path, (q.get("path") or [""])[0], ("report",))
        except folders.RunNotFound as exc:
            raise NotFound(str(exc)) from None
        ctype = folders.IMAGE_TYPES.get(f.suffix.lower())
        if ctype is None:
            raise NotFound(f"{f.name}: not a figure")
        return f, ctype, None

    def trace_file(self, q: dict[str, list[str]]) -> tuple[Path, str, str | None]:
        run_id, path = self._run(q)
        name = (q.get("name") or [""])[0]
        f = profiles.trace_path(path, name)
        if f is None:
            raise NotFound(f"profile {name!r}: no Chrome trace in this run")
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", path.name)  # a folder name must not reach the header raw
        return f, "application/json", f"{safe}-{name}.trace.json"

    def static_file(self, name: str) -> tuple[Path, str, str | None]:
        if name == "plotly.min.js":
            return plotly_js(), "text/javascript", None
        f = STATIC / name
        if "/" in name or not f.is_file():
            raise NotFound(f"/static/{name}: no such file")
        return f, mimetypes.guess_type(f.name)[0] or "application/octet-stream", None

    @cached_property
    def routes(self) -> dict[str, tuple[str, Callable[[dict[str, list[str]]], Any]]]:
        return {"/": ("html", self.runs_page), "/run": ("html", self.run_page), "/compare": ("html", self.compare_page),
                "/lineage": ("html", self.lineage_page), "/profile": ("html", self.profile_page),
                "/api/runs": ("json", self.api_runs), "/api/metrics": ("json", self.api_metrics),
                "/api/run": ("json", self.api_run), "/api/fl": ("json", self.api_fl),
                "/api/league": ("json", self.api_league), "/file": ("file", self.run_file),
                "/trace": ("file", self.trace_file)}


class _Handler(BaseHTTPRequestHandler):
    server: "BoardServer"
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        logger.debug("%s %s", self.address_string(), format % args)

    def _send(self, code: int, body: bytes, ctype: str, extra: dict[str, str] | None = None,
              cache: bool = False) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Security-Policy", CSP)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("Cache-Control", "max-age=3600" if cache else "no-store")
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, code: int, message: str) -> None:
        board = self.server.board
        body = board.page("error.html", code=code, message=message, data={}).encode()
        self._send(code, body, "text/html; charset=utf-8")

    def do_HEAD(self) -> None:  # noqa: N802 - http.server's naming
        self.do_GET()

    def do_GET(self) -> None:  # noqa: N802
        url = urlsplit(self.path)
        q = parse_qs(url.query)
        board = self.server.board
        try:
            if url.path.startswith("/static/"):
                self._file(*board.static_file(url.path[len("/static/"):]), cache=True)
                return
            route = board.routes.get(url.path)
            if route is None:
                raise NotFound(f"{url.path}: no such page")
            kind, fn = route
            result = fn(q)
            if kind == "html":
                self._send(200, result.encode(), "text/html; charset=utf-8")
            elif kind == "json":
                body = json.dumps(result, allow_nan=False, default=str).encode()
                self._send(200, body, "application/json")
            else:
                self._file(*result)
        except NotFound as exc:
            self._error(404, str(exc))
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception as exc:  # a bad run folder must not stop the board: answer 500, keep serving
            logger.exception("board: %s failed", url.path)
            try:
                self._error(500, f"{type(exc).__name__}: {exc}")
            except Exception:  # noqa: BLE001 - the connection itself is gone
                pass

    def do_POST(self) -> None:  # noqa: N802
        self._error(405, "the board is read-only")

    do_PUT = do_DELETE = do_PATCH = do_POST

    def _file(self, path: Path, ctype: str, download: str | None, cache: bool = False) -> None:
        try:
            body = path.read_bytes()
        except OSError as exc:
            raise NotFound(f"{path.name}: cannot be read ({exc.strerror})") from None
        extra = {"Content-Disposition": f'attachment; filename="{download}"'} if download else {}
        self._send(200, body, ctype, extra, cache=cache)


class BoardServer(ThreadingHTTPServer):
    """A threaded HTTP server for one :class:`Board`; ``url`` is where it listens."""

    daemon_threads = True

    def __init__(self, root: str | Path, host: str = "127.0.0.1", port: int = 8050, poll_seconds: float = 1.0):
        self.board = Board(root, poll_seconds)
        super().__init__((host, port), _Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}/"

    def start(self) -> threading.Thread:
        """Serve on a background thread (for tests and notebooks); ``shutdown()`` stops it."""
        t = threading.Thread(target=self.serve_forever, name="fedarena-board", daemon=True)
        t.start()
        return t


def _say(line: str) -> None:
    print(line, flush=True)  # flushed: a script reading our stdout learns the port at once


def serve(root: str | Path, host: str = "127.0.0.1", port: int = 8050, printer: Callable[[str], Any] = _say) -> None:
    """Serve the board over ``root`` until interrupted."""
    server = BoardServer(root, host, port)
    printer(f"fedarena board: {server.board.root} at {server.url} (Ctrl-C stops it)")
    try:
        server.serve_forever()
    finally:
        server.server_close()
