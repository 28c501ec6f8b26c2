// The randomized manager test's driver (randomized_test.cpp and its siblings): a seeded
// sequence of random operations (add, lookup, allocate, commit, fork, copy-on-write,
// eviction, swap out/in, pin, reset, free) on random_model.hpp's layouts, each checked
// against a plain reference model: its own block hashes, its own cached set, hit lengths
// by brute force over every candidate prefix, reference counts and page states recomputed
// from the page tables, evictions only of pages the model holds evictable, all-or-none
// failures. The checks: reference_model.cpp; the operations: random_operations.cpp.
#pragma once

#include "kvmm/manager/kv_cache_manager.hpp"
#include "random_model.hpp"

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <utility>
#include <vector>

namespace kvmm::test {

class Model {
 public:
  Model(std::uint64_t seed, std::uint32_t large_pages, int layout = 0, std::uint32_t learned = 0,
        std::uint32_t tail = 0, const BlockHashOptions& block_hash = {}, bool pack = true, double budget = 0.25,
        RetentionRelease release = RetentionRelease::kOwn);

  void run(int ops);

  std::uint64_t holds = 0, handovers = 0, hits = 0, lookups = 0, evictions = 0, failures = 0, cows = 0, swaps = 0,
                resets = 0, refusals = 0, pressure_releases = 0, over_bound = 0;
  std::array<std::uint64_t, kNumMissReasons> reports{};  // lookups per miss reason
  const KVCacheManager& kv() const { return kv_; }

 private:
  // ---- reference hashes and hits
  bool cached(GroupId g, const std::vector<BlockHash>& h, std::uint64_t i) const;
  std::uint64_t expected_hit(const RefRequest& q) const;
  // ---- reference counts and states, recomputed from the page tables and pins
  void count_refs();
  PageState state(GroupId g, PageId p) const {
    if (refs_[g][p] > 0) return PageState::kUsed;
    return page_hash_[g].count(p) ? PageState::kEvictable : PageState::kEmpty;
  }
  std::uint64_t pages(GroupId g) const { return std::uint64_t{kv_.large_pages().capacity()} * n_[g]; }
  void before_op();
  void forget(GroupId g, PageId p);
  void remember(GroupId g, PageId p, const BlockHash& h);
  // Removed events: only pages the model held evictable before the operation.
  void take_events(bool resetting = false);
  void after_op();
  struct Snap {
    std::map<std::pair<RequestId, GroupId>, std::vector<PageId>> tables;
    std::vector<std::uint32_t> refs;
    std::vector<PageState> states;
    std::uint32_t free_large;
    bool operator==(const Snap&) const = default;
  };
  Snap snap() const;
  std::optional<RequestId> pick(bool swapped);
  // ---- operations
  void op_add(bool always_lookup = false, bool pin = true);
  // A scheduler's refused admission: a lookup (pure), other requests change pages
  // meanwhile (or not), an allocation beyond all memory that changes nothing (the hit is
  // not pinned), reset; the model must match.
  void op_refuse();
  // Preemption by recompute that keeps the request: every page released, ids and hashes
  // kept; a later lookup must hit exactly as a new request with the same ids would.
  void op_reset(RequestId r);
  // The miss report agrees with the lookup: the hit, the limit, every decoder group's own
  // hit at least the hit, the named group's the least of them, kNone exactly at the limit.
  void check_report(RequestId r, std::uint64_t got);
  void lookup(RequestId r, bool pin = true);
  void op_step() {
    if (const auto pr = pick(false)) op_step(*pr);
  }
  void op_step(RequestId r);
  // Pages that left r's tables in its last commit are held iff a boundary (hinted, or
  // learned: the manager's list, which must contain the hinted ones; or, in the window
  // group, any length within the prompt's last tail_ tokens until the request computed
  // tail_ tokens past its prompt, when the pages only the tail held go) needs them.
  void check_held(RequestId r, RefRequest& q);
  // Bytes of the pages the model's requests hold for retention (the manager's bound:
  // budget_). O(held pages).
  std::uint64_t held_bytes() const;
  // After r's allocate: whether it released held pages (retention under pressure: r's own
  // with kOwn, anyone's with kAll, none with kOff). Then those leave the model's holds,
  // and those nothing else used may be evicted (or hand their hash over to a copy) in the
  // allocate's events. O(held pages log + requests).
  bool released_held(RequestId r);
  // After the allocate's events: the released pages still cached are evictable for the
  // rest of the operation (a commit's page with the same content may take one over).
  void settle_released();
  void op_free(RequestId r);
  void op_fork();
  void op_swap_out() {
    if (const auto pr = pick(false)) op_swap_out(*pr);
  }
  void op_swap_out(RequestId r);
  void op_swap_in();
  void op_pin();
  void one_op();

  std::mt19937_64 rng_;
  std::uint64_t tail_;  // prompt_tail_tokens
  BlockHasher hasher_;  // the manager's block_hash, for the model's own chain
  KVCacheManager kv_;
  GroupId ng_ = 3;  // groups of the layout (4 with layout 3's indexer)
  std::uint32_t n_[kMaxGroups];
  std::vector<std::uint32_t> bases_[4];
  std::map<RequestId, RefRequest> reqs_;
  std::map<HashKey, PageId> cached_[kMaxGroups];
  std::map<PageId, BlockHash> page_hash_[kMaxGroups];
  std::set<PageId> evictable_[kMaxGroups];
  std::set<PageId> released_[kMaxGroups];  // held pages released by this operation's allocate
  std::vector<std::uint32_t> refs_[kMaxGroups];
  std::map<PinId, std::vector<std::pair<GroupId, PageId>>> pins_;
  std::map<std::pair<RequestId, GroupId>, std::vector<PageId>> tables_before_;
  std::vector<CacheEvent> events_;
  int op_index_ = 0;
  RequestId last_added_ = 0;
  const char* last_op_ = "";
  std::uint64_t budget_ = 0;                           // KVCacheManagerOptions::retention_budget of the pool's bytes
  RetentionRelease release_ = RetentionRelease::kOwn;  // KVCacheManagerOptions::retention_release
};

}  // namespace kvmm::test
