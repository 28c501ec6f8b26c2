# Miss reasons and per-request cache accounting from Python (issue 34): lookup_report names
# where and why a hit stopped, counters count reasons, cache_usage keeps
# the tokens a request read from and wrote to the cache; bad input raises, state intact.
import pytest

import kvmm


def full_layout():
    return kvmm.KVLayout.plan([kvmm.LayerGroup.full_attention("full", 1, 1, 8, 2, 4)])


def run(kv, prompt, **extras):
    kv.begin_step()
    r = kv.add_request(prompt, **extras)
    hit = kv.lookup_prefix(r)
    assert kv.allocate(r, len(prompt) - hit)
    kv.commit(r, len(prompt))
    return r


def test_reasons_and_usage():
    kv = kvmm.KVCacheManager(full_layout(), num_large_pages=64, miss_reasons=256)
    a = run(kv, list(range(1, 17)))
    assert kv.cache_usage(a) == {"read_tokens": 0, "written_tokens": 16}
    kv.free(a)

    prompt = list(range(1, 17))
    prompt[9] = 999  # page 2 differs
    kv.begin_step()
    b = kv.add_request(prompt)
    assert kv.lookup_prefix(b) == 8
    rep = kv.lookup_report(b)
    assert rep["limit"] == 15 and rep["hit_tokens"] == 8
    assert rep["reason"] == "not_cached" and rep["group"] == 0
    assert rep["groups"] == [{"hit_tokens": 8, "reason": "not_cached", "page": 2}]
    assert kv.allocate(b, 8)
    kv.commit(b, 16)
    assert kv.cache_usage(b) == {"read_tokens": 8, "written_tokens": 8}

    salted = kv.add_request(list(range(1, 17)), cache_salt="tenant")
    assert kv.lookup_prefix(salted) == 0
    assert kv.lookup_report(salted)["reason"] == "key_mismatch"

    same = kv.add_request(list(range(1, 17)))
    assert kv.lookup_prefix(same) == 12
    assert kv.lookup_report(same)["reason"] == "page_floor"

    c = kv.counters()
    assert c.miss_lookups["not_cached"] == 2  # a (nothing cached) and b
    assert c.missed_tokens["not_cached"] == 15 + 7
    assert c.miss_lookups["key_mismatch"] == 1 and c.missed_tokens["key_mismatch"] == 15
    assert c.miss_lookups["page_floor"] == 1 and c.missed_tokens["page_floor"] == 3
    assert set(c.miss_lookups) == {"none", "page_floor", "checkpoint_grid", "not_cached", "key_mismatch",
                                   "image_key", "evicted", "retention_not_held", "image_evicted"}


def test_bad_input():
    off = kvmm.KVCacheManager(full_layout(), num_large_pages=8)
    r = off.add_request(list(range(9)))
    off.lookup_prefix(r)
    with pytest.raises(kvmm.Error, match="miss_reasons is 0"):
        off.lookup_report(r)
    assert off.num_computed(r) == 0  # state intact: the request goes on
    assert off.allocate(r, 9)
    with pytest.raises(kvmm.Error, match="miss_reasons = 16777217"):
        kvmm.KVCacheManager(full_layout(), num_large_pages=8, miss_reasons=(1 << 24) + 1)
    on = kvmm.KVCacheManager(full_layout(), num_large_pages=8, miss_reasons=16)
    r = on.add_request(list(range(9)))
    with pytest.raises(kvmm.Error, match="before its lookup_prefix"):
        on.lookup_report(r)
    on.free(r)
    with pytest.raises(kvmm.Error):
        on.cache_usage(r)  # stale handle
    with pytest.raises(TypeError):
        on.lookup_report("x")
