// Memory held for retention (issue 34 item 2): bounded by
// KVCacheManagerOptions::retention_budget, counted in counters().retention_bytes and
// prometheus_text, and released when a running request's allocate cannot be served
// otherwise (retention_release: its own held pages by default, anyone's with kAll; an
// admission refused leaves them held): the held pages are evicted first and the ordinary
// cached pages the allocate does not need survive. The randomized model test checks the
// bound and the release at every operation (reference_model.cpp).
#include "kvmm/manager/kv_cache_manager.hpp"
#include "kvmm/manager/metrics.hpp"
#include "kvmm/testing/manager_inspector.hpp"
#include "support/error_of.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

using namespace kvmm;
using kvmm::test::error_of;

namespace {

constexpr GroupId kFull = 0, kSw = 1;
constexpr std::uint32_t kLargePages = 16;

// Full attention + a window of 2, one-token pages, one small page per large page.
KVLayout layout() {
  return KVLayout::plan(
      {LayerGroup::full_attention("full", 1, 1, 8, 2, 1), LayerGroup::sliding_window("sw", 1, 1, 8, 2, 1, 2)});
}

KVCacheManager manager(double budget, RetentionRelease release = RetentionRelease::kAll) {
  return KVCacheManager(layout(), {.num_large_pages = kLargePages,
                                   .max_requests = 4,
                                   .learned_boundaries = 0,
                                   .prompt_tail_tokens = 0,
                                   .retention_budget = budget,
                                   .retention_release = release});
}

// Request a: 4 prompt tokens with boundaries 2 and 4, then 2 decoded: its window pages of
// tokens 0-3 left the window and a hit at 2 or 4 needs them (held, as the budget allows);
// 11 pages in use or held (token 4's window page is cached). Returns a, still running.
RequestId run_a(KVCacheManager& kv) {
  kv.begin_step();
  const std::vector<std::uint64_t> bounds{2, 4};
  const RequestId a = kv.add_request(std::vector<std::uint32_t>{1, 2, 3, 4}, {.cache_boundaries = bounds});
  REQUIRE(kv.lookup_prefix(a) == 0);
  REQUIRE(kv.allocate(a, 4));
  kv.commit(a, 4);
  for (std::uint32_t t : {5u, 6u}) {
    kv.append_token(a, t);
    kv.begin_step();
    REQUIRE(kv.allocate(a, 1));
    kv.commit(a, kv.num_computed(a) + 1);
  }
  return a;
}

// Request b: 2 tokens computed at a later step and freed: 4 ordinary cached pages.
void run_b(KVCacheManager& kv) {
  kv.begin_step();
  const RequestId b = kv.add_request(std::vector<std::uint32_t>{50, 51});
  REQUIRE(kv.lookup_prefix(b) == 0);
  REQUIRE(kv.allocate(b, 2));
  kv.commit(b, 2);
  kv.free(b);
}

}  // namespace

TEST_CASE("with kAll, pages held for retention are released and evicted first when an allocate needs their memory",
          "[manager][retention][pressure]") {
  KVCacheManager kv = manager(0.25);
  const testing::ManagerInspector in(kv);
  const RequestId a = run_a(kv);
  const auto held = in.held_pages(a);
  REQUIRE(held.size() == 4);  // the window pages of tokens 0-3
  for (const auto& [g, p] : held) CHECK(g == kSw);
  const std::uint64_t page = kv.layout().small_page_bytes(kSw);
  CHECK(kv.counters().retention_bytes == 4 * page);
  run_b(kv);
  // The ordinary cached pages: b's, and a's window page no boundary needs (token 4's).
  std::vector<std::pair<GroupId, PageId>> ordinary;
  for (GroupId g : {kFull, kSw})
    for (PageId p = 0; p < kLargePages; ++p)
      if (in.page_state(g, p) == PageState::kEvictable) ordinary.emplace_back(g, p);
  const std::uint64_t free = kv.counters().free_large_pages;
  REQUIRE(ordinary.size() == 5);
  REQUIRE(free == 0);
  kv.check_invariants();

  // c needs 6 pages (3 tokens, both groups): free and evictable pages make 5, so only the
  // held ones make it fit. The 4 held pages go first, then 2 ordinary ones; 3 survive.
  kv.begin_step();
  const RequestId c = kv.add_request(std::vector<std::uint32_t>{90, 91, 92});
  REQUIRE(kv.lookup_prefix(c) == 0);
  CHECK_FALSE(kv.allocate(c, 3));  // an admission: refused, the retention kept (c waits)
  CHECK(in.held_pages(a).size() == 4);
  REQUIRE(kv.allocate(c, 0));  // admitted with no page: now a running request's allocate
  REQUIRE(kv.allocate(c, 3));
  CHECK(in.held_pages(a).empty());
  for (const auto& [g, p] : held) CHECK_FALSE(in.page_hash(g, p).has_value());  // evicted
  const std::size_t survivors = static_cast<std::size_t>(std::count_if(
      ordinary.begin(), ordinary.end(), [&](const auto& gp) { return in.page_hash(gp.first, gp.second).has_value(); }));
  CHECK(survivors == 3);
  const ManagerCounters n = kv.counters();
  CHECK(n.retention_bytes == 0);
  CHECK(n.retention_released_pages == 4);
  CHECK(n.evicted_pages == 6);
  CHECK(n.refused_allocations == 1);  // the admission's; the running allocate's first try is not counted
  const std::string text = prometheus_text(kv);
  CHECK(text.find("\nkvmm_retention_bytes 0\n") != std::string::npos);
  CHECK(text.find("\nkvmm_retention_released_pages_total 4\n") != std::string::npos);
  kv.check_invariants();

  // a keeps its boundaries (a page one needs that leaves the window later is held again).
  CHECK(in.cache_boundaries(a) == std::vector<std::uint64_t>{2, 4});
}

TEST_CASE("with kAll, an allocate that fails even without retention leaves it released and changes nothing else",
          "[manager][retention][pressure]") {
  KVCacheManager kv = manager(0.25);
  const testing::ManagerInspector in(kv);
  const RequestId a = run_a(kv);
  REQUIRE(in.held_pages(a).size() == 4);
  kv.begin_step();
  const RequestId c = kv.add_request(std::vector<std::uint32_t>{90, 91, 92, 93, 94});
  REQUIRE(kv.lookup_prefix(c) == 0);
  REQUIRE(kv.allocate(c, 0));            // admitted: its allocates are a running request's
  CHECK_FALSE(kv.would_allocate(c, 5));  // 10 pages: 3 free, 1 cached and 4 held are not enough
  CHECK(in.held_pages(a).empty());       // would_allocate released them as allocate would
  CHECK(kv.allocate(c, 5).kind == AllocateStatus::kNoMemory);
  CHECK(kv.page_table(c, kFull).empty());
  CHECK(kv.counters().refused_allocations == 1);
  CHECK(kv.counters().retention_released_pages == 4);
  CHECK(kv.stats().groups[kSw].evictable_pages == 5);  // still cached, with token 4's
  kv.check_invariants();
}

TEST_CASE("by default a running request's refused allocate releases its own held pages, never another's",
          "[manager][retention][pressure]") {
  for (const RetentionRelease release : {RetentionRelease::kOwn, RetentionRelease::kOff}) {
    INFO("release " << static_cast<int>(release));
    KVCacheManager kv = manager(0.25, release);
    const testing::ManagerInspector in(kv);
    const RequestId a = run_a(kv);
    REQUIRE(in.held_pages(a).size() == 4);
    run_b(kv);  // 5 ordinary cached pages, nothing free
    // c, running, needs 6 pages: only a's held pages could make room; they are not c's.
    kv.begin_step();
    const RequestId c = kv.add_request(std::vector<std::uint32_t>{90, 91, 92});
    REQUIRE(kv.lookup_prefix(c) == 0);
    REQUIRE(kv.allocate(c, 0));
    CHECK_FALSE(kv.would_allocate(c, 3));
    CHECK(kv.allocate(c, 3).kind == AllocateStatus::kNoMemory);
    CHECK(in.held_pages(a).size() == 4);
    CHECK(kv.counters().retention_released_pages == 0);
    // a needs 8 pages (4 tokens, both groups): the 5 cached and its own 4 held make 9.
    const bool fits = kv.would_allocate(a, 4);
    CHECK(fits == (release == RetentionRelease::kOwn));
    CHECK(static_cast<bool>(kv.allocate(a, 4)) == fits);
    CHECK(in.held_pages(a).size() == (fits ? 0u : 4u));
    CHECK(kv.counters().retention_released_pages == (fits ? 4u : 0u));
    CHECK(kv.counters().retention_bytes == (fits ? 0 : 4 * kv.layout().small_page_bytes(kSw)));
    kv.check_invariants();
  }
}

TEST_CASE("retention_budget bounds the memory held for retention", "[manager][retention][pressure]") {
  const KVLayout l = layout();
  const std::uint64_t page = l.small_page_bytes(kSw);
  const double pool = static_cast<double>(kLargePages) * static_cast<double>(l.large_page_bytes());
  for (const std::uint64_t room : {0u, 1u, 3u, 4u}) {
    INFO("room for " << room << " pages");
    KVCacheManager kv = manager((static_cast<double>(room) + 0.5) * static_cast<double>(page) / pool);
    const testing::ManagerInspector in(kv);
    const RequestId a = run_a(kv);
    // Pages leave the window last first at each commit: tokens 1 and 0, then 2, then 3.
    CHECK(in.held_pages(a).size() == room);
    CHECK(kv.counters().retention_bytes == room * page);
    kv.check_invariants();
  }
  KVCacheManager none = manager(0.0);
  CHECK(testing::ManagerInspector(none).held_pages(run_a(none)).empty());
}

TEST_CASE("retention_budget outside [0, 1] is refused with its value", "[manager][retention][pressure]") {
  for (const double bad : {-0.25, 1.5, std::numeric_limits<double>::quiet_NaN()}) {
    const std::string e = error_of([&] { manager(bad); });
    INFO(e);
    CHECK(e.find("retention_budget = ") == 0);
    CHECK(e.find("must be in [0, 1]") != std::string::npos);
  }
  CHECK(error_of([] { manager(1.0); }) == "no error");
  const std::string e = error_of([] { manager(0.25, static_cast<RetentionRelease>(3)); });
  CHECK(e == "retention_release = 3: must be kOff, kOwn or kAll");
  CHECK(KVCacheManagerOptions{}.retention_release == RetentionRelease::kOwn);
}
