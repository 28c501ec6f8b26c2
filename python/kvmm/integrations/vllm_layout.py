"""vLLM's KV cache groups as a kvmm layout: `layout_from_kv_cache_config` (one kvmm layer
group per vLLM KV cache group, in vLLM's order) and `eagle_groups` (where vLLM's EAGLE / MTP
rule applies and how kvmm keys those groups). Pure functions of vLLM's KVCacheConfig, called
once per engine by the scheduler adapter (kvmm.integrations.vllm) and by kvmm-layout workers
(tests/vllm/hybrid_worker.py); cost O(groups + layers). Written against vLLM 0.33.0.
"""

from __future__ import annotations

import math

import kvmm
from vllm.v1.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    MambaSpec,
    SlidingWindowSpec,
)


def eagle_groups(config: KVCacheConfig, successor_tokens: int) -> tuple[dict[int, int], list[int], int]:
    """Where vLLM's EAGLE / MTP rule applies (its `is_eagle_group` flag, set on the groups
    holding draft layers when the drafter's KV at a position depends on the next token):
    ({draft group: target group}, keyed groups, drop tokens). A flagged group of draft layers
    only (its spec's `is_draft`) is a kvmm draft group of the first unflagged attention
    group, keyed with its `successor_tokens` (docs/speculative.md). A flagged full-attention
    group that also holds target layers (vLLM's planner merges layers of equal specs into one
    group, one block table: its usual plan) is a kvmm target group keyed with them
    (LayerGroup.successor_tokens), as vLLM's lookahead hashes key it: a page is hit exactly
    when the ids after it match. Any other flagged group (a merged sliding window or chunked
    group) cannot be keyed: there the adapter drops the last page of a hit as vLLM's drop
    rule does (drop tokens = its block size; 0 when no such group). `successor_tokens` = 0:
    no rule."""
    if successor_tokens <= 0:
        return {}, [], 0
    groups = config.kv_cache_groups
    flagged = [i for i, g in enumerate(groups) if getattr(g, "is_eagle_group", False)]
    if not flagged:  # vLLM flags every group when none is identified as the draft's
        flagged = list(range(len(groups)))
    drafts, keyed, drop = {}, [], 0
    for i in flagged:
        spec = groups[i].kv_cache_spec
        targets = [j for j, g in enumerate(groups) if j not in flagged
                   and isinstance(g.kv_cache_spec, (FullAttentionSpec, SlidingWindowSpec))
                   and g.kv_cache_spec.block_size == spec.block_size]
        targets.sort(key=lambda j: type(groups[j].kv_cache_spec) is not FullAttentionSpec)
        if getattr(spec, "is_draft", False) and isinstance(spec, (FullAttentionSpec, SlidingWindowSpec)) \
                and not isinstance(spec, ChunkedLocalAttentionSpec) and targets:
            drafts[i] = targets[0]
        elif type(spec) is FullAttentionSpec:
            keyed.append(i)
        else:
            drop = max(drop, spec.block_size)
    return drafts, keyed, drop


def layout_from_kv_cache_config(config: KVCacheConfig, kvmm_layout: bool = False,
                                successor_tokens: int = 0) -> "kvmm.KVLayout":
    """kvmm's layout for vLLM's KV cache groups: one layer group each, in vLLM's order (group
    ids are the same). For vLLM's workers (one pool of equal pages), every group must get
    one small page per large page. With `kvmm_layout` (a worker that lays memory out as
    kvmm's arena: KvmmLayoutScheduler) any LCM layout is taken, and Mamba / linear-attention
    state groups (MambaSpec) become kvmm state groups whose checkpoint interval is the
    spec's block size: page i holds the state after token (i + 1) * block_size - 1.
    `successor_tokens` > 0 (EAGLE / MTP): a group of draft layers flagged `is_eagle_group`
    becomes a kvmm draft group keyed with that many next ids, a flagged full-attention group
    holding target layers too a target group keyed with them (`eagle_groups`)."""
    drafts, keyed, _ = eagle_groups(config, successor_tokens)
    groups = []
    for i, group in enumerate(config.kv_cache_groups):
        spec = group.kv_cache_spec
        name = f"g{i}"
        layers = len(group.layer_names)
        # kvmm never touches KV memory: only the page bytes matter (equal in every group). A
        # float64 cache (CPU tests) is described as float32 with twice the head size.
        if not isinstance(spec, MambaSpec):
            scale = max(1, spec.dtype.itemsize // 4)
            common = (name, layers, spec.num_kv_heads, spec.head_size * scale, spec.dtype.itemsize // scale)
        if isinstance(spec, MambaSpec):
            if not kvmm_layout:
                raise NotImplementedError(
                    f"kv_cache_groups[{i}]: MambaSpec: kvmm's state pages follow kvmm's checkpoint contract, which "
                    "vLLM's workers do not: a worker laying memory out as kvmm's arena does (KvmmLayoutScheduler)")
            state = sum(math.prod(shape) * dtype.itemsize for shape, dtype in zip(spec.shapes, spec.dtypes))
            groups.append(kvmm.LayerGroup.mamba_state(name, layers, state, spec.block_size))
        elif isinstance(spec, SlidingWindowSpec):
            groups.append(kvmm.LayerGroup.sliding_window(*common, spec.block_size, spec.sliding_window))
        elif isinstance(spec, ChunkedLocalAttentionSpec):
            groups.append(kvmm.LayerGroup.chunked_local(*common, spec.block_size, spec.attention_chunk_size))
        elif type(spec) is FullAttentionSpec:
            groups.append(kvmm.LayerGroup.full_attention(*common, spec.block_size))
        else:
            raise NotImplementedError(
                f"kv_cache_groups[{i}]: {type(spec).__name__} is not supported by kvmm's vLLM adapter (full "
                "attention, sliding window, chunked local attention and, with KvmmLayoutScheduler, Mamba state are)")
    for d, t in drafts.items():
        groups[d].draft = kvmm.DraftRole(groups[t].name, successor_tokens=successor_tokens)
    for k in keyed:
        groups[k].successor_tokens = successor_tokens
    # vLLM chose each group's block size and its groups (ids shared with vLLM): kvmm must
    # neither fit another size nor slice a group (LayoutOptions::slice_layers).
    layout = kvmm.KVLayout.plan(groups, fit_tokens_per_page=False, slice_layers=kvmm.SliceLayers.OFF)
    for g in range(layout.num_groups if not kvmm_layout else 0):
        if layout.small_pages_per_large_page(g) != 1:
            raise NotImplementedError(
                f"kv_cache_groups[{g}]: {layout.small_pages_per_large_page(g)} small pages per large page; "
                "vLLM's block ids need one (equal page bytes in every group); a worker laying memory out as "
                "kvmm's arena takes any layout (KvmmLayoutScheduler)")
    return layout
