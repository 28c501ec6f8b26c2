// KVCacheManager: Jenga Fig. 10's timeline and eviction order, fork / copy-on-write,
// swap, vision groups, pins and priorities, stats, events, and misuse.
#include "fig10_support.hpp"
#include "kvmm/manager/kv_cache_manager.hpp"
#include "kvmm/testing/manager_inspector.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <vector>

using namespace kvmm;
using namespace kvmm::test;

TEST_CASE("Jenga Fig. 10: last access per layer and the eviction order that follows", "[manager][jenga]") {
  const KVLayout layout = fig10_layout();
  REQUIRE(layout.small_pages_per_large_page(kFull) == 1);
  REQUIRE(layout.small_pages_per_large_page(kSw) == 1);
  // Jenga's rule as the paper has it: no prompt-tail retention (issue 17's default).
  KVCacheManager kv(layout, {.num_large_pages = 12, .max_requests = 4, .record_events = true, .prompt_tail_tokens = 0});
  std::map<std::pair<GroupId, std::uint32_t>, PageId> page;  // (group, token) -> page
  auto remember = [&](RequestId r, const std::vector<std::uint32_t>& tokens) {
    for (GroupId g : {kFull, kSw}) {
      const auto t = kv.page_table(r, g);
      for (std::size_t i = 0; i < t.size(); ++i)
        if (t[i] != kNullPage) page[{g, tokens[i]}] = t[i];
    }
  };

  // Step 1: request 1's prefill ABCD -> E.
  REQUIRE(kv.begin_step() == 1);
  const RequestId r1 = kv.add_request(std::vector<std::uint32_t>{A, B, C, D});
  CHECK(kv.lookup_prefix(r1) == 0);
  REQUIRE(kv.allocate(r1, 4));
  remember(r1, {A, B, C, D});
  kv.commit(r1, 4);
  kv.append_token(r1, E);
  // Step 2: request 1's decode ABCDE -> F; the window (2) reads only D E.
  kv.begin_step();
  REQUIRE(kv.allocate(r1, 1));
  remember(r1, {A, B, C, D, E});
  kv.commit(r1, 5);
  kv.append_token(r1, F);
  kv.free(r1);
  // Step 3: request 2's prefill ABCDG -> H hits ABCD (the window needs C D).
  kv.begin_step();
  const RequestId r2 = kv.add_request(std::vector<std::uint32_t>{A, B, C, D, G});
  CHECK(kv.lookup_prefix(r2) == 4);
  CHECK(kv.page_table(r2, kSw)[0] == kNullPage);  // A and B are not needed by the window
  CHECK(kv.page_table(r2, kSw)[1] == kNullPage);
  REQUIRE(kv.allocate(r2, 1));
  remember(r2, {A, B, C, D, G});
  kv.commit(r2, 5);
  kv.append_token(r2, H);
  kv.free(r2);
  kv.check_invariants();

  // Fig. 10(b)/(c): last access times after the two requests.
  const std::map<std::uint32_t, std::uint64_t> full_time{{A, 3}, {B, 3}, {C, 3}, {D, 3}, {E, 2}, {G, 3}};
  const std::map<std::uint32_t, std::uint64_t> sw_time{{A, 1}, {B, 1}, {C, 3}, {D, 3}, {E, 2}, {G, 3}};
  const std::map<std::uint32_t, std::uint64_t> prefix_len{{A, 1}, {B, 2}, {C, 3}, {D, 4}, {E, 5}, {G, 5}};
  for (const auto& [tok, t] : full_time) {
    INFO("token " << tok);
    CHECK(kvmm::testing::ManagerInspector(kv).page_state(kFull, page[{kFull, tok}]) == PageState::kEvictable);
    CHECK(kvmm::testing::ManagerInspector(kv).eviction_key(kFull, page[{kFull, tok}]).time == t);
    CHECK(kvmm::testing::ManagerInspector(kv).eviction_key(kFull, page[{kFull, tok}]).prefix_len == prefix_len.at(tok));
  }
  for (const auto& [tok, t] : sw_time) {
    INFO("token " << tok);
    CHECK(kvmm::testing::ManagerInspector(kv).page_state(kSw, page[{kSw, tok}]) == PageState::kEvictable);
    CHECK(kvmm::testing::ManagerInspector(kv).eviction_key(kSw, page[{kSw, tok}]).time == t);
    CHECK(kvmm::testing::ManagerInspector(kv).eviction_key(kSw, page[{kSw, tok}]).prefix_len == prefix_len.at(tok));
  }
  CHECK(kv.large_pages().num_free() == 0);

  // A new, unrelated request needs all 12 pages: evictions follow (time asc, prefix len
  // desc), balanced (E of request 1 before request 2's tokens in both layers) and aligned
  // (G, then D, then C in both layers).
  std::vector<CacheEvent> events;
  kv.take_events(events);
  kv.begin_step();
  const RequestId r3 = kv.add_request(std::vector<std::uint32_t>{1, 2, 3, 4, 5, 6, 7});
  CHECK(kv.lookup_prefix(r3) == 0);
  REQUIRE(kv.allocate(r3, 6));
  kv.take_events(events);
  std::map<std::pair<GroupId, PageId>, std::uint32_t> token_of;
  for (const auto& [k, p] : page) token_of[{k.first, p}] = k.second;
  std::vector<std::pair<GroupId, std::uint32_t>> order;
  for (const CacheEvent& e : events) {
    REQUIRE(e.kind == CacheEventKind::kRemoved);
    order.emplace_back(e.group, token_of.at({e.group, e.page}));
  }
  REQUIRE(order.size() == 12);
  CHECK(order[0] == std::make_pair(kSw, B));
  CHECK(order[1] == std::make_pair(kSw, A));
  std::vector<std::uint32_t> tokens;
  for (const auto& o : order) tokens.push_back(o.second);
  CHECK(tokens == std::vector<std::uint32_t>{B, A, E, E, G, G, D, D, C, C, B, A});
  CHECK(order[10].first == kFull);
  CHECK(order[11].first == kFull);
  for (std::size_t i = 2; i + 2 < order.size(); i += 2) CHECK(order[i].first != order[i + 1].first);
  kv.check_invariants();
}

TEST_CASE("step 3 takes the LRU large page across groups of one and of several small pages", "[manager][jenga]") {
  // Full attention 32 B pages (n = 2), sliding window 64 B pages (n = 1, window wider
  // than the prompts): the sliding group's small-page LRU is a step-3 source of its own,
  // merged with the large-page LRU by (retention priority, time, prefix length desc),
  // equal keys in release order.
  const KVLayout layout = KVLayout::plan(
      {LayerGroup::full_attention("full", 1, 1, 8, 2, 1), LayerGroup::sliding_window("sw", 2, 1, 8, 2, 1, 100)});
  REQUIRE(layout.small_pages_per_large_page(kFull) == 2);
  REQUIRE(layout.small_pages_per_large_page(kSw) == 1);
  KVCacheManager kv(layout, {.num_large_pages = 18, .max_requests = 4, .record_events = true});
  std::map<std::pair<GroupId, PageId>, std::uint32_t> token_of;
  auto serve = [&](std::uint32_t base, std::uint32_t priority) {
    kv.begin_step();
    const std::vector<std::uint32_t> ids{base + 1, base + 2, base + 3, base + 4};
    const RequestId r = kv.add_request(ids, {.priority = priority});
    REQUIRE(kv.lookup_prefix(r) == 0);
    REQUIRE(kv.allocate(r, 4));
    for (GroupId g : {kFull, kSw})
      for (std::size_t i = 0; i < 4; ++i) token_of[{g, kv.page_table(r, g)[i]}] = ids[i];
    kv.commit(r, 4);
    kv.free(r);  // full group first, each last page first
  };
  serve(10, 0);  // step 1: 2 full large pages {11, 12} {13, 14}, 4 sliding ones
  serve(20, 1);  // step 2, retention priority 1: after every priority-0 page
  serve(30, 0);  // step 3
  REQUIRE(kv.large_pages().num_free() == 0);
  kv.check_invariants();
  REQUIRE(kvmm::testing::ManagerInspector(kv).next_large_victim() != kNoLargePage);
  // The sliding group has one small page per large page: its small page id is the large one's.
  CHECK(token_of.at({kSw, kvmm::testing::ManagerInspector(kv).next_large_victim().index}) == 14);

  std::vector<CacheEvent> events;
  kv.take_events(events);
  kv.begin_step();
  std::vector<std::uint32_t> ids(9);
  for (std::uint32_t i = 0; i < 9; ++i) ids[i] = 90 + i;
  const RequestId r = kv.add_request(ids);
  REQUIRE(kv.lookup_prefix(r) == 0);
  REQUIRE(kv.allocate(r, 8));  // 4 full large pages + 8 sliding ones: 12 victims
  kv.take_events(events);
  std::vector<std::pair<GroupId, std::uint32_t>> order;
  for (const CacheEvent& e : events) {
    REQUIRE(e.kind == CacheEventKind::kRemoved);
    order.emplace_back(e.group, token_of.at({e.group, e.page}));
  }
  // Per request (step 1, then step 3): (t, 4) sliding 4; (t, 3) the full page {3, 4},
  // released before sliding 3; (t, 2) sliding 2; (t, 1) the full page {1, 2}, then
  // sliding 1. A full large page's small pages go in slot order.
  std::vector<std::pair<GroupId, std::uint32_t>> want;
  for (std::uint32_t b : {10u, 30u}) {
    const std::vector<std::pair<GroupId, std::uint32_t>> one{{kSw, b + 4},   {kFull, b + 3}, {kFull, b + 4},
                                                             {kSw, b + 3},   {kSw, b + 2},   {kFull, b + 1},
                                                             {kFull, b + 2}, {kSw, b + 1}};
    want.insert(want.end(), one.begin(), one.end());
  }
  CHECK(order == want);
  for (const auto& [gp, tok] : token_of)  // the priority-1 request's pages stay cached
    if (tok > 20 && tok < 30)
      CHECK(kvmm::testing::ManagerInspector(kv).page_state(gp.first, gp.second) == PageState::kEvictable);
  kv.check_invariants();
}

TEST_CASE("request-aware placement and the five allocation steps with small pages", "[manager][jenga]") {
  // 4 tokens per page, full pages 64 B, sliding pages 128 B: n = 2 and 1.
  const KVLayout layout = KVLayout::plan(
      {LayerGroup::full_attention("full", 1, 1, 4, 2, 4), LayerGroup::sliding_window("sw", 2, 1, 4, 2, 4, 4)});
  REQUIRE(layout.small_pages_per_large_page(0) == 2);
  KVCacheManager kv(layout, {.num_large_pages = 6, .max_requests = 4, .record_events = true});
  kv.begin_step();
  std::vector<std::uint32_t> t1(8);
  for (std::uint32_t i = 0; i < 8; ++i) t1[i] = i + 1;
  const RequestId r1 = kv.add_request(t1);
  kv.lookup_prefix(r1);
  REQUIRE(kv.allocate(r1, 8));
  // Full attention: both pages in one large page (steps 1-2).
  CHECK(kv.small_pages(0).large_page_of(kv.page_table(r1, 0)[0]) ==
        kv.small_pages(0).large_page_of(kv.page_table(r1, 0)[1]));
  kv.commit(r1, 8);
  kv.free(r1);
  kv.check_invariants();
  // Both full pages and both sliding pages (the first one was released out of the window
  // at commit) stay cached: one evictable full large page, two sliding ones.
  CHECK(kv.stats().groups[0].evictable_pages == 2);
  CHECK(kv.stats().groups[1].evictable_pages == 2);
  std::vector<CacheEvent> ev;
  kv.take_events(ev);  // the stored events of r1
  CHECK(ev.size() == 4);
  kv.begin_step();
  std::vector<std::uint32_t> t2(16, 500);
  const RequestId r2 = kv.add_request(t2);
  CHECK(kv.lookup_prefix(r2) == 0);
  REQUIRE(kv.allocate(r2, 8));  // 1 fresh full large page + 2 fresh sliding ones: pool empty
  CHECK(kv.stats().free_large_pages == 0);
  kv.commit(r2, 8);  // r2's first sliding page leaves the window: cached at step 2
  kv.take_events(ev);
  CHECK(ev.size() == 4);  // r2's full pages in both groups stored
  CHECK(std::none_of(ev.begin(), ev.end(), [](const CacheEvent& e) { return e.kind == CacheEventKind::kRemoved; }));
  // Full needs a page: no associated slot, no empty large page -> step 3 evicts the LRU
  // evictable large page: the sliding page of prefix length 8 (same step, longer prefix).
  // The sliding group then evicts the next one, its page of prefix length 4.
  kv.begin_step();
  REQUIRE(kv.allocate(r2, 4));
  kv.take_events(ev);
  REQUIRE(ev.size() == 2);
  CHECK(ev[0].group == 1);
  CHECK(ev[1].group == 1);
  CHECK(kv.stats().groups[0].evictable_pages == 2);
  kv.commit(r2, 12);
  kv.take_events(ev);  // stored events of r2's third pages
  // Next: full takes the free slot of its new large page (step 1, no eviction); the
  // sliding group evicts the whole full-attention large page (2 small pages, step 3).
  REQUIRE(kv.allocate(r2, 4));
  kv.take_events(ev);
  REQUIRE(ev.size() == 2);
  CHECK(ev[0].group == 0);
  CHECK(ev[1].group == 0);
  CHECK(kv.small_pages(0).large_page_of(ev[0].page) == kv.small_pages(0).large_page_of(ev[1].page));
  kv.check_invariants();
}

TEST_CASE("fork shares pages and copy-on-write copies a shared partial page", "[manager][fork]") {
  KVCacheManager kv(fig10_layout(4, 8), {.num_large_pages = 32, .max_requests = 8});
  kv.begin_step();
  const RequestId p = kv.add_request(std::vector<std::uint32_t>{1, 2, 3, 4, 5, 6});
  kv.lookup_prefix(p);
  REQUIRE(kv.allocate(p, 6));
  kv.commit(p, 6);
  const RequestId c = kv.fork(p);
  kv.check_invariants();
  for (GroupId g : {kFull, kSw}) {
    REQUIRE(kv.page_table(c, g).size() == 2);
    CHECK(kv.page_table(c, g)[1] == kv.page_table(p, g)[1]);
    CHECK(kvmm::testing::ManagerInspector(kv).ref_count(g, kv.page_table(p, g)[1]) == 2);
  }
  kv.begin_step();
  kv.append_token(c, 9);
  REQUIRE(kv.allocate(c, 1));
  const auto copies = kv.copies();
  REQUIRE(copies.size() == 2);
  for (GroupId g : {kFull, kSw}) {
    const PageId shared = kv.page_table(p, g)[1];
    const PageId mine = kv.page_table(c, g)[1];
    CHECK(mine != shared);
    CHECK(std::find(copies.begin(), copies.end(), PageCopy{g, shared, mine}) != copies.end());
    CHECK(kvmm::testing::ManagerInspector(kv).ref_count(g, shared) == 1);
    // The full first page stays shared: no copy needed.
    CHECK(kv.page_table(c, g)[0] == kv.page_table(p, g)[0]);
  }
  kv.commit(c, 7);
  kv.check_invariants();
  // The parent writes its own partial page without a copy now.
  kv.begin_step();
  kv.append_token(p, 8);
  REQUIRE(kv.allocate(p, 1));
  CHECK(kv.copies().empty());
  kv.free(p);
  kv.free(c);
  kv.check_invariants();
  CHECK_THROWS_WITH(kv.fork(p), Catch::Contains("request = " + std::to_string(p)));
}

TEST_CASE("swap out and in move every page, all or nothing", "[manager][swap]") {
  KVCacheManager kv(fig10_layout(4, 4), {.num_large_pages = 16, .num_host_large_pages = 3, .max_requests = 4});
  kv.begin_step();
  std::vector<std::uint32_t> t(10);
  for (std::uint32_t i = 0; i < 10; ++i) t[i] = 7 * i;
  const RequestId r = kv.add_request(t);
  kv.lookup_prefix(r);
  REQUIRE(kv.allocate(r, 10));
  kv.commit(r, 10);
  // Window 4 drops sliding page 0 (the next query reads tokens 7..10).
  const std::vector<PageId> full_before(kv.page_table(r, kFull).begin(), kv.page_table(r, kFull).end());
  const std::size_t held = 3 + 2;
  // Host has 3 large pages of one small page each: too small, nothing changes.
  const Snapshot before = snapshot(kv, 4, {r});
  REQUIRE(before.computed == std::vector<std::uint64_t>{10});
  CHECK_FALSE(kv.swap_out(r).has_value());
  CHECK(snapshot(kv, 4, {r}) == before);
  kv.free(r);

  KVCacheManager kv2(fig10_layout(4, 4), {.num_large_pages = 16, .num_host_large_pages = 8, .max_requests = 4});
  kv2.begin_step();
  const RequestId r2 = kv2.add_request(t);
  kv2.lookup_prefix(r2);
  REQUIRE(kv2.allocate(r2, 10));
  kv2.commit(r2, 10);
  const std::vector<PageId> dev(kv2.page_table(r2, kFull).begin(), kv2.page_table(r2, kFull).end());
  const auto out = kv2.swap_out(r2);
  REQUIRE(out.has_value());
  CHECK(out->size() == held);
  CHECK(kv2.is_swapped(r2));
  CHECK(kv2.page_table(r2, kFull).empty());
  kv2.check_invariants();
  CHECK_THROWS_WITH(kv2.allocate(r2, 1), Catch::Contains("swapped out"));
  for (const PageCopy& pc : *out)
    if (pc.group == kFull) CHECK(std::find(dev.begin(), dev.end(), pc.src) != dev.end());
  const auto in = kv2.swap_in(r2);
  REQUIRE(in.has_value());
  CHECK(in->size() == held);
  CHECK_FALSE(kv2.is_swapped(r2));
  CHECK(kv2.page_table(r2, kFull).size() == 3);
  CHECK(kv2.page_table(r2, kSw)[0] == kNullPage);
  kv2.check_invariants();
  kv2.begin_step();
  kv2.append_token(r2, 1);
  REQUIRE(kv2.allocate(r2, 1));
  kv2.commit(r2, 11);
  kv2.free(r2);
  kv2.check_invariants();
  (void)full_before;
}

TEST_CASE("allocation failure leaves the state unchanged", "[manager][oom]") {
  KVCacheManager kv(fig10_layout(4, 8), {.num_large_pages = 4, .max_requests = 4});
  kv.begin_step();
  const RequestId a = kv.add_request(std::vector<std::uint32_t>(8, 1));
  kv.lookup_prefix(a);
  REQUIRE(kv.allocate(a, 8));
  kv.commit(a, 8);
  const RequestId b = kv.add_request(std::vector<std::uint32_t>(12, 2));
  kv.lookup_prefix(b);
  const Snapshot before = snapshot(kv, 4, {a, b});
  REQUIRE(before.allocated == std::vector<std::uint64_t>{8, 0});
  CHECK_FALSE(kv.allocate(b, 12));
  CHECK(snapshot(kv, 4, {a, b}) == before);
  kv.check_invariants();
}

TEST_CASE("pins and retention priority protect pages from eviction", "[manager][pin]") {
  KVCacheManager kv(fig10_layout(4, 64), {.num_large_pages = 4, .max_requests = 4});
  kv.begin_step();
  const RequestId a = kv.add_request(std::vector<std::uint32_t>{1, 2, 3, 4, 5});
  kv.lookup_prefix(a);
  REQUIRE(kv.allocate(a, 5));
  kv.commit(a, 5);
  const PinId pin = kv.pin_prefix(a);
  kv.free(a);
  kv.check_invariants();
  // Page 0 of each group stays used through the pin; only the partial pages were freed.
  CHECK(kv.stats().groups[0].used_pages == 1);
  kv.begin_step();
  const RequestId b = kv.add_request(std::vector<std::uint32_t>(9, 7));
  kv.lookup_prefix(b);
  CHECK_FALSE(kv.allocate(b, 9));  // 3 pages per group, only 1 large page free per group
  kv.unpin(pin);
  CHECK_THROWS_WITH(kv.unpin(pin), Catch::Contains("pin = "));
  kv.check_invariants();
  REQUIRE(kv.allocate(b, 8));  // evicts the unpinned pages
  kv.free(b);

  // Priority: pages of a priority-1 request outlive older priority-0 pages.
  KVCacheManager kp(fig10_layout(4, 64), {.num_large_pages = 8, .max_requests = 4});
  kp.begin_step();
  const RequestId hi = kp.add_request(std::vector<std::uint32_t>{1, 2, 3, 4, 0}, {.priority = 1});
  kp.lookup_prefix(hi);
  REQUIRE(kp.allocate(hi, 5));
  kp.commit(hi, 5);
  const PageId hi_page = kp.page_table(hi, kFull)[0];
  kp.free(hi);
  kp.begin_step();
  const RequestId lo = kp.add_request(std::vector<std::uint32_t>{5, 6, 7, 8, 0});
  kp.lookup_prefix(lo);
  REQUIRE(kp.allocate(lo, 5));
  kp.commit(lo, 5);
  const PageId lo_page = kp.page_table(lo, kFull)[0];
  kp.free(lo);
  CHECK(kvmm::testing::ManagerInspector(kp).next_small_victim(kFull) == lo_page);
  CHECK(kvmm::testing::ManagerInspector(kp).next_large_victim() != kp.small_pages(kFull).large_page_of(hi_page));
}

TEST_CASE("vision embedding pages are freed once consumed; images evicted whole", "[manager][vision]") {
  const KVLayout layout =
      KVLayout::plan({LayerGroup::full_attention("text", 1, 1, 8, 2, 4),
                      LayerGroup::cross_attention("cross", 1, 1, 8, 2, 4), LayerGroup::vision_embedding("vis", 32, 4)});
  KVCacheManager kv(layout, {.num_large_pages = 64, .max_requests = 4, .record_events = true});
  const MultimodalItem img{hash_bytes(std::as_bytes(std::span("pixels", 6))), 2, 8};
  std::vector<std::uint32_t> t{1, 2, 0, 0, 0, 0, 0, 0, 0, 0, 3, 4, 5};  // image at [2, 10)
  const RequestExtras extras{.items = std::span(&img, 1)};
  kv.begin_step();
  const RequestId r = kv.add_request(t, extras);
  CHECK(kv.lookup_prefix(r) == 0);
  REQUIRE(kv.allocate(r, 8));
  CHECK(kv.page_table(r, 1).size() == 2);  // 8 image tokens, 4 per page
  CHECK(kv.page_table(r, 2).size() == 2);
  kv.commit(r, 8);
  CHECK(kv.page_table(r, 2)[0] != kNullPage);  // image not consumed yet
  kv.begin_step();
  REQUIRE(kv.allocate(r, 5));
  kv.commit(r, 13);
  CHECK(kv.page_table(r, 2)[0] == kNullPage);  // consumed: freed, stays cached
  CHECK(kv.page_table(r, 1)[0] != kNullPage);  // cross attention keeps the image
  kv.check_invariants();
  kv.free(r);
  // Both pages of the image share one prefix length (evicted together).
  std::vector<CacheEvent> ev;
  kv.take_events(ev);
  std::vector<PageId> cross;
  for (const auto& e : ev)
    if (e.group == 1 && e.kind == CacheEventKind::kStored) cross.push_back(e.page);
  REQUIRE(cross.size() == 2);
  CHECK(kvmm::testing::ManagerInspector(kv).eviction_key(1, cross[0]).prefix_len ==
        kvmm::testing::ManagerInspector(kv).eviction_key(1, cross[1]).prefix_len);
  // The same prompt and image hit the text prefix and the cross-attention pages.
  kv.begin_step();
  const RequestId r2 = kv.add_request(t, extras);
  CHECK(kv.lookup_prefix(r2) == 12);
  CHECK(kv.page_table(r2, 1)[0] == cross[0]);
  kv.check_invariants();
  // A different image: the pages covering it hash differently, the hit stops before it.
  const MultimodalItem other{hash_bytes(std::as_bytes(std::span("other!", 6))), 2, 8};
  const RequestId r3 = kv.add_request(t, {.items = std::span(&other, 1)});
  CHECK(kv.lookup_prefix(r3) == 0);
  kv.check_invariants();
}

TEST_CASE("stats count used, evictable, empty pages, waste, hits and evictions", "[manager][stats]") {
  const KVLayout layout = fig10_layout(4, 8);
  KVCacheManager kv(layout, {.num_large_pages = 8, .max_requests = 4, .record_events = true});
  kv.begin_step();
  const RequestId r = kv.add_request(std::vector<std::uint32_t>{1, 2, 3, 4, 5, 6});
  kv.lookup_prefix(r);
  REQUIRE(kv.allocate(r, 6));
  kv.commit(r, 6);
  CacheStats s = kv.stats();
  CHECK(s.groups[kFull].used_pages == 2);
  CHECK(s.groups[kFull].allocated_bytes == 2 * layout.small_page_bytes(kFull));
  CHECK(s.groups[kFull].needed_bytes == 6 * layout.group(kFull).bytes_per_token());
  CHECK(s.groups[kFull].waste_bytes == 2 * layout.group(kFull).bytes_per_token());
  kv.free(r);
  s = kv.stats();
  CHECK(s.groups[kFull].evictable_pages == 1);
  CHECK(s.groups[kFull].used_pages == 0);
  CHECK(s.free_large_pages == 6);
  kv.begin_step();
  const RequestId r2 = kv.add_request(std::vector<std::uint32_t>{1, 2, 3, 4, 5, 9});
  CHECK(kv.lookup_prefix(r2) == 4);
  s = kv.stats();
  CHECK(s.groups[kFull].hit_pages == 1);
  CHECK(s.hit_tokens == 4);
  CHECK(s.lookup_tokens == 12);
  std::vector<CacheEvent> ev;
  kv.take_events(ev);
  CHECK(std::count_if(ev.begin(), ev.end(), [](const CacheEvent& e) { return e.kind == CacheEventKind::kStored; }) ==
        2);
  kv.free(r2);
  kv.reset_prefix_cache();
  kv.take_events(ev);
  CHECK(ev.size() == 2);
  CHECK(kv.stats().groups[kFull].evictable_pages == 0);
  CHECK(kv.stats().free_large_pages == 8);
  kv.check_invariants();
}

TEST_CASE("misuse raises kvmm::Error naming the argument, state intact", "[manager][misuse]") {
  KVCacheManager kv(fig10_layout(4, 8), {.num_large_pages = 8, .max_requests = 2});
  kv.begin_step();
  const RequestId r = kv.add_request(std::vector<std::uint32_t>{1, 2, 3, 4, 5});
  kv.lookup_prefix(r);
  REQUIRE(kv.allocate(r, 3));
  const Snapshot before = snapshot(kv, 2, {r});
  REQUIRE(before.allocated == std::vector<std::uint64_t>{3});
  CHECK_THROWS_WITH(kv.commit(r, 4), Catch::Contains("num_computed_tokens = 4"));
  CHECK_THROWS_WITH(kv.lookup_prefix(r), Catch::Contains("request = " + std::to_string(r)));
  CHECK_THROWS_WITH(kv.fork(7), Catch::Contains("request = 7"));
  CHECK_THROWS_WITH(kv.fork(1 - r), Catch::Contains("not an active request"));
  CHECK_THROWS_WITH(kv.swap_in(r), Catch::Contains("not swapped out"));
  CHECK_THROWS_WITH(kv.page_table(r, 5), Catch::Contains("group = 5"));
  CHECK_THROWS_WITH(kv.set_policy(0, std::make_unique<FullAttentionPolicy>(4)), Catch::Contains("active"));
  CHECK_THROWS_WITH(kv.set_policy(0, std::make_unique<FullAttentionPolicy>(8)), Catch::Contains("tokens_per_page = 8"));
  CHECK(snapshot(kv, 2, {r}) == before);
  kv.commit(r, 3);
  CHECK_THROWS_WITH(kv.commit(r, 2), Catch::Contains("num_computed_tokens = 2"));
  kv.free(r);
  CHECK_THROWS_WITH(kv.free(r), Catch::Contains("request = " + std::to_string(r)));
  CHECK_THROWS_WITH(kv.free(99), Catch::Contains("request = 99"));
  kv.check_invariants();
  const RequestId a = kv.add_request(std::vector<std::uint32_t>{1});
  kv.add_request(std::vector<std::uint32_t>{1});
  CHECK_THROWS_WITH(kv.add_request(std::vector<std::uint32_t>{1}), Catch::Contains("max_requests = 2"));
  const MultimodalItem bad{};
  kv.free(a);
  CHECK_THROWS_WITH(kv.add_request(std::vector<std::uint32_t>{1}, {.items = std::span(&bad, 1)}),
                    Catch::Contains("extras.items[0].length = 0"));
  kv.check_invariants();
  CHECK_THROWS_WITH(KVCacheManager(fig10_layout(), {.num_large_pages = 0}), Catch::Contains("num_large_pages = 0"));
}

TEST_CASE("an engine-registered policy drives release and hits", "[manager][policy]") {
  // Keeps only the last page (like a tiny window) and accepts any fully cached prefix.
  class LastPageOnly final : public LayerPolicy {
   public:
    using LayerPolicy::LayerPolicy;
    std::string_view name() const override { return "last_page"; }
    std::uint64_t first_touched_page(std::uint64_t b, std::uint64_t) const override { return floor_page(b); }
    std::uint64_t first_needed_page(std::uint64_t c) const override { return c ? floor_page(c - 1) : 0; }
    std::uint64_t first_required_page(std::uint64_t p) const override { return p ? floor_page(p - 1) : 0; }
    std::uint64_t longest_valid_prefix(std::uint64_t limit, PageProbe& probe) const override {
      for (std::uint64_t k = floor_page(limit); k > 0; --k)
        if (probe.hit(k - 1)) return k * tokens_per_page_;
      return 0;
    }
  };
  KVCacheManager kv(fig10_layout(4, 8), {.num_large_pages = 16, .max_requests = 2});
  kv.set_policy(kSw, std::make_unique<LastPageOnly>(4));
  CHECK(kv.policy(kSw).name() == "last_page");
  kv.begin_step();
  const RequestId r = kv.add_request(std::vector<std::uint32_t>{1, 2, 3, 4, 5, 6, 7, 8, 9});
  kv.lookup_prefix(r);
  REQUIRE(kv.allocate(r, 9));
  kv.commit(r, 9);
  CHECK(kv.page_table(r, kSw)[0] == kNullPage);
  CHECK(kv.page_table(r, kSw)[1] == kNullPage);
  CHECK(kv.page_table(r, kSw)[2] != kNullPage);
  kv.free(r);
  const RequestId r2 = kv.add_request(std::vector<std::uint32_t>{1, 2, 3, 4, 5, 6, 7, 8, 9});
  CHECK(kv.lookup_prefix(r2) == 8);
  kv.check_invariants();
}
