"""Collective algorithms as deterministic point-to-point schedules over a :class:`~.transport.Transport`.

Each function works in place on a flat, C-contiguous working buffer and splits every transfer into chunks of
``chunk`` elements; a chunk is forwarded as soon as it has been received (and reduced), so consecutive steps of
a schedule overlap on large messages (pipelining). Every element is combined in an order fixed by the schedule
alone, never by arrival timing, so a fixed algorithm and world size give bit-identical results on every rank and
on every run. References (the algorithms, not code):

- ring reduce-scatter + all-gather all-reduce: Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for
  clusters of workstations", JPDC 2009;
- recursive halving reduce-scatter + recursive doubling all-gather, with the fold of the ``n - 2^k`` extra ranks
  into their neighbours for non-power-of-two sizes: Thakur, Rabenseifner & Gropp, "Optimization of collective
  communication operations in MPICH", IJHPCA 2005, section 4.5 (Rabenseifner's algorithm);
- binary-tree reduce and broadcast pipelined by chunks (the tree NCCL uses, single rather than double);
- the dissemination barrier: Hensgen, Finkel & Manber, 1988.

Binary trees are heaps over the ranks relabelled so that the root is virtual rank 0: virtual rank ``v`` has the
parent ``(v - 1) // 2`` and the children ``2v + 1`` and ``2v + 2``.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from .transport import contiguous, Reduction, Request, Transport


def _chunks(lo: int, hi: int, chunk: int) -> Iterator[tuple[int, int]]:
    for a in range(lo, hi, chunk):
        yield a, min(a + chunk, hi)


def _wait(reqs: list[Request]) -> None:
    for r in reqs:
        r.wait()
    reqs.clear()


def even_bounds(length: int, parts: int) -> list[int]:
    """Split ``[0, length)`` into ``parts`` contiguous ranges whose sizes differ by at most one."""
    return [length * i // parts for i in range(parts + 1)]


# ------------------------------------------------------------------------------------------------------- ring


def ring_reduce_scatter(tr: Transport, buf: np.ndarray, bounds: list[int], op: Reduction, chunk: int,
                        offset: int) -> int:
    """Ring reduce-scatter of the ``n`` segments ``bounds``; returns the segment this rank then owns fully
    reduced, ``(rank + offset + 1) mod n``. Step ``s`` receives segment ``rank + offset - 1 - s`` from the left
    neighbour, reduces it, and forwards it to the right neighbour chunk by chunk."""
    n, r = tr.world_size, tr.rank
    right, left = (r + 1) % n, (r - 1) % n
    reqs: list[Request] = []
    seg = lambda i: (bounds[i % n], bounds[i % n + 1])  # noqa: E731
    for a, b in _chunks(*seg(r + offset), chunk):
        reqs.append(tr.isend(right, buf[a:b]))
    for s in range(n - 1):
        for a, b in _chunks(*seg(r + offset - 1 - s), chunk):
            tr.recv_reduce(left, buf[a:b], op)
            if s < n - 2:
                reqs.append(tr.isend(right, buf[a:b]))
    _wait(reqs)
    return (r + offset + 1) % n


def ring_all_gather(tr: Transport, buf: np.ndarray, bounds: list[int], chunk: int, own: int) -> None:
    """Ring all-gather: this rank holds segment ``own``; step ``s`` receives segment ``own - 1 - s``."""
    n, r = tr.world_size, tr.rank
    right, left = (r + 1) % n, (r - 1) % n
    reqs: list[Request] = []
    seg = lambda i: (bounds[i % n], bounds[i % n + 1])  # noqa: E731
    for a, b in _chunks(*seg(own), chunk):
        reqs.append(tr.isend(right, buf[a:b]))
    for s in range(n - 1):
        for a, b in _chunks(*seg(own - 1 - s), chunk):
            tr.recv_into(left, buf[a:b])
            if s < n - 2:
                reqs.append(tr.isend(right, buf[a:b]))
    _wait(reqs)


def ring_all_reduce(tr: Transport, buf: np.ndarray, op: Reduction, chunk: int) -> None:
    bounds = even_bounds(buf.size, tr.world_size)
    own = ring_reduce_scatter(tr, buf, bounds, op, chunk, offset=0)
    ring_all_gather(tr, buf, bounds, chunk, own)


def chain_broadcast(tr: Transport, buf: np.ndarray, root: int, chunk: int) -> None:
    """Pipelined chain root -> root+1 -> ... -> root-1 (the ring without its closing edge)."""
    n = tr.world_size
    v = (tr.rank - root) % n
    prev, nxt = (tr.rank - 1) % n, (tr.rank + 1) % n
    reqs: list[Request] = []
    for a, b in _chunks(0, buf.size, chunk):
        if v > 0:
            tr.recv_into(prev, buf[a:b])
        if v < n - 1:
            reqs.append(tr.isend(nxt, buf[a:b]))
    _wait(reqs)


def chain_reduce(tr: Transport, buf: np.ndarray, root: int, op: Reduction, chunk: int) -> None:
    """Pipelined chain root-1 -> root-2 -> ... -> root, each rank reducing before forwarding."""
    n = tr.world_size
    v = (tr.rank - root) % n
    prev, nxt = (tr.rank - 1) % n, (tr.rank + 1) % n
    reqs: list[Request] = []
    for a, b in _chunks(0, buf.size, chunk):
        if v < n - 1:
            tr.recv_reduce(nxt, buf[a:b], op)
        if v > 0:
            reqs.append(tr.isend(prev, buf[a:b]))
    _wait(reqs)


# ------------------------------------------------------------------------------------------------ binary tree


def _tree(tr: Transport, root: int) -> tuple[int, int | None, list[int]]:
    n = tr.world_size
    v = (tr.rank - root) % n
    parent = None if v == 0 else ((v - 1) // 2 + root) % n
    children = [(c + root) % n for c in (2 * v + 1, 2 * v + 2) if c < n]
    return v, parent, children


def tree_reduce(tr: Transport, buf: np.ndarray, root: int, op: Reduction, chunk: int) -> None:
    _, parent, children = _tree(tr, root)
    reqs: list[Request] = []
    for a, b in _chunks(0, buf.size, chunk):
        for c in children:
            tr.recv_reduce(c, buf[a:b], op)
        if parent is not None:
            reqs.append(tr.isend(parent, buf[a:b]))
    _wait(reqs)


def tree_broadcast(tr: Transport, buf: np.ndarray, root: int, chunk: int) -> None:
    _, parent, children = _tree(tr, root)
    reqs: list[Request] = []
    for a, b in _chunks(0, buf.size, chunk):
        if parent is not None:
            tr.recv_into(parent, buf[a:b])
        for c in children:
            reqs.append(tr.isend(c, buf[a:b]))
    _wait(reqs)


def tree_all_reduce(tr: Transport, buf: np.ndarray, op: Reduction, chunk: int) -> None:
    tree_reduce(tr, buf, 0, op, chunk)
    tree_broadcast(tr, buf, 0, chunk)


def _subtree(v: int, n: int) -> list[int]:
    """Virtual ranks of the heap subtree under ``v``, in preorder."""
    if v >= n:
        return []
    return [v] + _subtree(2 * v + 1, n) + _subtree(2 * v + 2, n)


def tree_gather(tr: Transport, block: np.ndarray, root: int) -> np.ndarray | None:
    """Binary-tree gather of equal-shaped blocks; returns the ``(n, *block.shape)`` stack on the root."""
    n = tr.world_size
    v, parent, children = _tree(tr, root)
    parts = [block[None]]
    for c in children:
        size = len(_subtree((c - root) % n, n))
        part = np.empty((size,) + block.shape, dtype=block.dtype)
        tr.recv_into(c, part)
        parts.append(part)
    mine = np.concatenate(parts, axis=0)
    if parent is not None:
        tr.send(parent, mine)
        return None
    out = np.empty_like(mine)
    for i, u in enumerate(_subtree(0, n)):
        out[(u + root) % n] = mine[i]
    return out


def tree_scatter(tr: Transport, blocks: np.ndarray | None, root: int) -> np.ndarray:
    """Binary-tree scatter of ``blocks[i]`` to rank ``i``; ``blocks`` is only read on the root."""
    n = tr.world_size
    v, parent, children = _tree(tr, root)
    if parent is None:
        assert blocks is not None
        mine = contiguous(blocks[[(u + root) % n for u in _subtree(0, n)]])
    else:
        mine = tr.recv(parent)
    order = _subtree(v, n)
    reqs: list[Request] = []
    for c in children:
        sub = _subtree((c - root) % n, n)
        start = order.index(sub[0])
        reqs.append(tr.isend(c, contiguous(mine[start:start + len(sub)])))
    _wait(reqs)
    return mine[0, ...].copy()


# ---------------------------------------------------------------------------------- linear (root talks to all)


def linear_gather(tr: Transport, block: np.ndarray, root: int) -> np.ndarray | None:
    if tr.rank != root:
        tr.send(root, block)
        return None
    out = np.empty((tr.world_size,) + block.shape, dtype=block.dtype)
    out[root, ...] = block
    for src in range(tr.world_size):
        if src != root:
            tr.recv_into(src, out[src, ...])
    return out


def linear_scatter(tr: Transport, blocks: np.ndarray | None, root: int) -> np.ndarray:
    if tr.rank != root:
        return tr.recv(root)
    assert blocks is not None
    reqs = [tr.isend(dst, contiguous(blocks[dst, ...])) for dst in range(tr.world_size) if dst != root]
    _wait(reqs)
    return np.array(blocks[root, ...])


# ----------------------------------------------------------------------------- recursive halving and doubling


def fold_layout(n: int) -> tuple[int, int]:
    """``(p, rem)``: the largest power of two ``p <= n`` and the ``rem = n - p`` ranks folded away.

    Ranks ``0 .. 2 rem - 1`` pair up; the even rank of each pair hands its data to the odd one and sits out the
    power-of-two phase. The remaining ``p`` ranks are renumbered ``0 .. p-1`` ("new ranks")."""
    p = 1 << (n.bit_length() - 1)
    return p, n - p


def new_rank(rank: int, rem: int) -> int:
    if rank < 2 * rem:
        return rank // 2 if rank % 2 else -1
    return rank - rem


def _first_original(k: int, rem: int) -> int:
    return 2 * k if k < rem else k + rem


def _real(k: int, rem: int) -> int:
    """The original rank that new rank ``k`` runs on (the odd rank of a folded pair)."""
    return 2 * k + 1 if k < rem else k + rem


def block_bounds(n: int, block: int) -> list[int]:
    """Element bounds owned by each new rank when new rank ``k`` stands for the original ranks it folded in."""
    p, rem = fold_layout(n)
    return [_first_original(k, rem) * block for k in range(p)] + [n * block]


def _hd_steps(nr: int, p: int) -> list[tuple[int, tuple[int, int], tuple[int, int]]]:
    """Recursive halving over new ranks: per step (partner, kept new-rank range, sent new-rank range)."""
    steps = []
    lo, hi, mask = 0, p, p >> 1
    while mask:
        mid = (lo + hi) // 2
        keep, give = ((lo, mid), (mid, hi)) if nr < mid else ((mid, hi), (lo, mid))
        steps.append((nr ^ mask, keep, give))
        lo, hi = keep
        mask >>= 1
    return steps


def _exchange(tr: Transport, partner: int, buf: np.ndarray, send: tuple[int, int], recv: tuple[int, int],
              chunk: int, op: Reduction | None) -> list[Request]:
    reqs = [tr.isend(partner, buf[a:b]) for a, b in _chunks(*send, chunk)]
    for a, b in _chunks(*recv, chunk):
        if op is None:
            tr.recv_into(partner, buf[a:b])
        else:
            tr.recv_reduce(partner, buf[a:b], op)
    return reqs


def halving_reduce_scatter(tr: Transport, buf: np.ndarray, bounds: list[int], op: Reduction,
                           chunk: int) -> int:
    """Fold, then recursive halving; new rank ``k`` ends with ``[bounds[k], bounds[k+1])`` reduced over all
    ranks. Returns the new rank (-1 for a folded-away rank)."""
    p, rem = fold_layout(tr.world_size)
    r = tr.rank
    nr = new_rank(r, rem)
    reqs: list[Request] = []
    if r < 2 * rem:
        if nr < 0:
            _wait([tr.isend(r + 1, buf[a:b]) for a, b in _chunks(0, buf.size, chunk)])
            return -1
        for a, b in _chunks(0, buf.size, chunk):
            tr.recv_reduce(r - 1, buf[a:b], op)
    for partner, keep, give in _hd_steps(nr, p):
        reqs += _exchange(tr, _real(partner, rem), buf, (bounds[give[0]], bounds[give[1]]),
                          (bounds[keep[0]], bounds[keep[1]]), chunk, op)
    _wait(reqs)
    return nr


def doubling_all_gather(tr: Transport, buf: np.ndarray, bounds: list[int], chunk: int, nr: int) -> None:
    """Recursive doubling over the new ranks (new rank ``nr`` starts with its own range), then unfold: each odd
    rank of a folded pair hands the full buffer to its even partner."""
    p, rem = fold_layout(tr.world_size)
    r = tr.rank
    reqs: list[Request] = []
    if nr >= 0:
        for partner, keep, give in reversed(_hd_steps(nr, p)):
            reqs += _exchange(tr, _real(partner, rem), buf, (bounds[keep[0]], bounds[keep[1]]),
                              (bounds[give[0]], bounds[give[1]]), chunk, None)
        _wait(reqs)
    if r < 2 * rem:
        if nr < 0:
            for a, b in _chunks(0, buf.size, chunk):
                tr.recv_into(r + 1, buf[a:b])
        else:
            reqs += [tr.isend(r - 1, buf[a:b]) for a, b in _chunks(0, buf.size, chunk)]
            _wait(reqs)


def halving_doubling_all_reduce(tr: Transport, buf: np.ndarray, op: Reduction, chunk: int) -> None:
    p, _ = fold_layout(tr.world_size)
    bounds = even_bounds(buf.size, p)
    nr = halving_reduce_scatter(tr, buf, bounds, op, chunk)
    doubling_all_gather(tr, buf, bounds, chunk, nr)


def halving_block_reduce_scatter(tr: Transport, buf: np.ndarray, block: int, op: Reduction,
                                 chunk: int) -> None:
    """Reduce-scatter of ``n`` blocks of ``block`` elements; afterwards ``buf``'s block ``rank`` is reduced."""
    n, r = tr.world_size, tr.rank
    p, rem = fold_layout(n)
    nr = halving_reduce_scatter(tr, buf, block_bounds(n, block), op, chunk)
    if r < 2 * rem:  # the odd rank of a folded pair holds both blocks; the even one gets its own back
        a = (r - 1 if nr >= 0 else r) * block
        if nr >= 0:
            reqs = [tr.isend(r - 1, buf[x:y]) for x, y in _chunks(a, a + block, chunk)]
            _wait(reqs)
        else:
            for x, y in _chunks(a, a + block, chunk):
                tr.recv_into(r + 1, buf[x:y])


def doubling_block_all_gather(tr: Transport, buf: np.ndarray, block: int, chunk: int) -> None:
    """All-gather of ``n`` blocks (this rank's block already in place) by fold + recursive doubling + unfold."""
    n, r = tr.world_size, tr.rank
    p, rem = fold_layout(n)
    nr = new_rank(r, rem)
    if r < 2 * rem:
        a = (r - 1 if nr >= 0 else r) * block
        if nr < 0:
            _wait([tr.isend(r + 1, buf[x:y]) for x, y in _chunks(a, a + block, chunk)])
        else:
            for x, y in _chunks(a, a + block, chunk):
                tr.recv_into(r - 1, buf[x:y])
    doubling_all_gather(tr, buf, block_bounds(n, block), chunk, nr)


# ------------------------------------------------------------------------------------------------ barrier


def dissemination_barrier(tr: Transport) -> None:
    token = np.zeros(0, dtype=np.uint8)
    k = 1
    while k < tr.world_size:
        req = tr.isend((tr.rank + k) % tr.world_size, token)
        tr.recv_into((tr.rank - k) % tr.world_size, token)
        req.wait()
        k <<= 1
