"""vLLM's v1 scheduler on kvmm: a replacement of vLLM's KVCacheManager, and the scheduler
classes that install it (`--scheduler-cls kvmm.integrations.vllm.KvmmScheduler`, or
`KvmmAsyncScheduler` with async scheduling). Written against vLLM 0.33.0 (scripts/vllm_env.sh
pins it); `UNSUPPORTED` names the members of vLLM's manager this adapter leaves out and the
vLLM feature that needs each (they raise NotImplementedError). Guide: docs/vllm.md.

- Layout: one kvmm layer group per vLLM KV cache group (full attention, sliding window,
  chunked local attention), each with one small page per large page: vLLM's block ids
  index one pool shared by every group, so kvmm page p of any group is vLLM block p + 1
  (block 0 is vLLM's null block, kvmm's null page maps to it) and ids stay unique across
  groups as vLLM's are. kvmm gets num_blocks - 1 large pages. KvmmLayoutScheduler is for a
  worker that lays memory out as kvmm's arena: any LCM layout, Mamba state groups, block
  ids per group (kvmm's small page + 1).
- EAGLE / MTP (SpeculativeConfig.use_eagle_block_drop): a group of draft layers flagged
  is_eagle_group is a kvmm draft group keyed with the next token (the hit keeps the last
  block when it matches); draft layers sharing the target's group get vLLM's last-block drop.
- Lookups: a cap (max_cache_hit_length) is kvmm's lookup_prefix(r, limit). Admission:
  full_sequence_must_fit, the watermark and a connector's reserved blocks through kvmm's
  pure would_allocate. KV connectors are bound to this
  manager; their synchronous loads are allocated with the step and committed as computed.
- num_computed_tokens is the scheduler's. kvmm caches a page at commit: the adapter commits
  the processed tokens (num_computed_tokens - num_in_flight_tokens) after each step's output
  (commit_after_output, the default), before a request's next allocation and before a free;
  commit also releases the pages that left a sliding window (vLLM's remove_skipped_blocks,
  which vLLM runs only at the request's next allocation: kvmm frees them a step earlier).
- Preemption is by recompute: vLLM frees a running request, kvmm resets it (its token ids
  and block hashes stay; the next get_computed_blocks looks it up again).
- Costs per call: get_computed_blocks O(pages probed); allocate_slots O(groups) plus the new
  block ids; get_blocks / get_block_ids O(pages of the request) (vLLM asks only at
  admission and for connectors).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

import kvmm
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.kv_cache_utils import KVCacheBlock
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import KVCacheConfig
from vllm.v1.metrics.stats import PrefixCacheStats
from vllm.v1.request import Request, RequestStatus

from kvmm.integrations.vllm_layout import eagle_groups, layout_from_kv_cache_config

VLLM_VERSION = "0.33.0"

# Members of vLLM's KVCacheManager that vLLM's scheduler reaches only for these features.
UNSUPPORTED: dict[str, str] = {
    "coordinator": "KV connectors' async-load block reservations (_request_remaining_blocks)",
    "pop_blocks_for_free": "KV connectors with deferred block frees",
    "evict_blocks": "KV connectors' invalid-block handling",
    "truncate_computed_blocks": "KV connectors (external hits)",
    "record_blocks_for_zeroing": "KV connectors' failed loads with KV cache zeroing",
    "mamba_shared_prefix_checkpoint": "Mamba shared-prefix checkpoints",
}


def _item_hash(identifier: str) -> int:
    return int.from_bytes(hashlib.blake2b(identifier.encode(), digest_size=16).digest(), "little")


@dataclass
class _Req:
    handle: int
    admitted: bool = False  # a successful allocate since add_request / reset
    looked_up: bool = False  # lookup_prefix since add_request / reset
    known: int = 0  # token ids kvmm has
    hit: int = 0  # the lookup's hit (tokens)
    committed: int = 0  # kvmm's num_computed
    allocated: int = 0  # tokens kvmm holds pages for
    table_len: list[int] = field(default_factory=list)  # page-table length last returned, per group


class KvmmKVCacheManager:
    """vLLM's KVCacheManager interface on a kvmm.KVCacheManager (see the module's notes)."""

    def __init__(self, kv_cache_config: KVCacheConfig, max_model_len: int, *, enable_caching: bool = True,
                 log_stats: bool = False, enable_kv_cache_events: bool = False, max_requests: int = 1024,
                 watermark: float = 0.0, check_invariants: bool = False, commit_after_output: bool = True,
                 kvmm_layout: bool = False, eagle_successor_tokens: int = 0) -> None:
        if not watermark >= 0:
            raise ValueError(f"watermark = {watermark}: must be >= 0")
        if kv_cache_config.num_blocks < 2:
            raise ValueError(f"kv_cache_config.num_blocks = {kv_cache_config.num_blocks}: vLLM needs at least 2")
        self.kv_cache_config = kv_cache_config
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.enable_kv_cache_events = enable_kv_cache_events
        self.log_stats = log_stats
        self.check_invariants = check_invariants
        # Commit each step's processed tokens right after its output (pages are cached and
        # out-of-window pages released at once), else only at the request's next allocation
        # or free, when vLLM's own manager releases them (remove_skipped_blocks).
        self.commit_after_output = commit_after_output
        # kvmm_layout: block ids are kvmm's small page ids + 1 of each group (a group's own id
        # space), for a worker that lays memory out as kvmm's arena (large page p // n of
        # group g's small page p, n = small_pages_per_large_page(g)).
        self.kvmm_layout = kvmm_layout
        # EAGLE / MTP (vLLM's use_eagle: the draft's KV at a position depends on the next
        # `eagle_successor_tokens` ids): draft groups and full-attention groups sharing draft
        # and target layers keyed with them, else vLLM's last-page drop (eagle_groups).
        self.draft_groups, self.eagle_keyed_groups, self.eagle_drop_tokens = eagle_groups(
            kv_cache_config, eagle_successor_tokens)
        self.layout = layout_from_kv_cache_config(kv_cache_config, kvmm_layout, eagle_successor_tokens)
        self.num_kv_cache_groups = self.layout.num_groups
        self.num_pages = kv_cache_config.num_blocks - 1
        self.kv = kvmm.KVCacheManager(self.layout, num_large_pages=self.num_pages,
                                      max_requests=min(max_requests, kvmm.KVCacheManager.MAX_REQUESTS),
                                      prefix_caching=enable_caching, record_kv_events=enable_kv_cache_events)
        self.tokens_per_page = [spec.kv_cache_spec.block_size for spec in kv_cache_config.kv_cache_groups]
        # vLLM's watermark: blocks an admission must leave free (free or evictable), counted
        # over the pool as vLLM's manager does.
        self.watermark_blocks = int(watermark * kv_cache_config.num_blocks)
        self.prefix_cache_stats = PrefixCacheStats() if log_stats else None
        self.empty_kv_cache_blocks = KVCacheBlocks(tuple(() for _ in range(self.num_kv_cache_groups)))
        self._reqs: dict[str, _Req] = {}
        from vllm.v1.kv_cache_interface import get_kv_cache_spec_kind, get_kv_cache_spec_sliding_window

        self._event_kinds = [(get_kv_cache_spec_kind(g.kv_cache_spec).value,
                              get_kv_cache_spec_sliding_window(g.kv_cache_spec))
                             for g in kv_cache_config.kv_cache_groups]
        self._new_block_ids: list[int] = []
        # vLLM's blocks by id (block_id = kvmm page + 1; 0 = the null block), made once.
        self._per_large = [self.layout.small_pages_per_large_page(g) for g in range(self.num_kv_cache_groups)]
        self._blocks = [KVCacheBlock(i) for i in range(self.num_pages * max(self._per_large) + 1)]

    @classmethod
    def for_scheduler(cls, scheduler: Scheduler, **kwargs) -> "KvmmKVCacheManager":
        return cls(scheduler.kv_cache_config, scheduler.max_model_len,
                   enable_caching=scheduler.cache_config.enable_prefix_caching, log_stats=scheduler.log_stats,
                   enable_kv_cache_events=scheduler.enable_kv_cache_events,
                   max_requests=4 * scheduler.scheduler_config.max_num_seqs + 64,
                   watermark=scheduler.scheduler_config.watermark, **kwargs)

    @property
    def block_pool(self) -> "_NoBlockPool":
        """What vLLM's scheduler binds KV connectors to (bind_gpu_block_pool): kvmm has no
        BlockPool; a connector that reaches into it (reference counts, cached blocks,
        deferred frees) gets NotImplementedError naming the member."""
        return _NoBlockPool()

    def get_computed_blocks_for_connector(self, request: Request, max_cache_hit_length: int | None = None):
        """vLLM's lookup for connectors that handle hybrid hits diverging per group: kvmm's
        hit is valid in every group, so it never diverges."""
        return (*self.get_computed_blocks(request, max_cache_hit_length), False)

    def __getattr__(self, name: str):
        if name in UNSUPPORTED:
            raise NotImplementedError(f"kvmm's vLLM adapter: KVCacheManager.{name} ({UNSUPPORTED[name]}) "
                                      "is not supported")
        raise AttributeError(name)

    # ---- requests
    def _state(self, request: Request, num_tokens: int | None = None) -> _Req:
        """The kvmm request of a vLLM request, registered with its first `num_tokens` token
        ids (all by default) when new."""
        st = self._reqs.get(request.request_id)
        if st is None:
            lora = request.lora_request.lora_int_id if request.lora_request is not None else 0
            items = []
            for f in request.mm_features or ():
                pos = f.mm_position
                items.append((_item_hash(f.identifier), pos.offset, pos.length))
            items.sort(key=lambda t: t[1])
            tokens = list(request.all_token_ids[:num_tokens])
            h = self.kv.add_request(tokens, lora_id=lora, cache_salt=request.cache_salt or "", items=items)
            st = _Req(h, known=len(tokens), table_len=[0] * self.num_kv_cache_groups)
            self._reqs[request.request_id] = st
        return st

    def _sync_tokens(self, request: Request, st: _Req, upto: int | None = None) -> None:
        n = request.num_tokens if upto is None else min(upto, request.num_tokens)
        if n > st.known:
            self.kv.append_tokens(st.handle, list(request.all_token_ids[st.known:n]))
            st.known = n

    def _commit(self, request: Request, st: _Req, num_tokens: int) -> None:
        """kvmm's commit of the processed tokens (capped by the ids known): their full pages
        become cached, out-of-window pages are released. No call into kvmm when nothing is
        new (the adapter mirrors kvmm's computed and allocated counts)."""
        if not st.admitted or num_tokens <= st.committed:
            return
        self._sync_tokens(request, st)
        n = min(num_tokens, st.known, st.allocated)
        if n > st.committed:
            self.kv.commit(st.handle, n)
            st.committed = n

    def commit_step(self, requests: dict, req_ids) -> None:
        """After a step's output: each running request's new token ids and its processed
        tokens into kvmm in two batched calls (append_batch, commit_batch) for the common
        case of one new token; more new tokens (accepted drafts) are appended one request at
        a time."""
        app_h, app_t, com_h, com_n = [], [], [], []
        for rid in req_ids:
            st = self._reqs.get(rid)
            req = requests.get(rid)
            if st is None or req is None or not st.admitted or req.status != RequestStatus.RUNNING:
                continue
            target = req.num_computed_tokens - req.num_in_flight_tokens
            if target <= st.committed:
                continue
            n_tok = req.num_tokens
            if n_tok == st.known + 1:
                app_h.append(st.handle)
                app_t.append(req.all_token_ids[n_tok - 1])
                st.known = n_tok
            elif n_tok > st.known:
                self._sync_tokens(req, st)
            n = min(target, st.known, st.allocated)
            if n > st.committed:
                com_h.append(st.handle)
                com_n.append(n)
                st.committed = n
        if app_h:
            self.kv.append_batch(np.array(app_h, np.uint32), np.array(app_t, np.uint32))
        if com_h:
            self.kv.commit_batch(np.array(com_h, np.uint32), np.array(com_n, np.uint64))

    def commit_processed(self, request: Request) -> None:
        st = self._reqs.get(request.request_id)
        if st is not None:
            self._commit(request, st, request.num_computed_tokens - request.num_in_flight_tokens)

    # ---- vLLM's KVCacheManager interface
    @property
    def usage(self) -> float:
        used = sum(self.kv.num_used_pages(g) / n for g, n in enumerate(self._per_large))
        return used / self.num_pages

    def new_step_starts(self) -> None:
        self.kv.begin_step()
        if self.check_invariants:
            self.kv.check_invariants()

    def make_prefix_cache_stats(self) -> PrefixCacheStats | None:
        if not self.log_stats:
            return None
        stats = self.prefix_cache_stats
        self.prefix_cache_stats = PrefixCacheStats()
        return stats

    def prefix_cache_lookup_enabled(self, request: Request) -> bool:
        return self.enable_caching and not request.skip_reading_prefix_cache

    def record_prefix_cache_stats(self, request: Request, num_hits: int) -> None:
        if not self.log_stats or not self.prefix_cache_lookup_enabled(request):
            return
        self.prefix_cache_stats.record(num_tokens=request.num_tokens, num_hits=num_hits,
                                       preempted=request.num_preemptions > 0)

    def get_computed_blocks(self, request: Request, max_cache_hit_length: int | None = None):
        """(blocks, hit tokens, shared_prefix_boundary). kvmm's lookup is pure: the hit's
        pages are pinned by the allocate_slots that admits the request, so the blocks
        returned are empty; allocate_slots takes the hit from kvmm.

        The hit is at most `max_cache_hit_length` tokens (default and ceiling: the request's
        tokens - 1, as vLLM's): kvmm's lookup_prefix(r, limit) caps it."""
        if not self.prefix_cache_lookup_enabled(request):
            return self.empty_kv_cache_blocks, 0, 0
        limit = request.num_tokens - 1
        if max_cache_hit_length is not None:
            if max_cache_hit_length < 0:
                raise ValueError(f"max_cache_hit_length = {max_cache_hit_length}: must be >= 0")
            limit = min(limit, max_cache_hit_length)
        st = self._state(request)
        if st.admitted:
            raise RuntimeError(f"request {request.request_id}: get_computed_blocks of an admitted request")
        if st.looked_up:  # looked up before but not admitted (the scheduler skipped it): again
            self.kv.reset(st.handle)
            st.looked_up = False
        self._sync_tokens(request, st)
        hit = self._eagle_hit(st.handle, self.kv.lookup_prefix(st.handle, limit))
        st.looked_up = True
        st.hit = hit
        return self.empty_kv_cache_blocks, hit, 0

    def _eagle_hit(self, handle: int, hit: int) -> int:
        """The hit under the EAGLE / MTP rule. A draft group never shortens kvmm's hit, but
        vLLM's workers compute a draft only over the scheduled positions (its input there is
        the target's hidden states, which a hit does not keep), so the hit reported ends where
        every draft group's own hit d does: kvmm is looked up again with the limit d until
        they agree. A draft page is keyed with the ids after it, so the last page of a prompt
        counts exactly when the next id matches; so does a keyed group sharing draft and target
        layers, which takes part in kvmm's hit itself. Where draft layers share a group that
        cannot be keyed, the last page of the hit is dropped (vLLM's rule). O(pages probed) per lookup, at most
        one more per draft page missing."""
        kv = self.kv
        if self.eagle_drop_tokens and hit:
            kv.reset(handle)
            hit = kv.lookup_prefix(handle, (hit - 1) // self.eagle_drop_tokens * self.eagle_drop_tokens)
        while self.draft_groups and hit:
            d = min(kv.draft_recompute(handle, g)[0] for g in self.draft_groups)
            if d >= hit:
                break
            kv.reset(handle)
            hit = kv.lookup_prefix(handle, d)
        return hit

    def allocate_slots(self, request: Request, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_blocks: KVCacheBlocks | None = None, num_lookahead_tokens: int = 0,
                       num_external_computed_tokens: int = 0, delay_cache_blocks: bool = False,
                       num_encoder_tokens: int = 0, full_sequence_must_fit: bool = False, reserved_blocks: int = 0,
                       has_scheduled_reqs: bool = True, skip_zeroing_group_ids: tuple[int, ...] = ()):
        if delay_cache_blocks or (num_external_computed_tokens and num_new_tokens == 0):
            raise NotImplementedError("asynchronous KV connector loads (delay_cache_blocks) are not supported by "
                                      "kvmm's vLLM adapter (synchronous loads are)")
        if num_encoder_tokens:
            raise NotImplementedError("allocate_slots for encoder-decoder models is not supported by kvmm")
        if num_new_tokens == 0 and num_new_computed_tokens == 0:
            raise ValueError("num_new_tokens must be greater than 0 when there are no computed tokens to adopt")
        st = self._state(request)
        h = self.kv
        if not st.admitted:
            self._sync_tokens(request, st)
            if not st.looked_up:  # caching off, or the lookup skipped: kvmm looks up (no hit)
                hit = h.lookup_prefix(st.handle)
                st.looked_up = True
                st.hit = hit
                if hit != num_new_computed_tokens:
                    h.reset(st.handle)
                    st.looked_up = False
                    raise NotImplementedError(f"request {request.request_id}: kvmm found a hit of {hit} tokens "
                                              "where vLLM skipped the prefix cache (skip_reading_prefix_cache)")
            if num_new_computed_tokens != st.hit or request.num_computed_tokens:
                raise NotImplementedError(f"request {request.request_id}: admitted with {num_new_computed_tokens} "
                                          f"computed tokens where kvmm's hit is {st.hit} (prefix replay, connectors)")
            # A connector's tokens (loaded into this step's new pages, synchronously) count as
            # computed for vLLM; kvmm allocates them with the step's tokens and commits them
            # with the step's output, as tokens the step computed.
            base = st.hit
            computed = base + num_external_computed_tokens
        else:
            if num_external_computed_tokens:
                raise NotImplementedError(f"request {request.request_id}: KV connector tokens for a running request")
            self._commit(request, st, request.num_computed_tokens - request.num_in_flight_tokens)
            computed = request.num_computed_tokens
            base = st.committed
        main = min(computed + num_new_tokens, self.max_model_len)
        slots = min(main + num_lookahead_tokens, self.max_model_len)
        keep = self._keep_free(request, has_scheduled_reqs, reserved_blocks)
        if full_sequence_must_fit:
            full = min(request.num_tokens, self.max_model_len)
            if full > main and not h.would_allocate(st.handle, full - base, keep):
                return self._refuse(st)
        if keep and not h.would_allocate(st.handle, main - base, slots - main + keep):
            return self._refuse(st)
        if not h.allocate(st.handle, main - base, slots - main):
            return self._refuse(st)
        if not st.admitted:
            st.admitted = True
            st.committed = base
        st.allocated = max(st.allocated, slots)
        new = []
        any_new = False
        for g, p in enumerate(self.tokens_per_page):
            start = st.table_len[g]
            if -(-st.allocated // p) <= start:  # no page added: nothing to copy
                new.append(())
                continue
            ids = (h.page_table(st.handle, g, start) + 1).tolist()  # null page (0xffffffff) wraps to 0
            st.table_len[g] = start + len(ids)
            self._new_block_ids.extend(ids)
            new.append([self._blocks[i] for i in ids])
            any_new = True
        return KVCacheBlocks(tuple(new)) if any_new else self.empty_kv_cache_blocks

    def _keep_free(self, request: Request, has_scheduled_reqs: bool, reserved_blocks: int = 0) -> int:
        """Blocks the allocation must leave free, as kvmm lookahead tokens: a connector's
        `reserved_blocks`, plus vLLM's watermark for an admission (a waiting or preempted
        request, while others are scheduled). kvmm checks it as the same allocation with
        `keep` more tokens, which need keep / tokens per page more pages in every group:
        exact with one group, or where the blocks divide by the number of groups; else up to
        groups - 1 blocks more than vLLM's."""
        blocks = reserved_blocks
        if self.watermark_blocks and has_scheduled_reqs and request.status in (RequestStatus.WAITING,
                                                                               RequestStatus.PREEMPTED):
            blocks += self.watermark_blocks
        return -(-blocks // self.num_kv_cache_groups) * max(self.tokens_per_page)

    def _refuse(self, st: _Req):
        if not st.admitted:  # a refused admission: kvmm gave the hit back; look it up again later
            self.kv.reset(st.handle)
            st.looked_up = False
        return None

    def free(self, request: Request) -> None:
        """A finished request: kvmm frees it. A preempted (still running) one: kvmm resets it,
        keeping its token ids and hashes for its return."""
        st = self._reqs.get(request.request_id)
        if st is None:
            return
        self._commit(request, st, request.num_computed_tokens - request.num_in_flight_tokens)
        if request.is_finished():
            self.kv.free(st.handle)
            del self._reqs[request.request_id]
            return
        if st.admitted or st.looked_up:
            self.kv.reset(st.handle)
        st.admitted = st.looked_up = False
        st.hit = st.committed = st.allocated = 0
        st.table_len = [0] * self.num_kv_cache_groups

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        st = self._reqs.get(request.request_id)
        if st is not None and self.enable_caching:
            self._commit(request, st, num_computed_tokens)

    def remove_skipped_blocks(self, request_id: str, processed_computed_tokens: int,
                              num_prompt_tokens: int | None = None) -> None:
        st = self._reqs.get(request_id)
        if st is not None and st.admitted:
            n = min(processed_computed_tokens, st.known, st.allocated)
            if n > st.committed:
                self.kv.commit(st.handle, n)
                st.committed = n

    def _block_ids(self, request_id: str) -> tuple[list[int], ...]:
        st = self._reqs.get(request_id)
        if st is None or not st.admitted:
            return tuple([] for _ in range(self.num_kv_cache_groups))
        return tuple((self.kv.page_table(st.handle, g) + 1).tolist() for g in range(self.num_kv_cache_groups))

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        ids = self._block_ids(request_id)
        if not any(ids):
            return self.empty_kv_cache_blocks
        return KVCacheBlocks(tuple([self._blocks[i] for i in g] for g in ids))

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        return self._block_ids(request_id)

    def get_block_ids_for_computed_tokens(self, request_id: str, num_computed_tokens: int):
        ids = self._block_ids(request_id)
        return tuple(g[:-(-num_computed_tokens // p)] for g, p in zip(ids, self.tokens_per_page))

    def estimate_cached_tokens(self, request: Request) -> int:
        st = self._reqs.get(request.request_id)
        if st is None or not self.enable_caching or not st.admitted:
            return 0
        p = max(self.tokens_per_page)
        return st.committed // p * p

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        return [0] * self.num_kv_cache_groups

    def take_new_block_ids(self) -> list[int]:
        ids, self._new_block_ids = self._new_block_ids, []
        return [i for i in ids if i != 0]

    def take_kv_cache_block_copies(self):
        copies = self.kv.copies()
        if len(copies):
            raise NotImplementedError("copy-on-write copies (forked requests) are not produced by vLLM's scheduler")
        return [], []

    def take_boundary_state_offloads(self) -> dict:
        return {}

    def finalize_partial_tail_offloads(self, request: Request) -> list:
        """A KV producer's finished request: the partial-tail state blocks of Mamba "align"
        groups to offload; kvmm's adapter has no such group."""
        return []

    def take_events(self) -> list:
        if not self.enable_kv_cache_events:
            return []
        from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored

        out = []
        for e in self.kv.take_kv_events():
            hashes = [h & 0xFFFFFFFFFFFFFFFF for h in e.get("block_hashes", ())]
            if e["kind"] == "cleared":
                out.append(AllBlocksCleared())
            elif e["kind"] == "removed":
                out.append(BlockRemoved(block_hashes=hashes, medium="GPU", group_idx=e["group"]))
            else:
                parent = e["parent"]
                out.append(BlockStored(block_hashes=hashes,
                                       parent_block_hash=None if parent is None else parent & 0xFFFFFFFFFFFFFFFF,
                                       token_ids=e["token_ids"].tolist(), block_size=e["tokens_per_page"],
                                       lora_id=e["lora_id"] or None, lora_name=None, medium="GPU",
                                       group_idx=e["group"], kv_cache_spec_kind=self._event_kinds[e["group"]][0],
                                       kv_cache_spec_sliding_window=self._event_kinds[e["group"]][1]))
        return out

    def reset_prefix_cache(self) -> bool:
        self.kv.reset_prefix_cache()
        if self.log_stats:
            self.prefix_cache_stats.reset = True
        return True

    def create_kv_cache_blocks(self, blocks) -> KVCacheBlocks:
        return KVCacheBlocks(blocks) if any(blocks) else self.empty_kv_cache_blocks

    # ---- checks (tests)
    def check(self) -> None:
        """kvmm's invariants, and every block id in [1, num_blocks) held by one group of one
        request at most unless kvmm shares it as a prefix-cache hit."""
        self.kv.check_invariants()


class _NoBlockPool:
    """kvmm's stand-in for vLLM's BlockPool, bound to KV connectors: every use raises."""

    def __getattr__(self, name: str):
        raise NotImplementedError(f"kvmm's vLLM adapter: BlockPool.{name} (a KV connector reaching into vLLM's "
                                  "block pool: reference counts, cached blocks, deferred frees) is not supported")


class _KvmmMixin:
    kvmm_layout = False  # block ids for a worker laying memory out as kvmm's arena

    def _install_kvmm(self, **kwargs) -> None:
        # vLLM's __init__ binds a KV connector to the manager it made: bound again to kvmm's.
        # What the adapter cannot follow is refused here, not midway through a run.
        if getattr(self, "aux_output_connector", None) is not None:
            raise NotImplementedError("the aux-output connector (aux_output_config) reads vLLM's KV cache "
                                      "coordinator and BlockPool: not supported by kvmm's vLLM adapter")
        if getattr(self, "defer_block_free", False):
            raise NotImplementedError("deferred block frees (a KV consumer with several batches in flight) return "
                                      "blocks to vLLM's BlockPool: not supported by kvmm's vLLM adapter")
        # vLLM's EAGLE / MTP rule (SpeculativeConfig.use_eagle_block_drop: the drafter's KV
        # at a position depends on the next ids, num_prefill_lookahead of them), whether vLLM
        # itself drops the block or keys it with lookahead hashes: kvmm keys draft groups
        # with the ids (docs/vllm.md, "Speculative decoding").
        spec = self.vllm_config.speculative_config
        if spec is not None and spec.use_eagle_block_drop():
            kwargs.setdefault("eagle_successor_tokens", max(1, self.num_prefill_lookahead))
        self.kv_cache_manager = KvmmKVCacheManager.for_scheduler(self, kvmm_layout=self.kvmm_layout, **kwargs)
        if getattr(self, "connector", None) is not None:
            self.connector.bind_kv_cache_manager(self.kv_cache_manager)

    def update_from_output(self, scheduler_output, model_runner_output):
        out = super().update_from_output(scheduler_output, model_runner_output)
        kv = self.kv_cache_manager
        if kv.commit_after_output:
            kv.commit_step(self.requests, scheduler_output.num_scheduled_tokens)
        return out


class KvmmScheduler(_KvmmMixin, Scheduler):
    """vLLM's Scheduler with kvmm's KV cache manager (--scheduler-cls)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._install_kvmm()


class KvmmAsyncScheduler(_KvmmMixin, AsyncScheduler):
    """vLLM's AsyncScheduler with kvmm's KV cache manager (--scheduler-cls, async scheduling)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._install_kvmm()


class KvmmLayoutScheduler(KvmmScheduler):
    """KvmmScheduler for a worker that lays KV and state memory out as kvmm's arena (any LCM
    layout, Mamba / linear-attention state groups): block ids are per group, kvmm's small
    page ids + 1. vLLM's own workers need KvmmScheduler (one pool of equal pages)."""

    kvmm_layout = True
