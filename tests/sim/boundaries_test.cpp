// Issue 17 in the simulator: the workloads that carry cache boundaries (arxiv-qa, the
// Fig. 17 sweep arxiv-sweep, chat), their trace field, and the kvmm policy's --boundaries
// modes handing them to the manager (runs checked against the manager's invariants).
#include "sim_test_util.hpp"

#include "kvmm/error.hpp"
#include "kvmm/manager/kv_cache_manager.hpp"
#include "sim/workload.hpp"
#include "support/error_of.hpp"

#include <catch2/catch.hpp>

#include <map>
#include <sstream>

using namespace kvmm::sim;

namespace {
WorkloadOptions opts(std::uint32_t n, std::uint64_t seed = 1, std::uint32_t articles = 8) {
  WorkloadOptions o;
  o.num_requests = n;
  o.seed = seed;
  o.articles = articles;
  return o;
}
std::string dump(const Workload& w) {
  std::ostringstream out;
  write_trace(w, out);
  return out.str();
}
}  // namespace

TEST_CASE("arxiv-qa: every question names its article as its boundary", "[sim][workload][boundaries]") {
  const Workload w = make_workload("arxiv-qa", opts(400));
  for (const auto& r : w.requests) {
    REQUIRE(r.boundaries.size() == 1);
    CHECK(r.boundaries[0] == r.prefix_len);
    CHECK(r.boundaries[0] < r.prompt_len);
  }
}

TEST_CASE("arxiv-sweep: N articles asked in round robin", "[sim][workload][boundaries]") {
  for (const std::uint32_t n : {1u, 3u, 7u}) {
    CAPTURE(n);
    const Workload w = make_workload("arxiv-sweep", opts(5 * n + 2, 4, n));
    REQUIRE(w.name == "arxiv-sweep");
    REQUIRE(w.requests.size() == 5 * n + 2);
    std::map<std::uint64_t, std::uint32_t> len;
    for (std::size_t i = 0; i < w.requests.size(); ++i) {
      const SimRequest& r = w.requests[i];
      // Request i asks about article i mod n: the previous question on it is n requests back.
      if (i >= n) CHECK(r.prefix_id == w.requests[i - n].prefix_id);
      if (i % n != 0) CHECK(r.prefix_id != w.requests[i - 1].prefix_id);
      CHECK(r.prefix_len >= 55000);
      CHECK(r.prefix_len <= 110000);
      CHECK(r.prompt_len >= r.prefix_len + 16);
      CHECK(r.prompt_len <= r.prefix_len + 64);
      CHECK(r.output_len >= 50);
      CHECK(r.output_len <= 100);
      CHECK(r.arrival == 0);
      CHECK(r.boundaries == std::vector<std::uint32_t>{r.prefix_len});
      auto [it, fresh] = len.emplace(r.prefix_id, r.prefix_len);
      if (!fresh) CHECK(it->second == r.prefix_len);  // one length per article
    }
    CHECK(len.size() == n);
  }
  CHECK_THROWS_WITH(make_workload("arxiv-sweep", opts(4, 1, 0)), Catch::Contains("articles = 0"));
  // The articles do not depend on the number of questions: more requests, same articles.
  const Workload a = make_workload("arxiv-sweep", opts(6, 9, 3)), b = make_workload("arxiv-sweep", opts(30, 9, 3));
  for (std::size_t i = 0; i < 3; ++i) CHECK(a.requests[i].prefix_len == b.requests[i].prefix_len);
}

TEST_CASE("chat: a turn's boundaries are where the earlier turns ended", "[sim][workload][boundaries]") {
  const Workload w = make_workload("chat", opts(3000, 2));
  REQUIRE(w.requests.size() == 3000);
  int follow_ups = 0, capped = 0;
  for (std::size_t i = 0; i < w.requests.size(); ++i) {
    const SimRequest& r = w.requests[i];
    CHECK(r.prefix_len == r.prompt_len + r.output_len);
    CHECK(r.boundaries.size() <= kvmm::kMaxCacheBoundaries);
    for (std::size_t k = 1; k < r.boundaries.size(); ++k) CHECK(r.boundaries[k - 1] < r.boundaries[k]);
    if (r.parent < 0) {
      CHECK(r.boundaries.empty());
      continue;
    }
    ++follow_ups;
    const SimRequest& p = w.requests[static_cast<std::size_t>(r.parent)];
    CHECK(p.prefix_id == r.prefix_id);
    // The parent's boundaries plus the parent's own end (its prompt and answer).
    REQUIRE(!r.boundaries.empty());
    CHECK(r.boundaries.back() == p.prompt_len + p.output_len);
    CHECK(r.boundaries.back() < r.prompt_len);
    std::vector<std::uint32_t> expect = p.boundaries;
    expect.push_back(p.prompt_len + p.output_len);
    if (expect.size() > kvmm::kMaxCacheBoundaries) {
      expect.erase(expect.begin());
      ++capped;
    }
    CHECK(r.boundaries == expect);
  }
  // U[2, 8] turns: 5 on average, so about 4 in 5 requests are follow-ups; at most 7
  // earlier turns, so the kMaxCacheBoundaries cap is never reached.
  CHECK(follow_ups > 2200);
  CHECK(follow_ups < 2600);
  CHECK(capped == 0);
  CHECK(dump(make_workload("chat", opts(500, 3))) == dump(make_workload("chat", opts(500, 3))));
}

TEST_CASE("JSONL trace: boundaries round trip and are checked", "[sim][trace][boundaries]") {
  const Workload w =
      parse_trace("{\"prompt_len\": 100, \"output_len\": 2, \"boundaries\": [10, 64, 100]}\n", "b.jsonl");
  REQUIRE(w.requests.size() == 1);
  CHECK(w.requests[0].boundaries == std::vector<std::uint32_t>{10, 64, 100});
  CHECK(dump(parse_trace(dump(w), "again.jsonl")) == dump(w));
  const Workload c = make_workload("chat", opts(50, 1));
  CHECK(dump(parse_trace(dump(c), "chat.jsonl")) == dump(c));
  auto err = [](const std::string& text) { return kvmm::test::error_of([&] { parse_trace(text, "b.jsonl"); }); };
  CHECK_THAT(err("{\"prompt_len\": 100, \"output_len\": 1, \"boundaries\": 5}"),
             Catch::Contains("b.jsonl:1: field 'boundaries': expected an ascending array"));
  CHECK_THAT(err("{\"prompt_len\": 100, \"output_len\": 1, \"boundaries\": [64, 64]}"),
             Catch::Contains("field 'boundaries[1]': expected an integer in [65, 100]"));
  CHECK_THAT(err("{\"prompt_len\": 100, \"output_len\": 1, \"boundaries\": [101]}"),
             Catch::Contains("field 'boundaries[0]': expected an integer in [1, 100]"));
  CHECK_THAT(err("{\"prompt_len\": 100, \"output_len\": 1, \"boundaries\": [0]}"),
             Catch::Contains("field 'boundaries[0]'"));
}

TEST_CASE("cache_boundaries_for: what the kvmm policy hands the manager", "[sim][kvmm][boundaries]") {
  const std::vector<std::uint32_t> b{0, 5, 9, 9, 12, 40};
  SeqInfo info;
  CHECK(cache_boundaries_for(info, 100).empty());
  info.boundaries = &b;
  CHECK(cache_boundaries_for(info, 100) == std::vector<std::uint64_t>{5, 9, 12, 40});
  CHECK(cache_boundaries_for(info, 12) == std::vector<std::uint64_t>{5, 9, 12});
  std::vector<std::uint32_t> many;
  for (std::uint32_t k = 1; k <= 11; ++k) many.push_back(10 * k);
  info.boundaries = &many;
  const auto last = cache_boundaries_for(info, 1000);
  REQUIRE(last.size() == kvmm::kMaxCacheBoundaries);
  CHECK(last.front() == 10 * (11 - kvmm::kMaxCacheBoundaries + 1));
  CHECK(last.back() == 110);
  CHECK_THROWS_WITH(parse_boundary_mode("always"), Catch::Contains("boundaries = 'always'"));
  CHECK(parse_boundary_mode("both") == BoundaryMode::kBoth);
}

namespace {
using simtest::Run;
Run run_mode(const Workload& w, const kvmm::KVLayout& layout, BoundaryMode mode, std::uint64_t memory,
             std::uint32_t token_budget = 16) {
  PolicyOptions po;
  po.memory_bytes = memory;
  po.max_seqs = 64;
  po.boundaries = mode;
  auto p = make_policy("kvmm", layout, po);
  SchedulerOptions so;
  so.check_invariants = true;
  so.token_budget = token_budget;
  Run out;
  std::ostringstream csv;
  out.summary = simulate(w, layout, *p, so, &csv);
  return out;
}
}  // namespace

TEST_CASE("kvmm --boundaries: hinted, learned and both run with the manager's checks", "[sim][kvmm][boundaries]") {
  // Two articles of 20 and 28 tokens on the full + sliding-window model (window 8, 4-token
  // pages), two questions each in round robin, chunked prefill of 16 tokens per step.
  // With memory for everything the second question on an article hits the article's
  // whole pages in every mode: 20 and 28 tokens.
  Workload w{"articles", {}};
  const std::uint32_t len[2] = {20, 28};
  for (std::uint32_t i = 0; i < 4; ++i) {
    SimRequest r = simtest::req(len[i % 2] + 3, 2);
    r.prefix_id = 100 + i % 2;
    r.prefix_len = len[i % 2];
    r.boundaries = {len[i % 2]};
    w.requests.push_back(r);
  }
  w.requests[2].arrival = w.requests[3].arrival = 30;  // after the first two finished
  for (const BoundaryMode mode :
       {BoundaryMode::kNone, BoundaryMode::kHinted, BoundaryMode::kLearned, BoundaryMode::kBoth}) {
    CAPTURE(static_cast<int>(mode));
    const Run big = run_mode(w, simtest::hybrid_layout(), mode, 64 * 256);
    CHECK(big.summary.finished == 4);
    CHECK(big.summary.first_hit_tokens == 20 + 28);
    // Tight memory (12 large pages: one article and a question at a time): evictions and
    // preemptions under every mode, invariants after every step, everything finishes.
    const Run tight = run_mode(w, simtest::hybrid_layout(), mode, 12 * 256);
    CHECK(tight.summary.finished == 4);
  }
  // A chat trace (boundaries on every follow-up) under every mode.
  const Workload c = make_workload("chat", opts(6, 7));
  for (const BoundaryMode mode : {BoundaryMode::kHinted, BoundaryMode::kBoth}) {
    const Run r = run_mode(c, simtest::hybrid_layout(), mode, std::uint64_t{1} << 18, 4096);
    CHECK(r.summary.finished == 6);
    CHECK(r.summary.first_hit_tokens > 0);
  }
}

TEST_CASE("kvmm's miss reasons: the histogram the simulator prints", "[sim][kvmm][miss_reasons]") {
  // Two articles of 20 and 28 tokens, two questions of 4 tokens each; the second round
  // arrives after the first finished. Memory for everything: the first question of each
  // article finds nothing (not_cached: 23 + 31 tokens missed), the second hits the
  // article's whole pages, and its question (tokens 20-23, 28-31) fills less than a page
  // below the limit (page_floor: 3 + 3 tokens). Nothing is evicted.
  Workload w{"articles", {}};
  const std::uint32_t len[2] = {20, 28};
  for (std::uint32_t i = 0; i < 4; ++i) {
    SimRequest r = simtest::req(len[i % 2] + 4, 2);
    r.prefix_id = 100 + i % 2;
    r.prefix_len = len[i % 2];
    w.requests.push_back(r);
  }
  w.requests[2].arrival = w.requests[3].arrival = 30;
  PolicyOptions po;
  po.memory_bytes = 64 * 256;
  po.max_seqs = 64;
  auto p = make_policy("kvmm", simtest::hybrid_layout(), po);
  SchedulerOptions so;
  so.max_seqs = 64;
  so.check_invariants = true;
  const Summary s = simulate(w, simtest::hybrid_layout(), *p, so, nullptr);
  REQUIRE(s.finished == 4);
  const std::vector<Policy::MissCount> m = p->miss_reasons();
  REQUIRE(m.size() == kvmm::kNumMissReasons);
  std::map<std::string, std::pair<std::uint64_t, std::uint64_t>> by;
  for (const auto& c : m) by[c.reason] = {c.lookups, c.tokens};
  CHECK(by["not_cached"].first == 2);
  CHECK(by["not_cached"].second == 23 + 31);
  CHECK(by["page_floor"].first == 2);
  CHECK(by["page_floor"].second == 3 + 3);
  CHECK(by["evicted"].first == 0);
  CHECK(by["none"].first == 0);
  CHECK(s.first_hit_tokens == 20 + 28);
  // The block models do not classify their misses.
  CHECK(make_policy("vllm-0.33", simtest::hybrid_layout(), po)->miss_reasons().empty());
}
