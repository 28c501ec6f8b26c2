# LayerGroup.kv_order from Python (kvmm/spec/kv_order.hpp): token-major by default; a
# head-major group plans to the same sizes and offsets, keeps its order in the layout and
# changes KVLayout.fingerprint(); an out-of-range order and a head-major group of a
# latent (MLA) format raise kvmm.Error naming kv_order; a plain int is refused (TypeError).
import pytest

import kvmm


def groups(order=kvmm.KVOrder.TOKEN_MAJOR):
    full = kvmm.LayerGroup.full_attention("full", 2, 4, 64, 2, 16)
    full.kv_order = order
    return [full, kvmm.LayerGroup.sliding_window("local", 1, 2, 64, 2, 16, 64)]


def test_kv_order_layout_and_fingerprint():
    assert kvmm.LayerGroup.full_attention("f", 1, 1, 64, 2, 16).kv_order == kvmm.KVOrder.TOKEN_MAJOR
    nhd = kvmm.KVLayout.plan(groups())
    hnd = kvmm.KVLayout.plan(groups(kvmm.KVOrder.HEAD_MAJOR))
    assert hnd.group(0).kv_order == kvmm.KVOrder.HEAD_MAJOR
    assert hnd.group(1).kv_order == kvmm.KVOrder.TOKEN_MAJOR
    assert hnd.large_page_bytes == nhd.large_page_bytes
    for g in range(hnd.num_groups):
        assert hnd.small_page_bytes(g) == nhd.small_page_bytes(g)
        for layer in range(hnd.group(g).num_layers):
            assert hnd.k_offset(g, layer) == nhd.k_offset(g, layer)
            assert hnd.v_offset(g, layer) == nhd.v_offset(g, layer)
    assert hnd.fingerprint() != nhd.fingerprint()
    assert kvmm.KVLayout.plan(groups()).fingerprint() == nhd.fingerprint()
    assert kvmm.KVLayout.plan(groups(kvmm.KVOrder.HEAD_MAJOR)).fingerprint() == hnd.fingerprint()


def test_kv_order_bad_values():
    g = groups()[0]
    with pytest.raises(TypeError):
        g.kv_order = 1
    g.kv_order = kvmm.KVOrder(7)  # pybind11 enums take any int: the planner refuses it
    with pytest.raises(kvmm.Error, match=r"'full': kv_order = 7"):
        kvmm.KVLayout.plan([g])
    mla = kvmm.presets.by_name("deepseek-v3").group(0)
    assert mla.storage == kvmm.KvStorage.LATENT
    kvmm.KVLayout.plan([mla])
    mla.kv_order = kvmm.KVOrder.HEAD_MAJOR
    with pytest.raises(kvmm.Error, match="kv_order = head_major"):
        kvmm.KVLayout.plan([mla])
