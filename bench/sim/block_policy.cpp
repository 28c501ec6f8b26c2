// BlockPolicy's request lifecycle (add, lookup, allocate, commit, free) and its block
// primitives (allocation, release, eviction, the LRU per pool); make_engine. See
// block_engine.hpp. O(blocks touched) per call.
#include "sim/block_engine.hpp"

#include "kvmm/error.hpp"

#include <algorithm>
#include <memory>

namespace kvmm::sim::block {

void BlockPolicy::add_request(std::uint32_t id, const SeqInfo& info) {
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

std::uint32_t BlockPolicy::lookup_prefix(std::uint32_t id, std::uint32_t max_hit) {
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

bool BlockPolicy::allocate(std::uint32_t id, std::uint32_t num_computed, std::uint32_t num_new) {
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

void BlockPolicy::commit(std::uint32_t id, std::uint32_t num_computed) {
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

void BlockPolicy::free(std::uint32_t id) {
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

std::uint64_t BlockPolicy::key(const Req& q, std::size_t v, std::uint64_t b) const {
  const std::uint32_t tpb = vgs_[v].tpb;
  if (b < q.token_keys[v].size()) return q.token_keys[v][b];
  if ((b + 1) * tpb <= q.info.prefix_len) return mix(mix(q.info.prefix_id) ^ (b * 0x9e3779b97f4a7c15ULL + tpb));
  return mix(mix(0x7e57000000000000ULL + q.info.uid) ^ (b * 0x9e3779b97f4a7c15ULL + tpb));
}

std::uint32_t BlockPolicy::new_block(std::size_t v) {
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

void BlockPolicy::release(std::size_t v, std::uint32_t s) {
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

void BlockPolicy::evict(Pool& p) {
  const std::uint32_t s = p.lru_head;
  if (s == kNull) fail("internal: pool {} has no evictable block after a capacity check", p.name);
  evict_slot(s);
}

void BlockPolicy::evict_slot(std::uint32_t s) {
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

void BlockPolicy::lru_push(Pool& p, std::uint32_t s) {
  prev_[s] = p.lru_tail;
  next_[s] = kNull;
  if (p.lru_tail != kNull)
    next_[p.lru_tail] = s;
  else
    p.lru_head = s;
  p.lru_tail = s;
}

void BlockPolicy::lru_remove(std::uint32_t s) {
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

std::unique_ptr<Policy> make_engine(std::string name, const KVLayout& layout, std::vector<VGroup> vgs,
                                    std::vector<Pool> pools, bool caching, std::string description,
                                    SkipOrder skip_order, CacheRules rules, Rebalance rebalance) {
  return std::make_unique<BlockPolicy>(std::move(name), layout, std::move(vgs), std::move(pools), caching,
                                       std::move(description), skip_order, rules, rebalance);
}

}  // namespace kvmm::sim::block
