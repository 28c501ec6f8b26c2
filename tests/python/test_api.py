# The Python API over the C++ core: layouts, presets, the HF config reader, the manager's
# per-request and batch calls, page-table exports (caller's arrays, package Buffers, DLPack),
# swap / fork / pins / events / stats, and the host Arena as a page source.
import json

import numpy as np
import pytest

import kvmm
from conftest import small_layout


def test_presets_and_layout():
    assert "gemma-2-27b" in kvmm.presets.names()
    lay = kvmm.presets.by_name("gemma-2-27b", tokens_per_page=16)
    assert lay.num_groups == 2
    kinds = {g.kind for g in lay.groups}
    assert kinds == {kvmm.LayerKind.FULL_ATTENTION, kvmm.LayerKind.SLIDING_WINDOW}
    for g in range(lay.num_groups):
        grp = lay.group(g)
        # page-layer layout: K and V of every layer, tokens_per_page tokens
        assert lay.natural_page_bytes(g) == 2 * grp.num_layers * grp.kv_heads * grp.head_dim * grp.dtype_bytes * 16
        assert lay.large_page_bytes % lay.small_page_bytes(g) == 0
        assert lay.small_pages_per_large_page(g) == lay.large_page_bytes // lay.small_page_bytes(g)
    assert lay.find_group("nope") is None
    assert "large" in lay.describe()


def test_custom_layout_offsets():
    lay = small_layout()
    assert lay.small_page_bytes(0) == 2 * 2 * 1 * 64 * 2 * 4
    assert lay.k_offset(0, 1) == lay.v_offset(0, 0) + 64 * 2 * 4
    assert lay.find_group("local") == 1


def test_hf_config_reader():
    cfg = {"model_type": "llama", "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
           "hidden_size": 512, "head_dim": 64}
    spec = kvmm.read_hf_config(json.dumps(cfg), "cfg.json", tokens_per_page=16)
    assert spec.model_type == "llama"
    assert spec.layout.num_groups == 1
    assert len(spec.layers) == 4 and all(p.group == 0 for p in spec.layers)
    assert [p.index for p in spec.layers] == [0, 1, 2, 3]
    att = spec.attention[0]
    assert (att.num_q_heads, att.num_kv_heads, att.head_dim) == (8, 2, 64)
    assert att.scale == pytest.approx(64 ** -0.5)
    assert "llama" in kvmm.hf_config_model_types()


def test_layer_map_and_slicing():
    # Gemma-3-27B: the default plan cuts the 52 local layers at the 10 global ones' count.
    cut = kvmm.presets.by_name("gemma-3-27b")
    whole = kvmm.presets.by_name("gemma-3-27b", slice_layers=kvmm.SliceLayers.OFF)
    assert (cut.num_groups, whole.num_groups) == (7, 2)
    assert cut.sliced and not whole.sliced
    assert whole.small_pages_per_large_page(0) == 26
    assert [cut.group(g).num_layers for g in range(7)] == [10] * 6 + [2]
    assert cut.group(0).layers == list(range(5, 62, 6))
    assert cut.layer_group(5) == (0, 0) and cut.layer_group(61) == (6, 1) and whole.layer_group(61) == (1, 51)
    assert [cut.source_group(g) for g in range(7)] == [0] + [1] * 6
    assert cut.num_model_layers == 62
    seen = sorted(cut.model_layer(g, k) for g in range(7) for k in range(cut.group(g).num_layers))
    assert seen == list(range(62))
    # The threshold: 26 pages per large page are dense above 25, not above 26.
    assert not kvmm.presets.by_name("gemma-3-27b", slice_layers=kvmm.SliceLayers.OFF).sliced
    full = kvmm.LayerGroup.full_attention("global", 10, 16, 128, 2, 16)
    local = kvmm.LayerGroup.sliding_window("local", 52, 16, 128, 2, 16, 1024)
    assert kvmm.KVLayout.plan([full, local], slice_above_pages_per_large_page=25).sliced
    assert not kvmm.KVLayout.plan([full, local], slice_above_pages_per_large_page=26).sliced
    # Layers given by the caller: kept; numbered in group order otherwise.
    full.layers = [1, 3]
    full.num_layers = 2
    local.num_layers = 2
    lay = kvmm.KVLayout.plan([full, local])
    assert lay.group(1).layers == [4, 5] and lay.layer_group(3) == (0, 1) and lay.layer_slots(2) == []
    with pytest.raises(kvmm.Error, match=r"model_layer = 2: no group holds it"):
        lay.layer_group(2)
    local.layers = [3, 4]
    with pytest.raises(kvmm.Error, match=r"LayerGroup 'local': layers\[0\] = 3: model layer 3 is already held"):
        kvmm.KVLayout.plan([full, local])
    with pytest.raises(kvmm.Error, match=r"slice_above_pages_per_large_page = 0"):
        kvmm.KVLayout.plan([full], slice_above_pages_per_large_page=0)
    # The HF reader's placements follow the sliced map.
    cfg = {"model_type": "gemma3_text", "num_hidden_layers": 62, "num_attention_heads": 32,
           "num_key_value_heads": 16, "head_dim": 128, "hidden_size": 5376, "sliding_window": 1024,
           "sliding_window_pattern": 6}
    spec = kvmm.read_hf_config(json.dumps(cfg))
    assert spec.layout.num_groups == 7 and len(spec.attention) == 7
    assert [(p.group, p.index) for p in spec.layers] == [spec.layout.layer_group(i) for i in range(62)]
    assert spec.attention[6].sliding_window == 1024 and spec.attention[0].sliding_window == 0
    assert kvmm.read_hf_config(json.dumps(cfg), slice_layers=kvmm.SliceLayers.OFF).layout.num_groups == 2


def run_prompt(kv, tokens):
    r = kv.add_request(np.asarray(tokens, dtype=np.uint32))
    hit = kv.lookup_prefix(r)
    assert kv.allocate(r, len(tokens) - hit)
    kv.commit(r, len(tokens))
    return r, hit


def test_prefix_hit_and_tables():
    kv = kvmm.KVCacheManager(small_layout(), num_large_pages=64, max_requests=16)
    kv.begin_step()
    prompt = list(range(100, 118))  # 18 tokens: 4 full pages
    a, hit = run_prompt(kv, prompt)
    assert hit == 0
    pt = kv.page_table(a, 0)
    assert pt.dtype == np.uint32 and len(pt) == 5
    assert kv.num_computed(a) == 18 and kv.num_tokens(a) == 18
    kv.free(a)
    assert not kv.is_active(a)
    b, hit = run_prompt(kv, prompt)
    assert hit == 16  # every full page, at most prompt - 1 tokens
    assert list(kv.page_table(b, 0)[:4]) == list(pt[:4])
    st = kv.stats()
    assert st.lookups == 2 and st.hit_tokens == 16 and st.lookup_tokens == 36
    c = kv.counters()
    assert c.admissions == 2 and c.active_requests == 1
    kv.check_invariants()


def test_export_csr_and_dense():
    lay = small_layout()
    kv = kvmm.KVCacheManager(lay, num_large_pages=64, max_requests=16)
    kv.begin_step()
    ids = np.array([run_prompt(kv, np.arange(n) + 1000 * n)[0] for n in (5, 9, 13)], dtype=np.uint32)
    indptr, indices, last, first = kv.export_csr(0, ids)
    assert first is None
    assert indptr.dtype == np.int32 and list(indptr) == [0, 2, 5, 9]
    assert list(last) == [1, 1, 1]
    for i, r in enumerate(ids):
        assert list(indices[indptr[i]:indptr[i + 1]]) == list(kv.page_table(r, 0).astype(np.int32))
    # caller-provided arrays: the same result, written in place
    p2, i2, l2 = np.zeros(4, np.int32), np.full(64, -7, np.int32), np.zeros(3, np.int32)
    assert kv.export_csr(0, ids, p2, i2, l2) == 9
    assert (p2 == indptr).all() and (i2[:9] == indices).all() and (l2 == last).all() and (i2[9:] == -7).all()
    dense = kv.export_dense(0, ids)
    assert dense.shape == (3, 4)
    for i in range(3):
        n = indptr[i + 1] - indptr[i]
        assert (dense[i, :n] == indices[indptr[i]:indptr[i + 1]]).all()
    # the sliding group's out-of-window pages: null_page replaces kNullPage, trim skips them
    _, ind_w, _, first_w = kv.export_csr(1, ids, null_page=0, trim=True)
    assert first_w is not None and (first_w >= 0).all()
    table = np.zeros((3, 8), np.int32)
    assert kv.export_dense(1, ids, block_table=table, null_page=0) is None
    assert (table >= 0).all()


def test_export_dense_incremental_matches_full_export():
    kv = kvmm.KVCacheManager(small_layout(), num_large_pages=64, max_requests=16)
    kv.begin_step()
    ids = np.array([run_prompt(kv, np.arange(n) + 1000 * n)[0] for n in (5, 9, 13)], dtype=np.uint32)
    inc = np.full((3, 16), -9, np.int32)
    first = kv.export_dense_incremental(1, ids, inc, null_page=0)
    assert first == inc.size  # the first call writes everything
    for step in range(12):  # decode steps: only changed entries are written again
        kv.begin_step()
        kv.append_batch(ids, np.full(3, step, np.uint32))
        assert kv.allocate_batch(ids, 1) == 3
        written = kv.export_dense_incremental(1, ids, inc, null_page=0)
        full = np.zeros((3, 16), np.int32)
        kv.export_dense(1, ids, block_table=full, null_page=0)
        assert (inc == full).all()
        assert written <= 3 * 3  # per row: a new page, a page leaving the window, its pad (of 16)
        kv.commit_batch(ids)
    with pytest.raises(kvmm.Error, match="max_pages"):
        kv.export_dense_incremental(0, ids, np.zeros(48, np.int32))


def test_decode_step_matches_the_separate_calls():
    """decode_step (one crossing) against commit_batch + append_batch + allocate_batch + a full
    export_dense per group on a twin manager: same refusals, tables, page tables and stats."""
    lay = small_layout()
    fused = kvmm.KVCacheManager(lay, num_large_pages=40, max_requests=16)
    plain = kvmm.KVCacheManager(lay, num_large_pages=40, max_requests=16)
    rng = np.random.default_rng(5)
    running, tables, refused = [], [np.full((16, 32), -9, np.int32) for _ in range(2)], 0
    for step in range(400):
        for kv in (fused, plain):
            kv.begin_step()
        if len(running) < 8 and rng.integers(3) == 0:  # a new prompt, prefilled, joins the batch
            prompt = rng.integers(0, 1 << 20, int(rng.integers(5, 20)), dtype=np.uint32)
            rs = [kv.add_request(prompt) for kv in (fused, plain)]
            assert rs[0] == rs[1] and fused.lookup_prefix(rs[0]) == plain.lookup_prefix(rs[0]) == 0
            admitted = fused.allocate(rs[0], len(prompt))
            assert plain.allocate(rs[0], len(prompt)) == admitted
            for kv in (fused, plain):
                if admitted:
                    kv.commit(rs[0], len(prompt))
                else:
                    kv.free(rs[0])
            if admitted:
                running.append(rs[0])
        ids = np.array(running, np.uint32)
        toks = rng.integers(0, 1 << 20, len(ids), dtype=np.uint32)
        got = fused.decode_step(ids, toks, tables, null_page=0)
        plain.commit_batch(ids)
        plain.append_batch(ids, toks)
        assert plain.allocate_batch(ids, 1) == got
        if got == len(ids):
            for g in range(2):
                full = np.zeros((len(ids), 32), np.int32)
                plain.export_dense(g, ids, block_table=full, null_page=0)
                assert (tables[g][:len(ids)] == full).all()
        else:  # preempted: the refused request and those after it go
            refused += 1
            for r in running[got:]:
                fused.free(r)
                plain.free(r)
            running = running[:got]
        for r in list(running):
            if fused.num_computed(r) >= 60:
                fused.free(r)
                plain.free(r)
                running.remove(r)
        for r in running:
            assert fused.num_computed(r) == plain.num_computed(r)
            for g in range(2):
                assert (fused.page_table(r, g) == plain.page_table(r, g)).all()
        assert [g.used_pages for g in fused.stats().groups] == [g.used_pages for g in plain.stats().groups]
    fused.check_invariants()
    assert refused > 0


def test_decode_step_tables_and_errors():
    kv = kvmm.KVCacheManager(small_layout(), num_large_pages=64, max_requests=8)
    kv.begin_step()
    ids = np.array([run_prompt(kv, np.arange(n) + 100 * n)[0] for n in (6, 10)], np.uint32)
    toks = np.array([1, 2], np.uint32)
    local = np.full((2, 16), -9, np.int32)
    assert kv.decode_step(ids, toks, [None, local], null_page=0) == 2  # group 0 not exported
    full = np.zeros((2, 16), np.int32)
    kv.export_dense(1, ids, block_table=full, null_page=0)
    assert (local == full).all()
    assert kv.num_tokens(int(ids[0])) == 7 and kv.num_computed(int(ids[0])) == 6
    before = [(kv.num_tokens(int(r)), kv.num_computed(int(r)), kv.num_allocated(int(r))) for r in ids]
    with pytest.raises(TypeError, match=r"tables\[1\]: dtype must be int32"):
        kv.decode_step(ids, toks, [None, np.zeros((2, 16), np.int64)])
    with pytest.raises(TypeError, match=r"tables\[0\]: the array must be writable"):
        kv.decode_step(ids, toks, [np.zeros((16, 2), np.int32).T, None])
    with pytest.raises(TypeError, match=r"tables\[0\]: expected a writable int32 array"):
        kv.decode_step(ids, toks, ["no", None])
    with pytest.raises(kvmm.Error, match=r"tables\[1\]: 8 columns"):
        kv.decode_step(ids, toks, [np.zeros((2, 16), np.int32), np.zeros((2, 8), np.int32)])
    with pytest.raises(kvmm.Error, match="max_pages is needed"):
        kv.decode_step(ids, toks, [np.zeros(32, np.int32)])
    with pytest.raises(kvmm.Error, match="tokens: 1 tokens for a batch of 2"):
        kv.decode_step(ids, toks[:1], [local])
    with pytest.raises(kvmm.Error, match="size 16 < batch 2 x max_pages 9"):
        kv.decode_step(ids, toks, [np.zeros(16, np.int32)], 9)
    assert [(kv.num_tokens(int(r)), kv.num_computed(int(r)), kv.num_allocated(int(r))) for r in ids] == before
    flat = np.zeros(2 * 16, np.int32)  # a 1-D table with max_pages
    assert kv.decode_step(ids, toks, [flat, local], 16, null_page=0) == 2
    assert kv.num_computed(int(ids[0])) == 7


def test_buffer_dlpack_zero_copy():
    kv = kvmm.KVCacheManager(small_layout(), num_large_pages=16, max_requests=4)
    kv.begin_step()
    r, _ = run_prompt(kv, range(10))
    indptr, indices, _, _ = kv.export_csr(0, np.array([r], np.uint32))
    buf = indices.base
    assert isinstance(buf, kvmm.Buffer)
    assert buf.__dlpack_device__() == (1, 0)
    through_dlpack = np.from_dlpack(buf)
    assert through_dlpack.dtype == np.int32
    indices[0] = 12345  # the same memory, no copy (numpy marks DLPack imports read-only)
    assert through_dlpack[0] == 12345
    view = np.asarray(buf)  # buffer protocol
    assert view.__array_interface__["data"][0] == indices.__array_interface__["data"][0]
    buf.__dlpack__()  # an unconsumed capsule frees itself


def test_batch_calls_match_single_calls():
    lay = small_layout()
    one = kvmm.KVCacheManager(lay, num_large_pages=96, max_requests=32)
    many = kvmm.KVCacheManager(lay, num_large_pages=96, max_requests=32)
    for kv in (one, many):
        kv.begin_step()
    ids_one = [run_prompt(one, np.arange(7) + 50 * i)[0] for i in range(8)]
    ids = np.array([run_prompt(many, np.arange(7) + 50 * i)[0] for i in range(8)], np.uint32)
    assert list(ids) == ids_one
    for step in range(12):
        one.begin_step()
        many.begin_step()
        toks = np.arange(8, dtype=np.uint32) + step
        for r, t in zip(ids_one, toks):
            one.append_token(r, int(t))
            assert one.allocate(r, 1)
            one.commit(r, one.num_computed(r) + 1)
        many.append_batch(ids, toks)
        assert many.allocate_batch(ids, 1) == 8
        many.commit_batch(ids)
        for r in ids_one:
            for g in range(2):
                assert (one.page_table(r, g) == many.page_table(r, g)).all()
    explicit = kvmm.KVCacheManager(lay, num_large_pages=64, max_requests=32)
    explicit.begin_step()
    r = explicit.add_request(np.arange(7, dtype=np.uint32))
    explicit.lookup_prefix(r)
    assert explicit.allocate_batch(np.array([r], np.uint32), np.array([7], np.uint32)) == 1
    explicit.commit_batch(np.array([r], np.uint32), np.array([7], np.uint64))
    assert explicit.num_computed(r) == 7


def test_allocate_batch_stops_at_first_refusal():
    # equal small page sizes: a large page is one small page; a request takes 2 + 2 of them
    kv = kvmm.KVCacheManager(small_layout(), num_large_pages=10, max_requests=8, prefix_caching=False)
    kv.begin_step()
    ids = np.array([kv.add_request(np.arange(8, dtype=np.uint32) + 9 * i) for i in range(6)], np.uint32)
    for r in ids:
        kv.lookup_prefix(int(r))
    done = kv.allocate_batch(ids, 8)
    assert done == 2
    for k, r in enumerate(ids):
        assert kv.num_allocated(int(r)) == (8 if k < done else 0)
    assert kv.counters().refused_admissions == 1


def test_fork_swap_pins_events():
    lay = small_layout()
    kv = kvmm.KVCacheManager(lay, num_large_pages=32, num_host_large_pages=32, max_requests=16, record_events=True)
    kv.begin_step()
    r, _ = run_prompt(kv, range(10))
    events = kv.take_events()
    assert events and all(kind == "stored" for kind, _, _, _ in events)
    assert all(0 <= h < 2 ** 128 for _, _, _, h in events)
    child = kv.fork(r)
    assert (kv.page_table(child, 0) == kv.page_table(r, 0)).all()
    kv.begin_step()
    assert kv.allocate(child, 1)
    copies = kv.copies()
    assert copies.shape[1] == 3 and len(copies) >= 1  # the shared partial page is copied on write
    plan = kv.swap_out(child)
    assert plan is not None and plan.shape[1] == 3 and kv.is_swapped(child)
    back = kv.swap_in(child)
    assert back is not None and len(back) == len(plan) and not kv.is_swapped(child)
    pin = kv.pin_prefix(r)
    kv.free(r)
    kv.unpin(pin)
    kv.set_priority(child, 3)
    kv.reset(child)
    assert kv.num_computed(child) == 0
    kv.reset_prefix_cache()
    assert kv.num_evictable_pages(0) == 0
    assert not kv.cached_image(12345, 16)
    kv.check_invariants()


def test_image_from_cache_other_text():
    """A cached image serves a request whose text before it differs (issue 29 item 1)."""
    import kvmm as k
    layout = k.KVLayout.plan([k.LayerGroup.full_attention("text", 1, 1, 8, 2, 4),
                              k.LayerGroup.cross_attention("cross", 1, 1, 8, 2, 4)])
    kv = k.KVCacheManager(layout, num_large_pages=64, max_requests=4)
    kv.begin_step()
    img = (987654321, 4, 10)
    a = kv.add_request(np.arange(16, dtype=np.uint32) + 100, items=[img])
    assert kv.lookup_prefix(a) == 0
    assert kv.allocate(a, 16)
    assert not kv.image_from_cache(a, 0)
    cross = list(kv.page_table(a, 1))
    kv.commit(a, 16)
    kv.free(a)
    assert kv.cached_image(img[0], img[2])
    b = kv.add_request(np.arange(16, dtype=np.uint32) + 500, items=[img])
    assert kv.lookup_prefix(b) == 0
    assert kv.allocate(b, 16)
    assert kv.image_from_cache(b, 0)
    assert list(kv.page_table(b, 1)) == cross
    kv.check_invariants()


def test_extras_salt_lora_items():
    kv = kvmm.KVCacheManager(small_layout(), num_large_pages=32, max_requests=8)
    kv.begin_step()
    prompt = np.arange(13, dtype=np.uint32)
    a, _ = run_prompt(kv, prompt)
    kv.free(a)
    for extras in ({"lora_id": 3}, {"cache_salt": "tenant"}, {"items": [(2 ** 100 + 5, 4, 4)]}):
        r = kv.add_request(prompt, **extras)
        assert kv.lookup_prefix(r) < 12  # a different key: no full hit
        kv.free(r)
    r = kv.add_request(prompt, priority=2, max_tokens=64)
    assert kv.lookup_prefix(r) == 12


def test_log_callback_and_reentry():
    seen = []
    holder = {}

    def log(level, msg):
        seen.append((level, msg))
        try:
            holder["kv"].num_active  # calling back is refused
        except kvmm.Error as e:
            seen.append(("reentry", str(e)))

    kv = kvmm.KVCacheManager(small_layout(), num_large_pages=1, max_requests=4, log=log)
    holder["kv"] = kv
    kv.begin_step()
    r = kv.add_request(np.arange(40, dtype=np.uint32))
    kv.lookup_prefix(r)
    assert not kv.allocate(r, 40)
    assert any(level != "reentry" for level, _ in seen)
    assert any(level == "reentry" and "single-threaded" in msg for level, msg in seen)


def test_host_arena_as_page_source():
    lay = small_layout()
    arena = kvmm.Arena(lay, 8, chunk_bytes=4096)
    assert arena.device == "cpu" and arena.bytes == 8 * lay.large_page_bytes
    kv = kvmm.KVCacheManager(lay, arena=arena, max_requests=4)
    kv.begin_step()
    r, _ = run_prompt(kv, range(9))
    mem = arena.numpy()
    page = int(kv.page_table(r, 0)[0])
    addr = arena.small_page_address(0, page)
    assert addr == arena.base + page * lay.small_page_bytes(0)
    mem[addr - arena.base] = 77  # the arena's bytes, writable in place
    assert np.from_dlpack(arena)[addr - arena.base] == 77  # the same bytes through DLPack
    k, v, stride = arena.layer_view(0, 1)
    assert stride == lay.small_page_bytes(0) and k == arena.base + lay.k_offset(0, 1)
    with pytest.raises(kvmm.Error, match="another KVCacheManager"):
        kvmm.KVCacheManager(lay, arena=arena)
    arena.check_invariants()
    elastic = kvmm.Arena(lay, 8, chunk_bytes=4096, backing="elastic")
    kv2 = kvmm.KVCacheManager(lay, arena=elastic, max_requests=4)
    assert elastic.num_backed_chunks == 0
    kv2.begin_step()
    run_prompt(kv2, range(9))
    assert elastic.num_backed_chunks > 0
    with pytest.raises(kvmm.Error, match="elastic"):
        elastic.numpy()


def test_cuda_arena_without_driver():
    if kvmm.cuda_available():
        pytest.skip("a CUDA driver is present")
    assert kvmm.cuda_unavailable_reason()
    with pytest.raises(kvmm.Error, match="cuda"):
        kvmm.Arena(small_layout(), 4, device="cuda")


# Found by test_differential's ASan replay (fixed in PrefixLookup::pin; C++ test in
# tests/manager/defects_test.cpp).
def test_interleaved_lookups_keep_their_own_hits():
    kv = kvmm.KVCacheManager(small_layout(), num_large_pages=64, max_requests=16)
    kv.begin_step()
    system = [7, 7, 9, 1]
    cached = []
    for lora in (0, 1):  # the same first page under two LoRA adapters: two cached pages
        r = kv.add_request(np.array(system + [50, 51, 52], np.uint32), lora_id=lora)
        kv.lookup_prefix(r)
        assert kv.allocate(r, 7)
        kv.commit(r, 7)
        cached.append(int(kv.page_table(r, 0)[0]))
    assert cached[0] != cached[1]
    x = kv.add_request(np.array(system + [1, 2], np.uint32), lora_id=0)
    y = kv.add_request(np.array(system + [3, 4], np.uint32), lora_id=1)
    assert kv.lookup_prefix(x) == 4 and kv.lookup_prefix(y) == 4  # a scheduler looks up its queue first
    assert kv.allocate(x, 2) and kv.allocate(y, 2)  # then admits
    assert int(kv.page_table(x, 0)[0]) == cached[0]
    assert int(kv.page_table(y, 0)[0]) == cached[1]  # fails: y gets LoRA 0's page


def test_prompt_in_chunks_and_hf_config_file(tmp_path):
    kv = kvmm.KVCacheManager(small_layout(), num_large_pages=32, max_requests=8)
    kv.begin_step()
    whole, _ = run_prompt(kv, np.arange(20, dtype=np.uint32))
    kv.free(whole)
    r = kv.add_request(np.arange(8, dtype=np.uint32), prompt_tokens=20)  # ids arrive in chunks
    kv.append_tokens(r, np.arange(8, 20, dtype=np.uint32))
    assert kv.num_tokens(r) == 20
    assert kv.lookup_prefix(r) == 16  # the same cached pages as the whole prompt's
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "qwen2", "num_hidden_layers": 2, "num_attention_heads": 4,
                                "num_key_value_heads": 2, "hidden_size": 256}))
    spec = kvmm.read_hf_config_file(str(path), tokens_per_page=8)
    assert spec.layout.group(0).tokens_per_page == 8 and spec.attention[0].head_dim == 64
    with pytest.raises(kvmm.Error, match="missing.json"):
        kvmm.read_hf_config_file(str(tmp_path / "missing.json"))


def test_retention_options():
    """learned_boundaries and prompt_tail_tokens reach the manager: a prompt longer than the
    window keeps the window pages a hit within its tail needs (used until free) only when
    the tail is on, counted in counters().retention_bytes; bad values raise naming the option."""
    lay = small_layout(tpp=4, window=8)
    used = {}
    for tail in (0, 16):
        kv = kvmm.KVCacheManager(lay, num_large_pages=64, learned_boundaries=0, prompt_tail_tokens=tail)
        kv.begin_step()
        r = kv.add_request(np.arange(40, dtype=np.uint32))
        kv.lookup_prefix(r)
        assert kv.allocate(r, 40)
        kv.commit(r, 40)
        used[tail] = kv.stats().groups[1].used_pages
        held = used[tail] - 2  # the pages out of the window that the tail holds
        assert kv.counters().retention_bytes == held * lay.small_page_bytes(1)
        kv.free(r)
        assert kv.stats().groups[1].used_pages == 0
        assert kv.counters().retention_bytes == 0 and kv.counters().retention_released_pages == 0
    # window 8 after 40 tokens: pages 8 and 9 in the table; a tail of 16 tokens (hits at 24..40)
    # also holds pages 4..7.
    assert used[0] == 2 and used[16] == 6
    # retention_budget 0 holds nothing past the window (Jenga's rule), whatever the tail.
    kv = kvmm.KVCacheManager(lay, num_large_pages=64, learned_boundaries=0, prompt_tail_tokens=16,
                             retention_budget=0.0, retention_release="off")
    kv.begin_step()
    r = kv.add_request(np.arange(40, dtype=np.uint32))
    kv.lookup_prefix(r)
    assert kv.allocate(r, 40)
    kv.commit(r, 40)
    assert kv.stats().groups[1].used_pages == 2 and kv.counters().retention_bytes == 0
    with pytest.raises(kvmm.Error, match="retention_budget = 1.5"):
        kvmm.KVCacheManager(lay, num_large_pages=8, retention_budget=1.5)
    with pytest.raises(ValueError, match="retention_release = 'some': expected 'own', 'all' or 'off'"):
        kvmm.KVCacheManager(lay, num_large_pages=8, retention_release="some")
    with pytest.raises(kvmm.Error, match="prompt_tail_tokens = 16777217"):
        kvmm.KVCacheManager(lay, num_large_pages=8, prompt_tail_tokens=2**24 + 1)
    with pytest.raises(kvmm.Error, match="learned_boundaries = 16777217"):
        kvmm.KVCacheManager(lay, num_large_pages=8, learned_boundaries=2**24 + 1)


def test_kv_events_for_a_router():
    """take_kv_events(): stored runs carry what a router rebuilds its keys from, in order;
    their hashes are the pages the page events report stored; reset_prefix_cache is one
    'cleared'; nothing when off."""
    lay = small_layout(tpp=4, window=8)
    kv = kvmm.KVCacheManager(lay, num_large_pages=64, record_events=True, record_kv_events=True)
    kv.begin_step()
    prompt = np.arange(100, 114, dtype=np.uint32)  # 14 tokens: 3 full pages of 4
    r = kv.add_request(prompt, lora_id=3, cache_salt="tenant")
    kv.lookup_prefix(r)
    assert kv.allocate(r, 14)
    kv.commit(r, 14)
    runs = kv.take_kv_events()
    pages = kv.take_events()
    assert [e["kind"] for e in runs] == ["stored", "stored"]  # full, then the window group
    assert [e["group"] for e in runs] == [0, 1]
    for e in runs:
        assert e["first_page"] == 0 and e["parent"] is None and e["medium"] == "device"
        assert e["tokens_per_page"] == 4 and e["lora_id"] == 3 and e["cache_salt"] == "tenant"
        assert list(e["token_ids"]) == list(prompt[:12])
        assert len(e["block_hashes"]) == 3
    stored = {(g, h) for kind, g, _, h in pages if kind == "stored"}
    assert stored == {(e["group"], h) for e in runs for h in e["block_hashes"]}
    # Two more tokens complete page 3: a run of one, its parent the last hash above.
    kv.append_tokens(r, np.array([7, 8], np.uint32))
    assert kv.allocate(r, 2)
    kv.commit(r, 16)
    more = kv.take_kv_events()
    assert more[0]["first_page"] == 3 and more[0]["parent"] == runs[0]["block_hashes"][-1]
    assert more[0]["cache_salt"] == ""  # the salt keys page 0 only
    kv.free(r)
    kv.reset_prefix_cache()
    assert [e["kind"] for e in kv.take_kv_events()] == ["cleared"]
    off = kvmm.KVCacheManager(lay, num_large_pages=16)
    off.begin_step()
    q = off.add_request(prompt)
    off.lookup_prefix(q)
    assert off.allocate(q, 14)
    off.commit(q, 14)
    assert off.take_kv_events() == []
