# Reference counts and leaks: managers, Buffers and DLPack capsules are freed when their
# last Python reference goes; exported views keep their Buffer (not the manager) alive;
# batch calls and exports hold no reference to their input or output arrays afterwards.
import gc
import sys
import weakref

import numpy as np
import pytest

import kvmm
from conftest import small_layout


def step_manager(pages=64):
    kv = kvmm.KVCacheManager(small_layout(), num_large_pages=pages, max_requests=32)
    kv.begin_step()
    ids = np.array([kv.add_request(np.arange(9, dtype=np.uint32) + 20 * i) for i in range(8)], np.uint32)
    for r in ids:
        kv.lookup_prefix(int(r))
    assert kv.allocate_batch(ids, 9) == 8
    kv.commit_batch(ids)
    return kv, ids


def test_managers_are_freed():
    gc.collect()
    base = kvmm._live_managers()
    for _ in range(50):
        step_manager()
    gc.collect()
    assert kvmm._live_managers() == base
    kv, _ = step_manager()
    assert kvmm._live_managers() == base + 1
    del kv
    assert kvmm._live_managers() == base  # no cycle: freed by reference counting alone


def test_arena_reference_held_by_manager():
    arena = kvmm.Arena(small_layout(), 8, chunk_bytes=4096)
    before = sys.getrefcount(arena)
    kv = kvmm.KVCacheManager(small_layout(), arena=arena)
    assert sys.getrefcount(arena) == before + 1
    del kv
    assert sys.getrefcount(arena) == before
    kvmm.KVCacheManager(small_layout(), arena=arena)  # free again for another manager


def test_views_keep_buffers_not_managers():
    gc.collect()
    managers, buffers = kvmm._live_managers(), kvmm._live_buffers()
    kv, ids = step_manager()
    indptr, indices, last, _ = kv.export_csr(0, ids)
    dense = kv.export_dense(1, ids)
    assert kvmm._live_buffers() == buffers + 4
    ref = weakref.ref(indices.base)
    del kv
    assert kvmm._live_managers() == managers
    assert indices.sum() >= 0 and dense.shape[0] == 8  # still readable
    del indptr, last, dense
    assert kvmm._live_buffers() == buffers + 1
    del indices
    assert ref() is None and kvmm._live_buffers() == buffers


def test_dlpack_capsules_release_their_buffer():
    kv, ids = step_manager()
    _, indices, _, _ = kv.export_csr(0, ids)
    buf = indices.base
    base = sys.getrefcount(buf)
    for _ in range(100):
        buf.__dlpack__()  # never consumed: the capsule's destructor frees it
    assert sys.getrefcount(buf) == base
    arrays = [np.from_dlpack(buf) for _ in range(10)]  # consumed: freed with the arrays
    assert sys.getrefcount(buf) > base
    del arrays
    gc.collect()
    assert sys.getrefcount(buf) == base


def test_batch_calls_hold_no_references():
    kv, ids = step_manager(pages=1400)  # 8 x (9 + 600) tokens in 4-token pages, + the window's
    toks = np.arange(8, dtype=np.uint32)
    indptr, indices, last = np.zeros(9, np.int32), np.zeros(1024, np.int32), np.zeros(8, np.int32)
    counts = [sys.getrefcount(a) for a in (ids, toks, indptr, indices, last)]
    gc.collect()
    buffers, objects = kvmm._live_buffers(), len(gc.get_objects())
    for step in range(400):
        kv.begin_step()
        kv.append_batch(ids, toks)
        assert kv.allocate_batch(ids, 1) == 8
        kv.export_csr(0, ids, indptr, indices, last)
        kv.commit_batch(ids)
    tables = [np.zeros((8, 256), np.int32), np.zeros((8, 256), np.int32)]
    table_counts = [sys.getrefcount(t) for t in tables]
    for step in range(200):  # the fused step holds its tables' buffers only during the call, and
        kv.begin_step()     # a reference to each group's last table (its address stays its own)
        assert kv.decode_step(ids, toks, tables, null_page=0) == 8
    for _ in range(20):  # and after an error (the second table's dtype), too
        with pytest.raises(TypeError):
            kv.decode_step(ids, toks, [tables[0], np.zeros((8, 256), np.int64)])
    gc.collect()
    assert [sys.getrefcount(t) for t in tables] == [c + 1 for c in table_counts]
    assert [sys.getrefcount(a) for a in (ids, toks, indptr, indices, last)] == counts
    assert kvmm._live_buffers() == buffers
    assert len(gc.get_objects()) - objects < 50
    kv.check_invariants()
    # Another table takes the group's reference; the manager's end drops it.
    other = np.zeros((8, 256), np.int32)
    kv.export_dense_incremental(0, ids, other, null_page=0)
    assert [sys.getrefcount(t) for t in tables] == [table_counts[0], table_counts[1] + 1]
    del kv
    assert [sys.getrefcount(t) for t in tables] == table_counts
