# KVCacheManager.would_allocate from Python: the answer of the allocate that follows, with
# nothing changed in between (the C++ side: tests/manager/would_allocate_test.cpp).
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
