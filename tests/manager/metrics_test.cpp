// The manager's O(1) counters, their Prometheus text, and the log callback (issue 15 item
// 5): a blocked queue head retried every step counts its prompt once among admitted
// requests; copies and swaps are counted; every metric has HELP and TYPE lines.
#include "kvmm/manager/metrics.hpp"
#include "kvmm/manager/kv_cache_manager.hpp"
#include "manager_fixture.hpp"

#include <catch2/catch.hpp>

#include <string>
#include <vector>

using namespace kvmm;

namespace {

std::vector<std::uint32_t> ids(std::uint32_t n, std::uint32_t salt) { return test::salted_ids(n, salt); }

}  // namespace

TEST_CASE("a blocked queue head counts each retry as a refused admission, its prompt once when admitted",
          "[manager][metrics]") {
  const KVLayout layout = KVLayout::plan({LayerGroup::full_attention("full", 1, 1, 8, 2, 4)});
  std::vector<std::pair<LogLevel, std::string>> logged;
  KVCacheManager kv(layout, {.num_large_pages = 16, .max_requests = 4, .log = [&](LogLevel l, std::string_view m) {
                               logged.emplace_back(l, std::string(m));
                             }});
  // A caches 8 tokens (2 pages) and then holds 14 of the 16 pages.
  kv.begin_step();
  const RequestId warm = kv.add_request(ids(9, 1));
  kv.lookup_prefix(warm);
  REQUIRE(kv.allocate(warm, 9));
  kv.commit(warm, 9);
  kv.free(warm);
  const RequestId a = kv.add_request(ids(56, 2));
  kv.lookup_prefix(a);
  REQUIRE(kv.allocate(a, 56));
  kv.commit(a, 56);
  // B (the cached 8 tokens + 20 more) waits three steps, then gets in.
  const std::vector<std::uint32_t> b_ids = [] {
    auto t = ids(9, 1);
    t.resize(28, 5);
    return t;
  }();
  const RequestId b = kv.add_request(b_ids);
  for (int retry = 0; retry < 3; ++retry) {
    kv.begin_step();
    CHECK(kv.lookup_prefix(b) == 8);
    CHECK_FALSE(kv.allocate(b, 20));
    kv.reset(b);
  }
  kv.free(a);
  kv.begin_step();
  CHECK(kv.lookup_prefix(b) == 8);
  REQUIRE(kv.allocate(b, 20));
  const ManagerCounters c = kv.counters();
  CHECK(c.lookups == 2 + 4);
  CHECK(c.lookup_tokens == 9 + 56 + 4 * 28);
  CHECK(c.hit_tokens == 4 * 8);
  CHECK(c.admissions == 3);
  CHECK(c.admitted_lookup_tokens == 9 + 56 + 28);
  CHECK(c.admitted_hit_tokens == 8);
  CHECK(c.refused_admissions == 3);
  CHECK(c.refused_allocations == 3);
  CHECK(c.active_requests == 1);
  CHECK(c.large_pages == 16);
  CHECK(c.used_pages == std::vector<std::uint32_t>{7});
  int refusals_logged = 0;
  for (const auto& [level, text] : logged)
    refusals_logged += level == LogLevel::kDebug && text.find("refused") != std::string::npos;
  CHECK(refusals_logged == 3);
  kv.reset_prefix_cache();
  CHECK(logged.back().first == LogLevel::kInfo);
  CHECK(logged.back().second.find("reset_prefix_cache") != std::string::npos);
}

TEST_CASE("copies and swaps are counted; the Prometheus text names every metric", "[manager][metrics]") {
  const KVLayout layout = KVLayout::plan({LayerGroup::full_attention("full \"a\"", 1, 1, 8, 2, 4)});
  KVCacheManager kv(layout, {.num_large_pages = 16, .num_host_large_pages = 8, .max_requests = 4});
  kv.begin_step();
  const RequestId p = kv.add_request(ids(6, 3));
  kv.lookup_prefix(p);
  REQUIRE(kv.allocate(p, 6));
  kv.commit(p, 6);
  const RequestId child = kv.fork(p);
  kv.append_token(child, 1);
  REQUIRE(kv.allocate(child, 1));  // writes into the shared partial page: one copy
  kv.commit(child, 7);
  REQUIRE(kv.swap_out(p));
  REQUIRE(kv.swap_in(p));
  const ManagerCounters c = kv.counters();
  CHECK(c.cow_copies == 1);
  CHECK(c.swapped_out_pages == 2);
  CHECK(c.swapped_in_pages == 2);
  const std::string text = prometheus_text(kv);
  CHECK(text.find("# TYPE kvmm_cow_copies_total counter\nkvmm_cow_copies_total 1\n") != std::string::npos);
  CHECK(text.find("kvmm_swapped_out_pages_total 2\n") != std::string::npos);
  CHECK(text.find("kvmm_active_requests 2\n") != std::string::npos);
  CHECK(text.find("kvmm_used_pages{group=\"full \\\"a\\\"\"} ") != std::string::npos);  // label escaped
  // Every sample line's metric has its HELP and TYPE lines.
  std::size_t samples = 0;
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t end = text.find('\n', at);
    const std::string line = text.substr(at, end - at);
    at = end + 1;
    if (line.starts_with("#")) continue;
    ++samples;
    const std::string name = line.substr(0, line.find_first_of("{ "));
    CHECK(text.find("# HELP " + name + " ") != std::string::npos);
    CHECK(text.find("# TYPE " + name + " ") != std::string::npos);
  }
  // 22 counters and gauges (4 of them a tier's, 2 retention's), 2 per-group gauges of the one group, 2 x 9 per
  // miss reason
  CHECK(samples == 42);
  CHECK(prometheus_text(kv, "engine_kv").find("engine_kv_lookups_total 1\n") != std::string::npos);
  CHECK_THROWS_WITH(prometheus_text(kv, "9bad"), Catch::Contains("prefix = \"9bad\""));
}
