// ManagerCore (private to src/manager/): KVCacheManager's state, and the units that act on
// it, one per operation. The coordinator itself only builds the parts, resolves handles to
// rows, and answers queries; each call of the facade goes to the unit named for it:
//   admission.hpp           lookup_prefix, allocate, would_allocate
//   lifecycle.hpp           add_request, commit, fork, free, reset, prefix pins
//   image_rows.hpp          a request's images in the encoder-token groups
//   boundary_retention.hpp  pages held past a window for later hits (retention.hpp: rules)
//   tier_hits.hpp           hits from a shared tier (TierAdmission's calls)
//   swap.hpp                swap_out and swap_in, with the host pool's rows
//   exports.hpp             kv lengths, kernel exports, the fused decode step
//   miss_reasons.hpp        why a lookup's hit stopped (issue 34), per group
//   draft_groups.hpp        speculative decoding's draft groups: successor keys, draft hits
//   verified_states.hpp     recurrent-state checkpoints cached only when tagged verified
// and the parts they share:
//   request.hpp             a request's Phase and sub-records; request_table.hpp: rows and handles
//   rows.hpp                the one writer of device rows and their pages' references
//   group.hpp               a layer group: policy, allocator, page tables, page records
//   page_store.hpp          page states and eviction lists (the prefix cache's memory)
//   allocation.hpp          Jenga §5.4's steps and the all-or-nothing check that replays them
//   prefix_lookup.hpp       the longest valid hit (writes nothing); hit_pins.hpp adopts it
//   prefetch.hpp            every prefetch strategy, behind KVMM_PREFETCH
//   event_log.hpp           page events and a router's KV events
// stats.cpp and invariants.cpp: the counters and the full check.
#pragma once

#include "admission.hpp"
#include "allocation.hpp"
#include "boundary_retention.hpp"
#include "draft_groups.hpp"
#include "event_log.hpp"
#include "exports.hpp"
#include "group.hpp"
#include "hit_pins.hpp"
#include "image_rows.hpp"
#include "key_table.hpp"
#include "kvmm/caching/prefix_index.hpp"
#include "kvmm/checked.hpp"
#include "kvmm/detail/debug_checks.hpp"
#include "kvmm/manager/kv_cache_manager.hpp"
#include "lifecycle.hpp"
#include "miss_reasons.hpp"
#include "page_store.hpp"
#include "partial_hits.hpp"
#include "prefix_lookup.hpp"
#include "request_table.hpp"
#include "retention.hpp"
#include "rows.hpp"
#include "swap.hpp"
#include "tier_hits.hpp"
#include "verified_states.hpp"

#include <fmt/format.h>

#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

namespace kvmm::detail {

class ManagerCore {
 public:
  ManagerCore(KVLayout layout, const KVCacheManagerOptions& options);
  ManagerCore(const ManagerCore&) = delete;
  ManagerCore& operator=(const ManagerCore&) = delete;

  void set_policy(GroupId g, std::unique_ptr<LayerPolicy> policy);
  const LayerPolicy& policy(GroupId g) const;
  // Pages a pool over a source kept backed during the last step (freed ones a swap-out
  // plan may still read, reserved ones not taken) go back to the source here.
  std::uint64_t begin_step() {
    copies_.clear();
    drop_partial_sources();
    pool_.release_kept();
    return ++step_;
  }
  std::span<const BlockHash> block_hashes(RequestId r, GroupId g) const;
  // ---- stats (stats.cpp) and checks (invariants.cpp)
  CacheStats stats() const;
  ManagerCounters counters() const;
  const LookupReport& lookup_report(RequestId r) const;
  void check_invariants() const;
  void take_events(std::vector<CacheEvent>& out) { events_.take(out); }
  void take_events(KvEventBatch& out) { events_.take(out); }

  // ---- queries
  const KVLayout& layout() const { return layout_; }
  std::uint64_t step() const { return step_; }
  std::span<const PageCopy> copies() const { return copies_; }
  // Cached pages held as this step's partial-hit copy sources (hit_unit), as (group, page).
  std::span<const std::pair<GroupId, PageId>> partial_sources() const { return partial_holds_; }
  const RequestTable& requests() const { return reqs_; }
  const Request& req(RequestId r) const { return reqs_[reqs_.row(r)]; }
  GroupId check_group(GroupId g) const {
    if (g >= groups_.size()) fail("group = {}: layout has {} groups", g, groups_.size());
    return g;
  }
  const Group& group(GroupId g) const { return groups_[check_group(g)]; }
  PageId check_page(GroupId g, PageId p) const {
    if (p >= group(g).pg.size()) fail("page = {}: group {} has {} small pages", p, g, group(g).pg.size());
    return p;
  }
  const LargePagePool& large_pages() const { return pool_; }
  const PageStore& store() const { return store_; }

 private:
  friend class Admission;
  friend class ImageRows;
  friend class Lifecycle;
  friend class BoundaryRetention;
  friend class TierHits;
  friend class Swap;
  friend class Exports;
  friend class MissReasons;
  friend class DraftGroups;
  friend class VerifiedStates;

  static KVLayout validated(KVLayout layout, const KVCacheManagerOptions& options);
  static std::uint64_t pages_for(std::uint64_t tokens, std::uint32_t P) { return ceil_div(tokens, P); }
  // The per-image random prefix lengths (splitmix64 over the options' seed).
  std::uint64_t next_rank() {
    std::uint64_t z = (rng_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return (z ^ (z >> 31)) >> 1;
  }
  // The row of an active, not swapped-out request.
  Row running(RequestId r) const;
  [[noreturn, gnu::cold]] static void loading_error(RequestId r, const char* call);
  // The engine's log callback, if any: formats only then.
  template <class... Args>
  void log(LogLevel level, fmt::format_string<Args...> f, Args&&... args) const {
    if (options_.log) [[unlikely]]
      options_.log(level, fmt::format(f, std::forward<Args>(args)...));
  }
  void expensive_check() const {
    if constexpr (kCheckExpensive) check_invariants();
  }
  void check_tables(GroupId g, std::vector<std::uint32_t>& refs) const;  // invariants.cpp

  // ---- the state the units share
  KVLayout layout_;
  KVCacheManagerOptions options_;
  BlockHasher hasher_;  // options_.block_hash, checked
  LargePagePool pool_;
  std::vector<Group> groups_;
  std::vector<std::uint32_t> class_tokens_;  // tokens per page of each hash class
  PrefixIndex index_;
  EventLog events_;
  PageStore store_;
  PageAllocation alloc_;
  PrefixLookup lookup_;
  Rows rows_;  // the one writer of device rows and their pages' references
  HitPins hit_pins_;
  RequestTable reqs_;
  std::uint64_t step_ = 0;
  std::uint64_t rng_;
  std::vector<PageCopy> copies_;
  PartialHits partial_;  // hits inside a page (options_.hit_unit)
  // Cached pages a partial hit copies from this step (one reference each until the next
  // begin_step, so the copy reads them intact).
  std::vector<std::pair<GroupId, PageId>> partial_holds_;
  void drop_partial_sources();
  BranchPoints branches_;
  SuffixLengths suffixes_;     // the adaptive prompt tail (options_.learned_tail_tokens)
  BranchPoints ends_;          // where finished requests' cached pages end (their last full page's hash)
  KeyTable plain_first_;       // miss reasons: a first page's plain key -> the keyed one it was cached under
  GroupId anchor_ = kNoGroup;  // the first whole-prefix decoder group: learned points use its hashes
  std::vector<PageCopy> plan_;
  std::vector<std::vector<std::pair<GroupId, PageId>>> pins_;
  std::vector<PinId> free_pins_;
  std::vector<std::uint64_t> need_;     // scratch per group: pages allocate (or swap) needs
  std::vector<std::uint8_t> cow_;       // scratch per group: a copy-on-write copy first
  std::uint64_t target_ = 0;            // scratch: the tokens allocate's pages cover
  std::vector<std::uint64_t> leaving_;  // scratch per group: evictable pages a pin would take
  std::uint64_t lookups_ = 0, lookup_tokens_ = 0, hit_tokens_ = 0;
  ManagerCounters counts_;                // the counters not kept elsewhere (admissions, refusals, copies, swaps)
  mutable std::vector<Row> export_rows_;  // scratch of the kernel exports
  mutable std::vector<std::uint64_t> export_lens_;
  std::vector<std::uint64_t> export_enc_lens_;  // scratch of an encoder group's kv lengths

 public:
  // ---- the units, one per operation (each holds a reference to this core)
  Admission admission{*this};
  Lifecycle lifecycle{*this};
  ImageRows images{*this};
  BoundaryRetention retention{*this};
  TierHits tier{*this};
  Swap swap{*this};
  Exports exports{*this};
  MissReasons misses{*this};
  DraftGroups drafts{*this};
  VerifiedStates verified{*this};
};

}  // namespace kvmm::detail
