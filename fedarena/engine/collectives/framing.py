"""The wire format of one array message: a fixed header (magic, dtype, shape, payload length) then raw bytes.

No pickle anywhere: a peer can only make the receiver allocate an array of a dtype from a fixed list and of the
shape it names, and only after the connection was authenticated. Layout (network byte order)::

    offset  size  field
    0       4     magic b"FACM" (fedarena array collective message)
    4       1     format version (1)
    5       1     ndim (0..32)
    6       10    dtype as numpy's ``dtype.str`` (e.g. b"<f4", b"|b1"), NUL padded
    16      8     payload length in bytes (uint64)
    24      8*ndim  shape (uint64 each)
    ...     payload, C order, exactly ``prod(shape) * itemsize`` bytes

``HEADER_FIXED`` is the fixed part; ``header_size(ndim)`` the whole header.
"""

from __future__ import annotations

import struct

import numpy as np

MAGIC = b"FACM"
VERSION = 1
MAX_NDIM = 32
_FIXED = struct.Struct("!4sBB10sQ")
HEADER_FIXED = _FIXED.size  # 24
# every dtype a message may carry: bool, signed/unsigned ints, floats, complex, in either byte order
ALLOWED_KINDS = frozenset("biufc")


class FramingError(ValueError):
    """A message header that is malformed or does not match what the receiver expects."""


def header_size(ndim: int) -> int:
    return HEADER_FIXED + 8 * ndim


def encode_header(array: np.ndarray) -> bytes:
    """The header of ``array`` (which must be C-contiguous when its payload is sent as is)."""
    dt = array.dtype
    if dt.kind not in ALLOWED_KINDS:
        raise FramingError(f"dtype {dt} cannot be sent: only bool, integer, float and complex arrays")
    if array.ndim > MAX_NDIM:
        raise FramingError(f"array has {array.ndim} dimensions; at most {MAX_NDIM} can be sent")
    return _FIXED.pack(MAGIC, VERSION, array.ndim, dt.str.encode("ascii"), array.nbytes) + struct.pack(
        f"!{array.ndim}Q", *array.shape)


def decode_fixed(raw: bytes) -> tuple[np.dtype, int, int]:
    """Parse the fixed header part: (dtype, ndim, payload length)."""
    if len(raw) != HEADER_FIXED:
        raise FramingError(f"header: expected {HEADER_FIXED} bytes, got {len(raw)}")
    magic, version, ndim, dtype_raw, nbytes = _FIXED.unpack(raw)
    if magic != MAGIC:
        raise FramingError(f"header.magic: expected {MAGIC!r}, got {magic!r}")
    if version != VERSION:
        raise FramingError(f"header.version: unsupported format version {version}")
    if ndim > MAX_NDIM:
        raise FramingError(f"header.ndim: {ndim} exceeds {MAX_NDIM}")
    try:
        dtype = np.dtype(dtype_raw.rstrip(b"\0").decode("ascii"))
    except (TypeError, ValueError, UnicodeDecodeError) as exc:
        raise FramingError(f"header.dtype: {dtype_raw!r} is not a numpy dtype ({exc})") from None
    if dtype.kind not in ALLOWED_KINDS or dtype.fields is not None or dtype.subdtype is not None:
        raise FramingError(f"header.dtype: {dtype} is not an allowed dtype")
    return dtype, ndim, nbytes


def decode_shape(raw: bytes, ndim: int, dtype: np.dtype, nbytes: int, max_bytes: int) -> tuple[int, ...]:
    """Parse the shape and check it agrees with the payload length and the receiver's size limit."""
    shape = struct.unpack(f"!{ndim}Q", raw)
    count = 1
    for d in shape:
        count *= d
    if count * dtype.itemsize != nbytes:
        raise FramingError(f"header.nbytes: {nbytes} does not match shape {shape} of {dtype}")
    if nbytes > max_bytes:
        raise FramingError(f"header.nbytes: {nbytes} exceeds the receiver's limit of {max_bytes} bytes")
    return shape


def check_matches(dtype: np.dtype, shape: tuple[int, ...], out: np.ndarray, src: int) -> None:
    """Raise when a received header does not describe the buffer the receiver posted."""
    if dtype != out.dtype or tuple(shape) != out.shape:
        raise FramingError(f"message from rank {src}: got {dtype}{list(shape)}, expected {out.dtype}{list(out.shape)}"
                           " (ranks called different collectives or passed different shapes)")
