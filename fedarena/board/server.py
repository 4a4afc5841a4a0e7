"""The board's HTTP server: HTML pages (Jinja2, autoescaped) and JSON endpoints over a folder of runs.

Requests are read by :class:`fedarena.board.connections.PooledHTTPServer` (one selector thread, a bounded
worker pool, timeouts) and admitted by :class:`fedarena.board.access.Access` (``Host`` / ``Origin``
allowlist, the access token of a board bound beyond loopback); every request only reads the run folders,
through :mod:`fedarena.board.folders` and :mod:`fedarena.board.confined` (no links, regular files, size caps),
so the board may watch runs that are being written.  Pages:

``/``                     runs list (kind, name, state, progress, start time, final numbers; filter and sort), and
                          the multi-seed groups with the band over seeds of their default curve
``/run?id=RUN``           one run: live curves (the kind's default curve first, :mod:`fedarena.board.curves`),
                          failure panel, config, report figures, checkpoints, log tail, and the FL or league views
                          when the run has their data
``/compare?id=A&id=B``    curves of several runs overlaid by step (or environment steps) and by wall time, and
                          their config diff
``/lineage?kind=K``       config values vs final metrics over the runs of a kind (table, parallel coordinates)
``/profile?id=RUN``       the engine profiles recorded in a run (:mod:`fedarena.board.profiles`)

JSON: ``/api/runs``, ``/api/groups`` (groups and their bands), ``/api/metrics?id=&offset=&file=&limit=`` (rows
appended since ``offset``, at most ``limit`` bytes of the file, ``more`` when there is more to read),
``/api/run?id=`` (status and log tail), ``/api/fl?id=``, ``/api/league?id=``; files: ``/file?id=&path=report/...``
(report figures), ``/runs/<run or group>/report/<file>`` (a report's ``index.html``, sandboxed without script,
and its figures), ``/trace?id=&name=`` (a profile's Chrome trace, as a download), ``/static/...`` (the board's
script, style sheet and Plotly's own ``plotly.min.js`` from the ``plotly`` package, so no CDN is needed).

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
from collections import OrderedDict
from functools import cached_property
from pathlib import Path
from typing import Any, Callable
from urllib.parse import parse_qs, quote, unquote, urlsplit

import jinja2

from fedarena.board import curves, fl, folders, league, lineage, profiles
from fedarena.board.access import Access, is_loopback, new_token
from fedarena.board.confined import Unreadable, read_bytes
from fedarena.board.connections import OneRequestHandler, PooledHTTPServer

STATIC = Path(__file__).with_name("static")
TEMPLATES = Path(__file__).with_name("templates")
CSP = ("default-src 'self'; script-src 'self' 'unsafe-eval'; style-src 'self' 'unsafe-inline'; "
       "img-src 'self' data: blob:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'")
# 'unsafe-eval': plotly.js builds its WebGL shaders (parcoords) with Function(); no inline script is allowed
REPORT_CSP = "sandbox; default-src 'none'; img-src 'self'; style-src 'unsafe-inline'; base-uri 'none'"
"""A run's own report/index.html: no script at all, a sandboxed (opaque) origin, images from the board only."""
MAX_COMPARE = 12
MAX_FILE_BYTES = 32 * 1024 * 1024
"""Report figures and pages larger than this are not served."""
BAND_CACHE = 256
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
        self._bands: OrderedDict[tuple, Any] = OrderedDict()
        self._bands_lock = threading.Lock()

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

    @staticmethod
    def _curve(kind: str) -> dict[str, Any] | None:
        c = curves.for_kind(kind)
        return c.to_json() if c else None

    # -- pages
    def runs_page(self, q: dict[str, list[str]]) -> str:
        runs = folders.list_runs(self.root)
        groups = folders.list_groups(self.root)
        kinds = sorted({r.kind for r in runs} | {g.kind for g in groups})
        return self.page("runs.html", runs=runs, groups=groups, kinds=kinds,
                         profiled={r.id for r in runs if r.state != "error" and profiles.has_profiles(r.path)},
                         data={"runs": len(runs), "groups": [g.id for g in groups]})

    def run_page(self, q: dict[str, list[str]]) -> str:
        run_id, path = self._run(q)
        info = folders.run_info(self.root, path)
        config, config_text, config_problem = folders.read_config(path)
        status = folders.status(path)
        data = {"id": run_id, "state": info.state, "fl": fl.is_fl_run(path, info.kind),
                "league": league.has_league_files(path, info.kind), "curve": self._curve(info.kind),
                "summary_keys": [k for k, v in (status.get("summary") or {}).items() if folders.is_number(v)]
                if isinstance(status.get("summary"), dict) else []}
        return self.page("run.html", run=info, status=status, config_text=config_text, config_problem=config_problem,
                         figures=folders.figures(path), checkpoints=folders.checkpoints(path),
                         log=folders.log_tail(path), profiles=profiles.read_profiles(path),
                         report=folders.has_report(path), data=data)

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
        kinds = {r.kind for r in infos}
        curve = self._curve(next(iter(kinds))) if len(kinds) == 1 else None  # one kind: its default curve
        data = {"runs": [{"id": r.id, "label": f"{r.name or r.kind} ({r.id})", "state": r.state,
                          "summary_keys": list(r.metrics)} for r in infos], "curve": curve}
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
                 "env_steps": r.env_steps, "progress": r.progress, "progress_text": r.progress_text, "started": r.started, "metrics": folders.finite_or_none(r.metrics),
                 "error": r.error, "group": r.group} for r in folders.list_runs(self.root)]

    def band(self, group: folders.GroupInfo) -> curves.Band | None:
        """The group's band of its default curve, cached while no seed's ``metrics.jsonl`` changes."""
        key_parts: list[Any] = [group.id, group.kind]
        for _, d in group.seeds:
            try:
                st = (d / "metrics.jsonl").lstat()
                key_parts.append((d.name, st.st_ino, st.st_size, st.st_mtime_ns))
            except OSError:
                key_parts.append((d.name, None))
        key = tuple(key_parts)
        with self._bands_lock:
            if key in self._bands:
                self._bands.move_to_end(key)
                return self._bands[key]
        b = curves.group_band([d for _, d in group.seeds], group.kind)
        with self._bands_lock:
            self._bands[key] = b
            while len(self._bands) > BAND_CACHE:
                self._bands.popitem(last=False)
        return b

    def api_groups(self, q: dict[str, list[str]]) -> Any:
        """Every group (or the one ``id`` names): state, seeds, report link, and the band of its default curve."""
        wanted = (q.get("id") or [""])[0]
        out = []
        for g in folders.list_groups(self.root):
            if wanted and g.id != wanted:
                continue
            b = self.band(g) if g.state != "error" else None
            mean, low, high = b.final() if b else (None, None, None)
            out.append({"id": g.id, "kind": g.kind, "name": g.name, "state": g.state, "started": g.started,
                        "seeds": [{"seed": s, "id": d.relative_to(self.root).as_posix()} for s, d in g.seeds],
                        "report": f"/runs/{quote(g.id)}/report/index.html" if g.report else None,
                        "error": g.error,
                        "band": None if b is None else {
                            "metric": b.metric, "x": b.x, "seeds": b.seeds, "grid": b.grid, "mean": b.mean,
                            "low": b.low, "high": b.high, "final": {"mean": mean, "min": low, "max": high},
                            "svg": b.svg()}})
        if wanted and not out:
            raise NotFound(f"group {wanted!r}: no group folder there")
        return out

    def api_metrics(self, q: dict[str, list[str]]) -> Any:
        _, path = self._run(q)

        def integer(name: str, default: int) -> int:
            try:
                return max(0, int((q.get(name) or [str(default)])[0]))
            except ValueError:
                return default

        chunk = folders.read_metrics_since(path, integer("offset", 0), (q.get("file") or [""])[0],
                                           integer("limit", folders.METRICS_PAGE_BYTES) or 1)
        return {"rows": folders.finite_or_none(chunk.rows), "offset": chunk.offset, "file": chunk.file_id,
                "malformed": chunk.malformed, "reset": chunk.reset, "more": chunk.more, "size": chunk.size}

    def api_run(self, q: dict[str, list[str]]) -> Any:
        run_id, path = self._run(q)
        info = folders.run_info(self.root, path)
        status = folders.status(path)
        return {"id": run_id, "state": info.state, "step": info.step, "total": info.total, "progress": info.progress,
                "env_steps": info.env_steps, "progress_text": info.progress_text,
                "error": status.get("error"), "error_type": status.get("error_type"),
                "log": folders.log_tail(path), "checkpoints": folders.checkpoints(path)}

    def api_fl(self, q: dict[str, list[str]]) -> Any:
        return fl.fl_data(self._run(q)[1])

    def api_league(self, q: dict[str, list[str]]) -> Any:
        _, path = self._run(q)
        return league.league_data(path, folders.iter_metrics(path, 4 * folders.METRICS_PAGE_BYTES))

    # -- files: (content, content type, download name or None, CSP or None for the board's own)
    def _read(self, folder: Path, relative: str, limit: int = MAX_FILE_BYTES) -> bytes:
        try:
            return read_bytes(folder, relative, limit)
        except Unreadable as exc:
            raise NotFound(f"{relative}: unavailable ({exc})") from None

    def run_file(self, q: dict[str, list[str]]) -> tuple[bytes, str, str | None, str | None]:
        _, path = self._run(q)
        rel = (q.get("path") or [""])[0]
        if not rel.startswith("report/"):
            raise NotFound(f"{rel!r}: only report figures are served")
        try:
            rel = folders.report_file(path, rel[len("report/"):])
        except folders.RunNotFound as exc:
            raise NotFound(str(exc)) from None
        ctype = folders.IMAGE_TYPES.get(Path(rel).suffix.lower())
        if ctype is None:
            raise NotFound(f"{rel}: not a figure")
        return self._read(path, rel), ctype, None, None

    def report_file(self, tail: str) -> tuple[bytes, str, str | None, str | None]:
        """``/runs/<run or group id>/report/<file>``: a report page (sandboxed, no script) or one of its figures."""
        folder_id, sep, name = unquote(tail).rpartition("/report/")
        if not sep:
            raise NotFound(f"/runs/{tail}: not a report file")
        try:
            try:
                folder = folders.resolve_run(self.root, folder_id)
            except folders.RunNotFound:
                folder = folders.resolve_group(self.root, folder_id)
            rel = folders.report_file(folder, name)
        except folders.RunNotFound as exc:
            raise NotFound(str(exc)) from None
        suffix = Path(name).suffix.lower()
        if suffix in (".html", ".htm"):
            return self._read(folder, rel), "text/html; charset=utf-8", None, REPORT_CSP
        ctype = folders.IMAGE_TYPES.get(suffix)
        if ctype is None:
            raise NotFound(f"{rel}: not a report page or figure")
        return self._read(folder, rel), ctype, None, None

    def trace_file(self, q: dict[str, list[str]]) -> tuple[bytes, str, str | None, str | None]:
        run_id, path = self._run(q)
        name = (q.get("name") or [""])[0]
        rel = profiles.trace_path(path, name)
        if rel is None:
            raise NotFound(f"profile {name!r}: no Chrome trace in this run")
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", path.name)  # a folder name must not reach the header raw
        return self._read(path, rel, profiles.MAX_TRACE_BYTES), "application/json", f"{safe}-{name}.trace.json", None

    def static_file(self, name: str) -> tuple[bytes, str, str | None, str | None]:
        if name == "plotly.min.js":
            return plotly_js().read_bytes(), "text/javascript", None, None
        f = STATIC / name
        if "/" in name or name.startswith(".") or not f.is_file():
            raise NotFound(f"/static/{name}: no such file")
        return f.read_bytes(), mimetypes.guess_type(f.name)[0] or "application/octet-stream", None, None

    @cached_property
    def routes(self) -> dict[str, tuple[str, Callable[[dict[str, list[str]]], Any]]]:
        return {"/": ("html", self.runs_page), "/run": ("html", self.run_page), "/compare": ("html", self.compare_page),
                "/lineage": ("html", self.lineage_page), "/profile": ("html", self.profile_page),
                "/api/runs": ("json", self.api_runs), "/api/groups": ("json", self.api_groups),
                "/api/metrics": ("json", self.api_metrics),
                "/api/run": ("json", self.api_run), "/api/fl": ("json", self.api_fl),
                "/api/league": ("json", self.api_league), "/file": ("file", self.run_file),
                "/trace": ("file", self.trace_file)}


class _Handler(OneRequestHandler):
    server: "BoardServer"
    _set_cookie = False

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        logger.debug("%s %s", self.address_string(), format % args)

    def _send(self, code: int, body: bytes, ctype: str, extra: dict[str, str] | None = None,
              cache: bool = False, csp: str | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Security-Policy", csp or CSP)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("X-Frame-Options", "DENY")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("Cache-Control", "private, max-age=3600" if cache else "no-store")
        if self._set_cookie:
            self.send_header("Set-Cookie", self.server.access.set_cookie())
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, code: int, message: str) -> None:
        board = self.server.board
        body = board.page("error.html", code=code, message=message, data={}).encode()
        self._send(code, body, "text/html; charset=utf-8")

    def _refuse(self, message: str) -> None:
        """403 as one line of plain text (no page: it would name the runs folder to whoever was refused)."""
        self.close_connection = True
        self._send(403, (message + "\n").encode(), "text/plain; charset=utf-8")

    def _admit(self, url: Any) -> bool:
        """Host / Origin allowlist, then the token; answers 403 and returns False for a request not let in."""
        access = self.server.access
        self._set_cookie = False
        if not access.host_allowed(self.headers.get("Host")):
            self._refuse("403: this board answers only to its own host names (fedarena board --allow-host NAME "
                         "adds one)")
            return False
        if not access.origin_allowed(self.headers.get("Origin")):
            self._refuse("403: requests from other sites are refused")
            return False
        token, in_url = access.presented(url.query, self.headers)
        if not access.token_ok(token):
            self._refuse("403: this board needs its access token: open the address it printed at startup "
                         "(.../?token=...)")
            return False
        self._set_cookie = access.token is not None and in_url
        return True

    def do_HEAD(self) -> None:  # noqa: N802 - http.server's naming
        self.do_GET()

    def do_GET(self) -> None:  # noqa: N802
        url = urlsplit(self.path)
        if not self._admit(url):
            return
        q = parse_qs(url.query)
        board = self.server.board
        try:
            if url.path.startswith("/static/"):
                self._file(*board.static_file(url.path[len("/static/"):]), cache=True)
                return
            if url.path.startswith("/runs/"):
                self._file(*board.report_file(url.path[len("/runs/"):]))
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
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            self.close_connection = True
        except Exception as exc:  # a bad run folder must not stop the board: answer 500, keep serving
            logger.exception("board: %s failed", url.path)
            try:
                self._error(500, f"{type(exc).__name__}: {exc}")
            except Exception:  # noqa: BLE001 - the connection itself is gone
                self.close_connection = True

    def do_POST(self) -> None:  # noqa: N802
        self.close_connection = True  # a body is never read: do not reuse the connection
        url = urlsplit(self.path)
        if self._admit(url):
            self._error(405, "the board is read-only")

    do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_POST

    def _file(self, body: bytes, ctype: str, download: str | None, csp: str | None, cache: bool = False) -> None:
        extra = {"Content-Disposition": f'attachment; filename="{download}"'} if download else {}
        self._send(200, body, ctype, extra, cache=cache, csp=csp)


class BoardServer(PooledHTTPServer):
    """The board over HTTP: a bounded worker pool (:mod:`fedarena.board.connections`) behind the ``Host`` /
    ``Origin`` allowlist and, when ``token`` is set, the access token (:mod:`fedarena.board.access`).

    ``url`` is where it listens; ``token_url`` the same with ``?token=`` when a token is needed.
    """

    def __init__(self, root: str | Path, host: str = "127.0.0.1", port: int = 8050, poll_seconds: float = 1.0, *,
                 token: str | None = None, allow_hosts: tuple[str, ...] = (), workers: int = 8,
                 max_connections: int = 512, head_timeout: float = 15.0, send_timeout: float = 30.0):
        self.board = Board(root, poll_seconds)
        super().__init__((host.strip("[]"), port), _Handler, workers=workers, max_connections=max_connections,
                         head_timeout=head_timeout, send_timeout=send_timeout)
        self.host = host
        self.access = Access.for_binding(host, self.server_address[1], token, tuple(allow_hosts))

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        host = f"[{host}]" if ":" in host else host
        if host in ("0.0.0.0", "[::]"):
            host = "127.0.0.1" if host == "0.0.0.0" else "[::1]"
        return f"http://{host}:{port}/"

    @property
    def token_url(self) -> str:
        return self.url + (f"?token={self.access.token}" if self.access.token else "")

    def start(self) -> threading.Thread:
        """Serve on a background thread (for tests and notebooks); ``shutdown()`` stops it."""
        t = threading.Thread(target=self.serve_forever, name="fedarena-board", daemon=True)
        t.start()
        return t


def _say(line: str) -> None:
    print(line, flush=True)  # flushed: a script reading our stdout learns the port at once


def access_token(host: str, token: str | None = None, no_token: bool = False) -> str | None:
    """The token a board bound to ``host`` needs: ``token`` if given; else a new one when ``host`` is beyond
    loopback (unless ``no_token``); else none."""
    if token is not None:
        if len(token) < 8:
            raise ValueError("--token: use at least 8 characters")
        return token
    if no_token or is_loopback(host):
        return None
    return new_token()


def serve(root: str | Path, host: str = "127.0.0.1", port: int = 8050, printer: Callable[[str], Any] = _say, *,
          token: str | None = None, no_token: bool = False, allow_hosts: tuple[str, ...] = ()) -> None:
    """Serve the board over ``root`` until interrupted (see :func:`access_token` for when a token is needed)."""
    server = BoardServer(root, host, port, token=access_token(host, token, no_token), allow_hosts=allow_hosts)
    printer(f"fedarena board: {server.board.root} at {server.token_url} (Ctrl-C stops it)")
    if not is_loopback(host):
        names = ", ".join(sorted(server.access.names))
        printer(f"fedarena board: listening beyond this machine on {host}; it answers to the host names {names} "
                "(--allow-host NAME adds one)"
                + ("" if server.access.token else "; WARNING: --no-token: anyone who can reach it can read the runs"))
    try:
        server.serve_forever()
    finally:
        server.server_close()
