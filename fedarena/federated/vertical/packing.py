"""Slot packing of fixed-point vectors into Paillier plaintexts, with overflow refused before it happens.

Many small numbers share one plaintext of |n| - 1 bits: slot i holds bits [i w, (i + 1) w). A value
x is stored as the non-negative integer round(x 2^f) + B, B = ceil(bound 2^f) (an offset encoding,
as in FATE's fixed-point packer; BatchCrypt, Zhang et al., USENIX ATC 2020, uses the same idea with
signed slots). Each :class:`PackedCiphertext` tracks, exactly, the offset every slot carries and an
upper bound on every slot's integer; homomorphic slot-wise sums, additions of plaintext vectors and
products by plaintext scalars (negative ones too) update both, and any operation whose result bound
would reach 2^w is refused with :class:`PackingOverflow` before it is computed. The headroom bits
(w minus the bits of a fresh slot) say how many such operations fit.

:func:`pack_ciphertexts` packs already-encrypted scalars homomorphically (Horner with 2^w shifts), so a
key holder decrypts many masked values at the price of one decryption.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Sequence

import gmpy2
import numpy as np

from fedarena.federated.vertical.paillier import FastPrivateKey, FastPublicKey, fixed_point_ints


class PackingOverflow(OverflowError):
    """An operation on packed ciphertexts could carry one slot into the next; it was not performed."""


def _fixed_ceil(x: float, frac_bits: int) -> int:
    return math.ceil(Fraction(x) * (1 << frac_bits))


@dataclass(frozen=True)
class PackingLayout:
    """How values sit in a plaintext: ``slots`` slots of ``slot_bits`` bits, ``frac_bits`` fraction bits."""

    slot_bits: int
    frac_bits: int
    value_bound: float
    slots: int

    @property
    def offset(self) -> int:
        return _fixed_ceil(self.value_bound, self.frac_bits)

    @property
    def headroom_bits(self) -> int:
        return self.slot_bits - (2 * self.offset).bit_length()


def make_layout(key_bits: int, value_bound: float, frac_bits: int, headroom_bits: int) -> PackingLayout:
    """The densest layout for values in [-value_bound, value_bound] with ``headroom_bits`` to spare."""
    if value_bound <= 0 or not np.isfinite(value_bound):
        raise ValueError(f"value_bound: must be positive and finite, got {value_bound}")
    if not 0 <= frac_bits <= 256:
        raise ValueError(f"frac_bits: {frac_bits} outside 0..256")
    if headroom_bits < 0:
        raise ValueError(f"headroom_bits: must be >= 0, got {headroom_bits}")
    offset = _fixed_ceil(value_bound, frac_bits)
    slot_bits = (2 * offset).bit_length() + headroom_bits
    slots = (key_bits - 2) // slot_bits
    if slots < 1:
        raise ValueError(f"slot of {slot_bits} bits does not fit a {key_bits}-bit key")
    return PackingLayout(slot_bits, frac_bits, float(value_bound), slots)


@dataclass(frozen=True)
class PackedCiphertext:
    """E(sum_i slot_i 2^(i w)); every slot holds value_i * 2^frac_bits + ``offset``, all <= ``bound``."""

    c: object
    count: int
    slot_bits: int
    frac_bits: int
    offset: int
    bound: int


class SlotPacker:
    """Encrypts, combines and decrypts packed vectors for one public key and layout."""

    def __init__(self, key: FastPublicKey, layout: PackingLayout) -> None:
        if layout.slots * layout.slot_bits > key.bits - 2:
            raise ValueError(f"layout of {layout.slots} x {layout.slot_bits} bits does not fit a {key.bits}-bit key")
        self.key = key
        self.layout = layout
        self._limit = 1 << layout.slot_bits

    # -- plaintext side
    def _slots_int(self, ints: Sequence[int]) -> int:
        p, w = 0, self.layout.slot_bits
        for v in reversed(ints):
            p = (p << w) | int(v)
        return p

    @staticmethod
    def _quantise(x: np.ndarray, bound: float, frac_bits: int, what: str = "the bound") -> tuple[list[int], int]:
        """Exact fixed-point ints of ``x`` (Python ints) and the offset ceil(bound 2^f); every |q| <= offset."""
        arr = np.asarray(x, dtype=np.float64).ravel()
        if not np.all(np.isfinite(arr)):
            raise ValueError("values: NaN or Inf cannot be packed")
        if not (math.isfinite(bound) and bound >= 0):
            raise ValueError(f"bound: must be finite and >= 0, got {bound}")
        if arr.size and np.max(np.abs(arr)) > bound:
            raise PackingOverflow(f"values: |x| up to {np.max(np.abs(arr))} exceeds {what} {bound}")
        q = fixed_point_ints(arr, frac_bits)
        off = _fixed_ceil(bound, frac_bits)
        for i, v in enumerate(q):  # exact: the slot integer v + off must lie in [0, 2 off]
            if not -off <= v <= off:
                raise PackingOverflow(f"values[{i}]: fixed-point {v} outside +-{off}")
        return q, off

    def encrypt(self, x: np.ndarray) -> list[PackedCiphertext]:
        """Pack ``x`` (|x| <= value_bound) into ceil(len/slots) ciphertexts, one pooled obfuscator each."""
        L = self.layout
        q, off = self._quantise(x, L.value_bound, L.frac_bits, "the layout bound")
        groups = [q[i : i + L.slots] for i in range(0, len(q), L.slots)]
        plains = [self._slots_int([v + off for v in g]) for g in groups]
        cs = self.key.encrypt_ints(plains)
        return [PackedCiphertext(c, len(g), L.slot_bits, L.frac_bits, off, 2 * off) for c, g in zip(cs, groups)]

    # -- homomorphic operations (all checked before computing)
    def _check(self, bound: int, what: str) -> None:
        if bound >= self._limit:
            raise PackingOverflow(
                f"{what}: slot bound {bound} would reach 2^{self.layout.slot_bits}; refused before overflow")

    def add(self, a: PackedCiphertext, b: PackedCiphertext) -> PackedCiphertext:
        if (a.count, a.frac_bits, a.slot_bits) != (b.count, b.frac_bits, b.slot_bits):
            raise ValueError("add: packed ciphertexts differ in count, frac_bits or slot_bits")
        self._check(a.bound + b.bound, "add")
        return PackedCiphertext(self.key.add(a.c, b.c), a.count, a.slot_bits, a.frac_bits,
                                a.offset + b.offset, a.bound + b.bound)

    def add_plain(self, a: PackedCiphertext, x: np.ndarray, bound: float | None = None) -> PackedCiphertext:
        """Slot-wise a + x for a plaintext vector (offset-encoded with its own bound)."""
        x = np.asarray(x, dtype=np.float64).ravel()
        if x.size != a.count:
            raise ValueError(f"add_plain: {x.size} values for {a.count} slots")
        if not np.all(np.isfinite(x)):
            raise ValueError("add_plain: NaN or Inf cannot be packed")
        bnd = (float(np.max(np.abs(x))) if x.size else 0.0) if bound is None else float(bound)
        q, off = self._quantise(x, bnd, a.frac_bits, "the declared bound")
        self._check(a.bound + 2 * off, "add_plain")
        p = self._slots_int([v + off for v in q])
        return PackedCiphertext(self.key.add_int(a.c, p), a.count, a.slot_bits, a.frac_bits,
                                a.offset + off, a.bound + 2 * off)

    def mul_scalar(self, a: PackedCiphertext, k: int) -> PackedCiphertext:
        """Every slot times the integer k (k < 0 maps slot s to |k| (bound - s), offsets tracked)."""
        k = int(k)
        if k >= 0:
            self._check(k * a.bound, "mul_scalar")
            return PackedCiphertext(self.key.mul_int(a.c, k), a.count, a.slot_bits, a.frac_bits, k * a.offset, k * a.bound)
        m = -k
        self._check(m * a.bound, "mul_scalar")
        const = self._slots_int([m * a.bound] * a.count)
        c = self.key.add_int(self.key.mul_int(a.c, -m), const)
        return PackedCiphertext(c, a.count, a.slot_bits, a.frac_bits, m * (a.bound - a.offset), m * a.bound)

    def mul_fixed(self, a: PackedCiphertext, s: float, frac_bits: int) -> PackedCiphertext:
        """Every slot times the real s encoded with ``frac_bits`` (the result has a.frac_bits + frac_bits)."""
        (k,) = fixed_point_ints([s], frac_bits, "s")
        r = self.mul_scalar(a, k)
        return PackedCiphertext(r.c, r.count, r.slot_bits, r.frac_bits + frac_bits, r.offset, r.bound)

    def sum(self, items: Sequence[PackedCiphertext]) -> PackedCiphertext:
        if not items:
            raise ValueError("sum: nothing to add")
        total = sum(i.bound for i in items)
        self._check(total, "sum")
        out = items[0]
        for it in items[1:]:
            out = self.add(out, it)
        return out

    # -- decryption
    def decrypt(self, sk: FastPrivateKey, items: Sequence[PackedCiphertext]) -> np.ndarray:
        vals: list[float] = []
        for it in items:
            p = sk.decrypt_int(it.c)
            mask = (1 << it.slot_bits) - 1
            for i in range(it.count):
                s = (p >> (i * it.slot_bits)) & mask
                vals.append((s - it.offset) / 2.0**it.frac_bits)
        return np.array(vals, dtype=np.float64)

    def decrypt_ints(self, sk: FastPrivateKey, items: Sequence[PackedCiphertext]) -> list[int]:
        """Exact slot integers minus offsets (value * 2^frac_bits), for exactness checks."""
        out: list[int] = []
        for it in items:
            p = sk.decrypt_int(it.c)
            mask = (1 << it.slot_bits) - 1
            out.extend(((p >> (i * it.slot_bits)) & mask) - it.offset for i in range(it.count))
        return out


def pack_ciphertexts(key: FastPublicKey, cs: Sequence, slot_bits: int) -> list:
    """Homomorphically pack scalar ciphertexts of integers in [0, 2^slot_bits) into few ciphertexts.

    Slot i of output j holds the plaintext of ``cs[j * k + i]`` (k = slots per plaintext). The caller
    must guarantee the range (e.g. by masking with a positive offset); it is what keeps slots apart.
    """
    k = (key.bits - 2) // slot_bits
    if k < 1:
        raise ValueError(f"slot_bits {slot_bits} does not fit a {key.bits}-bit key")
    nsq = key.nsquare
    shift = gmpy2.mpz(1) << slot_bits
    out = []
    for j in range(0, len(cs), k):
        group = cs[j : j + k]
        acc = gmpy2.mpz(group[-1])
        for c in reversed(group[:-1]):
            acc = gmpy2.powmod(acc, shift, nsq) * c % nsq
        out.append(acc)
    return out


def unpack_ints(plains: Sequence[int], slot_bits: int, count: int, key_bits: int) -> list[int]:
    """Split decrypted packs from :func:`pack_ciphertexts` back into ``count`` integers."""
    k = (key_bits - 2) // slot_bits
    mask = (1 << slot_bits) - 1
    out: list[int] = []
    for p in plains:
        take = min(k, count - len(out))
        out.extend((int(p) >> (i * slot_bits)) & mask for i in range(take))
    if len(out) != count:
        raise ValueError(f"unpack: {len(out)} values, expected {count}")
    return out
