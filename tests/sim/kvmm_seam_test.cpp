// PagedKVAllocator::free_page (added to the foundation for the first kvmm policy, before it
// moved to KVCacheManager; still public API): it
// frees one out-of-window page into the null page, and its misuse raises kvmm::Error
// naming the argument while leaving the allocator unchanged.
#include "sim_test_util.hpp"

#include "kvmm/error.hpp"
#include "kvmm/paging/kv_allocator.hpp"

#include <catch2/catch.hpp>

TEST_CASE("PagedKVAllocator::free_page frees one page into the null page", "[sim][paging]") {
  kvmm::PagedKVAllocator a(simtest::hybrid_layout(), {.num_large_pages = 8, .max_requests = 4});
  const kvmm::RequestId r = a.add_request();
  REQUIRE(a.append_tokens(r, 12));  // 3 pages in each group
  const kvmm::GroupId sliding = 1;
  const std::uint32_t free_before = a.large_pages().num_free();
  a.free_page(r, sliding, 0);
  CHECK(a.page_tables(sliding).pages(a.row(r))[0] == kvmm::kNullPage);
  CHECK(a.page_tables(sliding).num_pages(a.row(r)) == 3);
  CHECK(a.large_pages().num_free() == free_before + 1);  // sliding pages fill a large page each
  a.check_invariants();
  // Misuse: already null, out of range, inactive request; nothing changes.
  CHECK_THROWS_WITH(a.free_page(r, sliding, 0), Catch::Contains("index = 0") && Catch::Contains("null page"));
  CHECK_THROWS_WITH(a.free_page(r, sliding, 3), Catch::Contains("index = 3"));
  CHECK_THROWS_WITH(a.free_page(r, 5, 1), Catch::Contains("group = 5"));
  CHECK_THROWS_WITH(a.free_page(3, sliding, 1), Catch::Contains("request = 3"));
  CHECK(a.large_pages().num_free() == free_before + 1);
  CHECK(a.page_tables(sliding).pages(a.row(r))[1] != kvmm::kNullPage);
  a.check_invariants();
  // Growing afterwards still works and the freed slot is reused.
  REQUIRE(a.append_tokens(r, 4));
  a.check_invariants();
  a.free_request(r);
  CHECK(a.large_pages().num_free() == 8);
}
