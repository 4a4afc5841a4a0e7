"""The training board: a read-only local web server over a folder of run folders (``fedarena board RUNS_DIR``).

Runs list with multi-seed groups, live run pages, comparison, lineage across runs, engine profiles, FL and league
views (:mod:`fedarena.board.server`); the readers of run folders (:mod:`fedarena.board.folders`, through
:mod:`fedarena.board.confined`) never write, and :mod:`fedarena.board.access` decides who may ask.
:mod:`fedarena.board.record` is the one writer: a run's own code calls ``record_profile`` to save an engine
profile the profile page shows.  docs/board.md describes the pages and the files they read.
"""

from fedarena.board.server import Board, BoardServer, serve

__all__ = ["Board", "BoardServer", "serve"]
