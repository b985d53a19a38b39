"""Key history: a store's keys are a chain of statements sealed by the keys themselves.

The genesis key signs its own statement; each rotation is signed by the key it replaces and by
the new one. A key that arrives any other way — written into the key directory, named by a
statement the previous key did not sign, or by one whose body was edited — is not trusted.
"""

from __future__ import annotations

from loopwarden.kernel.log.keys import Signer
from loopwarden.kernel.log.rotations import KeyChain, genesis, parse_statement, rotation

ORIGIN = "loopwarden.local/test"
AT = "2026-12-01T00:00:00.000000Z"


def test_a_chain_follows_genesis_and_rotations_signed_by_both_keys():
    first, second, third = Signer.generate(), Signer.generate(), Signer.generate()
    chain = KeyChain(ORIGIN)
    assert chain.add(genesis(ORIGIN, first, AT))
    assert chain.add(rotation(ORIGIN, first, second, AT))
    assert chain.add(rotation(ORIGIN, second, third, AT))
    assert list(chain.keys) == [first.key_id, second.key_id, third.key_id]
    assert chain.first == first.key_id and chain.problems == []
    assert chain.keyring().ids() == sorted(chain.keys)


def test_a_key_handed_over_by_a_key_outside_the_chain_is_refused():
    first, rogue, planted = Signer.generate(), Signer.generate(), Signer.generate()
    chain = KeyChain(ORIGIN)
    chain.add(genesis(ORIGIN, first, AT))
    assert not chain.add(rotation(ORIGIN, rogue, planted, AT))
    assert planted.key_id not in chain.keys and "does not hold" in chain.problems[0]


def test_a_rotation_needs_the_previous_keys_signature_and_the_new_keys():
    first, planted = Signer.generate(), Signer.generate()
    chain = KeyChain(ORIGIN)
    chain.add(genesis(ORIGIN, first, AT))
    forged = rotation(ORIGIN, first, planted, AT)
    only_new = forged.replace(forged.split("\n\n")[1].split("\n")[0] + "\n", "")
    assert not chain.add(only_new)
    impostor = Signer.generate()  # signs as if it were `first`
    body = forged.split("\n\n")[0]
    renamed = rotation(ORIGIN, impostor, planted, AT).replace(impostor.key_id, first.key_id)
    assert not chain.add(renamed)
    assert not chain.add(body + "\n\n")
    assert list(chain.keys) == [first.key_id]


def test_an_edited_statement_or_another_stores_is_refused():
    first, second = Signer.generate(), Signer.generate()
    chain = KeyChain(ORIGIN)
    chain.add(genesis(ORIGIN, first, AT))
    note = rotation(ORIGIN, first, second, AT)
    assert not chain.add(note.replace(AT, "2027-01-01T00:00:00.000000Z"))
    assert not KeyChain("loopwarden.local/other").add(genesis(ORIGIN, first, AT))
    assert not chain.add(genesis(ORIGIN, second, AT)), "one genesis per chain"
    assert parse_statement("not a note") is None
    assert parse_statement(note.replace(second.key_id, "ed25519-0000000000000000", 1)) is None
