// The block-pool policies on the 2026 lineup's group kinds (issue 32): an MLA group's block
// holds its latent (not a K and a V of head_dim), and vLLM puts a DSA indexer's keys in its
// attention group's blocks (one block size, UniformTypeKVCacheSpecs), so the vLLM models
// (unified-block, vllm-0.33) have one policy group for both.
#include "sim_test_util.hpp"

#include <catch2/catch.hpp>

#include "kvmm/spec/element_format.hpp"
#include "kvmm/spec/presets.hpp"

using kvmm::ElementFormat;
using kvmm::ElementType;
using kvmm::KVLayout;
using kvmm::LayerGroup;

namespace {

// One MLA layer (latent 16 + rope 8, bf16: 48 B per token, 192 B pages of 4 tokens) and its
// indexer (16 fp8 keys + one fp32 scale per token: 20 B per token, 80 B pages).
KVLayout mla_indexer() {
  const ElementFormat bf16 = ElementFormat::of(ElementType::kBf16);
  return KVLayout::plan(
      {LayerGroup::mla("mla", 1, 16, 8, bf16, std::nullopt, 4),
       LayerGroup::indexer("indexer", 1, 1, 16, kvmm::parse_kv_cache_dtype("fp8_per_token_head"), 4, "mla")});
}

kvmm::sim::Workload one_request(std::uint32_t prompt, std::uint32_t output) {
  return {"one", {simtest::req(prompt, output)}};
}

}  // namespace

TEST_CASE("vLLM's blocks for MLA and its indexer: latent bytes, one group for both", "[sim][lineup]") {
  const KVLayout l = mla_indexer();
  REQUIRE(l.natural_page_bytes(0) == 192);
  REQUIRE(l.natural_page_bytes(1) == 80);
  const auto w = one_request(10, 3);
  const auto k = simtest::run(w, l, "kvmm", 1 << 16);
  for (const char* p : {"unified-block", "vllm-0.33"}) {
    INFO(p);
    const auto u = simtest::run(w, l, p, 1 << 16);
    REQUIRE(u.rows.size() == k.rows.size());
    CHECK(u.rows[0].count("indexer.used") == 0);  // the indexer has no group of its own
    for (std::size_t i = 0; i < u.rows.size(); ++i) {
      INFO("row " << i);
      // The same bytes are needed: the latent's and the keys' of every live token.
      CHECK(u.rows[i].at("mla.used") == k.rows[i].at("mla.used") + k.rows[i].at("indexer.used"));
      // A block is 4 tokens x (48 + 20) B = 272 B (K and V of head_dim 16 would be 64 + 40).
      const std::uint64_t held = u.rows[i].at("mla.used") + u.rows[i].at("mla.wasted");
      CHECK(held % 272 == 0);
      CHECK(held == (u.rows[i].at("mla.used") + 271) / 272 * 272);
    }
    kvmm::sim::PolicyOptions po;
    po.memory_bytes = 1 << 16;
    po.max_model_len = 64;
    CHECK(kvmm::sim::make_policy(p, l, po)->describe().find("mla + indexer 4 tokens/block x 1 layers") !=
          std::string::npos);
  }
}

TEST_CASE("DeepSeek-V3 (one MLA group): vLLM's block is kvmm's page, the same run", "[sim][lineup]") {
  const KVLayout l = kvmm::presets::deepseek_v3();
  kvmm::sim::WorkloadOptions o;
  o.num_requests = 60;
  o.seed = 3;
  const auto w = kvmm::sim::make_workload("sharegpt", o);
  const auto k = simtest::run(w, l, "kvmm", std::uint64_t{1} << 30, 8192, 64, 0, 1, false);
  for (const char* p : {"paged-uniform", "unified-block", "vllm-0.33"}) {
    INFO(p);
    const auto u = simtest::run(w, l, p, std::uint64_t{1} << 30, 8192, 64, 0, 1, false);
    CHECK(u.summary.steps == k.summary.steps);
    CHECK(u.summary.preemptions == k.summary.preemptions);
    // Waste in bytes, step by step (the capacities differ by the pool's rounding: kvmm
    // counts whole pages, the block pools per-layer units).
    REQUIRE(u.rows.size() == k.rows.size());
    auto wasted = [](const simtest::Row& r) {
      std::uint64_t sum = 0;
      for (const auto& [key, v] : r)
        if (key.ends_with(".wasted")) sum += v;
      return sum;
    };
    std::uint64_t total = 0;
    for (std::size_t i = 0; i < u.rows.size(); ++i) {
      INFO("row " << i);
      CHECK(wasted(u.rows[i]) == wasted(k.rows[i]));
      total += wasted(k.rows[i]);
    }
    CHECK(total > 0);
  }
}

TEST_CASE("vllm-0.33: prefix_match_unit sets where hits inside grown blocks may end", "[sim][lineup]") {
  // A 128 B attention page (4 tokens x 32 B) grows to 256 B to hold a 200 B state: blocks of
  // 8 tokens. vLLM's default unit is the configured block (4 tokens); the grown block's
  // size gives hits at block boundaries only; a unit that does not divide it is refused.
  const KVLayout l =
      KVLayout::plan({LayerGroup::full_attention("full", 1, 1, 8, 2, 4), LayerGroup::mamba_state("mamba", 1, 200, 4)});
  kvmm::sim::PolicyOptions po;
  po.memory_bytes = 1 << 16;
  po.max_model_len = 64;
  CHECK_THAT(kvmm::sim::make_policy("vllm-0.33", l, po)->describe(),
             Catch::Contains("full 8 tokens/block") && Catch::Contains("at 4-token units inside blocks"));
  po.prefix_match_unit = 8;
  CHECK_THAT(kvmm::sim::make_policy("vllm-0.33", l, po)->describe(), Catch::Contains("at block boundaries"));
  po.prefix_match_unit = 3;
  CHECK_THROWS_WITH(kvmm::sim::make_policy("vllm-0.33", l, po),
                    Catch::Contains("prefix_match_unit = 3: must divide the 8-token blocks"));
  // A shared 12-token prefix: the second request hits 8 tokens at block boundaries, 12 at
  // 4-token units (the partial block copied).
  kvmm::sim::Workload w{"two", {simtest::req(14, 1), simtest::req(14, 1, 5)}};
  for (auto& r : w.requests) {
    r.prefix_id = 1;
    r.prefix_len = 12;
  }
  std::uint64_t first_hits[2] = {0, 0};
  for (std::uint32_t unit : {0u, 8u}) {
    kvmm::sim::PolicyOptions o = po;
    o.prefix_match_unit = unit;
    auto p = kvmm::sim::make_policy("vllm-0.33", l, o);
    kvmm::sim::SchedulerOptions so;
    so.check_invariants = true;
    first_hits[unit == 8] = kvmm::sim::simulate(w, l, *p, so, nullptr).first_hit_tokens;
  }
  CHECK(first_hits[0] == 12);
  CHECK(first_hits[1] == 8);
}
