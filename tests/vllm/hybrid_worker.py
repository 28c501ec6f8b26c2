"""A CPU worker that lays KV and state memory out as kvmm's arena and computes a hybrid
model (transformers' Qwen3-Next: gated-DeltaNet linear attention + full attention, float64)
under vLLM's scheduler with KvmmLayoutScheduler. One float64 tensor is the arena: large
page P of `num_large_pages`; group g's small page p lives in large page p // n_g at slot
p % n_g (n_g = small_pages_per_large_page(g)); inside it, kvmm's page-layer layout
(k_offset / v_offset for attention layers, state_offset for state layers). Block ids are
kvmm's small page ids + 1 of each group (a group's own id space).

The state group follows kvmm's checkpoint contract (docs/manager.md): with checkpoint
interval C, page i holds the linear layers' state (conv window, recurrent matrix) after
token (i + 1) * C - 1. A request's scheduled tokens are computed in pieces split at
multiples of C: a piece starting at s > 0 reads the state of page (s - 1) // C (the one
kvmm keeps), one ending at e writes page (e - 1) // C. transformers' own modules compute
every layer (its gated-DeltaNet continues a chunk from a cached state; attention reads K/V
gathered from the pages). Costs: O(context x layers) per request and piece (the gather)."""

from __future__ import annotations

import block_tables

import torch
import torch.nn.functional as F
from vllm.v1.outputs import ModelRunnerOutput

from kvmm.integrations.vllm import layout_from_kv_cache_config


class _LinearState:
    """One request's state of one gated-DeltaNet layer, as transformers' cache layer shows it."""

    record_past = False

    def __init__(self, conv: torch.Tensor, recurrent: torch.Tensor):
        self.conv_states = {0: conv}
        self.recurrent_states = {0: recurrent}


class _PieceCache:
    """past_key_values of one request's piece [start, end): attention K/V written to and
    gathered from the arena, linear layers' state in scratch tensors loaded from a page."""

    def __init__(self, worker: "HybridWorker", rid: str, start: int, end: int):
        self.w, self.rid, self.start, self.end = worker, rid, start, end
        self.layers: dict[int, _LinearState] = {}

    def has_previous_state(self, layer_idx: int) -> bool:
        return self.start > 0

    def update_conv_state(self, x, layer_idx, conv_kernel_size=None, **kwargs):
        state = self.layers[layer_idx].conv_states[0]
        k = state.shape[-1]
        if self.start == 0:  # the first piece: the window starts empty (zeros on the left)
            full = x if x.shape[-1] >= k else F.pad(x, (k - x.shape[-1], 0))
        else:
            full = torch.cat([state, x], dim=-1)
        state.copy_(full[..., -k:])
        return full

    def update_recurrent_state(self, recurrent, layer_idx, **kwargs):
        self.layers[layer_idx].recurrent_states[0].copy_(recurrent)
        return self.layers[layer_idx].recurrent_states[0]

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        self.w.write_kv(self.rid, layer_idx, self.start, key_states, value_states)
        return self.w.read_kv(self.rid, layer_idx, self.end)


class HybridWorker:
    def __init__(self, model, kv_cache_config):
        self.model = model.eval()
        cfg = model.config
        self.cfg = cfg
        self.layout = layout_from_kv_cache_config(kv_cache_config, kvmm_layout=True)
        groups = kv_cache_config.kv_cache_groups
        self.num_groups = len(groups)
        self.tpp = [g.kv_cache_spec.block_size for g in groups]
        self.large = self.layout.large_page_bytes
        num_large = kv_cache_config.num_blocks - 1
        self.arena = torch.full((num_large * self.large // 8,), float("nan"), dtype=torch.float64)
        self.layer_group, self.layer_slot = {}, {}
        for g, grp in enumerate(groups):
            for slot, name in enumerate(grp.layer_names):
                li = int(name.split(".")[-1])
                self.layer_group[li], self.layer_slot[li] = g, slot
        self.state_group = next(g for g in range(self.num_groups) if self.layout.group(g).is_state())
        self.interval = self.tpp[self.state_group]  # kvmm's checkpoint interval
        lin = next(layer.linear_attn for layer in model.model.layers if hasattr(layer, "linear_attn"))
        self.conv_shape = (1, lin.conv_dim, lin.conv_kernel_size)
        self.rec_shape = (1, lin.num_v_heads, lin.head_k_dim, lin.head_v_dim)
        self.kv_width = cfg.num_key_value_heads * cfg.head_dim
        self.tables: dict[str, list[list[int]]] = {}
        self.tokens: dict[str, list[int]] = {}
        self.logits: dict[str, list[torch.Tensor]] = {}

    # ---- the arena
    def _page(self, rid: str, g: int, index: int) -> int:
        block = self.tables[rid][g][index]
        assert block != 0, f"{rid}: page {index} of group {g} is the null block"
        p = block - 1
        n = self.layout.small_pages_per_large_page(g)
        return (p // n) * self.large + (p % n) * self.layout.small_page_bytes(g)

    def _kv_index(self, rid: str, layer: int, start: int, end: int, v: bool) -> torch.Tensor:
        """Arena indices of K (or V) of `layer` at positions [start, end): [positions, width]."""
        g, slot = self.layer_group[layer], self.layer_slot[layer]
        off = (self.layout.v_offset if v else self.layout.k_offset)(g, slot)
        p, n = self.tpp[g], self.layout.small_pages_per_large_page(g)
        pos = torch.arange(start, end)
        blocks = torch.tensor(self.tables[rid][g])[pos // p]
        assert bool((blocks != 0).all()), f"{rid}: a position of group {g} in the null block"
        page = blocks - 1
        byte = (page // n) * self.large + (page % n) * self.layout.small_page_bytes(g) + off
        first = byte // 8 + (pos % p) * self.kv_width
        return first[:, None] + torch.arange(self.kv_width)[None, :]

    def write_kv(self, rid, layer, start, k, v):
        n = k.shape[2]
        for t, vv in ((k, False), (v, True)):
            self.arena[self._kv_index(rid, layer, start, start + n, vv)] = t[0].transpose(0, 1).reshape(n, -1)

    def read_kv(self, rid, layer, end):
        out = []
        for vv in (False, True):
            x = self.arena[self._kv_index(rid, layer, 0, end, vv)]
            assert not torch.isnan(x).any(), f"{rid}: unwritten K/V read in layer {layer}"
            out.append(x.view(1, end, self.cfg.num_key_value_heads, self.cfg.head_dim).transpose(1, 2))
        return out[0], out[1]

    def _state_range(self, rid: str, layer: int, page_index: int) -> tuple[int, int, int]:
        g, slot = self.state_group, self.layer_slot[layer]
        base = (self._page(rid, g, page_index) + self.layout.state_offset(g, slot)) // 8
        conv = self.conv_shape[1] * self.conv_shape[2]
        return base, base + conv, base + conv + self.rec_shape[1] * self.rec_shape[2] * self.rec_shape[3]

    def _load_state(self, rid: str, layer: int, start: int) -> _LinearState:
        if start == 0:
            return _LinearState(torch.zeros(self.conv_shape, dtype=torch.float64),
                                torch.zeros(self.rec_shape, dtype=torch.float64))
        a, b, c = self._state_range(rid, layer, (start - 1) // self.interval)
        conv, rec = self.arena[a:b].clone().view(self.conv_shape), self.arena[b:c].clone().view(self.rec_shape)
        assert not torch.isnan(conv).any() and not torch.isnan(rec).any(), f"{rid}: unwritten state read at {start}"
        return _LinearState(conv, rec)

    def _store_state(self, rid: str, layer: int, end: int, st: _LinearState) -> None:
        a, b, c = self._state_range(rid, layer, (end - 1) // self.interval)
        self.arena[a:b] = st.conv_states[0].reshape(-1)
        self.arena[b:c] = st.recurrent_states[0].reshape(-1)

    # ---- the model
    @torch.no_grad()
    def _piece(self, rid: str, start: int, end: int) -> torch.Tensor:
        m = self.model.model
        cache = _PieceCache(self, rid, start, end)
        linear = [li for li, layer in enumerate(m.layers) if hasattr(layer, "linear_attn")]
        for li in linear:
            cache.layers[li] = self._load_state(rid, li, start)
        ids = torch.tensor([self.tokens[rid][start:end]])
        pos = torch.arange(start, end)[None]
        h = m.embed_tokens(ids)
        pe = m.rotary_emb(h, pos)
        allowed = torch.arange(end)[None, :] <= pos[0][:, None]
        mask = torch.zeros(allowed.shape, dtype=torch.float64).masked_fill(~allowed, float("-inf"))[None, None]
        for li, layer in enumerate(m.layers):
            full = not hasattr(layer, "linear_attn")
            h = layer(h, position_embeddings=pe, attention_mask=mask if full else None, position_ids=pos,
                      past_key_values=cache)
        for li in linear:
            self._store_state(rid, li, end, cache.layers[li])
        return h

    @torch.no_grad()
    def execute(self, out):
        starts = block_tables.follow(out, self.tables, self.tokens, self.num_groups)
        req_ids = list(out.num_scheduled_tokens)
        sampled = []
        c = self.interval
        for rid in req_ids:
            start, end = starts[rid], starts[rid] + out.num_scheduled_tokens[rid]
            s = start
            while s < end:  # pieces split at the checkpoints
                e = min(end, (s // c + 1) * c)
                h = self._piece(rid, s, e)
                s = e
            toks = self.tokens[rid]
            if end < len(toks):  # a prefill chunk short of the last known token
                sampled.append([])
                continue
            logits = self.model.lm_head(self.model.model.norm(h[:, -1]))[0]
            t = int(torch.argmax(logits))
            toks.append(t)
            self.logits.setdefault(rid, []).append(logits)
            sampled.append([t])
        mro = ModelRunnerOutput(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                sampled_token_ids=sampled)
        return mro, None
