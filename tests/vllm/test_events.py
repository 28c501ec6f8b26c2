"""KV cache events in vLLM's classes from kvmm's adapter: stored runs (hashes, parent, token
ids, block size, group) at commit, a clear at reset_prefix_cache; prefix-cache stats."""

from vllm.distributed.kv_events import AllBlocksCleared, BlockStored
from vllm.sampling_params import SamplingParams
from vllm.v1.request import Request, RequestStatus

from harness import get_request_block_hasher, kv_cache_config, sha256
from kvmm.integrations.vllm import KvmmKVCacheManager


def request(rid, tokens):
    return Request(request_id=rid, prompt_token_ids=tokens, sampling_params=SamplingParams(max_tokens=4),
                   pooling_params=None, block_hasher=get_request_block_hasher(4, sha256))


def test_stored_events_and_a_clear():
    mgr = KvmmKVCacheManager(kv_cache_config(16, block_size=4, window=8), 256, enable_kv_cache_events=True,
                             log_stats=True)
    mgr.new_step_starts()
    a = request("a", list(range(10)))
    blocks, hit, _ = mgr.get_computed_blocks(a)
    assert hit == 0
    new = mgr.allocate_slots(a, 10)
    ids = mgr.get_block_ids("a")
    assert [len(g) for g in ids] == [3, 3] and new.get_block_ids() == ids
    assert not set(ids[0]) & set(ids[1]) and all(1 <= i < 16 for g in ids for i in g)
    a.num_computed_tokens = 10
    mgr.cache_blocks(a, 10)
    events = mgr.take_events()
    stored = [e for e in events if isinstance(e, BlockStored)]
    assert {e.group_idx for e in stored} == {0, 1}
    full = [e for e in stored if e.group_idx == 0]
    assert sum(len(e.block_hashes) for e in full) == 2  # two full pages of 4 tokens
    assert [t for e in full for t in e.token_ids] == list(range(8))
    assert all(e.block_size == 4 and e.parent_block_hash is None for e in full[:1])
    assert full[0].kv_cache_spec_kind is not None
    # A second request with the same prefix hits both full pages.
    b = request("b", list(range(9)) + [99])
    _, hit, _ = mgr.get_computed_blocks(b)
    assert hit == 8
    mgr.record_prefix_cache_stats(b, hit)
    stats = mgr.make_prefix_cache_stats()
    assert stats.hits == 8 and stats.queries == 10
    assert mgr.allocate_slots(b, 2, num_new_computed_tokens=8) is not None
    assert mgr.get_block_ids("b")[0][:2] == ids[0][:2]  # the same cached pages
    mgr.kv.check_invariants()
    assert mgr.reset_prefix_cache()
    assert any(isinstance(e, AllBlocksCleared) for e in mgr.take_events())


def test_capped_lookup_equals_vllm():
    """get_computed_blocks with a cap (vLLM's max_cache_hit_length): for every cap from 0 to
    past the shared prefix, kvmm's hit equals vLLM's manager's on the same cached pages, and a
    request looked up again with a lower or higher cap (kvmm registers it again) still
    admits with the capped hit."""
    from harness import Setup, make_scheduler

    prompt = list(range(100))
    other = list(range(90)) + [500 + i for i in range(30)]
    mgrs = [make_scheduler(Setup(num_blocks=64, block_size=4, caching=True), kvmm=k).kv_cache_manager
            for k in (False, True)]
    for m in mgrs:
        m.new_step_starts()
        a = request("a", prompt)
        m.get_computed_blocks(a)
        assert m.allocate_slots(a, 100) is not None
        a.num_computed_tokens = 100
        m.cache_blocks(a, 100)
    hits = {False: [], True: []}
    for k, m in zip((False, True), mgrs):
        b = request("b", other)
        for cap in list(range(0, 125, 3)) + [7, 95, 2, 61]:
            blocks, hit, _ = m.get_computed_blocks(b, cap)
            hits[k].append(hit)
        assert m.allocate_slots(b, len(other) - hit, num_new_computed_tokens=hit, new_computed_blocks=blocks) is not None
        assert m.get_block_ids("b")[0][:hit // 4] == m.get_block_ids("a")[0][:hit // 4]
    assert hits[True] == hits[False]
    assert max(hits[True]) == 88 and hits[True][-2:] == [0, 60]
    mgrs[1].kv.check_invariants()


def test_watermark_blocks_an_admission_as_vllm():
    """vLLM's watermark: an admission while others are scheduled must leave
    int(watermark * num_blocks) blocks free; a running request's allocation need not. kvmm's
    adapter refuses and admits the same allocations as vLLM's manager, at the boundary."""
    from harness import Setup, make_scheduler

    for need in (8, 9, 10, 11, 12):  # blocks the second request asks for; 19 are free after the first
        got = []
        for k in (False, True):
            m = make_scheduler(Setup(num_blocks=32, block_size=4, caching=False, watermark=0.25), kvmm=k).kv_cache_manager
            m.new_step_starts()
            a = request("a", list(range(48)))
            assert m.allocate_slots(a, 48, has_scheduled_reqs=False) is not None  # 12 blocks, no watermark
            b = request("b", list(range(100, 100 + 4 * need)))
            got.append(m.allocate_slots(b, 4 * need, has_scheduled_reqs=True) is not None)
            a.status = RequestStatus.RUNNING  # a running request's growth ignores the watermark
            a.num_computed_tokens = 48
            got.append(m.allocate_slots(a, 4 * 7, num_lookahead_tokens=0) is not None)
        assert got[:2] == got[2:], (need, got)
        assert got[0] == (need + 8 <= 31 - 12), (need, got)
        assert got[1] == (31 - 12 - (need if got[0] else 0) >= 7), (need, got)
