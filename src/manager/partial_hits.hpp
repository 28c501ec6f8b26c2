// PartialHits (private to src/manager/): hits that end inside a page (issue 34 item 3,
// KVCacheManagerOptions::hit_unit). Each page cached at commit is also indexed under the
// keys of its first u, 2u, ... tokens (u = hit_unit), each key chained on the hash of the
// page before it (and the multimodal items those tokens overlap), so a later request
// whose tokens leave a cached page part way finds it and continues from the last matching
// unit; its admission copies that page's first tokens into its own fresh page (the shared
// partial page is never written). A finished request's partial last page is cached too
// (under partial_key, which no full page's hash equals), its filled units indexed: the
// next turn of a chat hits into it. An entry is valid while its page is still cached
// under the hash it had when indexed (one compare per probe); re-indexing a page drops
// its old keys, so the map holds at most (P/u - 1) keys per small page. Costs per cached
// page O(P) hashing; per lookup at most P/u probes per group. Only whole-prefix (full
// attention) and sliding-window decoder groups of one hash class qualify (a recurrent
// state has no partial page; images and drafts are not split).
#pragma once

#include "group.hpp"
#include "kvmm/caching/block_hash.hpp"
#include "kvmm/caching/request_hashes.hpp"

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace kvmm::detail {

class PartialHits {
 public:
  // unit 0: off (every call is a no-op, find() misses).
  void configure(const std::vector<Group>& groups, std::uint32_t unit);
  bool on() const { return unit_ > 0; }
  std::uint32_t unit() const { return unit_; }
  // Whether group g's pages are indexed (a decoder group whose page is longer than a unit).
  bool indexes(GroupId g) const { return unit_ > 0 && per_page_[g] > 0; }

  // Page p of group g, just cached under `full`, whose chain parent is `parent` and whose
  // first `filled` tokens (P for a full page) are ids' tokens from `start`: indexed under
  // each unit prefix of them shorter than a page. O(filled).
  void index_page(GroupId g, PageId p, const BlockHash& parent, const BlockHash& full, const RequestHashes& ids,
                  std::uint64_t start, std::uint64_t filled);
  // The cached page of group g whose chain parent is `parent` and whose first `len` tokens
  // (a multiple of the unit, shorter than a page) are ids' tokens from `start`, or
  // kNullPage. *full receives the hash it is cached under. O(len).
  PageId find(const std::vector<Group>& groups, GroupId g, const BlockHash& parent, const RequestHashes& ids,
              std::uint64_t start, std::uint64_t len, BlockHash* full) const;
  // The hash a partial page (its first `filled` tokens from `start`, after `parent`) is
  // cached under: the key of those tokens with a tag, so no full page's chain hash (nor a
  // lookup's) equals it. O(filled).
  static BlockHash partial_key(const BlockHash& parent, const RequestHashes& ids, std::uint64_t start,
                               std::uint64_t filled);
  // Every key forgotten (reset_prefix_cache). O(keys).
  void clear();

 private:
  struct KeyHash {
    std::size_t operator()(const BlockHash& h) const { return static_cast<std::size_t>(h.lo ^ (h.hi * 31)); }
  };
  // hash_page over ids' tokens [start, start + len) after parent, with the multimodal items
  // they overlap as extra keys (as RequestHashes chains a page's). O(len + log items).
  static BlockHash key(const BlockHash& parent, const RequestHashes& ids, std::uint64_t start, std::uint64_t len);

  std::uint32_t unit_ = 0;
  std::vector<std::uint32_t> per_page_;                              // keys per page of each group
  std::vector<std::unordered_map<BlockHash, PageId, KeyHash>> map_;  // per group: key -> page
  std::vector<std::vector<BlockHash>> keys_;                         // per group: each page's keys
  std::vector<std::vector<BlockHash>> full_;                         // per group: each page's hash when indexed
  std::vector<std::vector<std::uint32_t>> count_;                    // per group: keys a page has indexed
};

}  // namespace kvmm::detail
