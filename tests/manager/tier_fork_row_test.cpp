// A forked request takes a recycled request row: it must not inherit the tier state of the
// row's previous request (found by the mini engine: a request freed after extend_prefix,
// before its allocate, left its row with a pending tier hit that the next fork's first
// allocate then "admitted", making the running child a loading request).
#include "kvmm/manager/kv_cache_manager.hpp"
#include "kvmm/manager/tier_admission.hpp"

#include <catch2/catch.hpp>

#include <numeric>
#include <vector>

using namespace kvmm;

TEST_CASE("fork: the child's row carries no tier state of the row's previous request") {
  KVCacheManager kv(KVLayout::plan({LayerGroup::full_attention("full", 1, 1, 8, 2, 4)}),
                    {.num_large_pages = 64, .max_requests = 4});
  TierAdmission adm(kv);
  std::vector<std::uint32_t> prompt(13);
  std::iota(prompt.begin(), prompt.end(), 1u);
  std::vector<std::uint32_t> other(prompt.size(), 7);
  const RequestId b = kv.add_request(other);  // row 0; A takes row 1
  // A: a tier hit extended past its (empty) local hit, then freed before its allocate.
  const RequestId a = kv.add_request(prompt);
  REQUIRE(kv.lookup_prefix(a) == 0);
  std::vector<TierKey> keys;
  REQUIRE(adm.tier_candidates(a, keys) == 3);
  const std::vector<TierStatus> present(keys.size(), TierStatus::kOk);
  REQUIRE(adm.extend_prefix(a, present) == 12);
  kv.free(a);
  // B: computed from scratch, then forked: the child takes A's old row.
  REQUIRE(kv.lookup_prefix(b) == 0);
  REQUIRE(kv.allocate(b, 13));
  kv.commit(b, 13);
  kv.append_token(b, 5);
  const RequestId c = kv.fork(b);
  REQUIRE(kv.allocate(c, 1));
  CHECK_FALSE(adm.is_loading(c));
  CHECK(adm.tier_loads(c).empty());
  CHECK(kv.num_computed(c) == 13);
  kv.commit(c, 14);
  kv.check_invariants();
}
