"""RFC 6962 Merkle log: the published transparency-dev vectors, then properties over sizes 1..300."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loopwarden.kernel.log import merkle

VECTORS = json.loads((Path(__file__).parent / "vectors" / "rfc6962.json").read_text())
LEAF_DATA = [bytes.fromhex(h) for h in VECTORS["leaves_hex"]]
LEAF_HASHES = [merkle.leaf_hash(d) for d in LEAF_DATA]
ROOTS = {r["tree_size"]: bytes.fromhex(r["root_hex"]) for r in VECTORS["roots"]}

PROPERTY = settings(max_examples=60, deadline=None)


def _hexes(values: list[str]) -> list[bytes]:
    return [bytes.fromhex(v) for v in values]


def _leaves(size: int) -> list[bytes]:
    return [merkle.leaf_hash(b"leaf-%d" % i) for i in range(size)]


def _appended(leaves: list[bytes]) -> tuple[list[bytes], dict[tuple[int, int], bytes]]:
    """The frontier after appending every leaf, and every node the appends reported complete."""
    frontier: list[bytes] = []
    stored: dict[tuple[int, int], bytes] = {}
    for size, leaf in enumerate(leaves):
        frontier, new_nodes = merkle.append_leaf(frontier, size, leaf)
        for level, index, node in new_nodes:
            stored[(level, index)] = node
    return frontier, stored


def _flip(data: bytes, position: int) -> bytes:
    position %= len(data)
    return data[:position] + bytes([data[position] ^ 0x01]) + data[position + 1 :]


def _path_shape(index: int, size: int) -> tuple[bool, ...]:
    """RFC 6962 §2.1.1 PATH as sibling sides, leaf side first (True = sibling on the right)."""
    if size == 1:
        return ()
    k = 1 << ((size - 1).bit_length() - 1)
    if index < k:
        return (*_path_shape(index, k), True)
    return (*_path_shape(index - k, size - k), False)


# --- published vectors -----------------------------------------------------------------------


def test_empty_tree_root_is_the_published_sha256_of_nothing():
    assert bytes.fromhex(VECTORS["empty_tree_root_hex"]) == merkle.EMPTY_ROOT
    assert merkle.root_from_leaves([]) == merkle.EMPTY_ROOT
    assert merkle.root_from_frontier([]) == merkle.EMPTY_ROOT


@pytest.mark.parametrize("vector", VECTORS["hasher_vectors"], ids=lambda v: v["desc"])
def test_hasher_reproduces_published_vector(vector):
    want = bytes.fromhex(vector["want_hex"])
    if vector["op"] == "empty_root":
        got = merkle.EMPTY_ROOT
    elif vector["op"] == "leaf_hash":
        got = merkle.leaf_hash(bytes.fromhex(vector["leaf_hex"]))
    else:
        got = merkle.node_hash(
            bytes.fromhex(vector["left_hex"]), bytes.fromhex(vector["right_hex"])
        )
    assert got == want


@pytest.mark.parametrize("size", sorted(ROOTS))
def test_root_of_first_n_published_leaves_matches_published_root(size):
    leaves = LEAF_HASHES[:size]
    frontier, _ = _appended(leaves)
    assert merkle.root_from_leaves(leaves) == ROOTS[size]
    assert merkle.root_from_frontier(frontier) == ROOTS[size]


@pytest.mark.parametrize(
    "vector",
    VECTORS["inclusion_proofs"],
    ids=lambda v: f"leaf{v['leaf_index']}-size{v['tree_size']}",
)
def test_published_inclusion_proof_equals_ours_and_verifies(vector):
    index, size = vector["leaf_index"], vector["tree_size"]
    published = _hexes(vector["path_hex"])
    ours = merkle.inclusion_proof(index, size, merkle.list_nodes(LEAF_HASHES))
    assert ours == published
    assert merkle.verify_inclusion(LEAF_HASHES[index], index, size, published, ROOTS[size])


@pytest.mark.parametrize(
    "vector",
    VECTORS["consistency_proofs"],
    ids=lambda v: f"{v['size1']}-to-{v['size2']}",
)
def test_published_consistency_proof_equals_ours_and_verifies(vector):
    old, new = vector["size1"], vector["size2"]
    published = _hexes(vector["path_hex"])
    ours = merkle.consistency_proof(old, new, merkle.list_nodes(LEAF_HASHES))
    assert ours == published
    assert merkle.verify_consistency(old, new, ROOTS[old], ROOTS[new], published)


def test_published_inclusion_proof_fails_against_another_published_root():
    vector = next(v for v in VECTORS["inclusion_proofs"] if v["tree_size"] == 8)
    proof = _hexes(vector["path_hex"])
    leaf = LEAF_HASHES[vector["leaf_index"]]
    assert not merkle.verify_inclusion(leaf, vector["leaf_index"], 8, proof, ROOTS[7])


# --- properties ------------------------------------------------------------------------------


@PROPERTY
@given(size=st.integers(1, 300))
def test_frontier_appends_give_the_reference_root_and_the_stored_frontier(size):
    leaves = _leaves(size)
    frontier, stored = _appended(leaves)
    listed = merkle.list_nodes(leaves)
    assert merkle.root_from_frontier(frontier) == merkle.root_from_leaves(leaves)
    assert merkle.frontier_at(size, listed) == frontier
    assert merkle.frontier_at(size, lambda level, index: stored[(level, index)]) == frontier
    assert all(listed(level, index) == node for (level, index), node in stored.items())


@PROPERTY
@given(size=st.integers(1, 300))
def test_every_inclusion_proof_verifies_for_every_leaf(size):
    leaves = _leaves(size)
    nodes = merkle.list_nodes(leaves)
    root = merkle.root_from_leaves(leaves)
    for index in range(size):
        proof = merkle.inclusion_proof(index, size, nodes)
        assert merkle.verify_inclusion(leaves[index], index, size, proof, root), index


@PROPERTY
@given(data=st.data())
def test_consistency_proof_verifies_between_random_sizes(data):
    new = data.draw(st.integers(1, 300), label="new_size")
    old = data.draw(st.integers(1, new), label="old_size")
    leaves = _leaves(new)
    proof = merkle.consistency_proof(old, new, merkle.list_nodes(leaves))
    old_root, new_root = merkle.root_from_leaves(leaves[:old]), merkle.root_from_leaves(leaves)
    assert merkle.verify_consistency(old, new, old_root, new_root, proof)


@PROPERTY
@given(data=st.data())
def test_inclusion_fails_when_any_byte_of_proof_leaf_or_root_is_flipped(data):
    size = data.draw(st.integers(1, 300), label="size")
    index = data.draw(st.integers(0, size - 1), label="index")
    leaves = _leaves(size)
    proof = merkle.inclusion_proof(index, size, merkle.list_nodes(leaves))
    root = merkle.root_from_leaves(leaves)
    leaf = leaves[index]
    targets = ["leaf", "root"] + (["proof"] if proof else [])
    target = data.draw(st.sampled_from(targets), label="target")
    position = data.draw(st.integers(0, merkle.HASH_SIZE - 1), label="byte")
    if target == "leaf":
        leaf = _flip(leaf, position)
    elif target == "root":
        root = _flip(root, position)
    else:
        element = data.draw(st.integers(0, len(proof) - 1), label="element")
        proof[element] = _flip(proof[element], position)
    assert not merkle.verify_inclusion(leaf, index, size, proof, root)


@PROPERTY
@given(data=st.data())
def test_consistency_fails_when_any_byte_of_proof_or_either_root_is_flipped(data):
    new = data.draw(st.integers(1, 300), label="new_size")
    old = data.draw(st.integers(1, new), label="old_size")
    leaves = _leaves(new)
    proof = merkle.consistency_proof(old, new, merkle.list_nodes(leaves))
    old_root, new_root = merkle.root_from_leaves(leaves[:old]), merkle.root_from_leaves(leaves)
    targets = ["old_root", "new_root"] + (["proof"] if proof else [])
    target = data.draw(st.sampled_from(targets), label="target")
    position = data.draw(st.integers(0, merkle.HASH_SIZE - 1), label="byte")
    if target == "old_root":
        old_root = _flip(old_root, position)
    elif target == "new_root":
        new_root = _flip(new_root, position)
    else:
        element = data.draw(st.integers(0, len(proof) - 1), label="element")
        proof[element] = _flip(proof[element], position)
    assert not merkle.verify_consistency(old, new, old_root, new_root, proof)


@PROPERTY
@given(data=st.data())
def test_inclusion_proof_fails_at_any_other_index(data):
    size = data.draw(st.integers(2, 300), label="size")
    index = data.draw(st.integers(0, size - 1), label="index")
    other = data.draw(st.integers(0, size - 1).filter(lambda i: i != index), label="other")
    leaves = _leaves(size)
    proof = merkle.inclusion_proof(index, size, merkle.list_nodes(leaves))
    root = merkle.root_from_leaves(leaves)
    assert not merkle.verify_inclusion(leaves[index], other, size, proof, root)


@PROPERTY
@given(data=st.data())
def test_inclusion_proof_verifies_at_another_size_only_if_the_path_shape_is_identical(data):
    # RFC 9162 verification binds the proof to (index, size) only through the path's shape: the
    # proof for leaf 0 of a 3-leaf tree also verifies as "leaf 0 of 4" against the 3-leaf root.
    # Any size whose shape differs (longer, shorter or other sides) must fail.
    size = data.draw(st.integers(1, 300), label="size")
    index = data.draw(st.integers(0, size - 1), label="index")
    claimed = data.draw(st.integers(0, 320).filter(lambda n: n != size), label="claimed_size")
    leaves = _leaves(size)
    proof = merkle.inclusion_proof(index, size, merkle.list_nodes(leaves))
    root = merkle.root_from_leaves(leaves)
    same_shape = index < claimed and _path_shape(index, claimed) == _path_shape(index, size)
    assert merkle.verify_inclusion(leaves[index], index, claimed, proof, root) is same_shape


def test_inclusion_proof_at_an_index_outside_the_tree_fails():
    leaves = _leaves(5)
    proof = merkle.inclusion_proof(4, 5, merkle.list_nodes(leaves))
    root = merkle.root_from_leaves(leaves)
    assert merkle.verify_inclusion(leaves[4], 4, 5, proof, root)
    assert not merkle.verify_inclusion(leaves[4], 5, 5, proof, root)
    assert not merkle.verify_inclusion(leaves[4], -1, 5, proof, root)
    assert not merkle.verify_inclusion(leaves[4], 4, 4, proof, root)


@PROPERTY
@given(data=st.data())
def test_consistency_proof_fails_for_any_size_pair_whose_proof_has_another_length(data):
    # As with inclusion, the verifier sees sizes only through the proof's shape: the proof for
    # 1 -> 3 also verifies as 1 -> 4. A claimed pair whose own proof is longer or shorter must
    # always fail, and so must the pair swapped.
    new = data.draw(st.integers(2, 300), label="new_size")
    old = data.draw(st.integers(1, new - 1), label="old_size")
    leaves = _leaves(new + 4)
    nodes = merkle.list_nodes(leaves)
    proof = merkle.consistency_proof(old, new, nodes)
    old_root, new_root = (
        merkle.root_from_leaves(leaves[:old]),
        merkle.root_from_leaves(leaves[:new]),
    )
    assert not merkle.verify_consistency(new, old, new_root, old_root, proof)
    checked = 0
    for claimed_new in range(max(new - 3, 1), new + 4):
        nearby = {*range(1, 9), *range(old - 3, old + 4), *range(claimed_new - 3, claimed_new + 1)}
        for claimed_old in sorted(m for m in nearby if 1 <= m <= claimed_new):
            if (claimed_old, claimed_new) == (old, new):
                continue
            if len(merkle.consistency_proof(claimed_old, claimed_new, nodes)) == len(proof):
                continue
            checked += 1
            assert not merkle.verify_consistency(
                claimed_old, claimed_new, old_root, new_root, proof
            ), (claimed_old, claimed_new)
    assert checked > 0


# --- malformed proofs ------------------------------------------------------------------------

MALFORMED = ["short_element", "long_element", "extra_element", "missing_element"]


def _malformed(proof: list[bytes], kind: str) -> list[bytes]:
    proof = list(proof)
    if kind == "short_element":
        proof[0] = proof[0][:-1]
    elif kind == "long_element":
        proof[0] = proof[0] + b"\x00"
    elif kind == "extra_element":
        proof.append(hashlib.sha256(b"extra").digest())
    else:
        proof.pop()
    return proof


@pytest.mark.parametrize("kind", MALFORMED)
@pytest.mark.parametrize(("index", "size"), [(0, 2), (2, 3), (5, 8), (6, 7), (12, 13), (0, 300)])
def test_malformed_inclusion_proof_returns_false(index, size, kind):
    leaves = _leaves(size)
    proof = merkle.inclusion_proof(index, size, merkle.list_nodes(leaves))
    root = merkle.root_from_leaves(leaves)
    assert merkle.verify_inclusion(leaves[index], index, size, proof, root)
    assert (
        merkle.verify_inclusion(leaves[index], index, size, _malformed(proof, kind), root) is False
    )


@pytest.mark.parametrize("kind", MALFORMED)
@pytest.mark.parametrize(("old", "new"), [(1, 2), (2, 5), (3, 7), (4, 8), (6, 8), (100, 300)])
def test_malformed_consistency_proof_returns_false(old, new, kind):
    leaves = _leaves(new)
    proof = merkle.consistency_proof(old, new, merkle.list_nodes(leaves))
    old_root, new_root = merkle.root_from_leaves(leaves[:old]), merkle.root_from_leaves(leaves)
    assert merkle.verify_consistency(old, new, old_root, new_root, proof)
    broken = _malformed(proof, kind)
    assert merkle.verify_consistency(old, new, old_root, new_root, broken) is False


def test_inclusion_proof_for_a_one_leaf_tree_is_empty_and_rejects_any_element():
    leaf = merkle.leaf_hash(b"only")
    assert merkle.inclusion_proof(0, 1, merkle.list_nodes([leaf])) == []
    assert merkle.verify_inclusion(leaf, 0, 1, [], leaf)
    assert merkle.verify_inclusion(leaf, 0, 1, [leaf], leaf) is False


def test_consistency_between_equal_sizes_needs_an_empty_proof_and_equal_roots():
    leaves = _leaves(6)
    root = merkle.root_from_leaves(leaves)
    assert merkle.consistency_proof(6, 6, merkle.list_nodes(leaves)) == []
    assert merkle.verify_consistency(6, 6, root, root, [])
    assert merkle.verify_consistency(6, 6, root, root, [root]) is False
    assert merkle.verify_consistency(6, 6, root, _flip(root, 0), []) is False


def test_empty_consistency_proof_between_different_sizes_returns_false():
    leaves = _leaves(8)
    for old in (1, 2, 3, 4, 7):
        old_root = merkle.root_from_leaves(leaves[:old])
        new_root = merkle.root_from_leaves(leaves)
        assert merkle.verify_consistency(old, 8, old_root, new_root, []) is False, old


def test_proof_generators_refuse_positions_outside_the_tree():
    nodes = merkle.list_nodes(_leaves(4))
    with pytest.raises(ValueError):
        merkle.inclusion_proof(4, 4, nodes)
    with pytest.raises(ValueError):
        merkle.consistency_proof(0, 4, nodes)
    with pytest.raises(ValueError):
        merkle.consistency_proof(5, 4, nodes)


def test_append_refuses_a_frontier_of_the_wrong_length():
    frontier, _ = _appended(_leaves(3))
    with pytest.raises(ValueError):
        merkle.append_leaf(frontier, 4, merkle.leaf_hash(b"x"))


# --- the per-loop state tree ------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(slots=st.integers(min_value=1, max_value=700), data=st.data())
def test_filling_a_state_tree_at_once_builds_the_tree_leaf_by_leaf_puts_build(slots, data):
    # The audit rebuilds each loop's tree in one `fill`; the write path `put`s leaf by leaf.
    # Every slot, a sparse subset, or (as a damaged row could) slots outside the tree.
    from loopwarden.kernel.store.statetree import EMPTY, StateTree, node

    inside = st.integers(min_value=0, max_value=slots - 1)
    chosen = data.draw(
        st.one_of(
            st.just(list(range(slots))),
            st.lists(inside, max_size=80),
            st.lists(st.integers(min_value=-3, max_value=slots + 40), max_size=20),
        )
    )
    leaves = {slot: hashlib.sha256(str(slot).encode()).digest() for slot in chosen}
    trees = [StateTree(0, node(EMPTY), lambda level, idx: None) for _ in range(2)]
    for tree in trees:
        tree.grow(slots)
    trees[0].fill(leaves)
    for slot, digest in leaves.items():
        trees[1].put(slot, digest)
    assert trees[0].root == trees[1].root
    assert trees[0].blobs() == trees[1].blobs()
