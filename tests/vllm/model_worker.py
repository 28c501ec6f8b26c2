"""A CPU worker that computes a real (tiny, randomly initialised) transformers model under
vLLM's scheduler: it follows SchedulerOutput's block-table protocol, keeps K/V in one paged
pool indexed by the block ids (the i-th layer of every KV cache group shares slot i of a
block, as vLLM's hybrid allocator shares one tensor: an id live in two groups corrupts the
output), and runs transformers' own modules (embedding, RoPE, norms, attention, MLP) in
float64 through a paged view. Each layer first writes every scheduled request's new K/V,
then attends: vLLM's forward pass writes K/V before attention in every layer, so a request
may hit blocks another request computes in the same step (vLLM's eager caching)."""

from __future__ import annotations

import block_tables

import torch
from transformers.cache_utils import Cache
from vllm.v1.outputs import ModelRunnerOutput


class _PagedView(Cache):
    """past_key_values for one request and layer: update() ignores the new K/V (already
    written) and returns K/V of positions [0, end) gathered from the pool."""

    def __init__(self, k, v):
        self.k, self.v = k, v

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        return self.k, self.v


class ModelWorker:
    def __init__(self, model, kv_cache_config, num_blocks: int):
        self.model = model.eval()
        cfg = model.config
        self.cfg = cfg
        groups = kv_cache_config.kv_cache_groups
        self.block_size = groups[0].kv_cache_spec.block_size
        self.num_groups = len(groups)
        n_layers = cfg.num_hidden_layers
        # layer -> (group, slot): vLLM's layer names are "model.layers.<i>..." per group.
        self.layer_group = [0] * n_layers
        self.layer_slot = [0] * n_layers
        for g, grp in enumerate(groups):
            for slot, name in enumerate(grp.layer_names):
                li = int(name.split(".")[-1])
                self.layer_group[li], self.layer_slot[li] = g, slot
        slots = max(len(g.layer_names) for g in groups)
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        shape = (num_blocks, slots, self.block_size, cfg.num_key_value_heads, head_dim)
        self.k_pool = torch.full(shape, float("nan"), dtype=torch.float64)
        self.v_pool = torch.full(shape, float("nan"), dtype=torch.float64)
        self.windows = [getattr(g.kv_cache_spec, "sliding_window", None) for g in groups]
        self.tables: dict[str, list[list[int]]] = {}
        self.tokens: dict[str, list[int]] = {}
        self.logits: dict[str, list[torch.Tensor]] = {}

    def _slots(self, rid: str, g: int, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        table = torch.tensor(self.tables[rid][g], dtype=torch.long)
        return table[positions // self.block_size], positions % self.block_size

    @torch.no_grad()
    def execute(self, out):
        starts = block_tables.follow(out, self.tables, self.tokens, self.num_groups)
        req_ids = list(out.num_scheduled_tokens)
        m = self.model.model
        state = {}
        for rid in req_ids:
            start, n = starts[rid], out.num_scheduled_tokens[rid]
            ids = torch.tensor([self.tokens[rid][start:start + n]])
            pos = torch.arange(start, start + n)[None]
            h = m.embed_tokens(ids)  # Gemma's scaled embedding scales itself
            state[rid] = [h, pos, start, n]
        for li, layer in enumerate(m.layers):
            g, slot = self.layer_group[li], self.layer_slot[li]
            attn = layer.self_attn
            normed = {}
            for rid in req_ids:  # phase 1: every request's new K/V into the pool
                h, pos, start, n = state[rid]
                x = layer.input_layernorm(h)
                normed[rid] = x
                cos, sin = self._rope(m, x, pos, li)
                k = attn.k_proj(x).view(1, n, -1, attn.head_dim).transpose(1, 2)
                v = attn.v_proj(x).view(1, n, -1, attn.head_dim).transpose(1, 2)
                if hasattr(attn, "k_norm"):
                    k = attn.k_norm(k)
                from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

                _, k = apply_rotary_pos_emb(k, k, cos, sin)
                blocks, offs = self._slots(rid, g, pos[0])
                self.k_pool[blocks, slot, offs] = k[0].transpose(0, 1)
                self.v_pool[blocks, slot, offs] = v[0].transpose(0, 1)
            for rid in req_ids:  # phase 2: attention over the paged K/V, transformers' module
                h, pos, start, n = state[rid]
                end = start + n
                window = self.windows[g]
                lo = 0 if window is None else max(0, start - window + 1)
                kpos = torch.arange(lo, end)
                blocks, offs = self._slots(rid, g, kpos)
                k = self.k_pool[blocks, slot, offs].transpose(0, 1)[None]
                v = self.v_pool[blocks, slot, offs].transpose(0, 1)[None]
                assert not torch.isnan(k).any(), f"{rid}: unwritten K/V read in layer {li}"
                q_pos = pos[0][:, None]
                allowed = kpos[None, :] <= q_pos
                if window is not None:
                    allowed &= kpos[None, :] > q_pos - window
                mask = torch.zeros(allowed.shape, dtype=torch.float64).masked_fill(~allowed, float("-inf"))[None, None]
                cos, sin = self._rope(m, normed[rid], pos, li)
                a, _ = attn(hidden_states=normed[rid], position_embeddings=(cos, sin), attention_mask=mask,
                            past_key_values=_PagedView(k, v))
                if hasattr(layer, "post_attention_layernorm") and hasattr(layer, "pre_feedforward_layernorm"):
                    a = layer.post_attention_layernorm(a)  # Gemma-2/3: norms around both blocks
                    h = h + a
                    r = h
                    h = layer.post_feedforward_layernorm(layer.mlp(layer.pre_feedforward_layernorm(h)))
                    h = r + h
                else:
                    h = h + a
                    h = h + layer.mlp(layer.post_attention_layernorm(h))
                state[rid][0] = h
        sampled = []
        for rid in req_ids:
            h, pos, start, n = state[rid]
            toks = self.tokens[rid]
            if start + n < len(toks):  # a prefill chunk short of the last known token
                sampled.append([])
                continue
            logits = self.model.lm_head(m.norm(h[:, -1]))[0]
            cap = getattr(self.cfg, "final_logit_softcapping", None)
            if cap:
                logits = torch.tanh(logits / cap) * cap
            t = int(torch.argmax(logits))
            toks.append(t)
            self.logits.setdefault(rid, []).append(logits)
            sampled.append([t])
        mro = ModelRunnerOutput(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                sampled_token_ids=sampled)
        return mro, None

    def _rope(self, m, x, pos, li):
        if getattr(self.cfg, "model_type", "") == "gemma3_text":  # one RoPE per layer type
            return m.rotary_emb(x, pos, self.cfg.layer_types[li])
        return m.rotary_emb(x, pos)
