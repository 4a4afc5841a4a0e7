"""Vertical-FL benchmark: PSI throughput, RSA with vs without CRT, Paillier plain phe vs accelerated vs packed,
and the epoch time of the breast-cancer hetero-LR run. Everything is measured side by side in one process.

    python benchmarks/vertical.py                    # full: PSI 100,000 x 100,000 at 2048 bits (minutes)
    python benchmarks/vertical.py --psi-ids 5000     # quicker
    python benchmarks/vertical.py --out results.json

Reference point (not measured here): FATE 1.x RSA PSI was reported at about 18,000 IDs/s on two
16-core hosts with 1024-bit keys.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import time

import gmpy2
import numpy as np
import phe


def _rate(n: int, seconds: float) -> float:
    return n / seconds if seconds > 0 else float("inf")


def _cpu_seconds() -> float:
    import resource

    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def bench_rsa(bits: int, n_ops: int) -> dict:
    from fedarena.federated.vertical.rsa_blind import CrtSigner, generate_key

    key = generate_key(bits, allow_insecure_keys=bits < 2048)  # smaller keys only when asked for on the CLI
    xs = [secrets.randbelow(key.public.n - 2) + 2 for _ in range(n_ops)]
    out = {}
    for crt in (False, True):
        s = CrtSigner(key, crt=crt)
        t0 = time.perf_counter()
        sig = s.sign_many(xs)
        out["crt" if crt else "no_crt"] = _rate(n_ops, time.perf_counter() - t0)
        assert all(pow(v, key.public.e, key.public.n) == x for v, x in zip(sig[:5], xs[:5]))
    out["crt_speedup"] = out["crt"] / out["no_crt"]
    return out


def bench_psi(n_ids: int, bits: int, workers: int, overlap: float) -> dict:
    from fedarena.federated.vertical import psi
    from fedarena.federated.vertical.channel import Link

    rng = random.Random(0)
    shared = [f"shared-{i}-{rng.getrandbits(40):x}" for i in range(int(overlap * n_ids))]
    ids_a = shared + [f"a-only-{i}" for i in range(n_ids - len(shared))]
    ids_b = shared + [f"b-only-{i}" for i in range(n_ids - len(shared))]
    rng.shuffle(ids_a)
    rng.shuffle(ids_b)
    link = Link()
    cpu0 = _cpu_seconds()
    t0 = time.perf_counter()
    ra, rb = psi.intersect(ids_a, ids_b, key_bits=bits, workers=workers, chunk_size=2048, transfer=link.transfer,
                           allow_insecure_keys=bits < 2048)
    wall = time.perf_counter() - t0
    cpu = _cpu_seconds() - cpu0  # this process + the (joined) worker processes
    exact = set(ra.ids) == set(ids_a) & set(ids_b) and ra.ids == rb.ids
    total = len(ids_a) + len(ids_b)
    return {"ids_a": len(ids_a), "ids_b": len(ids_b), "shared": len(ra.ids), "exact": exact, "seconds": wall,
            "ids_per_s": _rate(total, wall), "ids_per_s_per_core": _rate(total, wall) / workers,
            "bytes": link.stats.total_bytes, "workers": workers, "cpu_seconds": cpu,
            "ids_per_cpu_second": _rate(total, cpu), "peak_rss_mb": _peak_rss_mb()}


def bench_paillier(bits: int, n_plain: int, n_fast: int, workers: int) -> dict:
    from fedarena.federated.vertical import packing as K
    from fedarena.federated.vertical import paillier as P

    pk, sk = phe.generate_paillier_keypair(n_length=bits)
    fk, fs = P.FastPublicKey(pk), P.FastPrivateKey(sk)
    rng = np.random.default_rng(0)
    xs = rng.uniform(-8, 8, max(n_plain, n_fast))
    r: dict = {"key_bits": bits}

    # encryption: the paths are timed in interleaved rounds, so load changes on a shared machine hit
    # them alike; each path encrypts the same values
    ms = P.encode(xs[:n_fast], 24, pk.n)
    layout = K.make_layout(bits, value_bound=8.0, frac_bits=24, headroom_bits=10)
    r["packed_slots"] = layout.slots
    r["packed_slot_bits"] = layout.slot_bits
    packer = K.SlotPacker(fk, layout)  # no pool: one obfuscator computed per ciphertext, end to end
    vals = rng.uniform(-8, 8, n_fast * layout.slots)
    rounds = 10
    t = {"phe_encrypt": 0.0, "fast_encrypt_no_pool": 0.0, "keyholder_crt_encrypt": 0.0, "packed_encrypt_no_pool": 0.0}
    enc, cs, cs_k, pe = [], [], [], []
    for i in range(rounds):
        lo, hi = i * n_plain // rounds, (i + 1) * n_plain // rounds
        t0 = time.perf_counter()
        enc += [pk.encrypt(float(v)) for v in xs[lo:hi]]
        t["phe_encrypt"] += time.perf_counter() - t0
        lo, hi = i * n_fast // rounds, (i + 1) * n_fast // rounds
        t0 = time.perf_counter()
        cs += fk.encrypt_ints(ms[lo:hi])
        t["fast_encrypt_no_pool"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        cs_k += fs.encrypt_ints(ms[lo:hi])
        t["keyholder_crt_encrypt"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        pe += packer.encrypt(vals[lo * layout.slots : hi * layout.slots])
        t["packed_encrypt_no_pool"] += time.perf_counter() - t0
    r["phe_encrypt"] = _rate(n_plain, t["phe_encrypt"])
    r["fast_encrypt_no_pool"] = _rate(n_fast, t["fast_encrypt_no_pool"])
    r["keyholder_crt_encrypt"] = _rate(n_fast, t["keyholder_crt_encrypt"])
    r["packed_encrypt_no_pool"] = _rate(len(vals), t["packed_encrypt_no_pool"])
    reps = 20  # additions are fast: repeat them for a stable timing
    t0 = time.perf_counter()
    for _ in range(reps):
        for a, b in zip(enc, enc[1:] + enc[:1]):
            _ = a + b
    r["phe_add"] = _rate(reps * n_plain, time.perf_counter() - t0)
    dec, out, t_phe, t_crt = [], [], 0.0, 0.0
    for i in range(rounds):  # interleaved, as for encryption
        t0 = time.perf_counter()
        dec += [sk.decrypt(c) for c in enc[i * n_plain // rounds : (i + 1) * n_plain // rounds]]
        t_phe += time.perf_counter() - t0
        t0 = time.perf_counter()
        out += fs.decrypt_ints(cs[i * n_fast // rounds : (i + 1) * n_fast // rounds])
        t_crt += time.perf_counter() - t0
    r["phe_decrypt"] = _rate(n_plain, t_phe)
    r["crt_decrypt"] = _rate(n_fast, t_crt)
    assert np.allclose(dec, xs[:n_plain])

    # obfuscation pool on `workers` processes: fill rate (after the processes are up), then the hot path
    pool = P.ObfuscationPool(pk.n, capacity=n_fast, batch=16, workers=workers, background=False)
    pool.fill(16 * workers)
    pool.take(len(pool))
    t0 = time.perf_counter()
    pool.fill()
    fill_s = time.perf_counter() - t0
    r["pool_fill_per_s"] = _rate(n_fast, fill_s)
    fkp = P.FastPublicKey(pk, pool)
    t0 = time.perf_counter()
    cs_p = fkp.encrypt_ints(ms)
    hot = time.perf_counter() - t0
    r["fast_encrypt_pool_hot"] = _rate(n_fast, hot)
    r["fast_encrypt_pool_incl_fill"] = _rate(n_fast, hot + fill_s)
    assert fs.decrypt_ints(cs_p[:3]) == ms[:3]
    assert fs.decrypt_ints(cs_k[:3]) == ms[:3]
    pool.fill(len(pe))
    t0 = time.perf_counter()
    pe2 = K.SlotPacker(fkp, layout).encrypt(vals)
    hot = time.perf_counter() - t0
    pool.close()
    r["packed_encrypt_pool_hot"] = _rate(len(vals), hot)
    r["packed_encrypt_pool_incl_fill"] = _rate(len(vals), hot + fill_s * len(pe) / n_fast)
    t0 = time.perf_counter()
    nsq = fk.nsquare
    for _ in range(reps):
        for a, b in zip(cs, cs[1:] + cs[:1]):
            _ = a * b % nsq
    r["fast_add"] = _rate(reps * n_fast, time.perf_counter() - t0)
    assert [P.to_signed(m, pk.n) for m in out[:10]] == [P.to_signed(m, pk.n) for m in ms[:10]]
    assert fs.decrypt_ints(cs_k[:3]) == ms[:3]

    n_vals = len(vals)
    t0 = time.perf_counter()
    for _ in range(reps):
        ps = [packer.add(a, b) for a, b in zip(pe, pe2)]
    r["packed_add"] = _rate(reps * n_vals, time.perf_counter() - t0)
    t0 = time.perf_counter()
    got = packer.decrypt(fs, ps)
    r["packed_decrypt"] = _rate(n_vals, time.perf_counter() - t0)
    q = np.rint(vals * 2**24)
    assert np.array_equal(got * 2**24, 2 * q), "packed sum not exact"
    for k in ("fast_encrypt_no_pool", "fast_encrypt_pool_hot", "fast_encrypt_pool_incl_fill", "keyholder_crt_encrypt",
              "packed_encrypt_no_pool", "packed_encrypt_pool_hot", "packed_encrypt_pool_incl_fill"):
        r[f"{k}_x_phe"] = r[k] / r["phe_encrypt"]
    r["fast_add_x_phe"] = r["fast_add"] / r["phe_add"]
    r["packed_add_x_phe"] = r["packed_add"] / r["phe_add"]
    r["crt_decrypt_x_phe"] = r["crt_decrypt"] / r["phe_decrypt"]
    r["packed_decrypt_x_phe"] = r["packed_decrypt"] / r["phe_decrypt"]
    return r


def bench_epoch(bits: int) -> dict:
    from sklearn.datasets import load_breast_cancer

    from fedarena.federated.vertical.hetero_lr import HeteroLR, HeteroLRConfig
    from fedarena.federated.vertical.partition import standardize, train_test_rows, vertical_partition
    from fedarena.federated.vertical import psi

    x, y = load_breast_cancer(return_X_y=True)
    a, b = vertical_partition(x, y, 15, 0.8, 0)
    ra, rb = psi.intersect(a.ids, b.ids, key_bits=bits, workers=1, allow_insecure_keys=bits < 2048)
    xa, ya, xb = a.x[ra.indices], a.y[ra.indices], b.x[rb.indices]
    train, _ = train_test_rows(len(xa), 0.25, 0)
    xa, xb = standardize(xa, train), standardize(xb, train)
    out = {"rows": int(len(train))}
    for name, coord, pool in (("three_party", True, 0), ("three_party_pool", True, 1024), ("two_party", False, 0)):
        cfg = HeteroLRConfig(epochs=1, key_bits=bits, pool_size=pool, allow_insecure_keys=bits < 2048)
        m = HeteroLR(xa[train], ya[train], xb[train], cfg, coordinator=coord)
        if pool:
            m.b.pool.fill()  # a warm pool, as after the first epoch of a longer run
        t0 = time.perf_counter()
        rep = m.train_epoch()
        out[name] = {"seconds": time.perf_counter() - t0, **{k: round(v, 3) for k, v in rep.seconds.items()},
                     "bytes": rep.bytes, "loss": rep.loss}
        m.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--psi-ids", type=int, default=100_000, help="IDs per party for the PSI run")
    ap.add_argument("--psi-bits", type=int, default=2048)
    ap.add_argument("--overlap", type=float, default=0.5)
    ap.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--paillier-bits", type=int, default=2048)
    ap.add_argument("--n-plain", type=int, default=200, help="values encrypted with plain phe")
    ap.add_argument("--n-fast", type=int, default=200, help="ciphertexts for the accelerated paths")
    ap.add_argument("--skip", nargs="*", default=[], choices=["rsa", "psi", "paillier", "epoch"])
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    res: dict = {"cores": args.workers, "gmpy2": gmpy2.version(), "phe": phe.__version__}
    if "rsa" not in args.skip:
        res["rsa"] = bench_rsa(args.psi_bits, 300)
        print(f"RSA-{args.psi_bits} private op: CRT {res['rsa']['crt']:.0f}/s, no CRT {res['rsa']['no_crt']:.0f}/s "
              f"-> CRT x{res['rsa']['crt_speedup']:.2f}", flush=True)
    if "paillier" not in args.skip:
        p = res["paillier"] = bench_paillier(args.paillier_bits, args.n_plain, args.n_fast, args.workers)
        print(f"Paillier-{args.paillier_bits} values/s (ratio vs plain phe):")
        print(f"  encrypt  phe {p['phe_encrypt']:.1f} | fast no pool {p['fast_encrypt_no_pool']:.1f} "
              f"(x{p['fast_encrypt_no_pool_x_phe']:.2f}) | pool hot {p['fast_encrypt_pool_hot']:.0f} "
              f"(x{p['fast_encrypt_pool_hot_x_phe']:.0f}) | pool incl. fill on {args.workers} procs "
              f"{p['fast_encrypt_pool_incl_fill']:.1f} (x{p['fast_encrypt_pool_incl_fill_x_phe']:.2f}) | key holder CRT "
              f"{p['keyholder_crt_encrypt']:.1f} (x{p['keyholder_crt_encrypt_x_phe']:.2f})")
        print(f"  packed encrypt ({p['packed_slots']} slots of {p['packed_slot_bits']} bits): no pool "
              f"{p['packed_encrypt_no_pool']:.0f} (x{p['packed_encrypt_no_pool_x_phe']:.1f}) | pool hot "
              f"{p['packed_encrypt_pool_hot']:.0f} (x{p['packed_encrypt_pool_hot_x_phe']:.0f}) | pool incl. fill "
              f"{p['packed_encrypt_pool_incl_fill']:.0f} (x{p['packed_encrypt_pool_incl_fill_x_phe']:.1f})")
        print(f"  add      phe {p['phe_add']:.0f} | fast {p['fast_add']:.0f} (x{p['fast_add_x_phe']:.1f}) | packed "
              f"{p['packed_add']:.0f} (x{p['packed_add_x_phe']:.0f})")
        print(f"  decrypt  phe {p['phe_decrypt']:.1f} | CRT {p['crt_decrypt']:.1f} (x{p['crt_decrypt_x_phe']:.2f}) | packed "
              f"{p['packed_decrypt']:.0f} (x{p['packed_decrypt_x_phe']:.0f})", flush=True)
    if "psi" not in args.skip:
        s = res["psi"] = bench_psi(args.psi_ids, args.psi_bits, args.workers, args.overlap)
        print(f"PSI {s['ids_a']} x {s['ids_b']} IDs, {args.psi_bits}-bit, {s['workers']} workers: {s['seconds']:.1f}s, "
              f"{s['ids_per_s']:.0f} IDs/s ({s['ids_per_s_per_core']:.0f} per core of wall time; "
              f"{s['ids_per_cpu_second']:.0f} per CPU-second used), exact={s['exact']}, {s['bytes'] / 1e6:.1f} MB sent, "
              f"peak RSS of the driver {s['peak_rss_mb']:.0f} MB", flush=True)
    if "epoch" not in args.skip:
        e = res["epoch"] = bench_epoch(args.paillier_bits)
        for k in ("three_party", "three_party_pool", "two_party"):
            v = e[k]
            print(f"breast-cancer hetero LR epoch ({e['rows']} rows, {args.paillier_bits}-bit) {k}: {v['seconds']:.1f}s "
                  f"(crypto {v.get('crypto', 0):.1f}, compute {v.get('compute', 0):.2f}, comm {v.get('comm', 0):.2f}), "
                  f"{v['bytes'] / 1e6:.2f} MB", flush=True)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
