// Boundary-aware retention (issue 17): Jenga Fig. 10's setting plus one more eviction,
// where the sliding-window pages a hit at the shared prefix needs go first unless the
// boundary is named; the held pages' keys, stats and release; learned branch points; bad
// boundaries. The randomized model test (randomized_test.cpp) checks holds at every commit.
#include "kvmm/manager/kv_cache_manager.hpp"
#include "kvmm/testing/manager_inspector.hpp"
#include "support/error_of.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <vector>

using namespace kvmm;

namespace {

constexpr GroupId kFull = 0, kSw = 1;
constexpr std::uint32_t A = 101, B = 102, C = 103, D = 104, E = 105, F = 106, G = 107, X = 200;

// Jenga §5.1's setting: full attention + a window of 2, one-token pages, one small page
// per large page.
KVLayout fig10_layout() {
  return KVLayout::plan(
      {LayerGroup::full_attention("full", 1, 1, 8, 2, 1), LayerGroup::sliding_window("sw", 1, 1, 8, 2, 1, 2)});
}

struct Fig10Run {
  std::uint64_t hit = 0;
  std::vector<std::pair<GroupId, PageId>> held;  // at the end of request 1's decode
  GroupStats sw_before_free;
  EvictionKey sw_c, full_c;  // keys of token C's pages once request 1 is freed
};

// Request 1 computes ABCD (the shared prefix: boundary 4 when named), decodes E and F, and
// finishes; an unrelated request then takes 4 pages (2 per group) out of the 12, all cached;
// request 2, ABCDG, looks up.
Fig10Run fig10_plus_one_eviction(std::vector<std::uint64_t> boundaries) {
  KVCacheManager kv(fig10_layout(), {.num_large_pages = 12, .max_requests = 4, .prompt_tail_tokens = 0});
  testing::ManagerInspector in(kv);
  Fig10Run out;
  kv.begin_step();
  const RequestId r1 = kv.add_request(std::vector<std::uint32_t>{A, B, C, D}, {.cache_boundaries = boundaries});
  REQUIRE(kv.lookup_prefix(r1) == 0);
  REQUIRE(kv.allocate(r1, 4));
  const PageId sw_c = kv.page_table(r1, kSw)[2], full_c = kv.page_table(r1, kFull)[2];
  kv.commit(r1, 4);
  for (std::uint32_t t : {E, F}) {
    kv.append_token(r1, t);
    kv.begin_step();
    REQUIRE(kv.allocate(r1, 1));
    kv.commit(r1, kv.num_computed(r1) + 1);
  }
  kv.check_invariants();
  out.held = in.held_pages(r1);
  out.sw_before_free = kv.stats().groups[kSw];
  kv.free(r1);
  out.sw_c = in.eviction_key(kSw, sw_c);
  out.full_c = in.eviction_key(kFull, full_c);
  kv.begin_step();
  const RequestId other = kv.add_request(std::vector<std::uint32_t>{X, X + 1, X + 2});
  REQUIRE(kv.lookup_prefix(other) == 0);
  REQUIRE(kv.allocate(other, 2));
  kv.check_invariants();
  const RequestId r2 = kv.add_request(std::vector<std::uint32_t>{A, B, C, D, G});
  out.hit = kv.lookup_prefix(r2);
  return out;
}

}  // namespace

TEST_CASE("Jenga Fig. 10 plus one eviction: a named boundary keeps the 4-token hit", "[manager][retention]") {
  const Fig10Run plain = fig10_plus_one_eviction({});
  const Fig10Run named = fig10_plus_one_eviction({4});
  // Without the boundary, the window's pages C and D left request 1's window at steps 2 and
  // 3 with their older times and are the first victims: the hit needs them and is lost.
  CHECK(plain.held.empty());
  CHECK(plain.hit == 0);
  CHECK(plain.sw_c.time < plain.full_c.time);
  // Named, request 1 holds C and D (the window a hit at 4 needs) until it finishes; they
  // count as used, and go back with the key of the full-attention pages at their positions.
  REQUIRE(named.held.size() == 2);
  CHECK(named.held[0].first == kSw);
  CHECK(named.sw_before_free.used_pages == plain.sw_before_free.used_pages + 2);
  CHECK(named.sw_before_free.evictable_pages + 2 == plain.sw_before_free.evictable_pages);
  CHECK(named.sw_before_free.waste_bytes == 0);
  CHECK(named.sw_c == named.full_c);
  CHECK(named.hit == 4);
}

TEST_CASE("held pages are released at free and reset, not leaked", "[manager][retention]") {
  KVCacheManager kv(fig10_layout(), {.num_large_pages = 16, .max_requests = 4, .prompt_tail_tokens = 0});
  testing::ManagerInspector in(kv);
  const std::vector<std::uint64_t> bounds{2, 4};
  const RequestId r = kv.add_request(std::vector<std::uint32_t>{A, B, C, D, E, F, G}, {.cache_boundaries = bounds});
  kv.lookup_prefix(r);
  REQUIRE(kv.allocate(r, 7));
  kv.commit(r, 7);
  // Window 2 after 7 tokens: page 6 in the table (the next token reads 6 and itself); 0..3
  // held for boundaries 2 and 4; 4 and 5 released.
  CHECK(in.held_pages(r).size() == 4);
  CHECK(kv.stats().groups[kSw].used_pages == 5);
  kv.check_invariants();
  kv.reset(r);
  CHECK(in.held_pages(r).empty());
  CHECK(kv.stats().groups[kSw].used_pages == 0);
  CHECK(in.cache_boundaries(r) == bounds);  // a preempted request keeps its hints
  CHECK(kv.lookup_prefix(r) == 6);          // and its pages stay findable: hit up to the window at 6
  REQUIRE(kv.allocate(r, 1));
  kv.commit(r, 7);
  kv.free(r);
  kv.check_invariants();
  for (GroupId g : {kFull, kSw}) CHECK(kv.stats().groups[g].used_pages == 0);
}

TEST_CASE("learned boundaries: a branch point found by one lookup is held by the next requests",
          "[manager][retention]") {
  // A 12-token "article" shared by three questions of 2 tokens each, each prefilled 2 tokens
  // a step (window 2: the article's window pages leave early, with older times); after each
  // request an unrelated one takes 24 of the 40 pages, so the oldest pages go.
  auto run = [](std::uint32_t learned, std::uint32_t tail = 0) {
    KVCacheManager kv(
        fig10_layout(),
        {.num_large_pages = 40, .max_requests = 4, .learned_boundaries = learned, .prompt_tail_tokens = tail});
    testing::ManagerInspector in(kv);
    std::vector<std::uint32_t> article(12);
    for (std::uint32_t i = 0; i < 12; ++i) article[i] = 1000 + i;
    std::vector<std::uint64_t> hits;
    std::vector<std::size_t> bounds;
    for (std::uint32_t q = 0; q < 3; ++q) {
      std::vector<std::uint32_t> ids = article;
      ids.push_back(2000 + 10 * q);
      ids.push_back(2001 + 10 * q);
      kv.begin_step();
      const RequestId r = kv.add_request(ids);
      hits.push_back(kv.lookup_prefix(r));
      while (kv.num_computed(r) < ids.size()) {
        const auto n = static_cast<std::uint32_t>(std::min<std::uint64_t>(2, ids.size() - kv.num_computed(r)));
        REQUIRE(kv.allocate(r, n));
        kv.commit(r, kv.num_computed(r) + n);
        kv.begin_step();
      }
      bounds.push_back(in.cache_boundaries(r).size());
      kv.free(r);
      kv.begin_step();
      const RequestId o = kv.add_request(std::vector<std::uint32_t>(12, 3000 + q));
      kv.lookup_prefix(o);
      REQUIRE(kv.allocate(o, 12));
      kv.commit(o, 12);
      kv.free(o);
      kv.check_invariants();
    }
    return std::pair{hits, bounds};
  };
  const auto [plain_hits, plain_bounds] = run(0);
  const auto [learned_hits, learned_bounds] = run(64);
  // Without learning: the article's full-attention pages survive, its window does not.
  CHECK(plain_hits == std::vector<std::uint64_t>{0, 0, 0});
  CHECK(plain_bounds == std::vector<std::size_t>{0, 0, 0});
  // Learning: the second request's lookup finds the full-attention hit (12) longer than the
  // hit (0): 12 is a branch point, which it holds; the third request hits the article.
  CHECK(learned_hits == std::vector<std::uint64_t>{0, 0, 12});
  CHECK(learned_bounds == std::vector<std::size_t>{0, 1, 1});
  // Prompt tails: a request holding the window for hits within its prompt's last 2 tokens
  // holds it at 12, where the next question parts: the second request hits already. A
  // tail of 1 token does not reach back to 12: nothing held there, no hit.
  CHECK(run(0, 2).first == std::vector<std::uint64_t>{0, 12, 12});
  CHECK(run(0, 1).first == std::vector<std::uint64_t>{0, 0, 0});
  // Both: the tail reaches; learning finds nothing more.
  CHECK(run(64, 2).first == std::vector<std::uint64_t>{0, 12, 12});
}

TEST_CASE("prompt tails: the held pages are the union of the needs of every length in the tail",
          "[manager][retention]") {
  // Window 2 (fig10_layout: a token reads itself and the one before), 1-token pages, a
  // 9-token prompt prefilled at once, tail 3: hits at 6, 7, 8 and 9 need pages [4, 9) (a hit
  // at L needs [L - 2, L)); after the prefill the table keeps page 8, so 7, 6, 5 and 4 are
  // held, 0..3 released.
  KVCacheManager kv(fig10_layout(),
                    {.num_large_pages = 40, .max_requests = 2, .learned_boundaries = 0, .prompt_tail_tokens = 3});
  testing::ManagerInspector in(kv);
  const RequestId r = kv.add_request(std::vector<std::uint32_t>{A, B, C, D, E, F, G, X, 77});
  CHECK(in.prompt_tail(r) == std::pair<std::uint64_t, std::uint64_t>{6, 9});
  kv.lookup_prefix(r);
  REQUIRE(kv.allocate(r, 9));
  kv.commit(r, 9);
  std::vector<PageId> held;
  for (const auto& [g, p] : in.held_pages(r)) {
    CHECK(g == kSw);
    held.push_back(p);
  }
  const auto row = kv.page_table(r, kFull);  // the full-attention pages sit at the same indices
  REQUIRE(held.size() == 4);
  // Held in the order they left the window (last first): pages 7, 6, 5, 4 of the row.
  for (std::size_t k = 0; k < 4; ++k) CHECK(in.eviction_key(kSw, held[k]).prefix_len == 8 - k);
  CHECK(row.size() == 9);
  CHECK(kv.stats().groups[kSw].used_pages == 5);
  // The answer grows: up to 3 tokens past the prompt the tail stays (page 8, which a hit
  // at 9 needs, is held when it leaves the window; 9 and later are not); the 4th token
  // past the prompt drops the tail and its pages go back.
  for (std::uint32_t t = 0; t < 4; ++t) {
    kv.append_token(r, 500 + t);
    REQUIRE(kv.allocate(r, 1));
    kv.commit(r, 10 + t);
    CHECK(in.held_pages(r).size() == (t < 3 ? 5u : 0u));
  }
  CHECK(in.prompt_tail(r) == std::pair<std::uint64_t, std::uint64_t>{0, 0});
  CHECK(kv.stats().groups[kSw].used_pages == 1);  // the window alone
  CHECK(in.eviction_key(kSw, held[0]).time <= in.eviction_key(kFull, row[7]).time);
  kv.check_invariants();
  kv.free(r);
  CHECK(kv.stats().groups[kSw].used_pages == 0);  // released with the request
  kv.check_invariants();
  // A prompt shorter than the tail: every length from 1 is in it.
  const RequestId s = kv.add_request(std::vector<std::uint32_t>{A, B});
  CHECK(in.prompt_tail(s) == std::pair<std::uint64_t, std::uint64_t>{1, 2});
  kv.free(s);
  KVCacheManager off(fig10_layout(), {.num_large_pages = 8, .prompt_tail_tokens = 0});
  const RequestId t = off.add_request(std::vector<std::uint32_t>{A, B});
  CHECK(testing::ManagerInspector(off).prompt_tail(t) == std::pair<std::uint64_t, std::uint64_t>{0, 0});
}

TEST_CASE("bad cache boundaries raise and leave the manager as it was", "[manager][retention][errors]") {
  KVCacheManager kv(fig10_layout(), {.num_large_pages = 8, .max_requests = 2});
  const std::vector<std::uint32_t> ids{A, B, C, D};
  auto message = [&](std::vector<std::uint64_t> b) {
    return kvmm::test::error_of([&] { kv.add_request(ids, {.cache_boundaries = b}); });
  };
  CHECK_THAT(message({0}), Catch::Contains("extras.cache_boundaries[0] = 0"));
  CHECK_THAT(message({5}), Catch::Contains("extras.cache_boundaries[0] = 5: must be in [1, 4]"));
  CHECK_THAT(message({3, 2}), Catch::Contains("extras.cache_boundaries[1] = 2: must be ascending"));
  CHECK_THAT(message(std::vector<std::uint64_t>(kMaxCacheBoundaries + 1, 1)),
             Catch::Contains("extras.cache_boundaries.size() = 9"));
  CHECK(kv.num_active() == 0);
  // With prompt_tokens (ids arriving in chunks), the bound is the full prompt.
  CHECK(kv.is_active(kv.add_request(ids, {.prompt_tokens = 8, .cache_boundaries = std::vector<std::uint64_t>{8}})));
  KVCacheManagerOptions o{.num_large_pages = 8, .learned_boundaries = (1u << 24) + 1};
  CHECK_THROWS_WITH(KVCacheManager(fig10_layout(), o), Catch::Contains("learned_boundaries = 16777217"));
  KVCacheManagerOptions t{.num_large_pages = 8, .prompt_tail_tokens = (1u << 24) + 1};
  CHECK_THROWS_WITH(KVCacheManager(fig10_layout(), t), Catch::Contains("prompt_tail_tokens = 16777217"));
}

TEST_CASE("a prefix computed twice stays findable from its newest copy", "[manager][retention]") {
  const KVLayout layout = KVLayout::plan({LayerGroup::full_attention("full", 1, 1, 8, 2, 1)});
  KVCacheManager kv(layout, {.num_large_pages = 32, .max_requests = 4, .record_events = true});
  testing::ManagerInspector in(kv);
  const std::vector<std::uint32_t> ids{A, B, C, D, E, F, G, X};
  std::vector<std::uint32_t> longer = ids;
  longer.push_back(X + 1);
  std::vector<CacheEvent> events;

  SECTION("both admitted before either committed: the second copy takes over at the first's release") {
    const RequestId a = kv.add_request(ids), b = kv.add_request(ids);
    REQUIRE(kv.lookup_prefix(a) == 0);
    REQUIRE(kv.lookup_prefix(b) == 0);
    REQUIRE(kv.allocate(a, 8));
    REQUIRE(kv.allocate(b, 8));
    kv.commit(a, 8);
    kv.commit(b, 8);
    const auto pa = kv.page_table(a, 0), pb = kv.page_table(b, 0);
    const std::vector<PageId> a_pages(pa.begin(), pa.end()), b_pages(pb.begin(), pb.end());
    for (std::size_t i = 0; i < 8; ++i) {
      CHECK(in.page_hash(0, a_pages[i]).has_value());
      CHECK_FALSE(in.page_hash(0, b_pages[i]).has_value());  // a copy: private until a lets go
    }
    kv.take_events(events);
    kv.free(a);
    kv.check_invariants();
    for (std::size_t i = 0; i < 8; ++i) {
      CHECK(in.page_state(0, a_pages[i]) == PageState::kEmpty);  // its memory back at once
      CHECK(in.page_hash(0, b_pages[i]).has_value());
    }
    kv.take_events(events);
    CHECK(events.size() == 16);  // each page: removed (a's), then stored (b's)
    const RequestId c = kv.add_request(longer);
    CHECK(kv.lookup_prefix(c) == 8);  // from b's pages, while b runs
    REQUIRE(kv.allocate(c, 1));
    CHECK(std::equal(b_pages.begin(), b_pages.end(), kv.page_table(c, 0).begin()));
  }

  SECTION("computed again while the first copy is evictable: the new copy takes over, the old is evicted") {
    const RequestId a = kv.add_request(ids);
    REQUIRE(kv.allocate(a, 8));
    kv.commit(a, 8);
    const auto pa = kv.page_table(a, 0);
    const std::vector<PageId> a_pages(pa.begin(), pa.end());
    kv.free(a);
    CHECK(kv.page_counts(0).evictable == 8);
    const RequestId b = kv.add_request(ids);  // no lookup: computes the prefix again
    REQUIRE(kv.allocate(b, 8));
    kv.commit(b, 8);
    kv.check_invariants();
    CHECK(kv.page_counts(0).evictable == 0);
    CHECK(kv.page_counts(0).used == 8);
    for (PageId p : a_pages) CHECK(in.page_state(0, p) == PageState::kEmpty);
    for (PageId p : kv.page_table(b, 0)) CHECK(in.page_hash(0, p).has_value());
  }
}

// The prompt tail that adapts (issue 34): followers that part from a shared prefix 20 tokens
// before their prompts end teach the manager that suffix length; a new request's tail then
// holds the window where its own followers will part, not only within prompt_tail_tokens of
// its end.
TEST_CASE("learned tail: the tail reaches back as far as followers were seen to part", "[manager][retention]") {
  const KVLayout layout = KVLayout::plan(
      {LayerGroup::full_attention("full", 1, 1, 8, 2, 4), LayerGroup::sliding_window("sw", 1, 1, 8, 2, 4, 8)});
  auto prompt = [](std::uint32_t article, std::uint32_t question) {
    std::vector<std::uint32_t> p;
    for (std::uint32_t i = 0; i < 32; ++i) p.push_back(1000 * article + i);           // the article
    for (std::uint32_t i = 0; i < 20; ++i) p.push_back(500000 + 100 * question + i);  // a 20-token question
    return p;
  };
  auto held_after_prefill = [&](std::uint32_t learned_tail) {
    KVCacheManager kv(layout, {.num_large_pages = 256,
                               .max_requests = 8,
                               .learned_boundaries = 0,
                               .prompt_tail_tokens = 4,
                               .learned_tail_tokens = learned_tail});
    auto run = [&](const std::vector<std::uint32_t>& p, bool free_it) {
      kv.begin_step();
      const RequestId r = kv.add_request(p);
      const std::uint64_t hit = kv.lookup_prefix(r);
      REQUIRE(kv.allocate(r, static_cast<std::uint32_t>(p.size() - hit)));
      kv.commit(r, p.size());
      if (free_it) kv.free(r);
      return std::pair{r, hit};
    };
    for (std::uint32_t a = 0; a < 10; ++a) {
      run(prompt(a, 0), true);
      CHECK(run(prompt(a, 1), true).second == 32);  // the follower hits the article, parts 20 tokens before its end
    }
    const auto [r, hit] = run(prompt(99, 0), false);
    CHECK(hit == 0);
    kv.check_invariants();
    return testing::ManagerInspector(kv).num_held_pages(r, kSw);
  };
  // 52 computed tokens: the table keeps the window's pages from (52 - 8) / 4 = 11 on. A hit
  // at L needs pages [(L - 8) / 4, L / 4). Without learning the tail is [48, 52]: page 10
  // held. Learned (suffix 20): [32, 52], pages 6..10 held.
  CHECK(held_after_prefill(0) == 1);
  CHECK(held_after_prefill(2048) == 5);
  // The learned reach is bounded by learned_tail_tokens.
  CHECK(held_after_prefill(12) == 3);  // [40, 52]: pages 8..10
}

TEST_CASE("learned_tail_tokens out of range is refused", "[manager][retention]") {
  CHECK_THROWS_WITH(KVCacheManager(fig10_layout(), {.num_large_pages = 4, .learned_tail_tokens = (1u << 24) + 1}),
                    Catch::Contains("learned_tail_tokens = 16777217"));
}
