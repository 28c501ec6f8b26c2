# The defects of issue 29 on the Python surface, each exactly (items 2, 5, 6, 8, 10): every
# test here failed before its fix. The table of every call's bad input is test_bad_input.py.
import numpy as np
import pytest

import kvmm
from bad_input_world import BIG, U32, World, tables2
from conftest import small_layout



def test_buffer_shape_product_overflow_is_refused():
    """Item 2: the element count wrapped to 0 while the buffer exposed the huge shape, and
    reading it through memoryview crashed the interpreter."""
    for shape in ([BIG, BIG], [2**62, 4], [2**31, 2**31, 2], [3, 2**61]):
        with pytest.raises(ValueError, match="shape"):
            kvmm.Buffer(shape)
    b = kvmm.Buffer([3, 0])
    assert b.shape == (3, 0) and memoryview(b).nbytes == 0
    b = kvmm.Buffer([2, 3])
    assert memoryview(b).nbytes == 24 and b.numpy().sum() == 0


def test_batch_calls_are_atomic_when_they_raise():
    """Item 5: allocate_batch([a, stale]) gave a its tokens, then raised."""
    w = World()
    kv = w.kv
    fresh = kv.add_request(np.arange(9, dtype=U32) + 5000)
    kv.lookup_prefix(fresh)
    w.live.append(fresh)
    before = w.state()
    with pytest.raises(kvmm.Error, match=r"ids\[1\]"):
        kv.allocate_batch([fresh, w.stale], 9)
    assert kv.num_allocated(fresh) == 0
    with pytest.raises(kvmm.Error, match=r"ids\[1\]"):
        kv.append_batch([w.a, w.stale], [1, 2])
    with pytest.raises(kvmm.Error, match=r"num_computed\[1\]"):
        kv.commit_batch([w.a, w.b], [kv.kv_len(w.a, 0), kv.num_allocated(w.b) + 1])
    assert w.state() == before
    assert kv.allocate_batch([fresh], 9) == 1  # and then it serves


def test_arrays_of_ids_and_tokens_never_wrap():
    """Item 6: tokens [-1] became 4294967295, [2**32 + 7] became 7, 3.9 became 3; ids
    [h + 0.5], [2**32 + h] and ["h"] acted on the live request h."""
    w = World()
    kv, a = w.kv, w.a
    n = kv.num_tokens(a)
    for tokens, exc in (([-1], OverflowError), ([BIG + 7], OverflowError), ([3.9], TypeError)):
        with pytest.raises(exc, match=r"tokens\[0\]"):
            kv.add_request(tokens)
        with pytest.raises(exc, match=r"tokens\[0\]"):
            kv.append_batch([a], tokens)
    for ids, exc in (([a + 0.5], TypeError), ([BIG + a], OverflowError), (["h"], TypeError)):
        for call in (lambda: kv.append_batch(ids, [1]), lambda: kv.allocate_batch(ids, 1),
                     lambda: kv.commit_batch(ids), lambda: kv.decode_step(ids, [1], tables2(1)),
                     lambda: kv.export_dense(0, ids, 8)):
            with pytest.raises(exc, match=r"(ids|batch)\[0\]"):
                call()
    assert kv.num_tokens(a) == n


def test_incremental_export_into_another_table_writes_it_whole():
    """Item 8: the manager remembered its previous export, not the table: a new table got
    nothing (0 for a kernel: page 0)."""
    w = World()
    kv = w.kv
    ids = np.array([w.a, w.b], U32)
    for g in range(2):
        want = kv.export_dense(g, ids, 8, null_page=3)
        first, second = np.zeros((2, 8), np.int32), np.zeros((2, 8), np.int32)
        assert kv.export_dense_incremental(g, ids, first, null_page=3) == 16
        assert kv.export_dense_incremental(g, ids, first, null_page=3) == 0  # unchanged: nothing to write
        assert kv.export_dense_incremental(g, ids, second, null_page=3) == 16
        assert (first == want).all() and (second == want).all()
        # A table freed and another one allocated (maybe at its address): written whole.
        del first
        third = np.zeros((2, 8), np.int32)
        assert kv.export_dense_incremental(g, ids, third, null_page=3) == 16
        assert (third == want).all()
    # decode_step into new tables, too.
    kv.begin_step()
    fresh = tables2(2, width=8)
    assert kv.decode_step(ids, [1, 2], fresh, null_page=3) == 2
    for g in range(2):
        assert (fresh[g] == kv.export_dense(g, ids, 8, null_page=3)).all()


def test_is_swapped_of_a_stale_handle_raises():
    """Item 10: is_swapped answered False for a stale handle; every other query raises."""
    w = World()
    with pytest.raises(kvmm.Error, match=f"request = {w.stale}"):
        w.kv.is_swapped(w.stale)
    assert w.kv.is_swapped(w.sw) and not w.kv.is_swapped(w.a)
    assert not w.kv.is_active(w.stale)


def test_allocate_batch_stops_at_a_hit_its_own_allocations_evicted():
    """Item 5, the case no check can see ahead: y's allocation evicts the cached pages of
    x's prefix hit. The batch stops at x as at a refusal (x unchanged, y allocated; before,
    it raised with y's pages taken), the manager logs why, last_allocate_result says
    "hit_lost", and x's next allocate answers False for the same reason."""
    logs = []
    kv = kvmm.KVCacheManager(small_layout(), num_large_pages=10, max_requests=8, log=lambda lvl, m: logs.append(m))
    kv.begin_step()
    prompt = np.arange(17, dtype=U32) + 100
    c = kv.add_request(prompt)
    kv.lookup_prefix(c)
    assert kv.allocate(c, 17)
    kv.commit(c, 17)
    kv.free(c)  # its pages stay cached, evictable
    kv.begin_step()
    x = kv.add_request(prompt)
    hit = kv.lookup_prefix(x)
    assert hit == 16
    y = kv.add_request(np.arange(8, dtype=U32) + 5000)
    kv.lookup_prefix(y)
    x_before = (kv.num_allocated(x), kv.num_computed(x), [list(kv.page_table(x, g)) for g in range(2)])
    assert kv.allocate_batch([y, x], [8, 17 - hit]) == 1
    assert kv.num_allocated(y) == 8
    assert (kv.num_allocated(x), kv.num_computed(x), [list(kv.page_table(x, g)) for g in range(2)]) == x_before
    assert any("evicted" in m for m in logs)
    assert kv.last_allocate_result == "hit_lost"
    lost = kv.counters().lost_hits
    assert kv.allocate(x, 17 - hit) is False
    assert kv.last_allocate_result == "hit_lost"
    assert kv.counters().lost_hits == lost + 1
    kv.reset(x)
    kv.lookup_prefix(x)
    kv.free(y)
    assert kv.allocate(x, 17 - kv.num_computed(x))
    assert kv.last_allocate_result == "ok"
    assert kv.allocate(x, 10_000) is False  # more than the pool holds: refused
    assert kv.last_allocate_result == "no_memory"
    kv.check_invariants()
