"""RFC 6962 / RFC 9162 Merkle tree: hashing, roots, inclusion and consistency proofs, verifiers.

The log is stored as its *frontier* (the roots of the perfect subtrees covering the leaves,
largest first) plus every perfect-subtree node ever completed. Appending is O(log n) and never
rebuilds; any subtree hash a proof needs is at most popcount(size) stored nodes folded together.

Proof generation reads nodes through a `NodeSource` so the same code runs over SQLite, a bundle
or a plain list; every function here is pure.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

HASH_SIZE = 32
NodeSource = Callable[[int, int], bytes]
"""`nodes(level, index)` → hash of the perfect subtree covering leaves [index·2^level, (index+1)·2^level)."""


def leaf_hash(data: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


EMPTY_ROOT = hashlib.sha256(b"").digest()


def _split(n: int) -> int:
    """Largest power of two strictly less than n (n ≥ 2)."""
    return 1 << ((n - 1).bit_length() - 1)


# --- reference computations over a list of leaf hashes (tests, audits of small logs) ----------


def root_from_leaves(leaves: Sequence[bytes]) -> bytes:
    """MTH over already-hashed leaves; the empty tree hashes to SHA-256 of nothing."""
    if not leaves:
        return EMPTY_ROOT
    level = list(leaves)
    # Fold pairwise left to right; an odd node is carried up unchanged (RFC 6962 shape).
    while len(level) > 1:
        nxt = [node_hash(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0]


def list_nodes(leaves: Sequence[bytes]) -> NodeSource:
    """A `NodeSource` over an in-memory list of leaf hashes (for tests and bundle checks)."""
    cache: dict[tuple[int, int], bytes] = {}

    def nodes(level: int, index: int) -> bytes:
        key = (level, index)
        if key not in cache:
            if level == 0:
                cache[key] = leaves[index]
            else:
                cache[key] = node_hash(nodes(level - 1, 2 * index), nodes(level - 1, 2 * index + 1))
        return cache[key]

    return nodes


# --- the frontier: appending in O(log n) ------------------------------------------------------


def frontier_levels(size: int) -> list[int]:
    """Levels of the perfect subtrees covering `size` leaves, largest first (the set bits)."""
    return [bit for bit in range(size.bit_length() - 1, -1, -1) if size >> bit & 1]


def append_leaf(
    frontier: list[bytes], size: int, leaf: bytes
) -> tuple[list[bytes], list[tuple[int, int, bytes]]]:
    """Append one leaf hash to a log of `size` leaves.

    Returns the new frontier and the nodes completed by this append as `(level, index, hash)`,
    the leaf itself first. Runs in O(log n): only the right edge is touched.
    """
    if len(frontier) != bin(size).count("1"):
        raise ValueError(
            f"frontier has {len(frontier)} nodes, size {size} needs {bin(size).count('1')}"
        )
    frontier = list(frontier)
    new_nodes = [(0, size, leaf)]
    node, level, index = leaf, 0, size
    # Each trailing 1-bit of `size` is a perfect subtree the new leaf's subtree now pairs with.
    while index & 1:
        left = frontier.pop()
        node = node_hash(left, node)
        level += 1
        index >>= 1
        new_nodes.append((level, index, node))
    frontier.append(node)
    return frontier, new_nodes


def root_from_frontier(frontier: Sequence[bytes]) -> bytes:
    """The tree root: the frontier folded right to left (smaller subtrees hang on the right)."""
    if not frontier:
        return EMPTY_ROOT
    root = frontier[-1]
    for node in reversed(frontier[:-1]):
        root = node_hash(node, root)
    return root


def frontier_at(size: int, nodes: NodeSource) -> list[bytes]:
    """The frontier of the tree of the first `size` leaves, read from stored perfect nodes."""
    out, start = [], 0
    for level in frontier_levels(size):
        out.append(nodes(level, start >> level))
        start += 1 << level
    return out


# --- subtree hashes and proofs ---------------------------------------------------------------


def subtree_hash(start: int, end: int, nodes: NodeSource) -> bytes:
    """MTH(D[start:end]) for the aligned ranges RFC 6962 proofs use.

    `start` is a multiple of the largest power of two ≤ end - start, so the range decomposes into
    at most log2(end - start) + 1 perfect subtrees, folded right to left.
    """
    parts, cursor = [], start
    remaining = end - start
    for level in frontier_levels(remaining):
        if cursor % (1 << level):
            raise ValueError(f"range [{start}, {end}) is not aligned")
        parts.append(nodes(level, cursor >> level))
        cursor += 1 << level
    return root_from_frontier(parts)


def inclusion_proof(index: int, size: int, nodes: NodeSource) -> list[bytes]:
    """PATH(index, D[0:size]) from RFC 6962 §2.1.1, leaf-side first."""
    if not 0 <= index < size:
        raise ValueError(f"leaf {index} is not in a tree of size {size}")
    path: list[bytes] = []
    start, end = 0, size
    # Walk down from the root; siblings are collected top-down and returned bottom-up.
    while end - start > 1:
        k = _split(end - start)
        if index - start < k:
            path.append(subtree_hash(start + k, end, nodes))
            end = start + k
        else:
            path.append(subtree_hash(start, start + k, nodes))
            start += k
    path.reverse()
    return path


def consistency_proof(old_size: int, new_size: int, nodes: NodeSource) -> list[bytes]:
    """PROOF(old_size, D[0:new_size]) from RFC 6962 §2.1.2."""
    if not 0 < old_size <= new_size:
        raise ValueError(f"no consistency proof from size {old_size} to {new_size}")
    path: list[bytes] = []
    start, end, m, complete = 0, new_size, old_size, True
    while m != end - start:
        k = _split(end - start)
        if m <= k:
            path.append(subtree_hash(start + k, end, nodes))
            end = start + k
        else:
            path.append(subtree_hash(start, start + k, nodes))
            start += k
            m -= k
            complete = False
    if not complete:
        path.append(subtree_hash(start, end, nodes))
    path.reverse()
    return path


def _sides(fn: int, sn: int, count: int) -> list[bool] | None:
    """The walk up the tree both verifiers take (RFC 9162 §2.1.3.2, §2.1.4.2: the loop over the
    proof and the final `sn == 0`), from the node numbers `fn` and `sn`: for each of `count`
    proof hashes, whether it is hashed in on the left; None if the proof does not end at the
    root (longer or shorter than the path)."""
    sides: list[bool] = []
    for _ in range(count):
        if sn == 0:
            return None
        if fn & 1 or fn == sn:
            sides.append(True)
            if not fn & 1:
                while not fn & 1 and fn != 0:
                    fn >>= 1
                    sn >>= 1
        else:
            sides.append(False)
        fn >>= 1
        sn >>= 1
    return sides if sn == 0 else None


def verify_inclusion(
    leaf: bytes, index: int, size: int, proof: Sequence[bytes], root: bytes
) -> bool:
    """RFC 9162 §2.1.3.2. `leaf` is the leaf *hash*. Never raises on malformed input."""
    if not 0 <= index < size or any(len(p) != HASH_SIZE for p in proof):
        return False
    sides = _sides(index, size - 1, len(proof))
    if sides is None:
        return False
    r = leaf
    for p, left in zip(proof, sides, strict=True):
        r = node_hash(p, r) if left else node_hash(r, p)
    return r == root


def verify_consistency(
    old_size: int, new_size: int, old_root: bytes, new_root: bytes, proof: Sequence[bytes]
) -> bool:
    """RFC 9162 §2.1.4.2. Never raises on malformed input."""
    if any(len(p) != HASH_SIZE for p in proof) or not 0 <= old_size <= new_size:
        return False
    if old_size == new_size:
        return not proof and old_root == new_root
    if old_size == 0:
        return not proof
    path = list(proof)
    if old_size & (old_size - 1) == 0:
        path.insert(0, old_root)
    if not path:
        return False
    fn, sn = old_size - 1, new_size - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    sides = _sides(fn, sn, len(path) - 1)
    if sides is None:
        return False
    fr = sr = path[0]
    for c, left in zip(path[1:], sides, strict=True):
        if left:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
        else:
            sr = node_hash(sr, c)
    return fr == old_root and sr == new_root
