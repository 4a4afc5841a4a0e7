"""Masked decryption by a key holder: the step that lets parties learn their own gradients and nothing else.

In the coordinated protocols of vertical FL (Hardy et al. 2017, sec. 4; Yang et al., *Federated
Learning*, 2019, sec. 5.2.2) a party holding an encrypted result [[v]] adds a uniform random mask R,
sends [[v + R]] to the key holder, gets v + R back and subtracts R. Here R has ``mask_bits`` bits of
statistical hiding above the ``value_bits`` bound of |v|, and an offset 2^value_bits makes every masked
value non-negative, so many of them can be packed into one plaintext before decryption
(:func:`.packing.pack_ciphertexts`): the key holder pays one decryption per pack and the wire carries
one ciphertext per pack. Values found outside the bound after unmasking are reported, not wrapped.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass

import numpy as np
import phe

from fedarena.federated.vertical import messages as wmsg
from fedarena.federated.vertical import packing
from fedarena.federated.vertical import paillier as pl
from fedarena.federated.vertical.messages import ProtocolError, message
from fedarena.federated.vertical.timing import PhaseTimer


@message("vfl.public_key")
@dataclass(frozen=True)
class PublicKeyMsg:
    bits: int
    n: bytes



@message("vfl.masked")
@dataclass(frozen=True)
class MaskedMsg:
    """Masked encrypted values for the key holder; ``ciphertexts`` packs of ``slot_bits``-bit slots."""

    count: int
    slot_bits: int
    ciphertexts: int
    values: bytes


@message("vfl.unmasked")
@dataclass(frozen=True)
class DecryptedMsg:
    """The key holder's reply: the masked plaintexts (still masked), ``width`` bytes each."""

    count: int
    width: int
    values: bytes



def public_key_message(pk: phe.PaillierPublicKey) -> PublicKeyMsg:
    bits = pk.n.bit_length()
    return PublicKeyMsg(bits, pk.n.to_bytes((bits + 7) // 8, "big"))


def read_public_key(m: PublicKeyMsg, min_bits: int) -> pl.FastPublicKey:
    if m.bits < min_bits or m.bits % 8:
        raise ProtocolError("vfl.public_key.bits", f"{m.bits}-bit key refused (need >= {min_bits}, multiple of 8)")
    n = int.from_bytes(m.n, "big")
    if n.bit_length() != m.bits or n % 2 == 0:
        raise ProtocolError("vfl.public_key.n", f"modulus of {n.bit_length()} bits, declared {m.bits}, must be odd")
    return pl.FastPublicKey(phe.PaillierPublicKey(n))


# ----------------------------------------------------------------------------- masking and decryption


class Decryptor:
    """The key holder's side: decrypts masked values (coordinator C, or each party in the 2-party run)."""

    def __init__(self, private_key: phe.PaillierPrivateKey, timer: PhaseTimer, max_values: int = 1 << 20) -> None:
        self.sk = pl.FastPrivateKey(private_key)
        self.timer = timer
        self.max_values = max_values

    def decrypt(self, m: MaskedMsg) -> DecryptedMsg:
        wmsg.check_count(m.count, "vfl.masked.count", 0, self.max_values)
        wmsg.check_count(m.ciphertexts, "vfl.masked.ciphertexts", 0, m.count)
        wmsg.check_count(m.slot_bits, "vfl.masked.slot_bits", 0, self.sk.public.bits - 2)
        if m.slot_bits:
            per = (self.sk.public.bits - 2) // m.slot_bits
            if m.ciphertexts != -(-m.count // per):
                raise ProtocolError("vfl.masked.ciphertexts", f"{m.ciphertexts} packs cannot hold {m.count} values of {m.slot_bits} bits")
        elif m.ciphertexts != m.count:
            raise ProtocolError("vfl.masked.ciphertexts", "unpacked messages carry one ciphertext per value")
        cv = pl.from_bytes(self.sk.public, m.values, m.ciphertexts, 0, "vfl.masked.values")
        with self.timer("crypto"):
            plains = self.sk.decrypt_ints(cv.cs)
            if m.slot_bits:
                plains = packing.unpack_ints(plains, m.slot_bits, m.count, self.sk.public.bits)
        width = (self.sk.public.bits + 7) // 8
        return DecryptedMsg(len(plains), width, wmsg.ints_to_blob(plains, width))


class Masker:
    """The owner's side: adds a uniform mask to encrypted values and removes it from the reply."""

    def __init__(self, key: pl.FastPublicKey, value_bits: int, mask_bits: int, pack: bool, timer: PhaseTimer) -> None:
        if not 8 <= value_bits <= key.bits // 2 or not 20 <= mask_bits <= 128:
            raise ValueError(f"masking: value_bits {value_bits} / mask_bits {mask_bits} out of range for a {key.bits}-bit key")
        self.key, self.timer = key, timer
        self.value_bits, self.mask_bits, self.pack = value_bits, mask_bits, pack
        self.slot_bits = value_bits + mask_bits + 2

    def mask(self, v: pl.CipherVector) -> tuple[MaskedMsg, list[int]]:
        offset = 1 << self.value_bits  # makes every masked value positive when |value| < 2^value_bits
        masks = [secrets.randbits(self.value_bits + self.mask_bits) for _ in v.cs]
        with self.timer("crypto"):
            cs = [self.key.add_int(c, r + offset) for c, r in zip(v.cs, masks)]
            if self.pack:
                cs = packing.pack_ciphertexts(self.key, cs, self.slot_bits)
        blob = b"".join(int(c).to_bytes(self.key.width, "big") for c in cs)
        return MaskedMsg(len(v.cs), self.slot_bits if self.pack else 0, len(cs), blob), [r + offset for r in masks]

    def unmask(self, m: DecryptedMsg, masks: list[int], frac_bits: int) -> np.ndarray:
        n = int(self.key.n)
        width = (n.bit_length() + 7) // 8
        if m.count != len(masks) or m.width != width:
            raise ProtocolError("vfl.unmasked.count", f"{m.count} values of {m.width} bytes, expected {len(masks)} of {width}")
        plains = wmsg.blob_to_ints(m.values, width, m.count, "vfl.unmasked.values")
        out = []
        for i, (p, r) in enumerate(zip(plains, masks)):
            v = pl.to_signed((p - r) % n, n)
            if abs(v) >= 1 << self.value_bits:
                raise ProtocolError(f"vfl.unmasked.values[{i}]", "value outside the masked range (wrong reply or overflow)")
            out.append(v)
        return np.array([math.ldexp(float(v), -frac_bits) if abs(v) < 1 << 1000 else float("nan") for v in out])
