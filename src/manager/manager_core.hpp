// ManagerCore (private to src/manager/): KVCacheManager's state and its calls, composed of
// the units named after what they are:
//   group.hpp          a layer group: policy, allocator, page tables, page records
//   request_table.hpp  requests and their generation-checked handles
//   page_store.hpp     page states and eviction lists (the prefix cache's memory)
//   allocation.hpp     Jenga §5.4's steps and the all-or-nothing check that replays them
//   prefix_lookup.hpp  the longest valid hit, and pinning it at admission
//   prefetch.hpp       every prefetch strategy, behind KVMM_PREFETCH
//   event_log.hpp      page events and a router's KV events
//   retention.hpp      cache boundaries: pages held for later hits, learned branch points
// Its calls are split by concept over core.cpp (requests: add, lookup, allocate, commit,
// fork, free, reset, pins), tier_hits.cpp (hits from a shared tier, called by
// TierAdmission in tier_admission.cpp), host_tier.cpp
// (swap), step.cpp (a step's batch: the several-group incremental export, decode_step),
// stats.cpp and invariants.cpp.
#pragma once

#include "allocation.hpp"
#include "event_log.hpp"
#include "group.hpp"
#include "kvmm/caching/prefix_index.hpp"
#include "kvmm/checked.hpp"
#include "kvmm/detail/debug_checks.hpp"
#include "kvmm/manager/kv_cache_manager.hpp"
#include "page_store.hpp"
#include "prefix_lookup.hpp"
#include "request_table.hpp"
#include "retention.hpp"

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

  // ---- requests (core.cpp)
  RequestId add_request(std::span<const std::uint32_t> tokens, const RequestExtras& extras);
  void append_tokens(RequestId r, std::span<const std::uint32_t> tokens);
  void set_priority(RequestId r, std::uint32_t priority);
  std::uint64_t lookup_prefix(RequestId r);
  AllocateResult allocate(RequestId r, std::uint32_t num_new_tokens, std::uint32_t lookahead) {
    return allocate_at(r, running(r), num_new_tokens, lookahead);
  }
  void commit(RequestId r, std::uint64_t num_computed_tokens) { commit_at(r, running(r), num_computed_tokens); }
  bool would_allocate(RequestId r, std::uint32_t num_new_tokens, std::uint32_t lookahead);  // would_allocate.cpp
  // allocate and commit of r at its row s = running(r) (decode_step resolves rows once).
  AllocateResult allocate_at(RequestId r, std::uint32_t s, std::uint32_t num_new_tokens, std::uint32_t lookahead);
  void commit_at(RequestId r, std::uint32_t s, std::uint64_t num_computed_tokens);
  void check_commit_at(RequestId r, std::uint32_t s, std::uint64_t num_computed_tokens) const;
  void check_commit(RequestId r, std::uint64_t n) const { check_commit_at(r, running(r), n); }
  RequestId fork(RequestId parent);
  void free(RequestId r);
  void reset(RequestId r);
  PinId pin_prefix(RequestId r);
  void unpin(PinId pin);
  void reset_prefix_cache();
  void set_policy(GroupId g, std::unique_ptr<LayerPolicy> policy);
  const LayerPolicy& policy(GroupId g) const;
  bool cached_image(const MultimodalItem& m, std::uint32_t lora) const {
    if (m.length == 0) fail("item.length = 0: must be >= 1");
    return options_.prefix_caching && lookup_.image_cached(m, lora, hasher_);
  }
  bool image_from_cache(RequestId r, std::uint32_t item) const {
    const Request& q = req(r);
    if (item >= q.ids.items().size()) fail("item = {}: request {} has {} images", item, r, q.ids.items().size());
    return item < q.item_cached.size() && q.item_cached[item] != 0;
  }
  // Pages a pool over a source kept backed during the last step (freed ones a swap-out
  // plan may still read, reserved ones not taken) go back to the source here.
  std::uint64_t begin_step() {
    copies_.clear();
    pool_.release_kept();
    return ++step_;
  }
  // ---- hits from a shared tier (tier_hits.cpp)
  std::size_t tier_candidates(RequestId r, std::vector<TierKey>& out);
  std::uint64_t extend_prefix(RequestId r, std::span<const TierStatus> present);
  std::uint64_t finish_loads(RequestId r, std::span<const TierStatus> statuses);
  std::span<const BlockHash> block_hashes(RequestId r, GroupId g) const;
  // ---- swapping (host_tier.cpp)
  std::optional<std::span<const PageCopy>> swap_out(RequestId r);
  std::optional<std::span<const PageCopy>> swap_in(RequestId r);
  // ---- kernel exports (stats.cpp)
  std::uint64_t kv_len(RequestId r, GroupId g) const;
  // The rows and kv lengths of a batch, into scratch; the PageTableSet options for them.
  ExportOptions export_options(GroupId g, std::span<const RequestId> batch, const KernelExportOptions& o) const;
  std::span<const RequestId> export_rows() const { return export_rows_; }
  // ---- a step's incremental exports and the fused decode step (step.cpp)
  std::size_t export_incremental(std::span<const RequestId> batch, std::span<const BlockTableOut> tables,
                                 std::uint32_t max_pages, const KernelExportOptions& o);
  std::size_t decode_step(std::span<const RequestId> batch, std::span<const std::uint32_t> tokens,
                          std::span<const BlockTableOut> tables, std::uint32_t max_pages, const KernelExportOptions& o);
  // ---- stats (stats.cpp) and checks (invariants.cpp)
  CacheStats stats() const;
  ManagerCounters counters() const;
  void check_invariants() const;
  void take_events(std::vector<CacheEvent>& out) { events_.take(out); }
  void take_events(KvEventBatch& out) { events_.take(out); }

  // ---- queries
  const KVLayout& layout() const { return layout_; }
  std::uint64_t step() const { return step_; }
  std::span<const PageCopy> copies() const { return copies_; }
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
  std::uint32_t running(RequestId r) const;
  // ---- core.cpp helpers
  void build_encoder_rows(std::uint32_t s, const Request& q);
  std::uint64_t encoder_misses(std::uint32_t s, const Request& q, GroupId g) const;
  bool compute_need(std::uint32_t s, const Request& q, std::uint32_t num_new_tokens, std::uint64_t target);
  void take_pages(std::uint32_t s, Request& q);
  bool admit(RequestId r, std::uint32_t s, Request& q);
  void release_unpinned_hit(std::uint32_t s, Request& q);
  void release_admission_pins(std::uint32_t s, Request& q);
  bool pin_cached_images(std::uint32_t s, Request& q);
  void give_back_admission(std::uint32_t s, Request& q, bool pinning, bool images);
  AllocateResult refused(RequestId r, const Request& q, std::uint32_t num_new_tokens);  // counts, logs; kNoMemory
  bool refused_before_pin(RequestId r, const Request& q);
  void begin_backing(std::uint32_t s);  // with a large-page source: backs what the step may take
  void check_refusal(RequestId r, std::uint32_t s, Request& q, std::uint32_t num_new_tokens, std::uint64_t target);
  void check_shared_write(RequestId r, std::uint32_t s, const Request& q, std::uint64_t c) const;
  void register_full_pages(std::uint32_t s, Request& q, std::uint64_t c);
  void release_out_of_window(std::uint32_t s, Request& q, std::uint64_t c0, std::uint64_t c);
  void commit_images(std::uint32_t s, Request& q, std::uint64_t c);
  void release_rows(std::uint32_t s, Request& q);
  void release_all(std::uint32_t s, Request& q);
  void clear_progress(Request& q);
  // ---- tier_hits.cpp helpers
  bool admit_tier(RequestId r, std::uint32_t s, Request& q);
  void fill_tier_pages(std::uint32_t s, Request& q, GroupId g);
  void start_loads(RequestId r, std::uint32_t s, Request& q);
  std::uint64_t finish_loads_at(RequestId r, std::uint32_t s, Request& q, std::span<const TierStatus> statuses);
  std::uint64_t servable_prefix(std::uint32_t s, std::uint64_t p) const;
  [[noreturn, gnu::cold]] static void loading_error(RequestId r, const char* call);
  // ---- boundary-aware retention (requests.cpp)
  void set_boundaries(Request& q, std::span<const std::uint64_t> hinted, std::uint64_t prompt);
  void learn_at_admission(Request& q);
  void learn_on_register(Request& q, const BlockHash* hv, std::uint64_t from, std::uint64_t full);
  void release_held(Request& q);
  void drop_tail(Request& q);
  void update_anchor();
  // The engine's log callback, if any: formats only then.
  template <class... Args>
  void log(LogLevel level, fmt::format_string<Args...> f, Args&&... args) const {
    if (options_.log) [[unlikely]]
      options_.log(level, fmt::format(f, std::forward<Args>(args)...));
  }
  void expensive_check() const {
    if constexpr (kCheckExpensive) check_invariants();
  }
  // ---- step.cpp helpers
  std::uint64_t kv_len_at(std::uint32_t s, GroupId g) const;  // kv_len of row s (g checked)
  void check_block_tables(std::size_t batch, std::span<const BlockTableOut> tables, std::uint32_t max_pages) const;
  // export_incremental of the batch whose rows export_rows_ holds (resolved and checked).
  std::size_t export_rows_incremental(std::span<const BlockTableOut> tables, std::uint32_t max_pages,
                                      const KernelExportOptions& o);
  // ---- invariants.cpp helpers
  void check_tables(GroupId g, std::vector<std::uint32_t>& refs) const;

  KVLayout layout_;
  KVCacheManagerOptions options_;
  BlockHasher hasher_;  // options_.block_hash, checked
  LargePagePool pool_;
  LargePagePool host_pool_;
  std::vector<Group> groups_;
  std::vector<std::uint32_t> class_tokens_;  // tokens per page of each hash class
  PrefixIndex index_;
  EventLog events_;
  PageStore store_;
  PageAllocation alloc_;
  PrefixLookup lookup_;
  RequestTable reqs_;
  std::uint64_t step_ = 0;
  std::uint64_t rng_;
  std::vector<PageCopy> copies_;
  BranchPoints branches_;
  GroupId anchor_ = kNoGroup;  // the first whole-prefix decoder group: learned points use its hashes
  std::vector<PageCopy> plan_;
  std::vector<std::vector<std::pair<GroupId, PageId>>> pins_;
  std::vector<PinId> free_pins_;
  std::vector<std::uint64_t> need_;     // scratch per group: pages allocate needs
  std::vector<std::uint8_t> cow_;       // scratch per group: a copy-on-write copy first
  std::uint64_t target_ = 0;            // scratch: the tokens allocate's pages cover
  std::vector<std::uint64_t> leaving_;  // scratch per group: evictable pages a pin would take
  std::uint64_t lookups_ = 0, lookup_tokens_ = 0, hit_tokens_ = 0;
  ManagerCounters counts_;                      // the counters not kept elsewhere (admissions, refusals, copies, swaps)
  mutable std::vector<RequestId> export_rows_;  // scratch of the kernel exports
  mutable std::vector<std::uint64_t> export_lens_;
  std::vector<std::uint64_t> export_enc_lens_;  // scratch of an encoder group's kv lengths
};

}  // namespace kvmm::detail
