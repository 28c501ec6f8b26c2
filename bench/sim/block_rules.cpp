// BlockPolicy's cache rules (block_engine.hpp): hit validity per vgroup kind (whole blocks,
// hit units inside a block, token-granular stream reuse, state checkpoints), where a
// request keeps what a later hit needs (sparse retention, state checkpoints), and the pool
// rebalance. Each costs O(blocks of one hit) or less.
#include "sim/block_engine.hpp"

#include "kvmm/error.hpp"

#include <algorithm>
#include <cmath>

namespace kvmm::sim::block {

std::uint64_t BlockPolicy::align(std::uint64_t h) const {
  if (rules_.hit_unit > 0) return h - h % rules_.hit_unit;
  for (const VGroup& g : vgs_) h -= h % g.tpb;
  return h;
}

std::uint64_t BlockPolicy::unit_key(const Req& q, std::uint64_t pos, std::uint64_t salt) const {
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

std::uint64_t BlockPolicy::pkey(const Req& q, std::size_t v, std::uint64_t pos) const {
  return unit_key(q, pos, 0x70000000ULL + vgs_[v].tpb);
}

bool BlockPolicy::present_partial(const Req& q, std::size_t v, std::uint64_t pos) const {
  return pindex_[v].find(pkey(q, v, pos)) != pindex_[v].end() || present(q, v, pos / vgs_[v].tpb);
}

bool BlockPolicy::retained(const Req& q, const VGroup& g, std::uint64_t b) const {
  auto needs = [&](std::uint64_t a) { return a > b * g.tpb && first_needed_block(g, a) <= b; };
  const Positions& w = rules_.window;
  if (w.prompt_end && needs(replay_boundary(q))) return true;
  if (w.seq_end && needs(align(q.computed))) return true;
  if (w.junction && q.junction > 0 && needs(q.junction)) return true;
  const std::uint64_t n = w.interval;
  return n > 0 && needs((b * g.tpb / n + 1) * n);  // the first multiple past the block's start
}

std::uint64_t BlockPolicy::replay_boundary(const Req& q) const {
  return q.info.prompt_tokens > 0 ? align(q.info.prompt_tokens - 1) : 0;
}

void BlockPolicy::drop_unless_retained(const Req& q, std::size_t v, std::uint64_t b, std::uint32_t s) {
  const VGroup& g = vgs_[v];
  if (rules_.sparse_retention && g.kind == VKind::kWindow && b >= q.hit_blocks[v] && ref_[s] == 0 && cached_[s] != 0 &&
      !retained(q, g, b))
    evict_slot(s);
}

void BlockPolicy::register_units(Req& q, std::size_t v, std::uint32_t num_computed) {
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

void BlockPolicy::checkpoint_states(Req& q, std::size_t v, std::uint32_t num_computed) {
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

std::uint64_t BlockPolicy::state_prompt_end(const Req& q) const {
  if (rules_.stream_partial) return q.info.prompt_tokens;
  return replay_boundary(q);
}

void BlockPolicy::checkpoint_at_end(Req& q) {
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

std::uint64_t BlockPolicy::state_stream(const Req& q, std::uint64_t pos) const {
  return pos <= q.info.prefix_len ? mix(q.info.prefix_id ^ 0x57a7e5ULL) : mix(0x7e57000000000000ULL + q.info.uid);
}

void BlockPolicy::note_state(const Req& q, std::uint32_t s, std::uint64_t pos) {
  if (q.info.token_ids && !q.info.token_ids->empty()) return;
  const std::uint64_t st = state_stream(q, pos);
  states_[st].insert(static_cast<std::uint32_t>(pos));
  state_at_[s] = {st, static_cast<std::uint32_t>(pos)};
}

std::uint64_t BlockPolicy::deepest_state(const Req& q, std::size_t v, std::uint64_t h) const {
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

void BlockPolicy::register_stream(Req& q, std::size_t v, std::uint32_t num_computed) {
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

std::uint64_t BlockPolicy::stream_key(const Req& q, std::size_t v, std::uint64_t b) const {
  return mix(mix(q.info.prefix_id ^ 0x5157ULL) ^ (b * 0x9e3779b97f4a7c15ULL + vgs_[v].tpb));
}

std::uint64_t BlockPolicy::stream_len(const Req& q, std::size_t v, std::uint64_t b) const {
  if (!rules_.stream_partial || q.info.prefix_len <= b * vgs_[v].tpb) return 0;
  auto it = sindex_[v].find(stream_key(q, v, b));
  return it == sindex_[v].end() ? 0 : std::min<std::uint64_t>(it->second.second, q.info.prefix_len);
}

void BlockPolicy::sample_closed(const Req& q) {
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

void BlockPolicy::rebalance() {
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

std::uint64_t BlockPolicy::valid_hit(const Req& q, std::size_t v, std::uint64_t h) const {
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

std::uint64_t BlockPolicy::valid_state_hit(const Req& q, std::size_t v, std::uint64_t h) const {
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

std::uint64_t BlockPolicy::valid_stream_hit(const Req& q, std::size_t v, std::uint64_t h) const {
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

std::uint64_t BlockPolicy::valid_unit_hit(const Req& q, std::size_t v, std::uint64_t h) const {
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

void BlockPolicy::forget_state(std::uint32_t s) {
  auto it = state_at_.find(s);
  if (it == state_at_.end()) return;
  auto set = states_.find(it->second.first);
  set->second.erase(it->second.second);
  if (set->second.empty()) states_.erase(set);
  state_at_.erase(it);
}

void BlockPolicy::free_uncached(std::uint32_t s) {
  const VGroup& g = vgs_[vg_[s]];
  Pool& p = pools_[g.pool];
  lru_remove(s);
  p.evictable -= g.units;
  vg_evictable_[vg_[s]] -= g.units;
  p.free += g.units;
  free_slots_.push_back(s);
  ++evictions_;
}

}  // namespace kvmm::sim::block
