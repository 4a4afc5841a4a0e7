"""Build, cache and load the C modules of :mod:`.codegen_c` with the system C compiler.

A module's file name is the SHA-256 of its source, the flags and the Python and numpy versions, so a second process (or a second signature with the same code) loads the
cached shared object instead of compiling: the on-disk cache of ccache and of Numba's
``cache=True``.  The cache lives in ``$FEDARENA_NATIVE_CACHE`` (default
``~/.cache/fedarena/native``); a file is written under a temporary name and renamed, so
concurrent processes never load a half-written object.  The compiler is ``$CC`` (default the first
of ``cc``, ``gcc``, ``clang`` found); when it is missing or fails, :func:`build` raises
:class:`BuildError` and the caller keeps the per-equation executor.  :func:`cache_dir`,
:func:`compiler`, :func:`cache_key` and :func:`compile_shared` also build the int8 kernels of
:mod:`fedarena.engine.quantization.kernel`, in their own cache.  Products call numpy's own OpenBLAS, whose ``cblas`` functions are looked
up in the library numpy loaded (:func:`blas_addresses`).
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.machinery
import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile

import numpy as np

from ..core.threads import openblas_libraries
from ..primitives.checks import IndexRangeError
from .codegen_c import BLAS_FUNCTIONS, Lowered, ufunc_object

FLAGS = ("-O3", "-fPIC", "-shared", "-ffp-contract=off", "-fno-math-errno", "-fno-strict-aliasing", "-w")
"""No fused multiply-add contraction and no fast-math: every operation rounds as numpy's does.
``-O3`` vectorises the fused loops (with the restrict pointers of the generated code): on the PPO
step 82 us a call against 108 us at ``-O2`` and 118 us at ``-O1``, for 0.66 s of compiler CPU time
against 0.49 s and 0.37 s (measured on the shared 2-core machine, load 12-17)."""
_LOADED: dict = {}
_BLAS: list | None = None


class BuildError(Exception):
    """The C compiler is missing or failed, or numpy's BLAS could not be found."""


def cache_dir(env: str = "FEDARENA_NATIVE_CACHE", folder: str = "native") -> str:
    """The cache folder: ``$env``, default ``~/.cache/fedarena/<folder>``."""
    return os.environ.get(env) or os.path.join(os.path.expanduser("~"), ".cache", "fedarena", folder)


def compiler(check: bool = True) -> list:
    """The compiler command (``$CC``, default the first of ``cc``, ``gcc``, ``clang`` on the path) as
    an argument list; BuildError if ``check`` and it is not found."""
    default = next((c for c in ("cc", "gcc", "clang") if shutil.which(c)), "cc")
    cmd = shlex.split(os.environ.get("CC") or default) or [default]
    if check and shutil.which(cmd[0]) is None:
        raise BuildError(f"C compiler {cmd[0]!r} not found")
    return cmd


def blas_addresses() -> tuple[list, bool]:
    """Addresses of numpy's OpenBLAS ``cblas`` functions in ``BLAS_FUNCTIONS`` order, and whether
    its integers are 64-bit (ILP64); BuildError if numpy's BLAS does not export them."""
    global _BLAS
    if _BLAS is not None:
        return _BLAS
    np.dot(np.ones((2, 2)), np.ones((2, 2)))  # numpy's BLAS is loaded
    for lib in openblas_libraries():
        for prefix, suffix, ilp64 in (("scipy_cblas_", "64_", True), ("cblas_", "64_", True), ("cblas_", "", False)):
            names = [prefix + f + suffix for f in BLAS_FUNCTIONS]
            if all(hasattr(lib, n) for n in names):
                _BLAS = ([ctypes.cast(getattr(lib, n), ctypes.c_void_p).value for n in names], ilp64)
                return _BLAS
    raise BuildError("numpy's OpenBLAS with cblas functions not found")


def _flags(ilp64: bool) -> list:
    inc = [f"-I{sysconfig.get_paths()['include']}", f"-I{np.get_include()}"]
    return [*FLAGS, *inc, f"-DBLASINT={'int64_t' if ilp64 else 'int32_t'}"]


def build(lowered: Lowered):
    """The loaded, initialised module of ``lowered`` (compiled, or taken from the disk cache)."""
    cc = compiler(check=False)  # a cached module loads without a compiler
    addrs, ilp64 = blas_addresses()
    flags = _flags(ilp64)
    key = cache_key(lowered.source, *flags, sys.version, np.__version__, sysconfig.get_config_var("EXT_SUFFIX") or "")
    modname = f"_fedarena_graph_{key}"
    mod = _LOADED.get(modname)
    if mod is None:
        path = os.path.join(cache_dir(), modname + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"))
        if not os.path.exists(path):
            _compile(compiler(), flags, lowered.source, modname, path)
        loader = importlib.machinery.ExtensionFileLoader(modname, path)
        spec = importlib.util.spec_from_file_location(modname, path, loader=loader)
        mod = importlib.util.module_from_spec(spec)
        loader.exec_module(mod)
        # the same source names the same loops, so a module is initialised once
        mod.init(_loops(lowered.loops), list(addrs), IndexRangeError)
        _LOADED[modname] = mod
    return mod


def cache_key(*parts: str) -> str:
    """The file-name key of a build: 32 hex digits of the SHA-256 of ``parts`` (everything the
    shared object depends on)."""
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def compile_shared(cmd: list, path: str) -> None:
    """Run the compiler command ``cmd`` with ``-o`` a temporary file beside ``path`` and rename it to
    ``path``.  BuildError if the compiler cannot run or fails; OSError if ``path``'s folder cannot
    be created or written."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp_path = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
    os.close(fd)
    try:
        try:
            proc = subprocess.run([*cmd, "-o", tmp_path], capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise BuildError(f"C compiler failed: {err}") from None
        if proc.returncode != 0:
            raise BuildError(f"C compiler failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
        os.replace(tmp_path, path)
    finally:
        if os.path.exists(tmp_path):
            os.unlink(tmp_path)


def _compile(cc: list, flags: list, source: str, modname: str, path: str) -> None:
    with tempfile.TemporaryDirectory(prefix="fedarena-cc-") as tmp:
        src = os.path.join(tmp, modname + ".c")
        with open(src, "w") as f:
            f.write(source)
        compile_shared([*cc, *flags, f"-DMODNAME=\"{modname}\"", f"-DINITFUNC=PyInit_{modname}", src], path)


def _loops(keys: list) -> list:
    return [(ufunc_object(name), ("".join(ins) + res).encode()) for name, ins, res in keys]


__all__ = ["BuildError", "FLAGS", "blas_addresses", "build", "cache_dir", "cache_key", "compile_shared", "compiler"]
