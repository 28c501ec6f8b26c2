// PartialHits (private to src/manager/): hits that end inside a page (issue 34 item 3,
// KVCacheManagerOptions::hit_unit). Each page cached at commit is also indexed under the
// keys of its first u, 2u, ... tokens (u = hit_unit), each key chained on the hash of the
// page before it, so a later request whose tokens leave a cached page part way finds it
// and continues from the last matching unit; its admission copies that page's first
// tokens into its own fresh page (the shared partial page is never written). An entry is
// valid while its page is still cached under the hash it had when indexed (one compare
// per probe); re-indexing a page drops its old keys, so the map holds at most (P/u - 1)
// keys per small page. Costs per cached page O(P) hashing; per lookup at most P/u probes
// per group. Only whole-prefix (full-attention) and sliding-window decoder groups of one
// hash class qualify (a recurrent state has no partial page; images and drafts are not
// split).
#pragma once

#include "group.hpp"
#include "kvmm/caching/block_hash.hpp"

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace kvmm::detail {

class PartialHits {
 public:
  // unit 0: off (every call is a no-op, find() misses).
  void configure(const std::vector<Group>& groups, std::uint32_t unit);
  bool on() const { return unit_ > 0; }
  std::uint32_t unit() const { return unit_; }

  // Page p of group g, just cached under `full`, whose chain parent is `parent` and whose
  // tokens are `tokens` (P of them): indexed under each unit prefix. O(P).
  void index_page(GroupId g, PageId p, const BlockHash& parent, const BlockHash& full,
                  std::span<const std::uint32_t> tokens);
  // The cached page of group g whose chain parent is `parent` and whose first tokens are
  // `tokens` (a multiple of the unit, shorter than a page), or kNullPage. *full receives
  // the hash it is cached under. O(tokens).
  PageId find(const std::vector<Group>& groups, GroupId g, const BlockHash& parent,
              std::span<const std::uint32_t> tokens, BlockHash* full) const;
  // Every key forgotten (reset_prefix_cache). O(keys).
  void clear();

 private:
  struct KeyHash {
    std::size_t operator()(const BlockHash& h) const { return static_cast<std::size_t>(h.lo ^ (h.hi * 31)); }
  };
  static BlockHash key(const BlockHash& parent, std::span<const std::uint32_t> tokens);

  std::uint32_t unit_ = 0;
  std::vector<std::uint32_t> per_page_;                              // keys per page of each group
  std::vector<std::unordered_map<BlockHash, PageId, KeyHash>> map_;  // per group: key -> page
  std::vector<std::vector<BlockHash>> keys_;                         // per group: each page's keys
  std::vector<std::vector<BlockHash>> full_;                         // per group: each page's hash when indexed
  std::vector<std::vector<std::uint8_t>> has_;                       // per group: page indexed
};

}  // namespace kvmm::detail
