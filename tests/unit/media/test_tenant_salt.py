"""The tenant key namespace: key_salt of (token identity, cache_salt), salted mm_hashes and
token identities."""

from __future__ import annotations

from epd.common.auth import bearer_token, token_identity
from epd.server.media.hashing import is_mm_hash, key_salt, salted

HASH = "0123456789abcdef0123456789abcdef"


def test_no_tenant_and_no_cache_salt_is_the_shared_namespace() -> None:
    assert key_salt("", "") == ""
    assert salted(HASH, "") == HASH


def test_salts_tell_tenant_and_cache_salt_apart() -> None:
    salts = {key_salt("a", ""), key_salt("", "a"), key_salt("a", "b"), key_salt("ab", "")}
    assert len(salts) == 4
    assert key_salt("a", "b") == key_salt("a", "b")
    for salt in salts:
        # NOTE: vLLM refuses a cache_salt over 128 characters or holding '@', '/', '\\'.
        assert len(salt) == 32 and salt.isalnum()


def test_a_salted_mm_hash_is_an_mm_hash_of_its_salt_alone() -> None:
    one, other = key_salt("t1", ""), key_salt("t2", "")
    assert is_mm_hash(salted(HASH, one))
    assert salted(HASH, one) == salted(HASH, one)
    assert len({HASH, salted(HASH, one), salted(HASH, other)}) == 3


def test_a_token_identity_is_stable_and_hides_the_token() -> None:
    identity = token_identity("secret-token")
    assert identity == token_identity("secret-token") != token_identity("secret-token2")
    assert "secret" not in identity and len(identity) == 32
    assert token_identity("") == ""
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("bearer  abc ") == "abc"
    assert bearer_token("Basic abc") == ""
