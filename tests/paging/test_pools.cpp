#include <kvmm/paging/large_page_pool.hpp>
#include <kvmm/paging/small_page_allocator.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <set>
#include <vector>

using namespace kvmm;

TEST_CASE("LargePagePool: O(1) ids, exhaustion is a value, misuse is an error") {
  LargePagePool pool(4);
  std::vector<std::uint32_t> got;
  for (int i = 0; i < 4; ++i) got.push_back(pool.allocate(7)->index);
  CHECK(got == std::vector<std::uint32_t>{0, 1, 2, 3});
  CHECK_FALSE(pool.allocate(7).has_value());
  constexpr LargePageId two{2};
  CHECK(pool.owner(two) == 7);
  pool.free(two);
  CHECK(pool.owner(two) == kNoGroup);
  CHECK(pool.num_free() == 1);
  CHECK_THROWS_WITH(pool.free(two), Catch::Contains("large page id = 2") && Catch::Contains("double free"));
  CHECK_THROWS_WITH(pool.free(LargePageId{9}), Catch::Contains("large page id = 9"));
  CHECK(pool.num_free() == 1);          // state unchanged by the failed calls
  CHECK(pool.allocate(1)->index == 2);  // LIFO: the page just freed goes out first
}

TEST_CASE("Jenga Fig. 8: request-aware placement returns whole large pages") {
  // Two requests A and B allocate alternately, 4 small pages per large page, 4 pages
  // each. Interleaved placement mixes them in the same large pages (Fig. 8a), so when A
  // finishes no large page comes back; request-aware placement (Fig. 8b) gives each
  // request its own large page, which returns whole.
  constexpr Row A{0}, B{1};
  for (const Placement placement : {Placement::kInterleaved, Placement::kRequestAware}) {
    LargePagePool pool(4);
    SmallPageAllocator alloc(0, 4, pool, 2, placement);
    std::vector<PageId> a, b;
    for (int i = 0; i < 4; ++i) {
      a.push_back(*alloc.allocate(A));
      b.push_back(*alloc.allocate(B));
    }
    CHECK(pool.num_used() == 2);
    alloc.release_request(A);
    for (PageId p : a) alloc.free(p);
    alloc.check_invariants();
    if (placement == Placement::kInterleaved) {
      CHECK(pool.num_used() == 2);  // no large page returned
    } else {
      CHECK(pool.num_used() == 1);  // A's whole large page returned
      // A's pages were 0..3 (large page 0), B's 4..7 (large page 1).
      CHECK(a == std::vector<PageId>{0, 1, 2, 3});
      CHECK(b == std::vector<PageId>{4, 5, 6, 7});
    }
  }
}

TEST_CASE("SmallPageAllocator: steps 1-3 of Jenga §4.3 in order") {
  LargePagePool pool(2);
  SmallPageAllocator alloc(0, 3, pool, 4);
  const PageId a0 = *alloc.allocate(Row{0});  // step 2: fresh large page 0 for request 0
  CHECK(alloc.associated_row(LargePageId{0}) == Row{0});
  const PageId b0 = *alloc.allocate(Row{1});  // step 2: fresh large page 1 for request 1
  CHECK(alloc.large_page_of(a0) == LargePageId{0});
  CHECK(alloc.large_page_of(b0) == LargePageId{1});
  CHECK(alloc.large_page_of(*alloc.allocate(Row{0})) == LargePageId{0});  // step 1: request 0's own page
  // Request 2 has no large page and the pool is empty: step 3 takes any free slot.
  const PageId c0 = *alloc.allocate(Row{2});
  CHECK(alloc.num_free_small() == 2);
  const PageId c1 = *alloc.allocate(Row{2});
  CHECK(alloc.num_free_small() == 1);
  CHECK(alloc.large_page_of(c0) == LargePageId{1});  // the most recently opened page with room
  CHECK(alloc.large_page_of(c1) == LargePageId{1});
  CHECK(alloc.associated_row(LargePageId{1}) == Row{1});                  // step 3 does not re-associate
  CHECK(alloc.large_page_of(*alloc.allocate(Row{3})) == LargePageId{0});  // the last free slot, in large page 0
  CHECK_FALSE(alloc.allocate(Row{3}).has_value());                        // nothing left anywhere
  alloc.check_invariants();
  // A pool reserve makes step 2 yield to step 3.
  LargePagePool pool2(3);
  SmallPageAllocator x(0, 2, pool2, 4);
  (void)*x.allocate(Row{0});
  CHECK(x.large_page_of(*x.allocate(Row{1}, /*pool_reserve=*/2)) == LargePageId{0});  // reserve kept: step 3
  CHECK(pool2.num_free() == 2);
  CHECK(x.large_page_of(*x.allocate(Row{1}, 2)) == LargePageId{1});  // no free slot left: reserve ignored
  x.check_invariants();
}

TEST_CASE("SmallPageAllocator: misuse raises and changes nothing") {
  LargePagePool pool(2);
  SmallPageAllocator alloc(0, 4, pool, 2);
  const PageId p = *alloc.allocate(Row{0});
  CHECK_THROWS_WITH(alloc.allocate(Row{5}), Catch::Contains("request = 5"));
  alloc.free(p);
  CHECK_THROWS_WITH(alloc.free(p), Catch::Contains("small page id = 0") && Catch::Contains("double free"));
  CHECK_THROWS_WITH(alloc.free(100), Catch::Contains("small page id = 100"));
  CHECK_THROWS_WITH(alloc.release_request(Row{9}), Catch::Contains("request = 9"));
  CHECK(pool.num_free() == 2);
  alloc.check_invariants();
  CHECK_THROWS_WITH(SmallPageAllocator(0, 0, pool, 2), Catch::Contains("pages_per_large = 0"));
}

TEST_CASE("SmallPageAllocator: randomized against a reference model") {
  // Several groups share one pool; after every operation each large page is free xor
  // held by exactly one group, and the allocated sets equal the model's.
  std::mt19937 rng(1234);
  LargePagePool pool(24);
  const std::vector<std::uint32_t> per_large{1, 3, 7, 16};
  std::vector<SmallPageAllocator> allocs;
  for (GroupId g = 0; g < per_large.size(); ++g)
    allocs.emplace_back(g, per_large[g], pool, 8, g % 2 ? Placement::kInterleaved : Placement::kRequestAware);
  std::vector<std::vector<PageId>> held(per_large.size());
  for (int op = 0; op < 60000; ++op) {
    const GroupId g = rng() % per_large.size();
    SmallPageAllocator& a = allocs[g];
    const int kind = static_cast<int>(rng() % 10);
    if (kind < 5) {
      const std::uint32_t used_before = a.num_used_small();
      const std::optional<PageId> p = a.allocate(Row{static_cast<std::uint32_t>(rng() % 8)}, rng() % 3);
      if (p) {
        CHECK(std::find(held[g].begin(), held[g].end(), *p) == held[g].end());
        held[g].push_back(*p);
      } else {
        CHECK(pool.num_free() == 0);
        CHECK(a.num_free_small() == 0);
        CHECK(a.num_used_small() == used_before);
      }
    } else if (kind < 9 && !held[g].empty()) {
      const std::size_t i = rng() % held[g].size();
      a.free(held[g][i]);
      held[g][i] = held[g].back();
      held[g].pop_back();
    } else {
      a.release_request(Row{static_cast<std::uint32_t>(rng() % 8)});
    }
    std::uint32_t large_held = 0;
    for (GroupId h = 0; h < allocs.size(); ++h) {
      allocs[h].check_invariants();
      large_held += allocs[h].num_large_pages();
      REQUIRE(allocs[h].num_used_small() == held[h].size());
      // Every held large page is needed: it holds at least one used small page.
      REQUIRE(allocs[h].num_large_pages() <= allocs[h].num_used_small());
    }
    REQUIRE(large_held + pool.num_free() == pool.capacity());
  }
  for (GroupId g = 0; g < allocs.size(); ++g)
    for (PageId p : held[g]) allocs[g].free(p);
  CHECK(pool.num_free() == pool.capacity());
}
