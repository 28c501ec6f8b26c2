"""EAGLE / MTP speculative decoding with prefix caching through vLLM's scheduler (issue 33,
item 6). The drafter's KV at position p is computed from token p + 1 too, so a cached block
holds, at its last position, a value for the token after it. vLLM's rule (use_eagle) drops
the last block of every hit in the groups flagged is_eagle_group; kvmm's adapter keys a group
of draft layers with the next token instead (a kvmm draft group, successor_tokens = 1), so a
hit keeps that block exactly when the next token matches. vLLM's usual plan merges the draft
layers into the target's group: kvmm keys that target group with the next token
(LayerGroup.successor_tokens), as vLLM 0.33's default lookahead hashes key every block, where
its drop rule drops the block. The stand-in worker's content check
(kv_content.py) records in a draft slot the key of position p + 1: a hit that returns a draft
page computed for another next token fails."""

import contextlib
from unittest import mock

import pytest
import torch

from harness import Setup, Trace, VOCAB, expected_outputs, make_trace, run
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

BLOCK = 16


@contextlib.contextmanager
def no_eagle_rule():
    """vLLM's EAGLE groups treated as plain groups, in the adapter and in its layout (each
    module calls eagle_groups by its own name)."""
    none = ({}, [], 0)
    with mock.patch("kvmm.integrations.vllm.eagle_groups", return_value=none), \
            mock.patch("kvmm.integrations.vllm_layout.eagle_groups", return_value=none):
        yield


def spec(is_draft: bool = False) -> FullAttentionSpec:
    return FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=8, dtype=torch.float32, is_draft=is_draft)


def draft_layout(num_blocks: int) -> KVCacheConfig:
    """The target's layers and the draft head's in groups of their own (the draft's flagged
    as vLLM's planner flags the group holding draft layers), one layer each: vLLM's groups
    have equal page bytes."""
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["full.0"], spec()),
        KVCacheGroupSpec(["draft.0"], spec(is_draft=True), is_eagle_group=True)])


def merged_layout(num_blocks: int) -> KVCacheConfig:
    """vLLM's usual plan: the draft layer merged into the target's group (equal specs)."""
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["full.0", "draft.0"], spec(), is_eagle_group=True)])


def exact_trace() -> Trace:
    """A: a 40-token prompt, cached. Then, each after the one before has finished: B, the same
    prompt; C, A's first 32 tokens and another token at 32; D, A's first 33 tokens and
    another tail. Their hits: 32 tokens where the next token (32) matches, 16 where not."""
    a = [(7 * i + 3) % (VOCAB - 1) for i in range(40)]
    c = a[:32] + [(a[32] + 1) % (VOCAB - 1)] + a[33:]
    d = a[:33] + [(x + 5) % (VOCAB - 1) for x in a[33:]]
    prompts = {"A": a, "B": list(a), "C": c, "D": d}
    return Trace(prompts=prompts, max_tokens={r: 3 for r in prompts},
                 arrival_step={"A": 0, "B": 10, "C": 20, "D": 30}, priority={r: 0 for r in prompts})


SETUP = Setup(num_blocks=48, block_size=BLOCK, spec_tokens=3, eagle=True)


def test_kvmm_keeps_the_block_vllm_drops_when_the_next_token_matches():
    trace = exact_trace()
    vllm = run(SETUP, trace, kvmm=False, kcc=draft_layout(48))
    ours = run(SETUP, trace, kvmm=True, kcc=draft_layout(48))
    assert vllm.outputs == expected_outputs(trace) == ours.outputs
    # vLLM: the last block of every hit dropped; kvmm: kept where token 32 matches (B, D).
    assert vllm.hits == {"A": 0, "B": 16, "C": 16, "D": 16}
    assert ours.hits == {"A": 0, "B": 32, "C": 16, "D": 32}


def test_the_draft_layout_is_a_kvmm_draft_group():
    from harness import make_scheduler

    sched = make_scheduler(SETUP, kvmm=True, kcc=draft_layout(48))
    mgr = sched.kv_cache_manager
    assert mgr.draft_groups == {1: 0} and mgr.eagle_keyed_groups == [] and mgr.eagle_drop_tokens == 0
    role = mgr.layout.group(1).draft
    assert role is not None and role.target == "g0" and role.successor_tokens == 1
    # Without EAGLE's rule the same config is two plain groups.
    plain = make_scheduler(Setup(num_blocks=48, block_size=BLOCK, spec_tokens=3), kvmm=True, kcc=draft_layout(48))
    assert plain.kv_cache_manager.draft_groups == {} and plain.kv_cache_manager.layout.group(1).draft is None


def test_content_check_catches_a_draft_page_for_another_next_token():
    """The check can fail: with the draft group cached like a target group (no successor key,
    no drop), C is admitted on A's draft page 1, whose last slot was computed from A's token
    32, and the worker's content check says so."""
    with no_eagle_rule():
        with pytest.raises(AssertionError, match="another context at position 31"):
            run(SETUP, exact_trace(), kvmm=True, kcc=draft_layout(48))


LOOKAHEAD = Setup(num_blocks=48, block_size=BLOCK, spec_tokens=3, eagle=True, lookahead_hashes=True)


def test_merged_draft_layers_keep_the_block_vllms_drop_rule_drops():
    """Draft layers in the target's group (one block table): kvmm keys that group with the
    next token, so B and D (token 32 as A's) keep block 1, which vLLM's drop rule drops; the
    hits equal vLLM's with lookahead hashes (its 0.33 default). Content-checked: block 1's
    draft slot at position 31 holds token 32's key."""
    trace = exact_trace()
    drop = run(SETUP, trace, kvmm=False, kcc=merged_layout(48))
    lookahead = run(LOOKAHEAD, trace, kvmm=False, kcc=merged_layout(48))
    ours = run(SETUP, trace, kvmm=True, kcc=merged_layout(48))
    assert drop.outputs == lookahead.outputs == expected_outputs(trace) == ours.outputs
    assert drop.hits == {"A": 0, "B": 16, "C": 16, "D": 16}
    assert lookahead.hits == ours.hits == {"A": 0, "B": 32, "C": 16, "D": 32}


def test_the_merged_layout_is_a_keyed_target_group():
    from harness import make_scheduler

    mgr = make_scheduler(SETUP, kvmm=True, kcc=merged_layout(48)).kv_cache_manager
    assert mgr.draft_groups == {} and mgr.eagle_keyed_groups == [0] and mgr.eagle_drop_tokens == 0
    assert mgr.layout.group(0).successor_tokens == 1 and mgr.layout.group(0).draft is None
    plain = make_scheduler(Setup(num_blocks=48, block_size=BLOCK, spec_tokens=3), kvmm=True, kcc=merged_layout(48))
    assert plain.kv_cache_manager.layout.group(0).successor_tokens == 0


def test_content_check_catches_a_merged_block_for_another_next_token():
    """The check can fail on the merged layout too: with the group keyed by the chain alone
    (no successor key, no drop), C is admitted on A's block 1, computed from A's token 32."""
    with no_eagle_rule():
        with pytest.raises(AssertionError, match="another context at position 31"):
            run(SETUP, exact_trace(), kvmm=True, kcc=merged_layout(48))


@pytest.mark.parametrize("seed", [7, 11])
def test_seeded_trace_with_merged_draft_layers(seed):
    """The seeded trace on vLLM's usual plan: every stream exact, every admitted block's draft
    slots checked each step; kvmm's first-admission hits at least vLLM's drop rule's, and
    printed against vLLM's lookahead hashes."""
    setup = Setup(num_blocks=56, block_size=BLOCK, spec_tokens=3, eagle=True)
    trace = make_trace(seed)
    drop = run(setup, trace, kvmm=False, seed=seed, kcc=merged_layout(56))
    lookahead = run(Setup(num_blocks=56, block_size=BLOCK, spec_tokens=3, eagle=True, lookahead_hashes=True), trace,
                    kvmm=False, seed=seed, kcc=merged_layout(56))
    ours = run(setup, trace, kvmm=True, seed=seed, kcc=merged_layout(56))
    assert drop.outputs == lookahead.outputs == expected_outputs(trace) == ours.outputs
    print(f"seed {seed} merged: first-admission hit tokens vLLM drop rule {drop.hit_tokens}, vLLM lookahead hashes "
          f"{lookahead.hit_tokens}, kvmm {ours.hit_tokens}; preemptions {drop.preemptions} / "
          f"{lookahead.preemptions} / {ours.preemptions}")
    assert ours.hit_tokens > drop.hit_tokens


@pytest.mark.parametrize("seed", [7, 11])
def test_seeded_trace_with_a_draft_group(seed):
    """60 requests sharing prefixes, 3 drafts with random acceptance, chunked prefill and
    preemption: every stream exact, every admitted draft slot holds its own next token's
    key (checked each step), kvmm's invariants; hits printed against vLLM's rule."""
    setup = Setup(num_blocks=56, block_size=BLOCK, spec_tokens=3, eagle=True)
    trace = make_trace(seed)
    vllm = run(setup, trace, kvmm=False, seed=seed, kcc=draft_layout(56))
    ours = run(setup, trace, kvmm=True, seed=seed, kcc=draft_layout(56))
    assert vllm.outputs == expected_outputs(trace) == ours.outputs
    print(f"seed {seed}: first-admission hit tokens vLLM (drop rule) {vllm.hit_tokens}, kvmm {ours.hit_tokens}; "
          f"preemptions {vllm.preemptions} / {ours.preemptions}")
    assert ours.hit_tokens > 0
