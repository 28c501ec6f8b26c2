// PartialHits (private to src/manager/): hits that end inside a page (issue 34 item 3,
// KVCacheManagerOptions::hit_unit). Each page cached at commit is listed under the hash
// of the page before it (its chain parent) with a copy of its token ids, so a later
// request whose tokens leave a cached page part way finds the pages that followed the
// same parent and compares ids to find its longest common unit prefix; its admission
// copies that page's first tokens into its own fresh page (the shared partial page is
// never written). A finished request's partial last page is listed too (cached under
// partial_key, which no full page's hash equals): the next turn of a chat hits into it.
// An entry is valid while its page is still cached under the hash it had when listed
// (one compare per page walked; stale entries met are unlinked). Multimodal items: a
// page's items (those its filled tokens overlap) must equal the request's at the same
// offsets. Costs per cached page one map operation and a copy of its P ids (4 bytes a
// token of every page of the pool); per lookup one map find and a walk of the pages
// after that parent, O(P) each. Only decoder groups of one page size qualify (a
// recurrent state has no partial page; images and drafts are not split).
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
  // unit 0: off (every call is a no-op, longest() misses).
  void configure(const std::vector<Group>& groups, std::uint32_t unit);
  bool on() const { return unit_ > 0; }
  std::uint32_t unit() const { return unit_; }
  // Whether group g's pages are listed (a decoder group whose page is longer than a unit).
  bool indexes(GroupId g) const { return unit_ > 0 && P_[g] > 0; }

  // Page p of group g, just cached under `full`, whose chain parent is `parent` and whose
  // first `filled` tokens (P for a full page) are ids' tokens from `start`: listed under
  // parent (moved there from its previous list). O(filled) plus one or two map operations.
  void index_page(GroupId g, PageId p, const BlockHash& parent, const BlockHash& full, const RequestHashes& ids,
                  std::uint64_t start, std::uint64_t filled);
  // The longest multiple of the unit, at most max_len (shorter than a page), of ids'
  // tokens from `start` that a cached page of group g after `parent` begins with; *page
  // and *full receive that page and the hash it is cached under (kNullPage, 0: none).
  // O(pages listed after parent x max_len); unlinks stale entries it meets.
  std::uint64_t longest(const std::vector<Group>& groups, GroupId g, const BlockHash& parent, const RequestHashes& ids,
                        std::uint64_t start, std::uint64_t max_len, PageId* page, BlockHash* full);
  // The hash a partial page (its first `filled` tokens from `start`, after `parent`) is
  // cached under: a digest of those tokens and their items with a tag, so no full page's
  // chain hash (nor a lookup's) equals it. O(filled).
  static BlockHash partial_key(const BlockHash& parent, const RequestHashes& ids, std::uint64_t start,
                               std::uint64_t filled);
  // Every entry forgotten (reset_prefix_cache). O(pages).
  void clear();

 private:
  struct KeyHash {
    std::size_t operator()(const BlockHash& h) const { return static_cast<std::size_t>(h.lo ^ (h.hi * 31)); }
  };
  // ids' multimodal items overlapping [start, start + len): a digest of them and their
  // offsets relative to start ({} when none), and where the first begins (0 when it began
  // before start, len when none). O(log items + overlapping ones).
  struct Items {
    BlockHash digest;
    std::uint32_t first;
  };
  static Items items_in(const RequestHashes& ids, std::uint64_t start, std::uint64_t len);
  void unlink(GroupId g, PageId p);

  std::uint32_t unit_ = 0;
  std::vector<std::uint32_t> P_;                                      // per group: tokens per page (0: not listed)
  std::vector<std::unordered_map<BlockHash, PageId, KeyHash>> head_;  // per group: parent -> first page after it
  std::vector<std::vector<PageId>> next_, prev_;                      // per group: each page's list neighbours
  std::vector<std::vector<BlockHash>> parent_, full_, items_;         // per group: each listed page's keys
  std::vector<std::vector<std::uint32_t>> first_item_;                // per group: items_in(..).first of each page
  std::vector<std::vector<std::uint32_t>> filled_;                    // per group: ids a page holds (0: unlisted)
  std::vector<std::vector<std::uint32_t>> ids_;                       // per group: P ids per page
};

}  // namespace kvmm::detail
