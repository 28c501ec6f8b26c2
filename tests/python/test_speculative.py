# Issue 33 in Python: draft groups (DraftRole), draft_recompute, tag_state on the hybrid
# layout of tests/speculative (target full attention, tagged recurrent state, EAGLE draft).
import pytest

import kvmm


def hybrid(tagged=True):
    target = kvmm.LayerGroup.full_attention("target", 1, 1, 8, 2, 4)
    state = kvmm.LayerGroup.mamba_state("state", 1, 256, 8)
    state.tagged_checkpoints = tagged
    draft = kvmm.LayerGroup.full_attention("draft", 1, 1, 8, 2, 4)
    draft.draft = kvmm.DraftRole("target", successor_tokens=1)
    return kvmm.KVLayout.plan([target, state, draft])


def run_prompt(kv, tokens, sampled):
    r = kv.add_request(tokens)
    hit = kv.lookup_prefix(r)
    assert kv.allocate(r, len(tokens) - hit)
    kv.append_token(r, sampled)  # before the commit: the draft's last page is keyed with it
    kv.commit(r, len(tokens))
    return r, hit


def test_draft_role_and_presets():
    lay = hybrid()
    assert lay.group(2).is_draft() and not lay.group(0).is_draft()
    assert lay.group(2).draft.target == "target" and lay.group(2).draft.successor_tokens == 1
    assert lay.group(0).draft is None
    assert lay.group(1).tagged_checkpoints
    assert "eagle3-llama-3.1-8b" in kvmm.presets.speculative_names()
    eagle = kvmm.presets.by_name("eagle3-llama-3.1-8b")
    assert eagle.group(1).draft.successor_tokens == 1
    mtp = kvmm.presets.by_name("mtp-qwen3-next-80b-a3b", max_large_page_bytes=128 << 20)
    assert mtp.group(1).tagged_checkpoints and mtp.group(2).draft.target == "full"


def test_draft_keeps_the_hit_and_recomputes_its_last_page():
    kv = kvmm.KVCacheManager(hybrid(), num_large_pages=64)
    doc = list(range(1, 17))
    a, _ = run_prompt(kv, doc, 40)
    assert kv.tag_state(a, 1, 16)
    kv.free(a)
    same = kv.add_request(doc + [40, 3, 3])  # the same next token: every draft page reused
    assert kv.lookup_prefix(same) == 16
    assert kv.draft_recompute(same, 2) == (16, 16)
    other = kv.add_request(doc + [41, 3, 3])  # another next token: the draft's last page recomputed
    assert kv.lookup_prefix(other) == 16
    assert kv.draft_recompute(other, 2) == (12, 16)
    kv.check_invariants()


def test_state_over_a_draft_is_refused():
    kv = kvmm.KVCacheManager(hybrid(), num_large_pages=64)
    r = kv.add_request(list(range(1, 8)))
    assert kv.lookup_prefix(r) == 0
    assert kv.allocate(r, 7, lookahead=4)
    kv.commit(r, 7)
    kv.append_tokens(r, [8, 9])
    assert not kv.tag_state(r, 1, 8)  # position 7 not verified yet
    kv.commit(r, 8)
    assert kv.tag_state(r, 1, 8)


def test_bad_input_names_argument_and_value():
    kv = kvmm.KVCacheManager(hybrid(), num_large_pages=64)
    r = kv.add_request(list(range(1, 10)))
    kv.lookup_prefix(r)
    assert kv.allocate(r, 8)
    kv.commit(r, 8)
    with pytest.raises(kvmm.Error, match="group = 0"):
        kv.draft_recompute(r, 0)
    with pytest.raises(kvmm.Error, match="group = 2"):
        kv.tag_state(r, 2, 8)
    with pytest.raises(kvmm.Error, match="state_tokens = 0"):
        kv.tag_state(r, 1, 0)
    with pytest.raises(kvmm.Error, match="state_tokens = 12"):
        kv.tag_state(r, 1, 12)
    with pytest.raises(TypeError):
        kv.tag_state(r, 1, -1)
    kv.check_invariants()
    assert kv.num_computed(r) == 8
    bad = kvmm.LayerGroup.full_attention("draft", 1, 1, 8, 2, 4)
    bad.draft = kvmm.DraftRole("nope")
    with pytest.raises(kvmm.Error, match="draft.target = 'nope'"):
        kvmm.KVLayout.plan([kvmm.LayerGroup.full_attention("target", 1, 1, 8, 2, 4), bad])


def test_target_group_keyed_with_the_next_token():
    # Draft layers sharing the target's pages: the target group itself keyed with the next
    # token takes part in the hit, and its last page counts only when that token matches.
    merged = kvmm.LayerGroup.full_attention("merged", 2, 1, 8, 2, 4)
    merged.successor_tokens = 1
    lay = kvmm.KVLayout.plan([merged])
    assert lay.group(0).successor_tokens == 1 and lay.group(0).draft is None
    kv = kvmm.KVCacheManager(lay, num_large_pages=64)
    doc = list(range(1, 17))
    a, _ = run_prompt(kv, doc, 40)
    kv.free(a)
    assert kv.lookup_prefix(kv.add_request(doc + [40, 3])) == 16
    assert kv.lookup_prefix(kv.add_request(doc + [41, 3])) == 12
    assert kv.lookup_prefix(kv.add_request(doc)) == 12  # the next token unknown
    kv.check_invariants()
    bad = kvmm.LayerGroup.sliding_window("window", 1, 1, 8, 2, 4, 8)
    bad.successor_tokens = 1
    with pytest.raises(kvmm.Error, match="'window': successor_tokens = 1"):
        kvmm.KVLayout.plan([merged, bad])
    with pytest.raises(TypeError):
        merged.successor_tokens = -1
