// KVCacheManager over a request's life: lazy pinning, step 6's reclaim, hits never
// admitted, refused admissions, and reset (split from manager_test.cpp).
#include "fig10_support.hpp"
#include "kvmm/manager/kv_cache_manager.hpp"
#include "kvmm/testing/manager_inspector.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <vector>

using namespace kvmm;
using namespace kvmm::test;

TEST_CASE("lazy pinning: hit pages stay listed but are skipped, dropped and re-queued", "[manager][pin][lazy]") {
  // One full-attention group of 1-token pages: one small page per large page.
  const KVLayout layout = KVLayout::plan({LayerGroup::full_attention("full", 1, 1, 8, 2, 1)});
  REQUIRE(layout.small_pages_per_large_page(0) == 1);
  KVCacheManager kv(layout, {.num_large_pages = 6, .max_requests = 4, .record_events = true});
  std::vector<CacheEvent> events;
  auto removed = [&] {  // pages of the kRemoved events since the last call, in order
    kv.take_events(events);
    std::vector<PageId> out;
    for (const CacheEvent& e : events)
      if (e.kind == CacheEventKind::kRemoved) out.push_back(e.page);
    return out;
  };
  // Step 1: A B C D cached, all released at step 1; eviction order D C B A.
  kv.begin_step();
  const RequestId r1 = kv.add_request(std::vector<std::uint32_t>{A, B, C, D});
  CHECK(kv.lookup_prefix(r1) == 0);
  REQUIRE(kv.allocate(r1, 4));
  kv.commit(r1, 4);
  const std::vector<PageId> p1(kv.page_table(r1, 0).begin(), kv.page_table(r1, 0).end());
  kv.free(r1);
  CHECK(kvmm::testing::ManagerInspector(kv).next_small_victim(0) == p1[3]);
  // Step 2: A B X hits A B; they are pinned (used) though still in the lists.
  kv.begin_step();
  const RequestId r2 = kv.add_request(std::vector<std::uint32_t>{A, B, X});
  CHECK(kv.lookup_prefix(r2) == 2);
  CHECK(kvmm::testing::ManagerInspector(kv).page_state(0, p1[0]) == PageState::kEvictable);  // pure lookup
  REQUIRE(kv.allocate(r2, 0));                                                               // pins the hit
  CHECK(kvmm::testing::ManagerInspector(kv).page_state(0, p1[0]) == PageState::kUsed);
  CHECK(kvmm::testing::ManagerInspector(kv).page_state(0, p1[1]) == PageState::kUsed);
  CHECK(kv.stats().groups[0].evictable_pages == 2);
  kv.check_invariants();
  REQUIRE(kv.allocate(r2, 1));
  kv.commit(r2, 3);
  const PageId px = kv.page_table(r2, 0)[2];
  CHECK(removed().empty());
  // A new request takes the last empty large page, then evicts D and C; then the fronts
  // of both LRUs are the pinned A and B: skipped and dropped, so allocation fails.
  kv.begin_step();
  const RequestId r3 = kv.add_request(std::vector<std::uint32_t>{1, 2, 3, 4, 5});
  CHECK(kv.lookup_prefix(r3) == 0);
  REQUIRE(kv.allocate(r3, 3));
  kv.commit(r3, 3);
  CHECK(removed() == std::vector<PageId>{p1[3], p1[2]});
  CHECK(kvmm::testing::ManagerInspector(kv).next_small_victim(0) == kNullPage);
  CHECK(kvmm::testing::ManagerInspector(kv).next_large_victim() == kNoLargePage);
  CHECK_FALSE(kv.allocate(r3, 1));
  CHECK(kvmm::testing::ManagerInspector(kv).ref_count(0, p1[0]) == 1);
  CHECK(kvmm::testing::ManagerInspector(kv).ref_count(0, p1[1]) == 1);
  CHECK(kv.page_table(r2, 0)[0] == p1[0]);
  kv.check_invariants();
  // Freeing r2 re-queues A B X with r2's last access (step 2), which the lazy entries of
  // A B (keys of step 1) no longer show; X (longest prefix) goes first.
  kv.begin_step();
  kv.free(r2);
  CHECK(kvmm::testing::ManagerInspector(kv).eviction_key(0, p1[0]).time == 2);
  CHECK(kvmm::testing::ManagerInspector(kv).eviction_key(0, p1[1]).time == 2);
  CHECK(kvmm::testing::ManagerInspector(kv).next_small_victim(0) == px);
  REQUIRE(kv.allocate(r3, 2));
  CHECK(removed() == std::vector<PageId>{px, p1[1]});
  CHECK(kvmm::testing::ManagerInspector(kv).next_small_victim(0) == p1[0]);
  kv.check_invariants();
}

TEST_CASE("step 6 reclaims another group's large page of cached and empty slots", "[manager][jenga]") {
  // Full pages 64 B and sliding pages 128 B: a 128 B large page holds 2 full or 1 sliding.
  const KVLayout layout = KVLayout::plan(
      {LayerGroup::full_attention("full", 1, 1, 4, 2, 4), LayerGroup::sliding_window("sw", 2, 1, 4, 2, 4, 4)});
  REQUIRE(layout.small_pages_per_large_page(0) == 2);
  REQUIRE(layout.small_pages_per_large_page(1) == 1);
  // Jenga's step order (packing off): this case is about steps 3 and 6 (packing would give
  // r2's full-attention page full1's empty slot at step 4 instead).
  KVCacheManager kv(layout,
                    {.num_large_pages = 2, .max_requests = 2, .record_events = true, .pack_small_pages = false});
  kv.begin_step();
  const RequestId r1 = kv.add_request(std::vector<std::uint32_t>{1, 2, 3, 4, 5});
  CHECK(kv.lookup_prefix(r1) == 0);
  REQUIRE(kv.allocate(r1, 4));
  kv.commit(r1, 4);
  const PageId full1 = kv.page_table(r1, kFull)[0], sw1 = kv.page_table(r1, kSw)[0];
  kv.free(r1);
  // full1's large page: one cached page, one empty slot, nothing used. Not evictable in
  // Jenga's sense (not all its small pages are), so step 3 only sees the sliding page's.
  const LargePageId lp_full = kv.small_pages(kFull).large_page_of(full1);
  const LargePageId lp_sw = kv.small_pages(kSw).large_page_of(sw1);
  CHECK(kv.small_pages(kFull).free_in_large(lp_full) == 1);
  CHECK(kvmm::testing::ManagerInspector(kv).page_state(kFull, full1) == PageState::kEvictable);
  CHECK(kv.large_pages().num_free() == 0);
  CHECK(kvmm::testing::ManagerInspector(kv).next_large_victim() == lp_sw);
  CHECK(kvmm::testing::ManagerInspector(kv).next_mixed_victim() == lp_full);
  kv.check_invariants();
  std::vector<CacheEvent> ev;
  kv.take_events(ev);
  // A new prompt needs a page in each group; the pool is empty. Full attention: steps 1-2
  // fail, step 3 evicts the sliding page's large page. Sliding: steps 1-5 find nothing
  // (its only cached page is gone), step 6 reclaims full1's large page. Jenga's five
  // steps alone would fail here with both pages reclaimable.
  kv.begin_step();
  const RequestId r2 = kv.add_request(std::vector<std::uint32_t>{9, 8, 7, 6, 5});
  CHECK(kv.lookup_prefix(r2) == 0);
  REQUIRE(kv.allocate(r2, 4));
  kv.take_events(ev);
  REQUIRE(ev.size() == 2);
  CHECK(ev[0].kind == CacheEventKind::kRemoved);
  CHECK(ev[0].group == kSw);
  CHECK(ev[0].page == sw1);
  CHECK(ev[1].kind == CacheEventKind::kRemoved);
  CHECK(ev[1].group == kFull);
  CHECK(ev[1].page == full1);
  CHECK(kv.small_pages(kFull).large_page_of(kv.page_table(r2, kFull)[0]) == lp_sw);
  CHECK(kv.small_pages(kSw).large_page_of(kv.page_table(r2, kSw)[0]) == lp_full);
  CHECK(kvmm::testing::ManagerInspector(kv).next_mixed_victim() == kNoLargePage);
  kv.check_invariants();
}

TEST_CASE("a hit that is never admitted leaves the pages' ages; an admitted one touches them", "[manager][pin]") {
  const KVLayout layout = KVLayout::plan({LayerGroup::full_attention("full", 1, 1, 8, 2, 1)});
  KVCacheManager kv(layout, {.num_large_pages = 8, .max_requests = 4});
  kv.begin_step();
  const RequestId r1 = kv.add_request(std::vector<std::uint32_t>{A, B, C, D});
  kv.lookup_prefix(r1);
  REQUIRE(kv.allocate(r1, 4));
  kv.commit(r1, 4);
  const std::vector<PageId> p1(kv.page_table(r1, 0).begin(), kv.page_table(r1, 0).end());
  kv.free(r1);
  // Step 2: a scheduler looks A B X up, cannot admit it and drops it.
  kv.begin_step();
  const RequestId r2 = kv.add_request(std::vector<std::uint32_t>{A, B, X});
  CHECK(kv.lookup_prefix(r2) == 2);
  kv.free(r2);
  CHECK(kvmm::testing::ManagerInspector(kv).eviction_key(0, p1[0]).time == 1);
  CHECK(kvmm::testing::ManagerInspector(kv).eviction_key(0, p1[1]).time == 1);
  CHECK(kvmm::testing::ManagerInspector(kv).next_small_victim(0) == p1[3]);
  kv.check_invariants();
  // Step 3: admitted (its allocation succeeds), then preempted before computing anything.
  kv.begin_step();
  const RequestId r3 = kv.add_request(std::vector<std::uint32_t>{A, B, X});
  CHECK(kv.lookup_prefix(r3) == 2);
  REQUIRE(kv.allocate(r3, 1));
  kv.free(r3);
  CHECK(kvmm::testing::ManagerInspector(kv).eviction_key(0, p1[0]).time == 3);
  CHECK(kvmm::testing::ManagerInspector(kv).eviction_key(0, p1[1]).time == 3);
  CHECK(kvmm::testing::ManagerInspector(kv).next_small_victim(0) == p1[3]);  // D C (step 1) go before B A (step 3)
  kv.check_invariants();
}

TEST_CASE("a refused admission then reset leaves the manager as it found it", "[manager][reset]") {
  // Full attention (n = 2: a request of odd length leaves a large page of one cached page
  // and one empty slot) and a sliding window of 2 (n = 1, pages leave the window at commit);
  // then two full-attention groups (n = 2 and 1), whose hits are pinned by their own loop.
  const KVLayout two = KVLayout::plan(
      {LayerGroup::full_attention("full", 1, 1, 8, 2, 1), LayerGroup::sliding_window("sw", 2, 1, 8, 2, 1, 2)});
  const KVLayout one = KVLayout::plan(
      {LayerGroup::full_attention("full", 1, 1, 8, 2, 1), LayerGroup::full_attention("pad", 2, 1, 8, 2, 1)});
  REQUIRE(two.small_pages_per_large_page(kFull) == 2);
  REQUIRE(two.small_pages_per_large_page(kSw) == 1);
  const std::vector<std::uint32_t> x{1, 2, 3, 4, 5}, y{1, 2, 3, 9, 9, 9}, z{20, 21, 22, 23};
  for (const bool same_priority : {true, false})
    for (const KVLayout* layout : {&two, &one}) {
      INFO("same priority " << same_priority << ", " << layout->num_groups() << " groups, sliding "
                            << (layout == &two));
      // a: a refused admission, reset in place when it can be; s: the same, reset page by
      // page (a call between changes the count reset checks); b: neither. 24 large pages:
      // x, y and z fit (19) without evicting.
      // Jenga's step order: packing would give z x's cached slot in the large page y holds
      // (an eviction), and the scenario needs every page of x still cached.
      // No retention: the refused allocate would release y's held window pages (the prompt
      // tail's; retention_pressure_test.cpp), which b keeps.
      const KVCacheManagerOptions opt{.num_large_pages = 24,
                                      .max_requests = 4,
                                      .record_events = true,
                                      .pack_small_pages = false,
                                      .retention_budget = 0};
      KVCacheManager a(*layout, opt), s(*layout, opt), b(*layout, opt);
      RequestId running = 0;
      for (KVCacheManager* kv : {&a, &s, &b}) {
        auto serve = [kv](const std::vector<std::uint32_t>& ids, bool keep) {
          kv->begin_step();
          const RequestId r = kv->add_request(ids);
          const std::uint64_t hit = kv->lookup_prefix(r);
          REQUIRE(kv->allocate(r, static_cast<std::uint32_t>(ids.size() - hit)));
          kv->commit(r, ids.size());
          if (!keep) kv->free(r);
          return r;
        };
        serve(x, false);           // cached: {1 2} {3 4} wholly, {5 _} mixed; sliding 1..5
        running = serve(y, true);  // hits 1 2 3, keeps them used
        serve(z, false);
        kv->begin_step();
        REQUIRE(kv->page_counts(kFull).evicted + kv->page_counts(kSw).evicted == 0);
      }
      std::vector<std::uint32_t> big(x);
      big.resize(200, 7);
      for (KVCacheManager* kv : {&a, &s}) {
        const RequestId r = kv->add_request(big, {.priority = same_priority ? 0u : 1u});
        CHECK(kv->lookup_prefix(r) == 5);  // x's 5 tokens (the window needs 4 and 5)
        CHECK_FALSE(kv->allocate(r, 195));
        if (kv == &s) kv->set_priority(r, same_priority ? 0u : 1u);  // unchanged
        kv->reset(r);
        kv->check_invariants();
        kv->free(r);
      }
      // Each evicts everything it can, page by page, in its own order.
      std::vector<std::pair<GroupId, PageId>> order[3];
      std::size_t k = 0;
      for (KVCacheManager* kv : {&a, &s, &b}) {
        std::vector<CacheEvent> events;
        kv->take_events(events);
        const RequestId w = kv->add_request(std::vector<std::uint32_t>(40, 8));
        REQUIRE(kv->lookup_prefix(w) == 0);
        while (kv->num_allocated(w) < 40 && kv->allocate(w, 1)) kv->commit(w, kv->num_allocated(w));
        kv->take_events(events);
        for (const CacheEvent& e : events) order[k].emplace_back(e.group, e.page);
        kv->check_invariants();
        ++k;
      }
      CHECK(order[2].size() > 10);
      CHECK(order[0] == order[1]);
      CHECK(snapshot(a, 4, {running}) == snapshot(s, 4, {running}));
      // Same priority: b's evictions and state exactly. Another one: release_page re-levels
      // the hit's pages to the refused request's level, so a differs from b like s does.
      if (same_priority) {
        CHECK(order[0] == order[2]);
        CHECK(snapshot(a, 4, {running}) == snapshot(b, 4, {running}));
      }
      CHECK(a.num_computed(running) == b.num_computed(running));
    }
}

TEST_CASE("reset releases every page and keeps ids and hashes for a new lookup", "[manager][reset]") {
  const KVLayout layout = fig10_layout(2, 4);
  KVCacheManager kv(layout, {.num_large_pages = 16, .num_host_large_pages = 8, .max_requests = 4});
  kv.begin_step();
  const std::vector<std::uint32_t> prompt{A, B, C, D, E, F, G};
  const RequestId r = kv.add_request(prompt);
  CHECK(kv.lookup_prefix(r) == 0);
  REQUIRE(kv.allocate(r, 7));
  kv.commit(r, 7);
  kv.append_token(r, H);  // a sampled token: its page is completed and hashed on commit
  REQUIRE(kv.allocate(r, 1));
  kv.commit(r, 8);
  const std::vector<PageId> full(kv.page_table(r, kFull).begin(), kv.page_table(r, kFull).end());
  REQUIRE(full.size() == 4);

  // Preempted by recompute: every page released; full pages stay cached.
  kv.begin_step();
  kv.reset(r);
  CHECK(kv.is_active(r));
  CHECK(kv.num_computed(r) == 0);
  CHECK(kv.num_allocated(r) == 0);
  CHECK(kv.num_tokens(r) == 8);
  CHECK(kv.page_table(r, kFull).empty());
  CHECK(kv.page_table(r, kSw).empty());
  for (PageId p : full) CHECK(kvmm::testing::ManagerInspector(kv).page_state(kFull, p) == PageState::kEvictable);
  CHECK(kv.page_counts(kFull).used == 0);
  kv.check_invariants();

  // The new lookup (ids kept, hashes not recomputed) hits what a new request with the
  // same ids hits: 7 tokens (at most ids - 1), the full pages 0..2 and the window's.
  CHECK(kv.lookup_prefix(r) == 6);
  REQUIRE(kv.allocate(r, 0));
  CHECK(std::vector<PageId>(kv.page_table(r, kFull).begin(), kv.page_table(r, kFull).end()) ==
        std::vector<PageId>(full.begin(), full.begin() + 3));
  const RequestId twin = kv.add_request(std::vector<std::uint32_t>{A, B, C, D, E, F, G, H});
  CHECK(kv.lookup_prefix(twin) == 6);
  REQUIRE(kv.allocate(twin, 0));
  CHECK(std::vector<PageId>(kv.page_table(twin, kSw).begin(), kv.page_table(twin, kSw).end()) ==
        std::vector<PageId>(kv.page_table(r, kSw).begin(), kv.page_table(r, kSw).end()));
  kv.free(twin);
  REQUIRE(kv.allocate(r, 2));
  kv.commit(r, 8);
  kv.check_invariants();

  // A swapped-out request: reset frees its host pages.
  REQUIRE(kv.swap_out(r).has_value());
  CHECK(kv.is_swapped(r));
  kv.reset(r);
  CHECK_FALSE(kv.is_swapped(r));
  CHECK(kvmm::testing::ManagerInspector(kv).host_page_table(r, kFull).empty());
  CHECK(kv.num_computed(r) == 0);
  kv.check_invariants();

  // Misuse: an unknown request, state intact.
  CHECK_THROWS_WITH(kv.reset(3), Catch::Contains("request = 3"));
  CHECK_THROWS_WITH(kv.reset(99), Catch::Contains("request = 99"));
  kv.free(r);
  CHECK(kv.num_active() == 0);
  kv.check_invariants();
}
