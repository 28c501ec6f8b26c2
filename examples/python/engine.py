#!/usr/bin/env python3
"""A Python serving engine on kvmm: the mini engine's scheduling loop (examples/mini_engine)
written against the bindings, with a numpy toy model.

The model: 4 layers alternating full attention and a sliding window, float32 KV stored in a
kvmm.Arena (host memory, page-layer layout: per layer K then V, each [tokens_per_page]
[kv_heads][head_dim]) at the pages kvmm hands out. Each step: swapped requests come back,
running ones get a decode token or their next prefill chunk (chunked prefill under a token
budget), new ones are admitted with their prefix-cache hit; when memory is short the
youngest request is preempted (swap to host pages when the host pool has room, else
recompute). Attention reads the page tables in FlashInfer's plan() format (CSR indptr /
indices / last_page_len from export_csr; trim=True skips the sliding window's dropped
pages). --check replays every request without kvmm (dense recompute) and compares tokens.
Cost per step: O(batch) kvmm calls plus numpy work O(tokens x context).
"""
import argparse
import collections
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]


def import_kvmm(build):
    if build:
        sys.path.insert(0, str(pathlib.Path(build).resolve() / "python"))
    import kvmm  # noqa: F401
    return kvmm


class Model:
    """Greedy toy decoder: embed, per layer attention (+ residual), tanh MLP, unembed."""

    def __init__(self, np, vocab=64, hidden=32, head_dim=32, layers=4, window=12, tpp=4, seed=7):
        rng = np.random.default_rng(seed)
        self.np, self.vocab, self.hidden, self.head_dim = np, vocab, hidden, head_dim
        self.window, self.tpp, self.num_layers = window, tpp, layers
        self.kinds = ["full" if i % 2 == 0 else "sliding" for i in range(layers)]
        s = hidden ** -0.5
        self.embed = rng.standard_normal((vocab, hidden)) * 1.0
        self.unembed = rng.standard_normal((hidden, vocab)) * s
        self.w = [{k: rng.standard_normal((hidden, head_dim if k != "o" else hidden)) * s for k in "qkvo"}
                  for _ in range(layers)]
        for w in self.w:
            w["o"] = rng.standard_normal((head_dim, hidden)) * head_dim ** -0.5
            w["mlp"] = rng.standard_normal((hidden, hidden)) * s

    def layout(self, kvmm):
        n = self.num_layers // 2
        full = kvmm.LayerGroup.full_attention("full", n, 1, self.head_dim, 4, self.tpp)
        sliding = kvmm.LayerGroup.sliding_window("sliding", n, 1, self.head_dim, 4, self.tpp, self.window)
        full.layers = [i for i, k in enumerate(self.kinds) if k == "full"]  # which model layers each holds
        sliding.layers = [i for i, k in enumerate(self.kinds) if k == "sliding"]
        self._layout = kvmm.KVLayout.plan([full, sliding])
        return self._layout

    def place(self, layer):
        """(group, index in group) of a model layer: the planned layout's layer map."""
        return self._layout.layer_group(layer)

    def forward(self, tokens, positions, kv_io):
        """tokens, positions: the new tokens of one request. kv_io(layer, k, v, positions)
        stores their K/V and returns (K, V, key positions) of every visible key."""
        np = self.np
        h = self.embed[tokens]
        for layer, w in enumerate(self.w):
            q, k, v = h @ w["q"], h @ w["k"], h @ w["v"]
            keys, vals, kpos = kv_io(layer, k.astype(np.float32), v.astype(np.float32), positions)
            scores = (q @ keys.astype(np.float64).T) * self.head_dim ** -0.5
            visible = kpos[None, :] <= positions[:, None]
            if self.kinds[layer] == "sliding":
                visible &= positions[:, None] - kpos[None, :] < self.window
            scores = np.where(visible, scores, -np.inf)
            p = np.exp(scores - scores.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            h = h + (p @ vals.astype(np.float64)) @ w["o"]
            h = h + np.tanh(h @ w["mlp"])
        return h[-1] @ self.unembed  # logits of the last new token

    def reference(self, prompt, max_new):
        """The same model without kvmm: dense K/V per layer, recomputed from scratch."""
        np = self.np
        tokens = list(prompt)
        for _ in range(max_new):
            store = {}

            def io(layer, k, v, positions):
                store[layer] = (k, v)
                return k, v, positions

            pos = np.arange(len(tokens))
            tokens.append(int(np.argmax(self.forward(np.array(tokens), pos, io))))
        return tokens[len(prompt):]


class Seq:
    def __init__(self, index, prompt, max_new):
        self.index, self.prompt_len, self.max_new = index, len(prompt), max_new
        self.tokens = list(prompt)
        self.rid = None
        self.computed = 0


class Engine:
    def __init__(self, kvmm, np, model, large_pages, host_pages, max_running, token_budget, caching=True):
        self.kvmm, self.np, self.model = kvmm, np, model
        self.layout = model.layout(kvmm)
        self.arena = kvmm.Arena(self.layout, large_pages, chunk_bytes=4096)
        self.kv = kvmm.KVCacheManager(self.layout, arena=self.arena, num_host_large_pages=host_pages,
                                      max_requests=256, prefix_caching=caching)
        self.mem = self.arena.numpy()  # the arena's bytes, zero copy
        self.host = np.zeros(host_pages * self.layout.large_page_bytes, np.uint8)
        self.max_running, self.budget = max_running, token_budget
        self.waiting, self.running, self.swapped = collections.deque(), [], collections.deque()
        self.done = {}
        self.stats = collections.Counter()

    def submit(self, prompt, max_new):
        self.waiting.append(Seq(len(self.waiting) + len(self.running) + len(self.done), prompt, max_new))

    # --- KV memory: pages of the arena, addressed as the layout says -------------------
    def page_view(self, buf, group, page, layer, which):
        lay, m = self.layout, self.model
        off = page * lay.small_page_bytes(group) + (lay.k_offset if which == "k" else lay.v_offset)(group, layer)
        return buf[off:off + m.tpp * m.head_dim * 4].view(self.np.float32).reshape(m.tpp, m.head_dim)

    def copy_pages(self, plan, src_buf, dst_buf):
        for g, src, dst in plan:
            n = self.layout.small_page_bytes(int(g))
            dst_buf[int(dst) * n:(int(dst) + 1) * n] = src_buf[int(src) * n:(int(src) + 1) * n]

    # --- scheduling, as examples/mini_engine/engine.cpp --------------------------------
    def preempt(self, s):
        if len(self.host):
            plan = self.kv.swap_out(s.rid)
            if plan is not None:
                self.copy_pages(plan, self.mem, self.host)
                self.swapped.appendleft(s)
                self.stats["preempt_swap"] += 1
                return
        self.kv.free(s.rid)
        s.rid, s.computed = None, 0
        self.waiting.appendleft(s)
        self.stats["preempt_recompute"] += 1

    def schedule(self):
        kv, batch = self.kv, []  # (seq, start, n)
        while self.swapped and len(self.running) < self.max_running:
            plan = kv.swap_in(self.swapped[0].rid)
            if plan is None:
                break
            self.copy_pages(plan, self.host, self.mem)
            self.running.append(self.swapped.popleft())
            self.stats["swap_ins"] += 1
        budget = self.budget
        i = 0
        while i < len(self.running) and budget > 0:
            s = self.running[i]
            n = min(len(s.tokens) - s.computed, budget)
            ok = kv.allocate(s.rid, n)
            while not ok:
                if len(self.running) == 1 and not batch:
                    raise self.kvmm.Error(f"request {s.index}: does not fit the pool")
                victim = self.running.pop()
                self.preempt(victim)
                if victim is s:
                    break
                ok = kv.allocate(s.rid, n)
            if not ok:
                break
            batch.append((s, s.computed, n))
            budget -= n
            i += 1
        while budget > 0 and not self.swapped and self.waiting and len(self.running) < self.max_running:
            s = self.waiting[0]
            s.rid = kv.add_request(self.np.array(s.tokens, self.np.uint32), max_tokens=s.prompt_len + s.max_new)
            s.computed = kv.lookup_prefix(s.rid)
            n = min(len(s.tokens) - s.computed, budget)
            if not kv.allocate(s.rid, n):
                kv.free(s.rid)
                s.rid, s.computed = None, 0
                if not self.running and not batch:
                    raise self.kvmm.Error(f"request {s.index}: does not fit the pool")
                break
            self.waiting.popleft()
            self.running.append(s)
            self.stats["lookup_tokens"] += len(s.tokens)
            self.stats["hit_tokens"] += s.computed
            batch.append((s, s.computed, n))
            budget -= n
        return batch

    def step(self):
        np, kv, m = self.np, self.kv, self.model
        if not (self.running or self.waiting or self.swapped):
            return False
        kv.begin_step()
        self.stats["steps"] += 1
        batch = self.schedule()
        if not batch:
            return True
        ids = np.array([s.rid for s, _, _ in batch], np.uint32)
        # FlashInfer plan() inputs per group: indptr, indices, last_page_len (+ first page
        # of each row: the sliding window's dropped pages are trimmed off the front).
        tables = [kv.export_csr(g, ids, trim=True) for g in range(self.layout.num_groups)]
        for row, (s, start, n) in enumerate(batch):
            positions = np.arange(start, start + n)

            def io(layer, k, v, pos, row=row):
                g, idx = m.place(layer)
                indptr, indices, last, first = tables[g]
                pages = indices[indptr[row]:indptr[row + 1]]
                base = int(first[row]) * m.tpp  # position of the row's first page's first token
                for t, p in enumerate(pos):
                    page = int(pages[(p - base) // m.tpp])
                    self.page_view(self.mem, g, page, idx, "k")[p % m.tpp] = k[t]
                    self.page_view(self.mem, g, page, idx, "v")[p % m.tpp] = v[t]
                used = [int(x) for x in pages]
                keys = np.concatenate([self.page_view(self.mem, g, p, idx, "k") for p in used])
                vals = np.concatenate([self.page_view(self.mem, g, p, idx, "v") for p in used])
                count = (len(used) - 1) * m.tpp + int(last[row])
                return keys[:count], vals[:count], np.arange(base, base + count)

            logits = m.forward(np.array(s.tokens[start:start + n]), positions, io)
            s.computed += n
            self.stats["decode_tokens" if start >= s.prompt_len else "prefill_tokens"] += n
            if s.computed == len(s.tokens):  # its last known token ran: sample the next
                token = int(np.argmax(logits))
                s.tokens.append(token)
                kv.append_token(s.rid, token)
        kv.commit_batch(ids, np.array([s.computed for s, _, _ in batch], np.uint64))
        for s, _, _ in batch:
            if len(s.tokens) - s.prompt_len == s.max_new:
                kv.free(s.rid)
                self.done[s.index] = s.tokens[s.prompt_len:]
                self.running.remove(s)
        return True

    def run(self):
        while self.step():
            pass
        return [self.done[i] for i in sorted(self.done)]


def workload(np, count, vocab, seed):
    """Requests over three shared system prompts, so prefix caching hits."""
    rng = np.random.default_rng(seed)
    systems = [list(rng.integers(0, vocab, int(rng.integers(8, 20)))) for _ in range(3)]
    out = []
    for i in range(count):
        prompt = systems[i % 3] + list(rng.integers(0, vocab, int(rng.integers(2, 12))))
        out.append(([int(t) for t in prompt], int(rng.integers(3, 10))))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=None, help="build tree holding python/kvmm (default: kvmm on sys.path)")
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--large-pages", type=int, default=40)
    ap.add_argument("--host-pages", type=int, default=8)
    ap.add_argument("--max-running", type=int, default=8)
    ap.add_argument("--token-budget", type=int, default=24)
    ap.add_argument("--check", action="store_true", help="compare every output with a dense recompute")
    args = ap.parse_args(argv)
    kvmm = import_kvmm(args.build)
    import numpy as np

    model = Model(np)
    engine = Engine(kvmm, np, model, args.large_pages, args.host_pages, args.max_running, args.token_budget)
    reqs = workload(np, args.requests, model.vocab, seed=3)
    for prompt, max_new in reqs:
        engine.submit(prompt, max_new)
    t0 = time.perf_counter()
    outputs = engine.run()
    secs = time.perf_counter() - t0
    st = engine.stats
    print(f"{len(outputs)} requests, {st['steps']} steps, {st['prefill_tokens']} prefill + {st['decode_tokens']} decode "
          f"tokens in {secs:.2f} s; prefix hits {st['hit_tokens']}/{st['lookup_tokens']} tokens; preempted: "
          f"{st['preempt_swap']} swap, {st['preempt_recompute']} recompute; {st['swap_ins']} swap-ins")
    engine.kv.check_invariants()
    if args.check:
        bad = [i for i, (p, n) in enumerate(reqs) if model.reference(p, n) != outputs[i]]
        print("check: every output equals a dense recompute" if not bad else f"check FAILED for requests {bad}")
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
