// check_commit raises exactly what commit would and changes nothing, so a batch of commits
// (Python's commit_batch, decode_step) is checked whole before any is made (issue 29 item
// 5: a write into a page shared since fork raised part-way through a batch, after earlier
// requests of the batch were committed).
#include "kvmm/manager/kernel_exports.hpp"
#include "kvmm/manager/kv_cache_manager.hpp"

#include <catch2/catch.hpp>

#include <array>
#include <vector>

using namespace kvmm;

namespace {

KVLayout layout() { return KVLayout::plan({LayerGroup::full_attention("full", 1, 1, 8, 2, 4)}); }

std::vector<std::uint32_t> prompt(std::uint32_t first, std::uint32_t n) {
  std::vector<std::uint32_t> t(n);
  for (std::uint32_t i = 0; i < n; ++i) t[i] = first + i;
  return t;
}

}  // namespace

TEST_CASE("check_commit raises what commit raises, and changes nothing", "[manager][commit]") {
  KVCacheManager kv(layout(), {.num_large_pages = 32, .max_requests = 4});
  kv.begin_step();
  const RequestId a = kv.add_request(prompt(0, 6));
  kv.lookup_prefix(a);
  REQUIRE(kv.allocate(a, 6));
  kv.commit(a, 6);
  kv.append_token(a, 100);
  REQUIRE(kv.allocate(a, 1));  // scheduled before the fork: no copy planned for page 1
  const RequestId child = kv.fork(a);
  (void)child;
  // commit(a, 7) writes token 6 into page 1, now shared with the child.
  CHECK_THROWS_WITH(kv.check_commit(a, 7), Catch::Contains("shared since fork"));
  CHECK_THROWS_WITH(kv.commit(a, 7), Catch::Contains("shared since fork"));
  CHECK_THROWS_WITH(kv.check_commit(a, 9), Catch::Contains("has pages for 7 tokens only"));
  CHECK_THROWS_WITH(kv.check_commit(a, 5), Catch::Contains("already has 6 computed"));
  kv.check_commit(a, 6);  // nothing to write: fine
  CHECK(kv.num_computed(a) == 6);
  kv.check_invariants();
}

TEST_CASE("decode_step checks every commit before it makes one", "[manager][commit][decode-step]") {
  KVCacheManager kv(layout(), {.num_large_pages = 32, .max_requests = 4});
  kv.begin_step();
  const RequestId x = kv.add_request(prompt(500, 5));
  kv.lookup_prefix(x);
  REQUIRE(kv.allocate(x, 5));
  kv.commit(x, 4);  // its last allocate scheduled 5: decode_step commits the fifth
  const RequestId a = kv.add_request(prompt(0, 6));
  kv.lookup_prefix(a);
  REQUIRE(kv.allocate(a, 6));
  kv.commit(a, 6);
  kv.append_token(a, 100);
  REQUIRE(kv.allocate(a, 1));
  kv.fork(a);  // between a's allocate and its commit: the partial page is shared unplanned
  const std::array<RequestId, 2> batch{x, a};
  const std::array<std::uint32_t, 2> tokens{7, 8};
  std::vector<std::int32_t> table(2 * 8, -1);
  const std::array<BlockTableOut, 1> tables{BlockTableOut{0, table}};
  const std::vector<PageId> x_row(kv.page_table(x, 0).begin(), kv.page_table(x, 0).end());
  CHECK_THROWS_WITH(KernelExports(kv).decode_step(batch, tokens, tables, 8), Catch::Contains("shared since fork"));
  CHECK(kv.num_computed(x) == 4);  // x was not committed: the step changed nothing
  CHECK(kv.num_tokens(x) == 5);
  CHECK(std::vector<PageId>(kv.page_table(x, 0).begin(), kv.page_table(x, 0).end()) == x_row);
  CHECK(kv.num_computed(a) == 6);
  kv.check_invariants();
}
