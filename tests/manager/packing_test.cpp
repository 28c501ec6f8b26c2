// KVCacheManagerOptions::pack_small_pages (issue 32): exact cases of the packing order
// against Jenga's on a layout of two small pages per large page beside a one-page group.
// The randomized model test (randomized_test.cpp) runs both orders against its reference.
#include "kvmm/manager/kv_cache_manager.hpp"

#include <catch2/catch.hpp>

#include <vector>

using namespace kvmm;

namespace {
constexpr GroupId kFull = 0, kSw = 1;
}

TEST_CASE("packing fills a live large page and reuses its cached slots before a fresh one", "[manager][packing]") {
  // Full pages 64 B and sliding pages 128 B: a 128 B large page holds 2 full or 1 sliding.
  const KVLayout layout = KVLayout::plan(
      {LayerGroup::full_attention("full", 1, 1, 4, 2, 4), LayerGroup::sliding_window("sw", 2, 1, 4, 2, 4, 4)});
  REQUIRE(layout.small_pages_per_large_page(kFull) == 2);
  REQUIRE(layout.small_pages_per_large_page(kSw) == 1);
  for (const bool pack : {true, false}) {
    INFO("pack " << pack);
    KVCacheManager kv(layout, {.num_large_pages = 6, .max_requests = 4, .pack_small_pages = pack});
    auto admit = [&kv](std::vector<std::uint32_t> ids) {
      kv.begin_step();
      const RequestId r = kv.add_request(ids);
      REQUIRE(kv.lookup_prefix(r) == 0);
      REQUIRE(kv.allocate(r, 4));
      kv.commit(r, 4);
      return r;
    };
    auto large_of = [&kv](RequestId r) { return kv.small_pages(kFull).large_page_of(kv.page_table(r, kFull)[0]); };
    // r1: a full page in large page A (one slot left, associated with r1), a sliding page.
    const RequestId r1 = admit({1, 2, 3, 4});
    const LargePageId a = large_of(r1);
    CHECK(kv.large_pages().num_free() == 4);
    // r2 has no large page of its own: packing takes A's free slot (step 4), Jenga's order
    // a fresh large page (step 2).
    const RequestId r2 = admit({9, 8, 7, 6});
    const PageId p2 = kv.page_table(r2, kFull)[0];
    CHECK((large_of(r2) == a) == pack);
    CHECK(kv.large_pages().num_free() == (pack ? 3u : 2u));
    kv.free(r2);  // p2 is cached; with packing in A, which r1 keeps live
    // r3: no free slot in the group. Packing evicts the group's LRU cached page p2, since
    // its large page is live (step 4b); Jenga's order opens a fresh large page.
    const RequestId r3 = admit({20, 21, 22, 23});
    CHECK(kv.page_counts(kFull).evicted == (pack ? 1u : 0u));
    CHECK(kv.page_counts(kSw).evicted == 0);
    CHECK((kv.page_table(r3, kFull)[0] == p2) == pack);
    CHECK(kv.large_pages().num_free() == (pack ? 2u : 0u));
    kv.check_invariants();
    // r1 and r3 leave: A is all cached, not live, so step 4b leaves it to the evictor of
    // whole large pages and r4 takes a fresh one (the pool still has some).
    kv.free(r1);
    kv.free(r3);
    const std::uint64_t evicted = kv.page_counts(kFull).evicted;
    if (pack) {
      const RequestId r4 = admit({30, 31, 32, 33});
      CHECK(kv.page_counts(kFull).evicted == evicted);
      CHECK(large_of(r4) != a);
      // r1's page is still cached in A: a later request hits it.
      kv.begin_step();
      const RequestId r5 = kv.add_request(std::vector<std::uint32_t>{1, 2, 3, 4, 5});
      CHECK(kv.lookup_prefix(r5) == 4);
    }
    kv.check_invariants();
  }
}

TEST_CASE("packing's default: on, but Jenga's order where the layout has a draft group", "[manager][packing]") {
  // The first case's opening (r2 takes r1's large page's free slot only when packing), with
  // the option unset, on the same layout and on that layout plus a draft group of the full
  // group's size: packing raised kvmm-sim's draft recompute 100-fold, so drafts keep Jenga's.
  LayerGroup draft = LayerGroup::full_attention("draft", 1, 1, 4, 2, 4);
  draft.draft = DraftRole{.target = "full"};
  for (const bool with_draft : {false, true}) {
    INFO("draft group " << with_draft);
    std::vector<LayerGroup> groups{LayerGroup::full_attention("full", 1, 1, 4, 2, 4),
                                   LayerGroup::sliding_window("sw", 2, 1, 4, 2, 4, 4)};
    if (with_draft) groups.push_back(draft);
    const KVLayout layout = KVLayout::plan(groups);
    REQUIRE(layout.small_pages_per_large_page(kFull) == 2);
    KVCacheManager kv(layout, {.num_large_pages = 8, .max_requests = 4});
    std::vector<LargePageId> large;
    for (const std::vector<std::uint32_t>& ids : {std::vector<std::uint32_t>{1, 2, 3, 4}, {9, 8, 7, 6}}) {
      kv.begin_step();
      const RequestId r = kv.add_request(ids);
      REQUIRE(kv.allocate(r, 4));
      kv.commit(r, 4);
      large.push_back(kv.small_pages(kFull).large_page_of(kv.page_table(r, kFull)[0]));
    }
    CHECK((large[0] == large[1]) == !with_draft);
    kv.check_invariants();
  }
}
