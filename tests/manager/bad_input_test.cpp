// Bad input never corrupts the manager (issue 14): a seeded random driver (the fuzz target
// CI runs) of valid calls with a bad call mixed in at random. Each bad call must raise
// kvmm::Error naming the argument at fault, leave check_invariants() holding and every
// observable (counts, requests, rows) as it was; at the end the manager still serves a
// request end to end.
#include "kvmm/error.hpp"
#include "kvmm/manager/kv_cache_manager.hpp"
#include "kvmm/testing/manager_inspector.hpp"

#include <catch2/catch.hpp>

#include <cstdlib>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

using namespace kvmm;

namespace {

struct Snapshot {
  std::uint32_t active = 0, free_large = 0;
  std::vector<std::uint64_t> counts;  // per group: used, evictable, evicted
  std::vector<std::uint64_t> reqs;    // per live handle: computed, allocated, tokens, swapped
  std::vector<std::vector<PageId>> rows;
  bool operator==(const Snapshot&) const = default;
};

Snapshot snap(const KVCacheManager& kv, const std::vector<RequestId>& live) {
  Snapshot s;
  s.active = kv.num_active();
  s.free_large = kv.large_pages().num_free();
  for (GroupId g = 0; g < kv.layout().num_groups(); ++g)
    s.counts.insert(s.counts.end(), {kv.page_counts(g).used, kv.page_counts(g).evictable, kv.page_counts(g).evicted});
  for (RequestId r : live) {
    s.reqs.insert(s.reqs.end(), {kv.num_computed(r), kv.num_allocated(r), kv.num_tokens(r), kv.is_swapped(r)});
    for (GroupId g = 0; g < kv.layout().num_groups(); ++g) {
      s.rows.emplace_back(kv.page_table(r, g).begin(), kv.page_table(r, g).end());
      s.rows.emplace_back(kvmm::testing::ManagerInspector(kv).host_page_table(r, g).begin(),
                          kvmm::testing::ManagerInspector(kv).host_page_table(r, g).end());
    }
  }
  return s;
}

std::vector<std::uint32_t> prompt(std::mt19937_64& rng, std::size_t n) {
  std::vector<std::uint32_t> t(n);
  for (auto& x : t) x = static_cast<std::uint32_t>(rng() % 4);  // few ids: prefixes repeat
  return t;
}

}  // namespace

TEST_CASE("bad calls mixed into random traffic raise, name the argument and change nothing", "[manager][bad]") {
  const KVLayout layout = KVLayout::plan(
      {LayerGroup::full_attention("full", 1, 1, 8, 2, 4), LayerGroup::sliding_window("sw", 1, 1, 8, 2, 4, 8)});
  KVCacheManager kv(layout, {.num_large_pages = 48, .num_host_large_pages = 16, .max_requests = 8});
  // CI runs 20,000 operations of seed 14; KVMM_FUZZ_OPS / KVMM_FUZZ_SEED run longer drivers
  // (docs/results/reliability.md).
  const auto env = [](const char* name, std::uint64_t fallback) {
    const char* v = std::getenv(name);
    return v != nullptr ? std::strtoull(v, nullptr, 10) : fallback;
  };
  const std::uint64_t num_ops = env("KVMM_FUZZ_OPS", 20000);
  std::mt19937_64 rng(env("KVMM_FUZZ_SEED", 14));
  std::vector<RequestId> live;
  std::vector<RequestId> stale;          // freed handles
  std::vector<std::uint64_t> ids_known;  // per live request: ids given so far
  std::uint64_t bad_calls = 0, served = 0, lost_hits = 0;
  auto pick = [&] { return live[rng() % live.size()]; };
  std::set<RequestId> pending;  // looked up, hit not pinned by an allocate yet
  auto drop = [&](std::size_t k) {
    pending.erase(live[k]);
    stale.push_back(live[k]);
    live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
  };
  // Each bad call: the call, and a text its message must contain.
  using Bad = std::pair<std::function<void()>, std::string>;
  for (std::uint64_t op = 0; op < num_ops; ++op) {
    kv.begin_step();
    if (rng() % 3 == 0) {  // a bad call
      std::vector<Bad> bad;
      const MultimodalItem past{hash_bytes(std::as_bytes(std::span("x", 1))), 2, 64};
      if (live.size() < 8) {
        bad.push_back({[&] { kv.add_request(prompt(rng, 9), {.items = std::span(&past, 1)}); }, "extras.items[0]"});
        bad.push_back(
            {[&] { kv.add_request(prompt(rng, 9), {.max_tokens = std::uint64_t{1} << 40}); }, "extras.max_tokens"});
      } else {
        bad.push_back({[&] { kv.add_request(prompt(rng, 9)); }, "raise KVCacheManagerOptions::max_requests"});
      }
      bad.push_back({[&] { kv.unpin(1000 + static_cast<PinId>(rng() % 10)); }, "pin = 10"});
      if (!live.empty()) bad.push_back({[&] { kv.page_table(pick(), 7); }, "group = 7"});
      if (!stale.empty()) {
        const RequestId s = stale[rng() % stale.size()];
        const std::string name = "request = " + std::to_string(s);
        bad.push_back({[&, s] { kv.free(s); }, name});
        bad.push_back({[&, s] { kv.allocate(s, 1); }, name});
        bad.push_back({[&, s] { kv.commit(s, 1); }, name});
        bad.push_back({[&, s] { kv.fork(s); }, name});
        bad.push_back({[&, s] { kv.append_token(s, 1); }, name});
        bad.push_back({[&, s] { kv.set_priority(s, 1); }, name});
      }
      if (!live.empty()) {
        const RequestId r = pick();
        if (!kv.is_swapped(r)) {
          bad.push_back({[&, r] { kv.commit(r, kv.num_allocated(r) + 1 + rng() % 5); }, "num_computed_tokens"});
          bad.push_back({[&, r] { kv.allocate(r, ~0u, ~0u); }, "num_new_tokens"});
          bad.push_back({[&, r] { kv.swap_in(r); }, "not swapped out"});
          if (kv.num_computed(r) > 0) bad.push_back({[&, r] { kv.commit(r, kv.num_computed(r) - 1); }, "already has"});
          if (kv.num_allocated(r) > 0) bad.push_back({[&, r] { kv.lookup_prefix(r); }, "lookup_prefix must come once"});
          if (pending.count(r)) {  // no pages yet: nothing to commit, copy or swap
            const std::string before_pin = "before the allocate that pins";
            bad.push_back({[&, r] { kv.commit(r, kv.num_computed(r)); }, before_pin});
            if (live.size() < 8) bad.push_back({[&, r] { kv.fork(r); }, before_pin});
            bad.push_back({[&, r] { kv.swap_out(r); }, before_pin});
          }
        } else {
          bad.push_back({[&, r] { kv.commit(r, 0); }, "swapped out"});
          bad.push_back({[&, r] { kv.fork(r); }, "swapped out"});
        }
        bad.push_back({[&] { kv.set_policy(0, make_policy(layout.group(0))); }, "requests are active"});
      }
      const Bad& b = bad[rng() % bad.size()];
      const Snapshot before = snap(kv, live);
      REQUIRE_THROWS_WITH(b.first(), Catch::Contains(b.second));
      REQUIRE(snap(kv, live) == before);
      kv.check_invariants();
      ++bad_calls;
      continue;
    }
    // Valid traffic: add + lookup, steps, fork, swap, reset, free.
    const std::uint64_t what = rng() % 10;
    if ((what < 3 || live.empty()) && live.size() < 8) {
      const RequestId r = kv.add_request(prompt(rng, 4 + rng() % 40));
      const std::uint64_t hit = kv.lookup_prefix(r);
      // Admitted at once (lookup_prefix is pure; the first allocate pins the hit), or
      // reset when refused, as a scheduler does; or left pending for a later allocate.
      if (rng() % 4 != 0) {
        if (!kv.allocate(r, 0)) kv.reset(r);
      } else if (hit > 0) {
        pending.insert(r);
      }
      live.push_back(r);
      continue;
    }
    if (live.empty()) continue;
    const std::size_t k = rng() % live.size();
    const RequestId r = live[k];
    if (kv.is_swapped(r)) {
      if (!kv.swap_in(r)) {
        kv.free(r);
        drop(k);
      }
    } else if (what < 7) {
      const std::uint64_t c = kv.num_computed(r);
      const std::uint32_t n = 1 + static_cast<std::uint32_t>(rng() % 12);
      if (c + n > kv.num_tokens(r)) kv.append_tokens(r, prompt(rng, c + n - kv.num_tokens(r)));
      const std::uint64_t lost_before = kv.counters().lost_hits;
      const AllocateResult ok = kv.allocate(r, n);
      REQUIRE((kv.counters().lost_hits - lost_before == 1) == (ok.kind == AllocateStatus::kHitLost));
      if (ok.kind == AllocateStatus::kHitLost) {
        // A hit left unpinned since lookup_prefix lost a page to other requests: the
        // allocate changed nothing and says so; the scheduler starts the request over.
        REQUIRE(pending.count(r) > 0);
        kv.check_invariants();
        ++lost_hits;
        kv.reset(r);
        pending.erase(r);
        continue;
      }
      if (ok)
        kv.commit(r, c + n);
      else if (pending.count(r) || !kv.swap_out(r))
        kv.reset(r);
      pending.erase(r);
    } else if (what == 7 && live.size() < 8 && kv.num_allocated(r) > 0 && !pending.count(r)) {
      live.push_back(kv.fork(r));
    } else {
      kv.free(r);
      drop(k);
      ++served;
    }
  }
  CHECK(bad_calls > num_ops / 4);
  CHECK(served > num_ops / 60);
  CHECK(lost_hits > 0);
  WARN("ops " << num_ops << " bad calls " << bad_calls << " served " << served << " lost hits " << lost_hits);
  // Still serves: a new request end to end.
  for (RequestId r : live) kv.free(r);
  kv.begin_step();
  const RequestId r = kv.add_request(prompt(rng, 30));
  kv.lookup_prefix(r);
  REQUIRE(kv.allocate(r, 30 - static_cast<std::uint32_t>(kv.num_computed(r))));
  kv.commit(r, 30);
  kv.free(r);
  kv.check_invariants();
}
