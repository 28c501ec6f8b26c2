// Randomized, seeded runs of every policy on small models and tight memory: after every
// step the policy recounts its pages (check_invariants) and the memory categories add up
// to the capacity; every request finishes exactly once; the same seed gives the same
// CSV and summary.
#include "sim_test_util.hpp"

#include <catch2/catch.hpp>

#include "kvmm/spec/presets.hpp"

#include <random>

using kvmm::sim::Workload;

namespace {

std::vector<kvmm::KVLayout> layouts() {
  using kvmm::LayerGroup;
  return {simtest::hybrid_layout(), simtest::full_layout(),
          kvmm::KVLayout::plan({LayerGroup::full_attention("attention", 1, 1, 8, 2, 4),
                                LayerGroup::mamba_state("mamba", 2, 200, 4)}),
          kvmm::KVLayout::plan({LayerGroup::full_attention("self", 2, 1, 8, 2, 4),
                                LayerGroup::cross_attention("cross", 1, 1, 8, 2, 4)}),
          kvmm::KVLayout::plan({LayerGroup::full_attention("target", 3, 1, 8, 2, 4),
                                LayerGroup::full_attention("draft", 1, 1, 4, 2, 4)})};
}

Workload random_workload(std::mt19937_64& rng, std::uint32_t n) {
  Workload w{"random", {}};
  for (std::uint32_t i = 0; i < n; ++i) {
    kvmm::sim::SimRequest r;
    r.prompt_len = 1 + static_cast<std::uint32_t>(rng() % 40);
    r.output_len = 1 + static_cast<std::uint32_t>(rng() % 12);
    r.arrival = rng() % 30;
    if (rng() % 3 == 0) r.images.push_back({0, 1 + static_cast<std::uint32_t>(rng() % 12)});
    if (rng() % 2 == 0) {
      r.prefix_id = rng() % 4;
      r.prefix_len = std::min<std::uint32_t>(r.prompt_len, 8 + static_cast<std::uint32_t>(rng() % 16));
    }
    w.requests.push_back(r);
  }
  return w;
}

}  // namespace

TEST_CASE("every policy, random traces, tight memory: invariants after every step", "[sim][randomized]") {
  const auto ls = layouts();
  std::uint64_t preemptions = 0, evictions = 0, hits = 0, rows = 0;
  for (std::uint64_t seed = 1; seed <= 30; ++seed) {
    std::mt19937_64 rng(seed);
    const Workload w = random_workload(rng, 60);
    const auto& layout = ls[seed % ls.size()];
    const std::uint64_t memory = 8192 + (rng() % 4) * 4096;
    const auto budget = static_cast<std::uint32_t>(8 + rng() % 64);
    for (const auto& p : kvmm::sim::policy_names()) {
      INFO("seed " << seed << " policy " << p);
      const auto r = simtest::run(w, layout, p, memory, budget, 16, 0, 12);
      std::uint64_t outputs = 0;
      for (const auto& q : w.requests) outputs += q.output_len;
      CHECK(r.summary.finished + r.summary.aborted == w.requests.size());
      if (r.summary.aborted == 0) CHECK(r.summary.output_tokens == outputs);
      for (const auto& row : r.rows) {
        std::uint64_t sum = row.at("free");
        for (const auto& [k, v] : row)
          if (k.ends_with(".used") || k.ends_with(".wasted") || k.ends_with(".cached") || k.ends_with(".group_free"))
            sum += v;
        REQUIRE(sum == row.at("capacity"));
        ++rows;
      }
      preemptions += r.summary.preemptions;
      evictions += r.summary.evictions;
      hits += r.summary.hit_tokens;
      // Determinism: a second run is identical.
      const auto again = simtest::run(w, layout, p, memory, budget, 16, 0, 12);
      CHECK(again.csv == r.csv);
      CHECK(kvmm::sim::summary_json(again.summary, false) == kvmm::sim::summary_json(r.summary, false));
    }
  }
  // The traces exercise the interesting paths.
  CHECK(rows > 10000);
  CHECK(preemptions > 50);
  CHECK(evictions > 50);
  CHECK(hits > 1000);
}

TEST_CASE("same seed, same simulation for a synthetic workload", "[sim][determinism]") {
  kvmm::sim::WorkloadOptions o;
  o.num_requests = 150;
  o.seed = 11;
  const Workload a = kvmm::sim::make_workload("multi-turn", o);
  const Workload b = kvmm::sim::make_workload("multi-turn", o);
  const auto layout = kvmm::presets::gemma2_27b();
  for (const auto& p : kvmm::sim::policy_names()) {
    INFO(p);
    const auto x = simtest::run(a, layout, p, std::uint64_t{3} << 30, 2048, 64);
    const auto y = simtest::run(b, layout, p, std::uint64_t{3} << 30, 2048, 64);
    CHECK(x.csv == y.csv);
    CHECK(x.summary.finished == 150);
  }
}
