"""engine.set_num_threads limits every BLAS library the engine calls (numpy's and scipy's, which
the convolution input gradient uses)."""

from __future__ import annotations

import pytest

from fedarena import engine


def test_set_num_threads_limits_numpy_and_scipy_blas():
    threadpoolctl = pytest.importorskip("threadpoolctl")
    import scipy.linalg.blas  # noqa: F401

    engine.set_num_threads(1)
    try:
        libs = [i for i in threadpoolctl.threadpool_info() if i.get("user_api") == "blas"]
        paths = {i["filepath"] for i in libs}
        assert any("numpy" in p for p in paths) and any("scipy" in p for p in paths)
        assert all(i["num_threads"] == 1 for i in libs)
    finally:
        engine.set_num_threads(None)
