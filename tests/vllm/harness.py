"""vLLM's scheduler on the CPU, without a model hub or a GPU: a VllmConfig from a model
directory written here with transformers' config classes (HF_HUB_OFFLINE=1,
skip_tokenizer_init), a KVCacheConfig built by hand, and a deterministic stand-in model that
samples token f(request, position), so both managers must produce the same token streams.
Used by tests/vllm and bench/python/vllm_step.py."""

from __future__ import annotations

import contextlib
import hashlib
import os
import pathlib
import random
import tempfile
from unittest import mock
from dataclasses import dataclass, field

import block_tables
from connector_io import ConnectorStore
from kv_content import Extras, KVContent

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

import torch  # noqa: E402
from vllm.config import (  # noqa: E402
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    LoRAConfig,
    ModelConfig,
    SchedulerConfig,
    SpeculativeConfig,
    VllmConfig,
)
from vllm.lora.request import LoRARequest  # noqa: E402
from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.core.encoder_cache_manager import EncoderCacheManager  # noqa: E402
from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

from kvmm.integrations.vllm import KvmmAsyncScheduler, KvmmLayoutScheduler, KvmmScheduler  # noqa: E402

VOCAB = 1000
PLACEHOLDER = VOCAB - 1  # an image's placeholder token (never sampled: true_token < VOCAB - 1)
init_none_hash(sha256)


def kv_cache_config(num_blocks: int, block_size: int = 16, window: int | None = None,
                    layers_per_group: int = 1, chunk: int | None = None) -> KVCacheConfig:
    """One full-attention group, plus a sliding-window group (`window`) and/or a chunked
    local attention group (`chunk`, Llama-4's layout); equal page bytes, so one block id
    indexes the same pool for every group, as vLLM's hybrid allocator has it."""
    groups = [KVCacheGroupSpec([f"full.{i}" for i in range(layers_per_group)],
                               FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=8,
                                                 dtype=torch.float32))]
    if window is not None:
        groups.append(KVCacheGroupSpec([f"swa.{i}" for i in range(layers_per_group)],
                                       SlidingWindowSpec(block_size=block_size, num_kv_heads=1, head_size=8,
                                                         dtype=torch.float32, sliding_window=window)))
    if chunk is not None:
        groups.append(KVCacheGroupSpec([f"local.{i}" for i in range(layers_per_group)],
                                       ChunkedLocalAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=8,
                                                                 dtype=torch.float32, attention_chunk_size=chunk)))
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)


_MODEL_DIRS: dict[str, str] = {}


def model_dir(arch: str = "llama") -> str:
    """A model directory with only a config.json (written by transformers' config class)."""
    if arch in _MODEL_DIRS:
        return _MODEL_DIRS[arch]
    from transformers import LlamaConfig

    d = pathlib.Path(tempfile.mkdtemp(prefix=f"kvmm-vllm-{arch}-"))
    LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=4096).save_pretrained(d)
    _MODEL_DIRS[arch] = str(d)
    return str(d)


@dataclass
class Setup:
    num_blocks: int = 64
    block_size: int = 16
    window: int | None = None
    chunk: int | None = None  # a chunked local attention group of this chunk size
    lookahead: int = 0  # vLLM's num_lookahead_tokens (EAGLE / draft-model proposers' KV slots)
    caching: bool = True
    policy: str = "fcfs"
    spec_tokens: int = 0
    async_scheduling: bool = False
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 256
    max_model_len: int = 2048
    commit_after_output: bool = True  # kvmm's adapter (see KvmmKVCacheManager)
    max_loras: int = 0  # > 0: a LoRAConfig (the scheduler admits at most this many adapters per step)
    encoder_budget: int = 0  # > 0: multimodal requests (encoder compute budget and cache, in tokens)
    watermark: float = 0.0  # vLLM's scheduler_config.watermark (blocks an admission leaves free)
    kv_transfer: dict | None = None  # a KVTransferConfig's fields (a KV connector)
    chunked_prefill: bool = True
    kvmm_layout: bool = False  # KvmmLayoutScheduler (a worker laying memory out as kvmm's arena)
    mamba_cache_mode: str | None = None  # CacheConfig's ("align": vLLM splits chunks at state blocks)
    hit_cap: int = 0  # > 0: every lookup capped at tokens - 1 - (a request's own 0..hit_cap-1)
    # EAGLE / MTP's rule on (vLLM's use_eagle_block_drop, one prefill lookahead token, the
    # drop rule rather than 0.33's lookahead hashes); needs spec_tokens > 0
    eagle: bool = False
    # with eagle: vLLM 0.33's default instead of the drop rule, lookahead hashes (each block
    # hash covers the next token: num_hash_lookahead_tokens = 1)
    lookahead_hashes: bool = False


def kv_transfer_config(setup: Setup) -> KVTransferConfig | None:
    """The setup's connector; vLLM's ExampleConnector gets a store of its own per scheduler
    unless the setup names one."""
    if not setup.kv_transfer:
        return None
    fields = dict(setup.kv_transfer)
    extra = dict(fields.get("kv_connector_extra_config", {}))
    extra.setdefault("shared_storage_path", tempfile.mkdtemp(prefix="kvmm-vllm-store-"))
    fields["kv_connector_extra_config"] = extra
    return KVTransferConfig(**fields)


def successor_groups(config: KVCacheConfig) -> frozenset[int]:
    """The groups holding an EAGLE / MTP drafter's layers (vLLM's is_eagle_group): their KV
    at a position depends on the next token as well."""
    return frozenset(i for i, g in enumerate(config.kv_cache_groups) if g.is_eagle_group)


def make_scheduler(setup: Setup, kvmm: bool, check_invariants: bool = False, kcc: KVCacheConfig | None = None) -> Scheduler:
    model_config = ModelConfig(model=model_dir(), tokenizer=None, skip_tokenizer_init=True, dtype="float32",
                               seed=0, max_model_len=setup.max_model_len)
    scheduler_config = SchedulerConfig(max_num_seqs=setup.max_num_seqs,
                                       max_num_batched_tokens=setup.max_num_batched_tokens,
                                       max_model_len=setup.max_model_len,
                                       enable_chunked_prefill=setup.chunked_prefill,
                                       policy=setup.policy, async_scheduling=setup.async_scheduling,
                                       watermark=setup.watermark,
                                       is_encoder_decoder=False)
    cache_config = CacheConfig(block_size=setup.block_size, enable_prefix_caching=setup.caching,
                               **({"mamba_cache_mode": setup.mamba_cache_mode} if setup.mamba_cache_mode else {}))
    speculative_config = None
    if setup.spec_tokens:
        speculative_config = SpeculativeConfig(method="ngram", num_speculative_tokens=setup.spec_tokens,
                                               prompt_lookup_max=4, prompt_lookup_min=2)
    lora_config = LoRAConfig(max_loras=setup.max_loras, max_lora_rank=8) if setup.max_loras else None
    vllm_config = VllmConfig(model_config=model_config, scheduler_config=scheduler_config,
                             cache_config=cache_config, speculative_config=speculative_config,
                             device_config=DeviceConfig(device="cpu"), lora_config=lora_config,
                             kv_transfer_config=kv_transfer_config(setup))
    if kcc is None:
        kcc = kv_cache_config(setup.num_blocks, setup.block_size, setup.window, chunk=setup.chunk)
    cache_config.num_gpu_blocks = setup.num_blocks
    if kvmm:
        cls = KvmmAsyncScheduler if setup.async_scheduling else KvmmScheduler
        if setup.kvmm_layout:
            assert not setup.async_scheduling
            cls = KvmmLayoutScheduler
    else:
        cls = AsyncScheduler if setup.async_scheduling else Scheduler
    # EAGLE / draft-model proposers reserve KV slots past the scheduled tokens (vLLM's
    # num_lookahead_tokens); their draft models cannot be built here without a model hub, so
    # the property is set for the scheduler's construction (it keeps its own copy).
    # EAGLE's rule: its drafter cannot be built here either, so the speculative config's
    # predicates are set for the construction (the scheduler, its manager and kvmm's adapter
    # read them there). vLLM's manager then drops the last block of a hit in the groups
    # flagged is_eagle_group (with setup.lookahead_hashes it keys every block with the next
    # token instead: 0.33's default).
    eagle = contextlib.ExitStack()
    if setup.eagle:
        assert setup.spec_tokens, "EAGLE's rule needs draft tokens"
        for name in ("use_eagle_block_drop", "needs_eagle_block_drop"):
            eagle.enter_context(mock.patch.object(SpeculativeConfig, name, return_value=True))
        hashes = 1 if setup.lookahead_hashes else 0
        for name, value in (("num_prefill_lookahead_tokens", 1), ("num_hash_lookahead_tokens", hashes)):
            eagle.enter_context(mock.patch.object(VllmConfig, name, new_callable=mock.PropertyMock,
                                                  return_value=value))
    with eagle, mock.patch.object(VllmConfig, "num_lookahead_tokens", new_callable=mock.PropertyMock,
                                  return_value=setup.lookahead):
        sched = cls(vllm_config=vllm_config, kv_cache_config=kcc, log_stats=True,
                    structured_output_manager=StructuredOutputManager(vllm_config), block_size=setup.block_size)
    assert sched.num_lookahead_tokens == setup.lookahead
    if setup.eagle and not kvmm:  # which rule vLLM's manager follows
        assert sched.use_eagle_block_drop == (not setup.lookahead_hashes)
        assert sched.num_hash_lookahead_tokens == (1 if setup.lookahead_hashes else 0)
    if setup.hit_cap:
        # A caller's cap on the hit (vLLM's max_cache_hit_length, which its aux-output
        # connector sets): passed to the manager's lookup as the scheduler passes it.
        lookup = sched._get_local_prefix_cache_hit

        def capped(request, max_cache_hit_length=None):
            h = hashlib.blake2b(f"cap:{request.request_id}".encode(), digest_size=4).digest()
            cap = max(0, request.num_tokens - 1 - int.from_bytes(h, "little") % setup.hit_cap)
            if max_cache_hit_length is not None:
                cap = min(cap, max_cache_hit_length)
            out = lookup(request, cap)
            assert out[1] <= cap, f"{request.request_id}: a hit of {out[1]} tokens past the cap of {cap}"
            return out

        sched._get_local_prefix_cache_hit = capped
    if setup.encoder_budget:
        # A text model's config gives no encoder budget; a multimodal one needs its processor
        # (a model hub). The scheduler's encoder budget and cache are set as a vision model's.
        sched.max_num_encoder_input_tokens = setup.encoder_budget
        sched.encoder_cache_manager = EncoderCacheManager(cache_size=2 * setup.encoder_budget)
    if kvmm:
        sched.kv_cache_manager.check_invariants = check_invariants
        sched.kv_cache_manager.commit_after_output = setup.commit_after_output
    return sched


def true_token(req_id: str, position: int) -> int:
    """The stand-in model's greedy token at a position: a function of the request and the
    position only, so any correct scheduling yields the same stream."""
    h = hashlib.blake2b(f"{req_id}:{position}".encode(), digest_size=4).digest()
    return int.from_bytes(h, "little") % (VOCAB - 1)


def accepted_drafts(req_id: str, position: int, k: int, seed: int) -> int:
    """How many of k drafts at a position the stand-in verifier accepts (seeded)."""
    h = hashlib.blake2b(f"{seed}:{req_id}:{position}:acc".encode(), digest_size=4).digest()
    return int.from_bytes(h, "little") % (k + 1)


@dataclass
class Trace:
    prompts: dict[str, list[int]]
    max_tokens: dict[str, int]
    arrival_step: dict[str, int]
    priority: dict[str, int]
    extras: dict[str, Extras] = field(default_factory=dict)


def make_trace(seed: int, num_requests: int = 60, num_prefixes: int = 4, max_prompt: int = 300,
               loras: int = 0, salts: bool = False, images: bool = False) -> Trace:
    """Seeded requests sharing prefixes. With `loras`, a request runs under LoRA adapter
    1..loras or none; with `salts`, some carry a cache salt; with `images`, each prefix holds
    an image's placeholder tokens (the same ids for every image) and a request picks one of
    two images for it: equal token ids, different cache keys."""
    rng = random.Random(seed)
    prefixes = []
    for _ in range(num_prefixes):
        head = [rng.randrange(VOCAB - 1) for _ in range(rng.randrange(16, 160))]
        img = None
        if images:
            offset = rng.randrange(0, len(head))
            length = rng.randrange(16, 48)
            head[offset:offset] = [PLACEHOLDER] * length
            img = (offset, length)
        prefixes.append((head, img))
    t = Trace({}, {}, {}, {})
    step = 0
    for i in range(num_requests):
        rid = f"r{i}"
        prompt, ex = [], Extras()
        if rng.random() < 0.7:
            j = rng.randrange(num_prefixes)
            prompt, img = list(prefixes[j][0]), prefixes[j][1]
            if img is not None and img[0] + img[1] <= max_prompt:
                ex.images.append((f"image{j}{rng.choice('ab')}", *img))
        if loras and rng.random() < 0.4:
            ex.lora = rng.randrange(1, loras + 1)
        if salts and rng.random() < 0.2:
            ex.salt = "salt"
        if loras or salts or images:
            t.extras[rid] = ex
        prompt += [rng.randrange(VOCAB - 1) for _ in range(rng.randrange(1, max_prompt - len(prompt) + 2))]
        t.prompts[rid] = prompt[:max_prompt]
        t.max_tokens[rid] = rng.randrange(1, 48)
        step += rng.choice((0, 0, 1, 2))
        t.arrival_step[rid] = step
        t.priority[rid] = rng.randrange(3)
    return t



@dataclass
class RunLog:
    outputs: dict[str, list[int]] = field(default_factory=dict)
    schedule: list[tuple] = field(default_factory=list)
    preemptions: int = 0
    hit_tokens: int = 0
    hits: dict[str, int] = field(default_factory=dict)  # per request, at its first admission
    steps: int = 0
    worker: object = None


class Worker:
    """A stand-in model runner that follows SchedulerOutput's block-table protocol (new
    requests: full lists; running: appended ids; resumed: replaced lists) and keeps each
    request's tokens as vLLM's input batch does."""

    def __init__(self, num_groups: int, spec_tokens: int, seed: int, content: KVContent | None = None):
        self.tables: dict[str, list[list[int]]] = {}
        self.tokens: dict[str, list[int]] = {}
        self.num_groups = num_groups
        self.spec_tokens = spec_tokens
        self.seed = seed
        self.content = content  # what each block holds (kv_content.py), checked at admission
        self.kv_done: dict[str, int] = {}  # positions whose K/V the worker wrote, per request
        self.drafts: dict[str, list[int]] = {}  # the drafts proposed last, per request
        self.store: ConnectorStore | None = None  # vLLM's ExampleConnector's worker side

    def execute(self, out) -> tuple[ModelRunnerOutput, DraftTokenIds | None]:
        starts = block_tables.follow(out, self.tables, self.tokens, self.num_groups)
        req_ids = list(out.num_scheduled_tokens)
        sampled, drafted = [], []
        kv_end = {}  # the end of the positions whose K/V this step wrote
        for rid in req_ids:
            toks = self.tokens[rid]
            drafts = out.scheduled_spec_decode_tokens.get(rid, [])
            end = starts[rid] + out.num_scheduled_tokens[rid] - len(drafts)
            if end < len(toks):  # a prefill chunk short of the last known token
                sampled.append([])
                kv_end[rid] = end
                continue
            p = len(toks)
            new = [true_token(rid, p)]
            # With async scheduling the scheduler may only hold placeholders (-1) for drafts the
            # worker proposed itself (vLLM's runner keeps them): those are the worker's own.
            mine = self.drafts.get(rid, [])
            drafts = [mine[j] if d == -1 and j < len(mine) else d for j, d in enumerate(drafts)]
            for j, d in enumerate(drafts):  # verification: accept while the drafts are right
                if d != new[-1]:
                    break
                new.append(true_token(rid, p + j + 1))
            toks.extend(new)
            kv_end[rid] = len(toks) - 1  # the accepted drafts' K/V too; the new token's not yet
            sampled.append(new)
            if self.spec_tokens:
                q = len(toks)
                good = accepted_drafts(rid, q, self.spec_tokens, self.seed)
                drafted.append([true_token(rid, q + j) if j < good else (true_token(rid, q + j) + 1) % (VOCAB - 1)
                                for j in range(self.spec_tokens)])
                self.drafts[rid] = drafted[-1]
        if self.content is not None:
            # Every request's new K/V first (vLLM's forward pass writes K/V before attention in
            # each layer: vLLM's manager caches a block when it allocates it, so a request may
            # hit a block another one computes in the same step), then the admitted requests'
            # cached positions are read.
            # With async scheduling the scheduler counts unverified drafts as computed until
            # their output comes back; the worker, as vLLM's, computes from its own count.
            admitted = [nr.req_id for nr in out.scheduled_new_reqs]
            admitted += [r for r in out.scheduled_cached_reqs.req_ids if r in out.scheduled_cached_reqs.resumed_req_ids]
            for rid in admitted:
                self.kv_done[rid] = starts[rid]
            if self.store is not None:
                self.store.before_step(out, self.tables)
            for rid in req_ids:
                lo = min(starts[rid], self.kv_done.get(rid, starts[rid]))
                self.content.write(rid, self.tables[rid], self.tokens[rid], lo, kv_end[rid])
                self.kv_done[rid] = max(kv_end[rid], lo)
            for rid in admitted:
                self.content.check_admitted(rid, self.tables[rid], self.tokens[rid], starts[rid])
            if self.store is not None:
                self.store.after_step(self.tokens, self.kv_done)
        mro = ModelRunnerOutput(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                sampled_token_ids=sampled)
        draft_ids = None
        if self.spec_tokens:
            ids = [r for r, s in zip(req_ids, sampled) if s]
            draft_ids = DraftTokenIds(ids, drafted)
        return mro, draft_ids


def check_tables(sched, worker: Worker, num_blocks: int, kvmm: bool) -> None:
    """The worker's tables equal the manager's on every held entry; with kvmm: ids in
    [1, num_blocks), no id in two groups, an id in two requests only as the same cached page
    (equal tokens up to its end), kvmm's invariants."""
    mgr = sched.kv_cache_manager
    owner: dict[int, tuple[int, str, int]] = {}
    for rid, req in sched.requests.items():
        if rid not in worker.tables or req.status.name != "RUNNING":
            continue
        ids = mgr.get_block_ids(rid)
        for g, (mine, theirs) in enumerate(zip(worker.tables[rid], ids)):
            assert len(mine) == len(theirs), (rid, g, mine, theirs)
            for i, (a, b) in enumerate(zip(mine, theirs)):
                if b == 0:
                    continue  # released (out of window): the worker keeps the old id, unread
                assert a == b, (rid, g, i, mine, theirs)
                if not kvmm:
                    continue
                per_group = mgr.kvmm_layout  # ids are per group (kvmm's small pages + 1)
                assert 1 <= b < (len(mgr._blocks) if per_group else num_blocks), (rid, g, b)
                key = (g, b) if per_group else b
                prev = owner.get(key)
                if prev is None:
                    owner[key] = (g, rid, i)
                    continue
                assert prev[0] == g, f"block {b} live in groups {prev[0]} and {g}"
                assert prev[2] == i, f"block {b} at page {prev[2]} of {prev[1]} and page {i} of {rid}"
                p = sched.kv_cache_config.kv_cache_groups[g].kv_cache_spec.block_size
                end = (i + 1) * p + (g in successor_groups(sched.kv_cache_config))  # a drafter's: the next id too
                a_t = list(sched.requests[prev[1]].all_token_ids[:end])
                b_t = list(req.all_token_ids[:end])
                assert a_t == b_t and len(a_t) == end, f"block {b} shared by unrelated {prev[1]} and {rid}"
                c = getattr(worker, "content", None)
                if c is not None:  # and the same LoRA adapter, salt and images
                    last = (i + 1) * p - 1
                    assert c.key(prev[1], worker.tokens[prev[1]], last) == c.key(rid, worker.tokens[rid], last), \
                        f"block {b} shared by {prev[1]} and {rid}: same tokens, other LoRA, salt or image"
    if kvmm:
        mgr.kv.check_invariants()


def run(setup: Setup, trace: Trace, kvmm: bool, seed: int = 0, check: bool = True, max_steps: int = 5000,
        kcc: KVCacheConfig | None = None, make_worker=None) -> RunLog:
    sched = make_scheduler(setup, kvmm, kcc=kcc)
    hasher = get_request_block_hasher(setup.block_size, sha256,
                                      1 if setup.eagle and setup.lookahead_hashes else 0)
    if make_worker is None:
        worker = Worker(len(sched.kv_cache_config.kv_cache_groups), setup.spec_tokens, seed,
                        KVContent(setup.block_size, trace.extras, successor_groups(sched.kv_cache_config)))
        if sched.connector is not None:
            worker.store = ConnectorStore(sched.connector, worker.content)
    else:
        worker = make_worker(sched.kv_cache_config)
    log = RunLog()
    order = sorted(trace.prompts, key=lambda r: trace.arrival_step[r])
    pending = []
    admitted = set()
    step = 0
    while step < max_steps:
        while order and trace.arrival_step[order[0]] <= step:
            rid = order.pop(0)
            params = SamplingParams(max_tokens=trace.max_tokens[rid], ignore_eos=True)
            ex = trace.extras.get(rid, Extras())
            lora = LoRARequest(f"lora{ex.lora}", ex.lora, "/nonexistent") if ex.lora else None
            mm = [MultiModalFeatureSpec(data=None, modality="image", identifier=ident, mm_hash=ident,
                                        mm_position=PlaceholderRange(offset=o, length=n)) for ident, o, n in ex.images]
            sched.add_request(Request(request_id=rid, prompt_token_ids=trace.prompts[rid], sampling_params=params,
                                      pooling_params=None, arrival_time=float(trace.arrival_step[rid]),
                                      priority=trace.priority[rid], block_hasher=hasher, lora_request=lora,
                                      cache_salt=ex.salt, mm_features=mm or None))
        if not order and not sched.requests and not pending:
            break
        out = sched.schedule()
        log.schedule.append((tuple(sorted(out.num_scheduled_tokens.items())), tuple(sorted(out.preempted_req_ids or ()))))
        log.preemptions += len(out.preempted_req_ids or ())
        for nr in out.scheduled_new_reqs:
            if nr.req_id not in admitted:  # first admissions only (a preempted request returns)
                admitted.add(nr.req_id)
                log.hit_tokens += nr.num_computed_tokens
                log.hits[nr.req_id] = nr.num_computed_tokens
        mro, drafts = worker.execute(out)
        if check:
            check_tables(sched, worker, setup.num_blocks, kvmm)
        pending.append((out, mro, drafts))
        depth = 2 if setup.async_scheduling else 1
        while len(pending) >= depth or (pending and not out.num_scheduled_tokens):
            o, m, d = pending.pop(0)
            outputs = sched.update_from_output(o, m)
            for eco in outputs.values():
                for co in eco.outputs:
                    log.outputs.setdefault(co.request_id, []).extend(co.new_token_ids)
            if d is not None and not setup.async_scheduling:
                # With async scheduling the scheduler schedules placeholders for the drafts the
                # worker keeps (as vLLM's GPU-side drafts); drafts handed back a step late
                # would be for the wrong positions.
                sched.update_draft_token_ids(d)
        step += 1
    log.steps = step
    log.worker = worker
    assert not sched.requests, f"unfinished after {step} steps: {list(sched.requests)[:5]}"
    if kvmm:
        mgr = sched.kv_cache_manager
        mgr.kv.check_invariants()
        assert all(mgr.kv.num_used_pages(g) == 0 for g in range(mgr.num_kv_cache_groups)), "pages still used"
    return log


def expected_outputs(trace: Trace) -> dict[str, list[int]]:
    return {rid: [true_token(rid, len(p) + j) for j in range(trace.max_tokens[rid])] for rid, p in trace.prompts.items()}
