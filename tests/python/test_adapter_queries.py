# The queries kvmm.integrations.vllm needs, from Python: would_allocate (the answer of the
# allocate that follows, nothing changed in between; C++: tests/manager/would_allocate_test.cpp)
# and page_table from a start index (new pages only).
import kvmm
import pytest
from conftest import small_layout


def test_would_allocate_answers_and_changes_nothing():
    kv = kvmm.KVCacheManager(small_layout(), num_large_pages=6, max_requests=4)
    kv.begin_step()
    r = kv.add_request(list(range(1, 10)))
    assert kv.lookup_prefix(r) == 0
    used = [kv.num_used_pages(g) for g in range(2)]
    assert not kv.would_allocate(r, 40)  # 10 pages per group > 6 large pages
    assert kv.would_allocate(r, 9)
    assert [kv.num_used_pages(g) for g in range(2)] == used
    assert kv.allocate(r, 9)
    kv.check_invariants()
    with pytest.raises(kvmm.Error, match="request"):
        kv.would_allocate(r + 1000, 1)


def test_page_table_from_a_start_index():
    kv = kvmm.KVCacheManager(small_layout(), num_large_pages=16, max_requests=4)
    kv.begin_step()
    r = kv.add_request(list(range(1, 14)))
    kv.lookup_prefix(r)
    assert kv.allocate(r, 13)
    full = kv.page_table(r, 0)
    assert len(full) == 4
    assert kv.page_table(r, 0, 1).tolist() == full[1:].tolist()
    assert kv.page_table(r, 0, 4).tolist() == []
    with pytest.raises(kvmm.Error, match="start = 5"):
        kv.page_table(r, 0, 5)


def test_lookup_prefix_with_a_limit():
    # The capped lookup (vLLM's max_cache_hit_length, EAGLE's last-block rule): at most
    # limit tokens, the longest valid prefix among those; no limit given is no cap.
    kv = kvmm.KVCacheManager(small_layout(), num_large_pages=32, max_requests=4)
    kv.begin_step()
    prompt = list(range(1, 30))
    w = kv.add_request(prompt)
    kv.lookup_prefix(w)
    assert kv.allocate(w, len(prompt))
    kv.commit(w, len(prompt))
    kv.free(w)
    uncapped = kv.add_request(prompt)
    full = kv.lookup_prefix(uncapped)
    assert full > 0
    capped = kv.add_request(prompt)
    hit = kv.lookup_prefix(capped, full - 1)
    assert hit < full and hit <= full - 1
    with pytest.raises(TypeError):  # a scalar out of range: pybind11's TypeError (python/args.hpp)
        kv.lookup_prefix(kv.add_request(prompt), -1)
