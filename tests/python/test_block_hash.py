# KVCacheManager(block_hash=...): the block hash function from Python. The same prompts hit
# the same in every mode; the KV events' hashes are the chosen function's (SHA-256 of the
# documented page encoding, computed here with hashlib); keyed BLAKE2b depends on the key;
# salted_only keeps XXH3-128 (bit 127 clear) for unsalted requests; bad arguments raise
# TypeError / ValueError, bad key material kvmm.Error naming the option.
import hashlib
import struct

import numpy as np
import pytest

import kvmm
from conftest import small_layout

KEY = b"0123456789abcdef0123456789ABCDEF"
MODES = [None, "sha256", {"function": "sha256", "salted_only": True},
         {"function": "blake2b-keyed", "key": KEY}, {"function": "blake2b-keyed", "key": KEY, "salted_only": True}]


def first_page_hash(block_hash, salt=""):
    kv = kvmm.KVCacheManager(small_layout(), num_large_pages=32, max_requests=8, record_kv_events=True,
                             block_hash=block_hash)
    kv.begin_step()
    prompt = np.arange(1, 14, dtype=np.uint32)
    r = kv.add_request(prompt, cache_salt=salt)
    kv.lookup_prefix(r)
    assert kv.allocate(r, len(prompt))
    kv.commit(r, len(prompt))
    stored = [e for e in kv.take_kv_events() if e["kind"] == "stored" and e["first_page"] == 0]
    return stored[0]["block_hashes"][0]


def test_every_mode_hits_the_same():
    hits = []
    for mode in MODES:
        kv = kvmm.KVCacheManager(small_layout(), num_large_pages=32, max_requests=8, block_hash=mode)
        kv.begin_step()
        seen = []
        for salt, n in (("", 13), ("", 17), ("t", 13), ("t", 17), ("u", 13)):
            prompt = np.arange(n, dtype=np.uint32)
            r = kv.add_request(prompt, cache_salt=salt)
            seen.append(kv.lookup_prefix(r))
            assert kv.allocate(r, n - seen[-1])
            kv.commit(r, n)
        kv.check_invariants()
        hits.append(seen)
    assert hits[0] == [0, 12, 0, 12, 0]
    assert all(h == hits[0] for h in hits)


def test_events_carry_the_chosen_hash():
    # SHA-256 of "kvmm.pg1" | parent (0) | u32 count | u32 flags | 4 u32 ids, first 16 bytes
    # little-endian into (lo, hi); Python's int is hi << 64 | lo.
    m = b"kvmm.pg1" + bytes(16) + struct.pack("<II", 4, 0) + struct.pack("<4I", 1, 2, 3, 4)
    d = hashlib.sha256(m).digest()
    lo, hi = struct.unpack("<QQ", d[:16])
    assert first_page_hash("sha256") == hi << 64 | lo
    k = hashlib.blake2b(m, digest_size=16, key=KEY).digest()
    lo, hi = struct.unpack("<QQ", k)
    assert first_page_hash({"function": "blake2b-keyed", "key": KEY}) == hi << 64 | lo
    assert first_page_hash({"function": "blake2b-keyed", "key": KEY[::-1]}) != hi << 64 | lo
    assert first_page_hash(None) != first_page_hash("sha256")
    # salted_only: unsalted requests keep XXH3-128 with bit 127 clear; salted ones have it set.
    xxh3 = first_page_hash(None)
    assert first_page_hash({"function": "sha256", "salted_only": True}) == xxh3 & ~(1 << 127)
    assert first_page_hash({"function": "sha256", "salted_only": True}, salt="t") >> 127 == 1


def test_bad_block_hash_arguments():
    lay = small_layout()
    with pytest.raises(ValueError, match="md5"):
        kvmm.KVCacheManager(lay, num_large_pages=8, block_hash="md5")
    with pytest.raises(TypeError, match="block_hash"):
        kvmm.KVCacheManager(lay, num_large_pages=8, block_hash=3)
    with pytest.raises(TypeError, match="key"):
        kvmm.KVCacheManager(lay, num_large_pages=8, block_hash={"function": "blake2b-keyed", "key": "text"})
    with pytest.raises(ValueError, match="salt_only"):
        kvmm.KVCacheManager(lay, num_large_pages=8, block_hash={"function": "sha256", "salt_only": True})
    with pytest.raises(kvmm.Error, match=r"block_hash\.key: 0 bytes"):
        kvmm.KVCacheManager(lay, num_large_pages=8, block_hash="blake2b-keyed")
    with pytest.raises(kvmm.Error, match=r"block_hash\.key: 8 bytes"):
        kvmm.KVCacheManager(lay, num_large_pages=8, block_hash={"function": "blake2b-keyed", "key": b"12345678"})
    with pytest.raises(kvmm.Error, match="takes no key"):
        kvmm.KVCacheManager(lay, num_large_pages=8, block_hash={"function": "sha256", "key": KEY})
