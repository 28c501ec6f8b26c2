// The block-pool engine of the models of today's engines (configured per engine in
// block_engines.cpp): "policy groups" (vgroups) allocate
// fixed-size blocks from pools of interchangeable units; optional block-hash prefix
// caching with an LRU of evictable blocks per pool. See docs/sim.md for each model.
#include "sim/block_policy.hpp"

#include "kvmm/error.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <unordered_map>

namespace kvmm::sim::block {

namespace {

class BlockPolicy final : public Policy {
 public:
  BlockPolicy(std::string name, const KVLayout& layout, std::vector<VGroup> vgs, std::vector<Pool> pools, bool caching,
              std::string description, SkipOrder skip_order, CacheRules rules, Rebalance rebalance)
      : name_(std::move(name)),
        layout_(layout),
        vgs_(std::move(vgs)),
        pools_(std::move(pools)),
        caching_(caching),
        skip_order_(skip_order),
        rules_(rules),
        rb_(rebalance),
        description_(std::move(description)),
        index_(vgs_.size()),
        pindex_(vgs_.size()),
        sindex_(vgs_.size()),
        vg_evictable_(vgs_.size(), 0),
        vg_in_use_(vgs_.size(), 0) {
    std::vector<std::uint8_t> seen(pools_.size(), 0);
    for (const VGroup& g : vgs_) {  // a pool's one-group free memory is reported by its first vgroup
      reports_pool_free_.push_back(seen[g.pool] == 0);
      seen[g.pool] = 1;
    }
    rb_target_.assign(pools_.size(), 0.0);
    for (const VGroup& g : vgs_)
      if (rules_.hit_unit > 0 && g.kind != VKind::kState && g.kind != VKind::kEncoder && g.tpb % rules_.hit_unit != 0)
        fail("hit_unit = {}: must divide the {} tokens per block of vgroup '{}'", rules_.hit_unit, g.tpb, g.name);
  }

  std::string_view name() const override { return name_; }
  void begin_step() override {
    if (rb_.enabled) rebalance();
  }
  std::string describe() const override { return description_; }
  bool prefix_caching() const override { return caching_; }

  void add_request(std::uint32_t id, const SeqInfo& info) override {
    if (id >= reqs_.size()) reqs_.resize(std::size_t{id} + 1);
    Req& q = reqs_[id];
    if (q.active) fail("request = {}: already added", id);
    q.active = true;
    q.info = info;
    q.tokens = 0;
    q.blocks.assign(vgs_.size(), {});
    q.first_live.assign(vgs_.size(), 0);
    q.committed.assign(vgs_.size(), 0);
    q.token_keys.assign(vgs_.size(), {});
    q.unit_done.assign(vgs_.size(), 0);
    q.hit_blocks.assign(vgs_.size(), 0);
    q.unit_keys.clear();
    q.junction = 0;
    q.state_done = 0;
    q.computed = 0;
    if (caching_ && info.token_ids && !info.token_ids->empty() && rules_.hit_unit > 0) {
      std::uint64_t h = 0x756e6974;
      for (std::size_t u = 0; (u + 1) * rules_.hit_unit <= info.token_ids->size(); ++u) {
        for (std::size_t t = u * rules_.hit_unit; t < (u + 1) * rules_.hit_unit; ++t) h = mix(h ^ (*info.token_ids)[t]);
        q.unit_keys.push_back(h);
      }
    }
    if (caching_ && info.token_ids && !info.token_ids->empty()) {
      for (std::size_t v = 0; v < vgs_.size(); ++v) {
        const std::uint32_t tpb = vgs_[v].tpb;
        std::uint64_t h = 0x6b76606d;
        for (std::size_t b = 0; (b + 1) * tpb <= info.token_ids->size(); ++b) {
          for (std::size_t t = b * tpb; t < (b + 1) * tpb; ++t) h = mix(h ^ (*info.token_ids)[t]);
          q.token_keys[v].push_back(h);
        }
      }
    }
    active_.push_back(id);
  }

  std::uint32_t lookup_prefix(std::uint32_t id, std::uint32_t max_hit) override {
    Req& q = req(id);
    if (!caching_ || max_hit == 0) return 0;
    std::uint64_t h = align(max_hit);
    const std::uint64_t top = h;
    for (bool changed = true; changed && h > 0;) {
      changed = false;
      for (std::size_t v = 0; v < vgs_.size(); ++v) {
        const std::uint64_t before = h;
        h = align(valid_hit(q, v, h));
        changed |= h != before;
      }
    }
    if (rules_.window.junction || rules_.state.junction) {
      // The shared-prefix junction: where the full-attention groups alone would hit, when a
      // sparse group (window, state) stopped the hit before it (vLLM: num_new_computed_tokens
      // + num_uncached_common_prefix_tokens).
      std::uint64_t full = top;
      bool sparse = false, any_full = false;
      for (std::size_t v = 0; v < vgs_.size(); ++v) {
        if (vgs_[v].kind == VKind::kFull) {
          full = std::min(full, align(valid_hit(q, v, top)));
          any_full = true;
        }
        sparse |= vgs_[v].kind == VKind::kWindow || vgs_[v].kind == VKind::kState;
      }
      q.junction = any_full && sparse && full > h ? static_cast<std::uint32_t>(full) : 0;
    }
    if (h == 0) return 0;
    for (std::size_t v = 0; v < vgs_.size(); ++v) {
      const VGroup& g = vgs_[v];
      q.unit_done[v] = static_cast<std::uint32_t>(h);
      if (g.kind == VKind::kState) {  // the cached state is copied into the request's own block
        q.state_done = static_cast<std::uint32_t>(h);
        continue;
      }
      const std::uint64_t nb = h / g.tpb, first = std::min(first_needed_block(g, h), nb);
      for (std::uint64_t b = 0; b < nb; ++b) {
        if (b < first) {
          q.blocks[v].push_back(kNull);
          continue;
        }
        const std::uint32_t s = index_[v].at(key(q, v, b));
        if (ref_[s]++ == 0) {
          lru_remove(s);
          pools_[g.pool].evictable -= g.units;
          vg_evictable_[v] -= g.units;
          vg_in_use_[v] += g.units;
        }
        q.blocks[v].push_back(s);
      }
      q.first_live[v] = static_cast<std::uint32_t>(first);
      q.committed[v] = static_cast<std::uint32_t>(nb);
      q.hit_blocks[v] = static_cast<std::uint32_t>(nb);
    }
    q.tokens = static_cast<std::uint32_t>(h);
    return q.tokens;
  }

  bool allocate(std::uint32_t id, std::uint32_t num_computed, std::uint32_t num_new) override {
    Req& q = req(id);
    const std::uint64_t T = std::uint64_t{num_computed} + num_new;
    // Out-of-window blocks go first (engines that free them do so before allocating).
    for (std::size_t v = 0; v < vgs_.size(); ++v) {
      const VGroup& g = vgs_[v];
      if (g.kind != VKind::kWindow && g.kind != VKind::kChunked) continue;
      const std::uint64_t first = std::min<std::uint64_t>(first_needed_block(g, num_computed), q.blocks[v].size());
      for (std::uint64_t k = q.first_live[v]; k < first; ++k) {
        const std::uint64_t b = skip_order_ == SkipOrder::kHighFirst ? first - 1 - (k - q.first_live[v]) : k;
        const std::uint32_t s = q.blocks[v][b];
        release(v, s);
        // Sparse retention: a block no retained hit needs leaves the cache at once.
        drop_unless_retained(q, v, b, s);
        q.blocks[v][b] = kNull;
      }
      q.first_live[v] = static_cast<std::uint32_t>(std::max<std::uint64_t>(q.first_live[v], first));
    }
    need_.assign(vgs_.size(), 0);
    pool_need_.assign(pools_.size(), 0);
    for (std::size_t v = 0; v < vgs_.size(); ++v) {
      const VGroup& g = vgs_[v];
      std::uint64_t want = 0;
      switch (g.kind) {
        case VKind::kState:
          want = T > 0 ? 1 : 0;
          break;
        case VKind::kEncoder:
          want = (q.info.encoder_tokens + g.tpb - 1) / g.tpb;
          break;
        default:
          want = (T + g.tpb - 1) / g.tpb;
      }
      need_[v] = want > q.blocks[v].size() ? want - q.blocks[v].size() : 0;
      pool_need_[g.pool] += need_[v] * g.units;
    }
    for (std::size_t p = 0; p < pools_.size(); ++p)
      if (pool_need_[p] > pools_[p].free + pools_[p].evictable) return false;
    for (std::size_t v = 0; v < vgs_.size(); ++v)
      for (std::uint64_t k = 0; k < need_[v]; ++k) q.blocks[v].push_back(new_block(v));
    q.tokens = static_cast<std::uint32_t>(T);
    return true;
  }

  void commit(std::uint32_t id, std::uint32_t num_computed) override {
    Req& q = req(id);
    q.computed = std::max(q.computed, num_computed);
    if (!caching_) return;
    for (std::size_t v = 0; v < vgs_.size(); ++v) {
      const VGroup& g = vgs_[v];
      if (g.kind == VKind::kState) {
        if (rules_.state_caching) checkpoint_states(q, v, num_computed);
        continue;
      }
      if (g.kind == VKind::kEncoder) continue;
      const std::uint32_t full = num_computed / g.tpb;
      for (std::uint32_t b = q.committed[v]; b < full && b < q.blocks[v].size(); ++b) {
        const std::uint32_t s = q.blocks[v][b];
        if (s == kNull || (cached_[s] & kFullKey)) continue;
        const std::uint64_t k = key(q, v, b);
        if (index_[v].emplace(k, s).second) {
          cached_[s] |= kFullKey;
          key_[s] = k;
        }
      }
      q.committed[v] = std::max(q.committed[v], full);
      if (rules_.stream_partial)
        register_stream(q, v, num_computed);
      else if (rules_.hit_unit > 0 && rules_.hit_unit < g.tpb)
        register_units(q, v, num_computed);
    }
  }

  void free(std::uint32_t id) override {
    Req& q = req(id);
    if (caching_ && rules_.state_caching && rules_.state.seq_end) checkpoint_at_end(q);
    if (rb_.enabled) sample_closed(q);
    for (std::size_t v = 0; v < vgs_.size(); ++v) {
      // Reverse order: with prefix caching the tail blocks become LRU-first.
      for (std::size_t b = q.blocks[v].size(); b-- > 0;) {
        const std::uint32_t s = q.blocks[v][b];
        if (s == kNull) continue;
        release(v, s);
        drop_unless_retained(q, v, b, s);
      }
      q.blocks[v].clear();
    }
    q.active = false;
    active_.erase(std::find(active_.begin(), active_.end(), id));
  }

  void check_invariants() const override {
    std::vector<std::uint32_t> refs(ref_.size(), 0);
    for (std::uint32_t id : active_) {
      const Req& q = reqs_[id];
      for (std::size_t v = 0; v < vgs_.size(); ++v)
        for (std::size_t b = 0; b < q.blocks[v].size(); ++b) {
          const std::uint32_t s = q.blocks[v][b];
          if ((s == kNull) != (b < q.first_live[v]))
            fail("invariant: request {} vgroup {} block {} null-ness disagrees with first_live", id, v, b);
          if (s == kNull) continue;
          if (vg_[s] != v) fail("invariant: block {} of vgroup {} held by vgroup {}", s, vg_[s], v);
          ++refs[s];
        }
    }
    std::vector<std::uint64_t> in_use(vgs_.size(), 0), evictable(vgs_.size(), 0), cached(vgs_.size(), 0),
        partial(vgs_.size(), 0);
    std::vector<std::uint8_t> free_slot(ref_.size(), 0);
    for (std::uint32_t s : free_slots_) free_slot[s] = 1;
    for (std::uint32_t s = 0; s < ref_.size(); ++s) {
      if (refs[s] != ref_[s]) fail("invariant: block {} has ref {} but {} holders", s, ref_[s], refs[s]);
      if (free_slot[s]) {
        if (ref_[s] != 0 || cached_[s] || !pkeys_[s].empty())
          fail("invariant: free slot {} is referenced or cached", s);
        continue;
      }
      const std::size_t v = vg_[s];
      if (ref_[s] > 0)
        in_use[v] += vgs_[v].units;
      else if (!cached_[s])
        fail("invariant: block {} has no holder and is not cached", s);
      else
        evictable[v] += vgs_[v].units;
      if (cached_[s] & kFullKey) {
        ++cached[v];
        auto it = index_[v].find(key_[s]);
        if (it == index_[v].end() || it->second != s) fail("invariant: cached block {} missing from the index", s);
      }
      if (((cached_[s] & kUnitKeys) != 0) == pkeys_[s].empty())
        fail("invariant: block {} partial-key flag disagrees with its {} keys", s, pkeys_[s].size());
      for (std::uint64_t k : pkeys_[s]) {
        auto it = pindex_[v].find(k);
        auto st = sindex_[v].find(k);
        if ((it == pindex_[v].end() || it->second != s) && (st == sindex_[v].end() || st->second.first != s))
          fail("invariant: block {} partial key missing from the index", s);
        ++partial[v];
      }
    }
    for (std::size_t v = 0; v < vgs_.size(); ++v)
      if (partial[v] != pindex_[v].size() + sindex_[v].size())
        fail("invariant: vgroup {} has {} partial keys on blocks, {} in the index", vgs_[v].name, partial[v],
             pindex_[v].size());
    for (std::size_t v = 0; v < vgs_.size(); ++v) {
      if (in_use[v] != vg_in_use_[v] || evictable[v] != vg_evictable_[v] || cached[v] != index_[v].size())
        fail("invariant: vgroup {} counts in use {}/{}, evictable {}/{}, cached {}/{}", vgs_[v].name, in_use[v],
             vg_in_use_[v], evictable[v], vg_evictable_[v], cached[v], index_[v].size());
    }
    for (std::size_t p = 0; p < pools_.size(); ++p) {
      std::uint64_t used = 0, lru = 0, lru_units = 0;
      for (std::size_t v = 0; v < vgs_.size(); ++v)
        if (vgs_[v].pool == p) used += in_use[v] + evictable[v];
      for (std::uint32_t s = pools_[p].lru_head; s != kNull; s = next_[s]) {
        ++lru;
        lru_units += vgs_[vg_[s]].units;
        if (ref_[s] != 0 || cached_[s] == 0) fail("invariant: LRU block {} is in use or not cached", s);
      }
      if (used + pools_[p].free != pools_[p].capacity || lru_units != pools_[p].evictable)
        fail("invariant: pool {}: {} held + {} free != {} units, or LRU {} units != evictable {}", pools_[p].name, used,
             pools_[p].free, pools_[p].capacity, lru_units, pools_[p].evictable);
      (void)lru;
    }
  }

  void stats(MemoryStats& out) const override {
    out.groups.resize(vgs_.size());
    std::vector<std::uint64_t> in_use(vgs_.size(), 0);
    std::vector<double> waste(vgs_.size(), 0);
    // A block shared by k requests counts 1/k of its waste for each of them, so the sum
    // over requests is the waste of the distinct blocks in use.
    for (std::uint32_t id : active_) {
      const Req& q = reqs_[id];
      for (std::size_t v = 0; v < vgs_.size(); ++v) {
        const VGroup& g = vgs_[v];
        const double bytes = static_cast<double>(g.units * pools_[g.pool].unit_bytes);
        const std::vector<std::uint32_t>& bl = q.blocks[v];
        const std::uint64_t live = bl.size() - q.first_live[v];
        if (live == 0) continue;
        // The next step writes position `tokens` too: it is needed when its block exists.
        const std::uint64_t T = g.kind == VKind::kState
                                    ? q.tokens
                                    : std::min<std::uint64_t>(std::uint64_t{q.tokens} + 1, bl.size() * g.tpb);
        // Closed form as if no block were shared, then a correction for shared blocks.
        waste[v] += static_cast<double>(live) * bytes -
                    static_cast<double>(live_need(g, q.first_live[v], T, q.info.encoder_tokens));
        for (std::size_t b = q.first_live[v]; b < bl.size(); ++b) {
          const std::uint32_t r = ref_[bl[b]];
          if (r > 1)
            waste[v] -= (bytes - static_cast<double>(block_need(g, b, T, q.info.encoder_tokens))) *
                        (1.0 - 1.0 / static_cast<double>(r));
        }
      }
    }
    // Bytes in blocks with ref > 0, per vgroup: counted from the block arrays.
    for (std::size_t v = 0; v < vgs_.size(); ++v) in_use[v] = vg_in_use_[v] * pools_[vgs_[v].pool].unit_bytes;
    out.free = rb_spare_bytes_;  // bytes a rebalance has not yet given to a pool
    out.capacity = rb_spare_bytes_;
    for (const Pool& p : pools_) {
      out.capacity += p.capacity * p.unit_bytes;
      if (p.shared) out.free += p.free * p.unit_bytes;
    }
    for (std::size_t v = 0; v < vgs_.size(); ++v) {
      const VGroup& g = vgs_[v];
      GroupUsage& u = out.groups[v];
      u.name = g.name;
      u.wasted = std::min(static_cast<std::uint64_t>(std::llround(std::max(0.0, waste[v]))), in_use[v]);
      u.used = in_use[v] - u.wasted;
      u.cached = vg_evictable_[v] * pools_[g.pool].unit_bytes;
      u.group_free =
          pools_[g.pool].shared || !reports_pool_free_[v] ? 0 : pools_[g.pool].free * pools_[g.pool].unit_bytes;
    }
    out.evictions = evictions_;
  }

 private:
  struct Req {
    bool active = false;
    SeqInfo info;
    std::uint32_t tokens = 0;                            // decoder tokens with memory
    std::vector<std::vector<std::uint32_t>> blocks;      // per vgroup: block slots or kNull
    std::vector<std::uint32_t> first_live;               // per vgroup: first non-null block
    std::vector<std::uint32_t> committed;                // per vgroup: blocks already offered to the cache
    std::vector<std::vector<std::uint64_t>> token_keys;  // per vgroup: chained hashes of token ids
    std::vector<std::uint64_t> unit_keys;                // chained hashes of token ids per hit unit
    std::vector<std::uint32_t> unit_done;                // per vgroup: tokens whose unit keys are registered
    std::vector<std::uint32_t> hit_blocks;               // per vgroup: blocks taken from the cache at lookup
    std::uint32_t junction = 0;                          // shared-prefix junction found at lookup (0: none)
    std::uint32_t state_done = 0;                        // tokens up to which state checkpoints were considered
    std::uint32_t computed = 0;                          // tokens committed so far
  };

  static constexpr std::uint8_t kFullKey = 1, kUnitKeys = 2;  // cached_ bits

  // A hit length rounded down to what every vgroup can end a hit on.
  std::uint64_t align(std::uint64_t h) const {
    if (rules_.hit_unit > 0) return h - h % rules_.hit_unit;
    for (const VGroup& g : vgs_) h -= h % g.tpb;
    return h;
  }

  // Content key of the first `pos` tokens at a hit-unit boundary inside a block (partial
  // key), or of a state checkpoint at `pos` (salted apart).
  std::uint64_t unit_key(const Req& q, std::uint64_t pos, std::uint64_t salt) const {
    if (!q.unit_keys.empty() && pos % rules_.hit_unit == 0 && pos / rules_.hit_unit <= q.unit_keys.size())
      return mix(q.unit_keys[pos / rules_.hit_unit - 1] ^ salt);
    if (q.info.token_ids && !q.info.token_ids->empty() && pos <= q.info.token_ids->size()) {
      std::uint64_t h = 0x73746174;  // ids without unit keys: hash the prefix
      for (std::uint64_t t = 0; t < pos; ++t) h = mix(h ^ (*q.info.token_ids)[t]);
      return mix(h ^ salt);
    }
    if (pos <= q.info.prefix_len) return mix(mix(q.info.prefix_id) ^ (pos * 0x9e3779b97f4a7c15ULL + salt));
    return mix(mix(0x7e57000000000000ULL + q.info.uid) ^ (pos * 0x9e3779b97f4a7c15ULL + salt));
  }
  std::uint64_t pkey(const Req& q, std::size_t v, std::uint64_t pos) const {
    return unit_key(q, pos, 0x70000000ULL + vgs_[v].tpb);
  }
  std::uint64_t skey(const Req& q, std::uint64_t pos) const { return unit_key(q, pos, 0x5747e000ULL); }

  // A hit ending at pos (not a block boundary) can take the tokens of its last block from
  // a cached block: one with that partial key, or the full block itself.
  bool present_partial(const Req& q, std::size_t v, std::uint64_t pos) const {
    return pindex_[v].find(pkey(q, v, pos)) != pindex_[v].end() || present(q, v, pos / vgs_[v].tpb);
  }

  // Does a hit at a position the request retains need block b of window vgroup g? The
  // retained positions: the replay boundary, the junction, multiples of the interval.
  bool retained(const Req& q, const VGroup& g, std::uint64_t b) const {
    auto needs = [&](std::uint64_t a) { return a > b * g.tpb && first_needed_block(g, a) <= b; };
    const Positions& w = rules_.window;
    if (w.prompt_end && needs(replay_boundary(q))) return true;
    if (w.seq_end && needs(align(q.computed))) return true;
    if (w.junction && q.junction > 0 && needs(q.junction)) return true;
    const std::uint64_t n = w.interval;
    return n > 0 && needs((b * g.tpb / n + 1) * n);  // the first multiple past the block's start
  }
  std::uint64_t replay_boundary(const Req& q) const {
    return q.info.prompt_tokens > 0 ? align(q.info.prompt_tokens - 1) : 0;
  }

  // Sparse retention: window block b (slot s), just released by request q, leaves the cache
  // unless a hit at one of q's retained positions needs it. Only blocks q computed itself:
  // blocks it hit were cached by another request's rule (vLLM masks the blocks a request
  // caches, cache_full_blocks' block_mask).
  void drop_unless_retained(const Req& q, std::size_t v, std::uint64_t b, std::uint32_t s) {
    const VGroup& g = vgs_[v];
    if (rules_.sparse_retention && g.kind == VKind::kWindow && b >= q.hit_blocks[v] && ref_[s] == 0 &&
        cached_[s] != 0 && !retained(q, g, b))
      evict_slot(s);
  }

  // Registers the partial keys of the unit boundaries in (unit_done, num_computed] that
  // fall inside a block.
  void register_units(Req& q, std::size_t v, std::uint32_t num_computed) {
    const VGroup& g = vgs_[v];
    const std::uint32_t u = rules_.hit_unit;
    for (std::uint64_t pos = (q.unit_done[v] / u + 1) * u; pos <= num_computed; pos += u) {
      if (pos % g.tpb == 0) continue;
      const std::uint64_t b = pos / g.tpb;
      if (b >= q.blocks[v].size() || q.blocks[v][b] == kNull) continue;
      const std::uint32_t s = q.blocks[v][b];
      const std::uint64_t k = pkey(q, v, pos);
      if (pindex_[v].emplace(k, s).second) {
        pkeys_[s].push_back(k);
        cached_[s] |= kUnitKeys;
      }
    }
    q.unit_done[v] = std::max(q.unit_done[v], num_computed);
  }

  // Mamba "align": caches the state at each retained position in (state_done,
  // num_computed] (vLLM ends the chunk there), as an evictable block; skipped when the
  // pool has no room for it.
  void checkpoint_states(Req& q, std::size_t v, std::uint32_t num_computed) {
    const VGroup& g = vgs_[v];
    const Positions& ps = rules_.state;
    std::vector<std::uint64_t> at{ps.prompt_end ? state_prompt_end(q) : 0, ps.junction ? q.junction : 0};
    if (ps.interval > 0)
      for (std::uint64_t a = (q.state_done / ps.interval + 1) * ps.interval; a <= num_computed; a += ps.interval)
        at.push_back(a);
    std::sort(at.begin(), at.end());
    for (std::uint64_t a : at) {
      if (a <= q.state_done || a > num_computed) continue;
      const std::uint64_t k = skey(q, a);
      Pool& p = pools_[g.pool];
      if (index_[v].count(k) != 0 || p.free + p.evictable < g.units) continue;
      const std::uint32_t s = new_block(v);
      index_[v].emplace(k, s);
      cached_[s] = kFullKey;
      key_[s] = k;
      note_state(q, s, a);
      release(v, s);
    }
    q.state_done = std::max(q.state_done, num_computed);
  }

  // The prompt-end state position: vLLM's replay boundary (aligned to the hit granularity);
  // with token-granular hits (TensorRT-LLM) the prompt's end itself.
  std::uint64_t state_prompt_end(const Req& q) const {
    if (rules_.stream_partial) return q.info.prompt_tokens;
    return replay_boundary(q);
  }

  // SGLang: the request's running state becomes the cached state at its sequence's end
  // (the tree's leaf), aligned down to the hit granularity (the state tracked there).
  void checkpoint_at_end(Req& q) {
    for (std::size_t v = 0; v < vgs_.size(); ++v) {
      if (vgs_[v].kind != VKind::kState || q.blocks[v].empty()) continue;
      const std::uint64_t a = align(q.computed);
      const std::uint32_t s = q.blocks[v][0];
      if (a == 0 || s == kNull || cached_[s] != 0) continue;
      const std::uint64_t k = skey(q, a);
      if (!index_[v].emplace(k, s).second) continue;
      cached_[s] = kFullKey;
      key_[s] = k;
      note_state(q, s, a);
    }
  }

  // Cached states by content stream, so a lookup finds the deepest one below a hit length
  // at any position (synthetic streams; traces with token ids scan a grid).
  std::uint64_t state_stream(const Req& q, std::uint64_t pos) const {
    return pos <= q.info.prefix_len ? mix(q.info.prefix_id ^ 0x57a7e5ULL) : mix(0x7e57000000000000ULL + q.info.uid);
  }
  void note_state(const Req& q, std::uint32_t s, std::uint64_t pos) {
    if (q.info.token_ids && !q.info.token_ids->empty()) return;
    const std::uint64_t st = state_stream(q, pos);
    states_[st].insert(static_cast<std::uint32_t>(pos));
    state_at_[s] = {st, static_cast<std::uint32_t>(pos)};
  }
  // The deepest cached state of q's streams at or below h (0: none).
  std::uint64_t deepest_state(const Req& q, std::size_t v, std::uint64_t h) const {
    std::uint64_t best = 0;
    auto probe = [&](std::uint64_t stream, std::uint64_t lo, std::uint64_t hi) {  // positions in (lo, hi]
      auto it = states_.find(stream);
      if (it == states_.end() || hi <= lo) return;
      auto p = it->second.upper_bound(static_cast<std::uint32_t>(hi));
      if (p == it->second.begin()) return;
      const std::uint64_t a = *--p;
      if (a > lo && index_[v].count(skey(q, a)) != 0) best = std::max(best, a);
    };
    if (q.info.prefix_len > 0) probe(state_stream(q, 1), 0, std::min<std::uint64_t>(h, q.info.prefix_len));
    probe(state_stream(q, q.info.prefix_len + 1), q.info.prefix_len, h);
    return best;
  }

  // Token-granular partial reuse: the block holding the end of the request's shared stream
  // (its prefix, up to what is computed) is registered under (stream, block) with the
  // stream's length in it; a longer one replaces a shorter one.
  void register_stream(Req& q, std::size_t v, std::uint32_t num_computed) {
    const VGroup& g = vgs_[v];
    if (q.info.prefix_len == 0 || (q.info.token_ids && !q.info.token_ids->empty())) return;
    const std::uint64_t p = std::min<std::uint64_t>(num_computed, q.info.prefix_len);
    if (p % g.tpb == 0) return;
    const std::uint64_t b = p / g.tpb;
    if (b >= q.blocks[v].size() || q.blocks[v][b] == kNull) return;
    const std::uint32_t s = q.blocks[v][b];
    const std::uint64_t k = stream_key(q, v, b);
    auto [it, fresh] = sindex_[v].try_emplace(k, s, static_cast<std::uint32_t>(p));
    if (!fresh) {
      if (it->second.second >= p) return;
      const std::uint32_t old = it->second.first;
      it->second = {s, static_cast<std::uint32_t>(p)};
      if (old != s) {  // repoint from the shorter block, which may leave the cache
        std::vector<std::uint64_t>& keys = pkeys_[old];
        keys.erase(std::find(keys.begin(), keys.end(), k));
        if (keys.empty()) cached_[old] &= static_cast<std::uint8_t>(~kUnitKeys);
        if (cached_[old] == 0 && ref_[old] == 0) free_uncached(old);
        pkeys_[s].push_back(k);
      }
    } else {
      pkeys_[s].push_back(k);
    }
    cached_[s] |= kUnitKeys;
  }
  std::uint64_t stream_key(const Req& q, std::size_t v, std::uint64_t b) const {
    return mix(mix(q.info.prefix_id ^ 0x5157ULL) ^ (b * 0x9e3779b97f4a7c15ULL + vgs_[v].tpb));
  }
  // Tokens of block b a hit can take from the stream's registered block (0: none).
  std::uint64_t stream_len(const Req& q, std::size_t v, std::uint64_t b) const {
    if (!rules_.stream_partial || q.info.prefix_len <= b * vgs_[v].tpb) return 0;
    auto it = sindex_[v].find(stream_key(q, v, b));
    return it == sindex_[v].end() ? 0 : std::min<std::uint64_t>(it->second.second, q.info.prefix_len);
  }

  // Rebalance: moving averages of finished requests' lengths (squared, as the engine does:
  // long requests also live long).
  void sample_closed(const Req& q) {
    const double cap = static_cast<double>(q.computed);
    rb_sum_ = rb_.decay * rb_sum_ + cap * cap;
    rb_weight_ = rb_.decay * rb_weight_ + 1.0;
    if (++rb_closed_ % rb_.update_interval != 0 || rb_closed_ < rb_.min_closed) return;
    const double len = std::sqrt(rb_sum_ / rb_weight_);
    double total = 0;
    for (std::size_t p = 0; p < pools_.size(); ++p) rb_target_[p] = 0;
    for (const VGroup& g : vgs_) {
      double blocks = std::ceil(len / g.tpb);
      if (g.kind == VKind::kWindow) blocks = std::min(blocks, std::ceil((g.window - 1.0) / g.tpb) + 1);
      if (g.kind == VKind::kChunked) blocks = std::min(blocks, std::ceil(static_cast<double>(g.chunk) / g.tpb) + 1);
      if (g.kind == VKind::kState) blocks = 1;
      if (g.kind == VKind::kEncoder) continue;
      const double bytes = blocks * static_cast<double>(g.units * pools_[g.pool].unit_bytes);
      rb_target_[g.pool] += bytes;
      total += bytes;
    }
    for (double& t : rb_target_) t = total > 0 ? t / total : 0;
  }

  // Resizes the pools to the target shares when one is off by more than the threshold:
  // shrinking pools give up free units (evicting cached ones first), growing pools take the
  // bytes freed, in whole units. Called at the start of a step.
  void rebalance() {
    ++rb_step_;
    if (rb_closed_ < rb_.min_closed || rb_step_ - rb_last_ < rb_.cooldown_steps) return;
    double total = static_cast<double>(rb_spare_bytes_);
    for (const Pool& p : pools_) total += static_cast<double>(p.capacity * p.unit_bytes);
    bool off = false;
    for (std::size_t p = 0; p < pools_.size(); ++p) {
      if (rb_target_[p] <= 0) continue;
      const double share = static_cast<double>(pools_[p].capacity * pools_[p].unit_bytes) / total;
      off |= share <= 0 || share / rb_target_[p] > rb_.threshold || rb_target_[p] / share > rb_.threshold;
    }
    if (!off) return;
    rb_last_ = rb_step_;
    ++rebalances_;
    for (std::size_t p = 0; p < pools_.size(); ++p) {  // shrink
      Pool& pool = pools_[p];
      if (rb_target_[p] <= 0) continue;
      const auto want = static_cast<std::uint64_t>(total * rb_target_[p] / static_cast<double>(pool.unit_bytes));
      if (want >= pool.capacity) continue;
      const std::uint64_t give = std::min(pool.capacity - want, pool.free + pool.evictable);
      while (pool.free < give) evict(pool);
      pool.free -= give;
      pool.capacity -= give;
      rb_spare_bytes_ += give * pool.unit_bytes;
    }
    for (std::size_t p = 0; p < pools_.size(); ++p) {  // grow
      Pool& pool = pools_[p];
      if (rb_target_[p] <= 0) continue;
      const auto want = static_cast<std::uint64_t>(total * rb_target_[p] / static_cast<double>(pool.unit_bytes));
      if (want <= pool.capacity) continue;
      const std::uint64_t take = std::min(want - pool.capacity, rb_spare_bytes_ / pool.unit_bytes);
      pool.capacity += take;
      pool.free += take;
      rb_spare_bytes_ -= take * pool.unit_bytes;
    }
  }

  static std::uint64_t mix(std::uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
  }

  Req& req(std::uint32_t id) {
    if (id >= reqs_.size() || !reqs_[id].active) fail("request = {}: not an active request", id);
    return reqs_[id];
  }

  // Content key of block b of vgroup v: token ids when the trace has them, else the
  // shared stream (prefix_id, b) inside the prefix, else the request's own stream.
  std::uint64_t key(const Req& q, std::size_t v, std::uint64_t b) const {
    const std::uint32_t tpb = vgs_[v].tpb;
    if (b < q.token_keys[v].size()) return q.token_keys[v][b];
    if ((b + 1) * tpb <= q.info.prefix_len) return mix(mix(q.info.prefix_id) ^ (b * 0x9e3779b97f4a7c15ULL + tpb));
    return mix(mix(0x7e57000000000000ULL + q.info.uid) ^ (b * 0x9e3779b97f4a7c15ULL + tpb));
  }

  // Bytes of block b that the next position needs: per covered group, the block's
  // tokens that group reads (all of them, those in the window, those in the chunk).
  std::uint64_t block_need(const VGroup& g, std::uint64_t b, std::uint64_t T, std::uint64_t E) const {
    if (g.kind == VKind::kState) return T > 0 ? layout_.group(g.covers[0]).natural_page_bytes() : 0;
    const std::uint64_t lo = b * g.tpb, hi = (b + 1) * g.tpb;
    const std::uint64_t n = g.kind == VKind::kEncoder ? E : T;
    std::uint64_t need = 0;
    for (GroupId c : g.covers) {
      const LayerGroup& grp = layout_.group(c);
      std::uint64_t from = 0;
      if (grp.kind == LayerKind::kSlidingWindow) from = n > grp.window ? n - grp.window : 0;
      if (grp.kind == LayerKind::kChunkedLocal) from = n == 0 ? 0 : (n - 1) / grp.chunk * grp.chunk;
      const std::uint64_t a = std::max(lo, from), z = std::min(hi, n);
      if (z > a) need += (z - a) * grp.bytes_per_token();
    }
    return need;
  }

  // Sum of block_need over blocks [first_live, end) of a request.
  std::uint64_t live_need(const VGroup& g, std::uint64_t first_live, std::uint64_t T, std::uint64_t E) const {
    if (g.kind == VKind::kState) return T > 0 ? layout_.group(g.covers[0]).natural_page_bytes() : 0;
    const std::uint64_t n = g.kind == VKind::kEncoder ? E : T;
    std::uint64_t need = 0;
    for (GroupId c : g.covers) {
      const LayerGroup& grp = layout_.group(c);
      std::uint64_t from = first_live * g.tpb;
      if (grp.kind == LayerKind::kSlidingWindow && n > grp.window) from = std::max(from, n - grp.window);
      if (grp.kind == LayerKind::kChunkedLocal && n > 0) from = std::max(from, (n - 1) / grp.chunk * grp.chunk);
      if (n > from) need += (n - from) * grp.bytes_per_token();
    }
    return need;
  }

  bool present(const Req& q, std::size_t v, std::uint64_t b) const {
    return index_[v].find(key(q, v, b)) != index_[v].end();
  }

  // First block the computation of position p still reads.
  static std::uint64_t first_needed_block(const VGroup& g, std::uint64_t p) {
    if (g.kind == VKind::kWindow) return p + 1 > g.window ? (p + 1 - g.window) / g.tpb : 0;
    if (g.kind == VKind::kChunked) return p / g.chunk * g.chunk / g.tpb;
    return 0;
  }

  // Largest hit <= h (block aligned) that vgroup v can serve from the cache.
  std::uint64_t valid_hit(const Req& q, std::size_t v, std::uint64_t h) const {
    const VGroup& g = vgs_[v];
    if (g.kind == VKind::kState && rules_.state_caching) return valid_state_hit(q, v, h);
    if (g.kind == VKind::kState || g.kind == VKind::kEncoder) return 0;
    if (rules_.stream_partial) return valid_stream_hit(q, v, h);
    if (rules_.hit_unit > 0 && rules_.hit_unit < g.tpb) return valid_unit_hit(q, v, h);
    h -= h % g.tpb;
    if (g.kind == VKind::kFull) {
      std::uint64_t b = 0;
      while ((b + 1) * g.tpb <= h && present(q, v, b)) ++b;
      return b * g.tpb;
    }
    // Window/chunked: the blocks the next position reads must all be cached; scan down.
    while (h > 0) {
      const std::uint64_t first = first_needed_block(g, h);
      std::uint64_t b = h / g.tpb;
      while (b > first && present(q, v, b - 1)) --b;
      if (b == first) return h;
      h = (b - 1) * g.tpb;  // block b-1 is missing: no hit can end after it
    }
    return 0;
  }

  // A state hit: the largest position <= h with a cached state. Candidates: h, the request's
  // own prompt end (a preempted request's snapshot), and the grid of the smallest attention
  // block below h.
  std::uint64_t valid_state_hit(const Req& q, std::size_t v, std::uint64_t h) const {
    if (h == 0) return 0;
    if (!q.info.token_ids || q.info.token_ids->empty()) return align(deepest_state(q, v, h));
    if (index_[v].count(skey(q, h)) != 0) return h;
    const std::uint64_t own = state_prompt_end(q);
    std::uint64_t grid = 0;
    for (const VGroup& g : vgs_)
      if (g.kind != VKind::kState) grid = grid == 0 ? g.tpb : std::min<std::uint64_t>(grid, g.tpb);
    if (rules_.hit_unit > 0) grid = rules_.hit_unit;
    if (grid == 0) grid = 1;
    for (std::uint64_t a = (h - 1) / grid * grid; a > 0; a -= grid) {
      if (own > a && own < h && index_[v].count(skey(q, own)) != 0) return own;
      if (index_[v].count(skey(q, a)) != 0) return a;
    }
    return own > 0 && own < h && index_[v].count(skey(q, own)) != 0 ? own : 0;
  }

  // valid_hit with token-granular partial reuse: a hit may end inside a block that the
  // request's stream registered (copied).
  std::uint64_t valid_stream_hit(const Req& q, std::size_t v, std::uint64_t h) const {
    const VGroup& g = vgs_[v];
    if (g.kind == VKind::kFull) {
      std::uint64_t b = 0;
      while ((b + 1) * g.tpb <= h && present(q, v, b)) ++b;
      if (b * g.tpb == h) return h;
      return std::max(b * g.tpb, std::min(h, stream_len(q, v, b)));
    }
    while (h > 0) {
      if (h % g.tpb != 0 && !present(q, v, h / g.tpb) && stream_len(q, v, h / g.tpb) < h) {
        const std::uint64_t l = stream_len(q, v, h / g.tpb);
        h = l > h / g.tpb * g.tpb ? l : h / g.tpb * g.tpb;
        continue;
      }
      const std::uint64_t first = first_needed_block(g, h);
      std::uint64_t b = h / g.tpb;
      while (b > first && present(q, v, b - 1)) --b;
      if (b == first) return h;
      const std::uint64_t l = stream_len(q, v, b - 1);  // block b-1 is missing: end inside it?
      h = l > (b - 1) * g.tpb ? std::min(l, b * g.tpb - 1) : (b - 1) * g.tpb;
    }
    return 0;
  }

  // valid_hit at hit-unit granularity: the last block may be partly hit (copied).
  std::uint64_t valid_unit_hit(const Req& q, std::size_t v, std::uint64_t h) const {
    const VGroup& g = vgs_[v];
    const std::uint64_t u = rules_.hit_unit;
    h -= h % u;
    if (g.kind == VKind::kFull) {
      std::uint64_t b = 0;
      while ((b + 1) * g.tpb <= h && present(q, v, b)) ++b;
      if (b * g.tpb == h) return h;
      // The hit ends inside block b: at its last unit boundary whose tokens are cached.
      for (std::uint64_t pos = std::min(h, (b + 1) * g.tpb - u); pos > b * g.tpb; pos -= u)
        if (present_partial(q, v, pos)) return pos;
      return b * g.tpb;
    }
    while (h > 0) {
      if (h % g.tpb != 0 && !present_partial(q, v, h)) {
        h -= u;
        continue;
      }
      const std::uint64_t first = first_needed_block(g, h);
      std::uint64_t b = h / g.tpb;
      while (b > first && present(q, v, b - 1)) --b;
      if (b == first) return h;
      h = b * g.tpb - u;  // block b-1 is missing: a hit can still end inside it
    }
    return 0;
  }

  std::uint32_t new_block(std::size_t v) {
    const VGroup& g = vgs_[v];
    Pool& p = pools_[g.pool];
    while (p.free < g.units) evict(p);
    p.free -= g.units;
    std::uint32_t s;
    if (!free_slots_.empty()) {
      s = free_slots_.back();
      free_slots_.pop_back();
    } else {
      s = static_cast<std::uint32_t>(ref_.size());
      ref_.push_back(0);
      cached_.push_back(0);
      key_.push_back(0);
      pkeys_.emplace_back();
      vg_.push_back(0);
      prev_.push_back(kNull);
      next_.push_back(kNull);
    }
    ref_[s] = 1;
    cached_[s] = 0;
    vg_[s] = static_cast<std::uint32_t>(v);
    vg_in_use_[v] += g.units;
    return s;
  }

  void release(std::size_t v, std::uint32_t s) {
    const VGroup& g = vgs_[v];
    Pool& p = pools_[g.pool];
    if (--ref_[s] > 0) return;
    vg_in_use_[v] -= g.units;
    if (cached_[s]) {
      lru_push(p, s);
      p.evictable += g.units;
      vg_evictable_[v] += g.units;
    } else {
      p.free += g.units;
      free_slots_.push_back(s);
    }
  }

  void evict(Pool& p) {
    const std::uint32_t s = p.lru_head;
    if (s == kNull) fail("internal: pool {} has no evictable block after a capacity check", p.name);
    evict_slot(s);
  }

  void forget_state(std::uint32_t s) {
    auto it = state_at_.find(s);
    if (it == state_at_.end()) return;
    auto set = states_.find(it->second.first);
    set->second.erase(it->second.second);
    if (set->second.empty()) states_.erase(set);
    state_at_.erase(it);
  }

  // Frees evictable block s that just lost its last cache key.
  void free_uncached(std::uint32_t s) {
    const VGroup& g = vgs_[vg_[s]];
    Pool& p = pools_[g.pool];
    lru_remove(s);
    p.evictable -= g.units;
    vg_evictable_[vg_[s]] -= g.units;
    p.free += g.units;
    free_slots_.push_back(s);
    ++evictions_;
  }

  // Drops evictable block s from the cache and frees it.
  void evict_slot(std::uint32_t s) {
    Pool& p = pools_[vgs_[vg_[s]].pool];
    lru_remove(s);
    const std::size_t v = vg_[s];
    if (cached_[s] & kFullKey) index_[v].erase(key_[s]);
    for (std::uint64_t k : pkeys_[s]) {
      if (auto it = pindex_[v].find(k); it != pindex_[v].end() && it->second == s) pindex_[v].erase(it);
      if (auto it = sindex_[v].find(k); it != sindex_[v].end() && it->second.first == s) sindex_[v].erase(it);
    }
    pkeys_[s].clear();
    forget_state(s);
    cached_[s] = 0;
    p.evictable -= vgs_[v].units;
    vg_evictable_[v] -= vgs_[v].units;
    p.free += vgs_[v].units;
    free_slots_.push_back(s);
    ++evictions_;
  }

  void lru_push(Pool& p, std::uint32_t s) {
    prev_[s] = p.lru_tail;
    next_[s] = kNull;
    if (p.lru_tail != kNull)
      next_[p.lru_tail] = s;
    else
      p.lru_head = s;
    p.lru_tail = s;
  }
  void lru_remove(std::uint32_t s) {
    Pool& p = pools_[vgs_[vg_[s]].pool];
    if (prev_[s] != kNull)
      next_[prev_[s]] = next_[s];
    else
      p.lru_head = next_[s];
    if (next_[s] != kNull)
      prev_[next_[s]] = prev_[s];
    else
      p.lru_tail = prev_[s];
    prev_[s] = next_[s] = kNull;
  }

  std::string name_;
  KVLayout layout_;
  std::vector<VGroup> vgs_;
  std::vector<Pool> pools_;
  bool caching_;
  SkipOrder skip_order_;
  CacheRules rules_;
  Rebalance rb_;
  std::string description_;
  std::vector<std::unordered_map<std::uint64_t, std::uint32_t>> index_;   // per vgroup: key -> block
  std::vector<std::unordered_map<std::uint64_t, std::uint32_t>> pindex_;  // per vgroup: partial key -> block
  // per vgroup: stream key -> (block, stream tokens in it), for token-granular partial reuse
  std::vector<std::unordered_map<std::uint64_t, std::pair<std::uint32_t, std::uint32_t>>> sindex_;
  std::vector<bool> reports_pool_free_;                                // per vgroup
  std::unordered_map<std::uint64_t, std::set<std::uint32_t>> states_;  // stream -> positions with a cached state
  std::unordered_map<std::uint32_t, std::pair<std::uint64_t, std::uint32_t>> state_at_;  // state block -> (stream, pos)
  // Rebalance state.
  std::vector<double> rb_target_;  // per pool: target byte share (0: not computed)
  double rb_sum_ = 0, rb_weight_ = 0;
  std::uint64_t rb_closed_ = 0, rb_step_ = 0, rb_last_ = 0, rb_spare_bytes_ = 0, rebalances_ = 0;
  std::vector<std::uint64_t> vg_evictable_;
  std::vector<std::uint64_t> vg_in_use_;  // per vgroup: units in blocks with ref > 0
  // Block slots, structure of arrays.
  std::vector<std::uint32_t> ref_, vg_, prev_, next_;
  std::vector<std::uint8_t> cached_;
  std::vector<std::uint64_t> key_;
  std::vector<std::vector<std::uint64_t>> pkeys_;  // partial keys registered for each block
  std::vector<std::uint32_t> free_slots_;
  std::vector<Req> reqs_;
  std::vector<std::uint32_t> active_;
  std::vector<std::uint64_t> need_, pool_need_;
  std::uint64_t evictions_ = 0;
};

}  // namespace

std::unique_ptr<Policy> make_engine(std::string name, const KVLayout& layout, std::vector<VGroup> vgs,
                                    std::vector<Pool> pools, bool caching, std::string description,
                                    SkipOrder skip_order, CacheRules rules, Rebalance rebalance) {
  return std::make_unique<BlockPolicy>(std::move(name), layout, std::move(vgs), std::move(pools), caching,
                                       std::move(description), skip_order, rules, rebalance);
}

}  // namespace kvmm::sim::block
