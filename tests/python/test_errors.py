# Error mapping at the boundary: kvmm::Error arrives as kvmm.Error (a RuntimeError) with the
# C++ message naming the argument and value, a raising call leaves the manager unchanged,
# and wrong Python types are TypeErrors before any C++ runs.
import numpy as np
import pytest

import kvmm
from conftest import small_layout


def snapshot(kv, ids):
    st = kv.stats()
    return (st.free_large_pages, [(g.used_pages, g.evictable_pages) for g in st.groups],
            [[list(kv.page_table(r, g)) for g in range(2)] for r in ids])


@pytest.fixture
def kv():
    m = kvmm.KVCacheManager(small_layout(), num_large_pages=32, max_requests=8)
    m.begin_step()
    return m


def test_error_type_and_message(kv):
    assert issubclass(kvmm.Error, RuntimeError)
    r = kv.add_request(np.arange(5, dtype=np.uint32))
    kv.free(r)
    with pytest.raises(kvmm.Error) as e:
        kv.free(r)
    assert str(r) in str(e.value)  # the stale handle is named
    with pytest.raises(kvmm.Error, match="nope"):
        kvmm.presets.by_name("nope")
    with pytest.raises(kvmm.Error, match="kv_heads"):
        kvmm.KVLayout.plan([kvmm.LayerGroup.full_attention("bad", 2, 0, 64, 2, 16)])
    with pytest.raises(kvmm.Error, match="model_type"):
        kvmm.read_hf_config('{"model_type": "unknown_family"}')
    with pytest.raises(kvmm.Error, match=r"\d+:\d+|line"):
        kvmm.read_hf_config('{"model_type": ', "broken.json")
    with pytest.raises(kvmm.Error, match="max_requests"):
        kvmm.KVCacheManager(small_layout(), num_large_pages=4, max_requests=0)


def test_failed_calls_change_nothing(kv):
    a = kv.add_request(np.arange(9, dtype=np.uint32))
    kv.lookup_prefix(a)
    assert kv.allocate(a, 9)
    before = snapshot(kv, [a])
    with pytest.raises(kvmm.Error):
        kv.commit(a, 10)  # past the allocated tokens
    small = np.zeros(1, np.int32)
    with pytest.raises(kvmm.Error):
        kv.export_csr(0, np.array([a], np.uint32), np.zeros(2, np.int32), small, np.zeros(1, np.int32))
    with pytest.raises(kvmm.Error, match="tokens"):
        kv.append_batch(np.array([a], np.uint32), np.array([1, 2], np.uint32))
    with pytest.raises(kvmm.Error, match="num_new_tokens"):
        kv.allocate_batch(np.array([a], np.uint32), np.array([1, 2], np.uint32))
    assert snapshot(kv, [a]) == before
    kv.check_invariants()


def test_types_checked_at_the_boundary(kv):
    with pytest.raises(TypeError):
        kv.add_request("not tokens")
    with pytest.raises(TypeError):
        kv.allocate("r", 1)
    r = kv.add_request(np.arange(9, dtype=np.uint32))
    kv.lookup_prefix(r)
    kv.allocate(r, 9)
    ids = np.array([r], np.uint32)
    with pytest.raises(TypeError, match="int32"):
        kv.export_csr(0, ids, np.zeros(2, np.int64), np.zeros(8, np.int32), np.zeros(1, np.int32))
    with pytest.raises(TypeError, match="C-contiguous"):
        kv.export_dense(0, ids, block_table=np.zeros((8, 2), np.int32).T)
    with pytest.raises(TypeError, match="writable"):
        kv.export_csr(0, ids, [0, 0], np.zeros(8, np.int32), np.zeros(1, np.int32))
    with pytest.raises(kvmm.Error, match="together"):
        kv.export_csr(0, ids, np.zeros(2, np.int32))
    with pytest.raises(TypeError):
        kvmm.KVCacheManager(small_layout(), num_large_pages=4, arena=object())
    with pytest.raises(kvmm.Error, match="hash"):
        kv.add_request(np.arange(9, dtype=np.uint32), items=[(-1, 0, 4)])
    with pytest.raises(kvmm.Error, match="device"):
        kvmm.Arena(small_layout(), 4, device="tpu")


def test_threads_get_an_error_not_a_race():
    """Long calls release the GIL; a second thread on the same manager meanwhile gets
    kvmm.Error (never a data race), and the manager stays consistent."""
    import threading

    kv = kvmm.KVCacheManager(small_layout(), num_large_pages=64, max_requests=64)
    kv.begin_step()
    prompt = np.arange(8192, dtype=np.uint32)  # long enough to release the GIL
    errors, unexpected = [], []

    def hammer(n):
        for _ in range(n):
            try:
                r = kv.add_request(prompt)
                kv.lookup_prefix(r)
                kv.free(r)
            except kvmm.Error as e:
                errors.append(str(e))
            except Exception as e:  # noqa: BLE001
                unexpected.append(repr(e))

    threads = [threading.Thread(target=hammer, args=(40,)) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not unexpected
    # an error other than the guard's would be a stale handle from an interleaving the
    # guard let through: none
    assert all("single-threaded" in e or "request" in e for e in errors)
    kv.check_invariants()
