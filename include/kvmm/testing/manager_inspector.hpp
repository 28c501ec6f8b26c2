// Testing aid (kvmm/testing/: not part of the engine-facing API; docs/api-stability.md).
// kvmm::testing::ManagerInspector: read-only views of a KVCacheManager's page states for
// tests, simulators and debugging (a page's state, reference count, eviction key and
// hash; the next victims of the eviction steps). Not for an engine's hot path: each call
// checks its arguments; the victim queries drop the stale list entries they meet
// (amortized O(1)), which a later front would drop anyway.
#pragma once

#include "kvmm/caching/block_hash.hpp"
#include "kvmm/caching/evictor.hpp"
#include "kvmm/manager/kv_cache_manager.hpp"

#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

namespace kvmm::testing {

class ManagerInspector {
 public:
  explicit ManagerInspector(const KVCacheManager& kv) : kv_(kv) {}

  PageState page_state(GroupId g, PageId p) const;
  std::uint32_t ref_count(GroupId g, PageId p) const;
  EvictionKey eviction_key(GroupId g, PageId p) const;  // last access and prefix length
  std::optional<BlockHash> page_hash(GroupId g, PageId p) const;
  // Next victims: a group's small-page LRU front (step 5), step 3's next large page (the
  // earliest of the large-page LRU's front and the fronts of the groups with one small
  // page per large page), step 6's next mixed large page; kNullPage (kNoLargePage) for none.
  PageId next_small_victim(GroupId g) const;
  LargePageId next_large_victim() const;
  LargePageId next_mixed_victim() const;
  // Request r's pages held for its cache boundaries (out of its page tables), as (group,
  // page) in the order they left the window; and its boundaries, hinted and learned.
  std::vector<std::pair<GroupId, PageId>> held_pages(RequestId r) const;
  // Pages of g request r holds for its cache boundaries (out of its page table, counted in
  // page_counts(g).used): O(1).
  std::uint32_t num_held_pages(RequestId r, GroupId g) const;
  // Cached pages held (outside every row) as this step's partial-hit copy sources
  // (KVCacheManagerOptions::hit_unit), as (group, page), each counted in page_counts(g).used
  // until the next begin_step.
  std::vector<std::pair<GroupId, PageId>> partial_sources() const;
  // A swapped-out request's host page ids (the swap plans' sources and destinations).
  std::span<const PageId> host_page_table(RequestId r, GroupId g) const;
  std::vector<std::uint64_t> cache_boundaries(RequestId r) const;
  // Its prompt-tail boundaries (KVCacheManagerOptions::prompt_tail_tokens): every length in
  // [first, second] is one; (0, 0) when none.
  std::pair<std::uint64_t, std::uint64_t> prompt_tail(RequestId r) const;

 private:
  const KVCacheManager& kv_;
};

}  // namespace kvmm::testing
