// PrefixLookup (private to src/manager/): the longest prefix of a request valid in every
// group (Jenga §5.2: each group's policy decides which of its pages a hit needs), found
// without changing any page or row (hit_pins.hpp adopts the pages it returns).
// A lookup costs O(pages probed): a whole-prefix group (full attention) is probed once in
// page order up to its first miss, other groups through their policy's
// longest_valid_prefix over a memoized probe; a hit's pages again cost O(hit pages).
#pragma once

#include "group.hpp"
#include "kvmm/caching/prefix_index.hpp"
#include "page_store.hpp"
#include "request_table.hpp"

#include <cstdint>
#include <span>
#include <vector>

namespace kvmm::detail {

// Pages a shared tier holds (extend_prefix's answers): group g's pages [lo[g], lo[g] +
// n[g]) at present[off[g] + i - lo[g]] (nonzero: held).
struct TierPresence {
  const std::uint64_t* lo;
  const std::uint64_t* n;
  const std::uint64_t* off;
  const std::uint8_t* present;
  bool has(GroupId g, std::uint64_t i) const { return i >= lo[g] && i - lo[g] < n[g] && present[off[g] + i - lo[g]]; }
};

class PrefixLookup {
 public:
  PrefixLookup(std::vector<Group>& groups, PageStore& store, PrefixIndex& index);

  // The longest prefix of at most `limit` tokens valid in every group for request q, whose
  // chains cover limit tokens. Remembers the pages its probes found for pin() (until the
  // next call). Changes no page and no list. O(pages probed).
  std::uint64_t longest_hit(RequestId handle, const Request& q, std::uint64_t limit);
  // Whether the last longest_hit was handle's and no page left the cache since: its
  // answer and probes still hold (pages cached since can only lengthen a hit). O(1).
  bool current(RequestId handle) const { return memo_owner_ == handle && store_.uncached() == memo_uncached_; }
  // Right after longest_hit(handle, q, limit): the longest prefix of at most limit tokens
  // every group serves with each page it needs either cached here or in the tier (>= the
  // local hit). Encoder-token groups: cached pages only. O(pages probed).
  std::uint64_t longest_hit_with(const Request& q, std::uint64_t limit, const TierPresence& tier);
  // Page i of q's prefix in decoder group g if cached here (the index), else null. O(1).
  PageId cached(const Request& q, GroupId g, std::uint64_t i) const;
  // Whether the probes at hand are handle's (its lookup was the last); if not, they stop
  // being anyone's: adopting another request's hit rewrites them with its pages, so their
  // owner must not trust them afterwards. O(1).
  bool claim(RequestId handle) {
    const bool mine = memo_owner_ == handle;
    if (!mine) memo_owner_ = kNoRequest;
    return mine;
  }
  // The pages a hit of p tokens needs in decoder group g: entries [lo, p / P) of the
  // result, lo = the policy's first required page; from the probes when `mine` (claim()),
  // else the index, into *hit; false when one is not cached. *check receives the hashes to check
  // each page against when pages may have left the cache since the probes (nullptr: none
  // did, debug tier 2 checks them all the same). Writes no page. O(hit pages).
  bool hit_pages(const Request& q, GroupId g, std::uint64_t p, bool mine, const PageId** hit, const BlockHash** check);
  // The cached page of encoder-token group g under h (an image's page), or null. O(1).
  PageId image_page(GroupId g, const BlockHash& h) const;
  // Whether every page of image m (under LoRA lora) is cached in every encoder-token group:
  // the engine may skip the encoder for it. false without such groups. O(pages of m).
  bool image_cached(const MultimodalItem& m, std::uint32_t lora, const BlockHasher& hasher) const;
  // The evictable pages (reference count 0) among those pin() would take for request q's
  // hit of p tokens, per group, into out: read only, O(hit pages). false (out unset) unless
  // the probes of that lookup are at hand and no page left the cache since.
  bool evictable_in_hit(RequestId handle, const Request& q, std::uint64_t p, std::vector<std::uint64_t>& out);
  // After longest_hit: how far the whole-prefix groups (full attention) alone would have
  // hit (the least of them), limit when there are none. O(groups).
  std::uint64_t whole_prefix_hit(std::uint64_t limit) const;
  // After longest_hit(q, limit) (the miss reasons): group g's own longest valid prefix of
  // at most limit tokens (a decoder group: its policy over the probes; an encoder-token
  // group: up to its first missing image). O(pages probed).
  std::uint64_t own_hit(const Request& q, GroupId g, std::uint64_t limit) {
    return groups_[g].decoder ? decoder_hit(q, g, limit) : image_hit(q, g, limit);
  }
  // After longest_hit: a whole-prefix group's first missing page, else whether page i of
  // q's prefix is cached in decoder group g (the probes, else the index). O(1).
  std::uint64_t first_miss(GroupId g) const { return first_miss_[g]; }
  bool has_page(const Request& q, GroupId g, std::uint64_t i) { return page_of(q, g, i) != kNullPage; }
  // Draft group g's own hit inside the last longest_hit's answer (<= it). O(1).
  std::uint64_t draft_hit(GroupId g) const { return draft_hit_[g]; }
  // The part of a hit of p tokens group g adopts: p, a draft group's own hit (q's). O(1).
  std::uint64_t group_hit(const Request& q, GroupId g, std::uint64_t p) const {
    return groups_[g].draft ? std::min(q.drafts.hit[g], p) : p;
  }
  // Adds a hit of p tokens to each group's hit_pages (the pages it needs). O(groups + items).
  void count_hit(const Request& q, std::uint64_t p);

 private:
  // Group g's pages [0, pages) probed in order up to the first miss, each hit recorded in
  // memo_[g]; returns the first miss (pages when every page hits).
  std::uint64_t probe_in_order(const Request& q, GroupId g, std::uint64_t pages);
  std::uint64_t decoder_hit(const Request& q, GroupId g, std::uint64_t p);
  std::uint64_t image_hit(const Request& q, GroupId g, std::uint64_t p) const;
  std::uint64_t tier_group_hit(const Request& q, GroupId g, std::uint64_t p, const TierPresence& tier);
  // The page of group g holding page i of q's prefix (memo, else the index), or null.
  PageId page_of(const Request& q, GroupId g, std::uint64_t i);

  std::vector<Group>& groups_;
  PageStore& store_;
  PrefixIndex& index_;
  std::vector<std::vector<PageId>> memo_;  // per group: page ids found (or unknown / null)
  std::vector<std::uint64_t> first_miss_;  // per whole-prefix group: its first missing page
  std::vector<std::uint64_t> accepted_;    // per group: its last valid prefix
  std::vector<std::uint64_t> draft_hit_;   // per draft group: its own hit inside the last answer
  std::vector<PageId> run_;                // scratch: a group's hit pages from the index
  RequestId memo_owner_ = kNoRequest;      // whose probes memo_ holds
  std::uint64_t memo_uncached_ = 0;        // store_.uncached() when memo_ was filled
};

}  // namespace kvmm::detail
