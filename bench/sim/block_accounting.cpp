// BlockPolicy's memory accounting (block_engine.hpp): stats() in closed form per request
// (O(running requests x vgroups), plus the blocks shared by several requests) and
// check_invariants(), a recount of every block (O(blocks), for tests).
#include "sim/block_engine.hpp"

#include "kvmm/error.hpp"

#include <algorithm>
#include <cmath>

namespace kvmm::sim::block {

void BlockPolicy::check_invariants() const {
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
      if (ref_[s] != 0 || cached_[s] || !pkeys_[s].empty()) fail("invariant: free slot {} is referenced or cached", s);
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

void BlockPolicy::stats(MemoryStats& out) const {
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
      const std::uint64_t T =
          g.kind == VKind::kState ? q.tokens : std::min<std::uint64_t>(std::uint64_t{q.tokens} + 1, bl.size() * g.tpb);
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

std::uint64_t BlockPolicy::block_need(const VGroup& g, std::uint64_t b, std::uint64_t T, std::uint64_t E) const {
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

std::uint64_t BlockPolicy::live_need(const VGroup& g, std::uint64_t first_live, std::uint64_t T,
                                     std::uint64_t E) const {
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

}  // namespace kvmm::sim::block
