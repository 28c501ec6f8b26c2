// allocate's result when the looked-up hit was evicted before the allocate that pins it:
// kHitLost, counted, nothing changed, and a reset and a second lookup admit the request.
// Also: the result converts to bool in Catch2's assertions and names its kinds.
#include "kvmm/manager/kv_cache_manager.hpp"

#include <catch2/catch.hpp>

#include <numeric>
#include <vector>

using namespace kvmm;

TEST_CASE("allocate answers kHitLost, changing nothing, when the looked-up hit was evicted", "[manager][lost_hit]") {
  const KVLayout layout = KVLayout::plan({LayerGroup::full_attention("full", 1, 1, 8, 2, 4)});
  KVCacheManager kv(layout, {.num_large_pages = 8, .max_requests = 4, .prompt_tail_tokens = 0});
  const std::uint64_t capacity = 8 * (layout.large_page_bytes() / layout.small_page_bytes(0)) * 4;  // tokens
  std::vector<std::uint32_t> prompt(13);
  std::iota(prompt.begin(), prompt.end(), 1u);
  // A computes the prompt and finishes: its three full pages stay cached.
  const RequestId a = kv.add_request(prompt);
  REQUIRE(kv.lookup_prefix(a) == 0);
  REQUIRE(kv.allocate(a, 13));
  kv.commit(a, 13);
  kv.free(a);
  // B finds them; before B's allocate, C takes the whole pool (evicting them) and leaves.
  const RequestId b = kv.add_request(prompt);
  REQUIRE(kv.lookup_prefix(b) == 12);
  std::vector<std::uint32_t> other(capacity, 7);
  const RequestId c = kv.add_request(other);
  REQUIRE(kv.lookup_prefix(c) == 0);
  const AllocateResult taken = kv.allocate(c, static_cast<std::uint32_t>(capacity));
  REQUIRE(taken);
  CHECK(taken.kind == AllocateStatus::kOk);
  kv.free(c);  // nothing committed: its pages are empty, A's are gone
  const ManagerCounters before = kv.counters();
  const AllocateResult lost = kv.allocate(b, 1);
  CHECK_FALSE(lost);
  REQUIRE(lost.kind == AllocateStatus::kHitLost);
  CHECK(to_string(lost.kind) == "hit_lost");
  CHECK(kv.counters().lost_hits == before.lost_hits + 1);
  CHECK(kv.counters().refused_allocations == before.refused_allocations);
  CHECK(kv.num_allocated(b) == 12);  // as lookup_prefix left it
  CHECK(kv.page_counts(0).used == 0);
  kv.check_invariants();
  // The engine resets and looks up again: nothing is cached now, the allocate admits.
  kv.reset(b);
  REQUIRE(kv.lookup_prefix(b) == 0);
  const AllocateResult ok = kv.allocate(b, 13);
  REQUIRE(ok);
  CHECK(ok == AllocateResult{});
  kv.commit(b, 13);
  kv.check_invariants();
}

TEST_CASE("allocate answers kNoMemory when refused", "[manager][lost_hit]") {
  const KVLayout layout = KVLayout::plan({LayerGroup::full_attention("full", 1, 1, 8, 2, 4)});
  KVCacheManager kv(layout, {.num_large_pages = 1, .max_requests = 4});
  const std::uint64_t capacity = (layout.large_page_bytes() / layout.small_page_bytes(0)) * 4;
  const RequestId r = kv.add_request(std::vector<std::uint32_t>(capacity + 4, 3));
  kv.lookup_prefix(r);
  const AllocateResult refused = kv.allocate(r, static_cast<std::uint32_t>(capacity + 4));
  CHECK_FALSE(refused);
  CHECK(refused.kind == AllocateStatus::kNoMemory);
  CHECK(to_string(refused.kind) == "no_memory");
  CHECK(kv.counters().lost_hits == 0);
  CHECK(kv.num_allocated(r) == 0);
  REQUIRE(kv.allocate(r, static_cast<std::uint32_t>(capacity)));
  kv.check_invariants();
}
