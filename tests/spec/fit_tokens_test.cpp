// LayoutOptions::fit_tokens_per_page (issue 32): when the LCM of the natural small pages
// passes max_large_page_bytes, the planner divides the token groups' tokens_per_page by
// the smallest common divisor that makes the LCM fit, and pads nothing. Exact sizes on
// Qwen3-Next and DeepSeek-V3.2, and a seeded comparison against a brute-force search.
#include "kvmm/error.hpp"
#include "kvmm/spec/kv_layout.hpp"
#include "kvmm/spec/presets.hpp"
#include "spec/layout_test_util.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

using namespace kvmm;
using spectest::divided;
using spectest::fit_divisor;
using spectest::lcm_of;

TEST_CASE("fit: Qwen3-Next at the default limit plans 8-token attention pages, one state page per large page",
          "[spec][layout][fit][lineup]") {
  const KVLayout l = presets::qwen3_next_80b_a3b();
  // 12 layers x 2 (K, V) x 2 KV heads x 256 x 2 B = 24,576 B per token; the gated-DeltaNet
  // state is 36 layers x (conv 8192 x 3 + recurrent 32 x 128 x 128) x 2 B = 39,518,208 B
  // = 2^16 x 603, a multiple of 8 x 24,576 = 2^16 x 3 but not of 16 x 24,576.
  CHECK(l.tokens_per_page_fitted());
  CHECK(l.requested_tokens_per_page(0) == 16);
  CHECK(l.group(0).tokens_per_page == 8);
  CHECK(l.group(1).tokens_per_page == 512);  // the checkpoint interval is never fitted
  CHECK(l.requested_tokens_per_page(1) == 512);
  CHECK(l.natural_page_bytes(0) == 196608);
  CHECK(l.small_page_bytes(0) == 196608);
  CHECK(l.natural_page_bytes(1) == 39518208);
  CHECK(l.small_page_bytes(1) == 39518208);
  CHECK(l.large_page_bytes() == 39518208);
  CHECK(l.natural_lcm_bytes() == 39518208);
  CHECK(l.small_pages_per_large_page(0) == 201);
  CHECK(l.small_pages_per_large_page(1) == 1);
  CHECK_FALSE(l.padded());
  CHECK(l.padding_fraction() == 0.0);
  CHECK_THAT(l.describe(), Catch::Contains("fitted from 16 tokens/page"));

  // Fitting off: the padded plan of before (16 tokens, 2.04% / 1.55% at each page's tail).
  const KVLayout padded = presets::qwen3_next_80b_a3b({.layout = {.fit_tokens_per_page = false}});
  CHECK_FALSE(padded.tokens_per_page_fitted());
  CHECK(padded.group(0).tokens_per_page == 16);
  CHECK(padded.padded());
  CHECK(padded.natural_lcm_bytes() == 79036416);
  // A floor the fit cannot meet: padded as well.
  const KVLayout floor16 = presets::qwen3_next_80b_a3b({.layout = {.min_fitted_tokens_per_page = 16}});
  CHECK(floor16.group(0).tokens_per_page == 16);
  CHECK(floor16.padded());
  // Under a limit that holds the LCM nothing is fitted: 16 tokens, 201 pages per 75.4 MiB.
  const KVLayout raised = presets::qwen3_next_80b_a3b({.layout = {.max_large_page_bytes = 79036416}});
  CHECK_FALSE(raised.tokens_per_page_fitted());
  CHECK(raised.group(0).tokens_per_page == 16);
  CHECK(raised.large_page_bytes() == 79036416);
  CHECK_FALSE(raised.padded());
  // The MTP variant's draft group is fitted with the target's attention: 8 tokens each.
  const KVLayout mtp = presets::mtp_qwen3_next_80b_a3b();
  CHECK_FALSE(mtp.padded());
  CHECK(mtp.group(0).tokens_per_page == 8);
  CHECK(mtp.group(2).tokens_per_page == 8);
  CHECK(mtp.large_page_bytes() == 39518208);

  CHECK_THROWS_WITH(presets::qwen3_next_80b_a3b({.layout = {.min_fitted_tokens_per_page = 0}}),
                    Catch::Contains("min_fitted_tokens_per_page = 0"));
  CHECK_NOTHROW(
      presets::qwen3_next_80b_a3b({.layout = {.fit_tokens_per_page = false, .min_fitted_tokens_per_page = 0}}));
}

TEST_CASE("fit: DeepSeek-V3.2 in fp8_ds_mla at 64 tokens per page plans 32", "[spec][layout][fit][lineup]") {
  const KVLayout l = presets::deepseek_v3_2({.tokens_per_page = 64, .kv_cache_dtype = "fp8_ds_mla"});
  // Latent 656 B = 16 x 41 and indexer 132 B = 4 x 3 x 11 per token and layer: the LCM of
  // 32-token pages is 32 x 61 x 21,648 B (40.3 MiB), of 64-token pages twice that (81 MiB).
  CHECK(l.group(0).tokens_per_page == 32);
  CHECK(l.group(1).tokens_per_page == 32);
  CHECK(l.small_page_bytes(0) == std::uint64_t{32} * 61 * 656);
  CHECK(l.small_page_bytes(1) == std::uint64_t{32} * 61 * 132);
  CHECK(l.large_page_bytes() == std::uint64_t{32} * 61 * 21648);
  CHECK(l.small_pages_per_large_page(0) == 33);
  CHECK(l.small_pages_per_large_page(1) == 164);
  CHECK_FALSE(l.padded());
}

TEST_CASE("fit: random hybrids take the smallest fitting divisor, else the padded plan", "[spec][layout][fit]") {
  std::mt19937_64 rng(32);
  int fitted = 0, padded = 0, exact = 0;
  for (int iter = 0; iter < 400; ++iter) {
    const std::uint32_t base = std::vector<std::uint32_t>{8, 12, 16, 24, 32, 48, 64}[rng() % 7];
    std::vector<LayerGroup> gs;
    const int n = 1 + static_cast<int>(rng() % 3);
    for (int i = 0; i < n; ++i)
      gs.push_back(LayerGroup::full_attention("a" + std::to_string(i), 1 + rng() % 16, 1 + rng() % 8,
                                              64 * (1 + rng() % 4), 2, base * (1 + static_cast<std::uint32_t>(i % 2))));
    if (rng() % 4 != 0) gs.push_back(LayerGroup::mamba_state("s", 1 + rng() % 40, 4096 * (1 + rng() % 300), 512));
    const std::uint64_t limit = std::uint64_t{1} << (22 + rng() % 5);
    const std::uint32_t floor = 1 + static_cast<std::uint32_t>(rng() % 8);
    // The size limit alone: the state bound (on by default, state_pages_test.cpp) off.
    const LayoutOptions on{.max_large_page_bytes = limit,
                           .min_fitted_tokens_per_page = floor,
                           .max_state_pages_per_large_page = 0,
                           .slice_layers = SliceLayers::kOff};
    const LayoutOptions off{.max_large_page_bytes = limit,
                            .fit_tokens_per_page = false,
                            .max_state_pages_per_large_page = 0,
                            .slice_layers = SliceLayers::kOff};

    // Brute force (layout_test_util.hpp).
    const std::uint32_t want = fit_divisor(gs, limit, floor);
    INFO("iter " << iter << " limit " << limit << " floor " << floor << " want d " << want);

    if (want > 1) {
      const KVLayout l = KVLayout::plan(gs, on);
      ++fitted;
      CHECK(l.tokens_per_page_fitted());
      CHECK_FALSE(l.padded());
      CHECK(l.large_page_bytes() == lcm_of(divided(gs, want)));
      CHECK(l.natural_lcm_bytes() == l.large_page_bytes());
      CHECK(l.large_page_bytes() <= limit);
      for (GroupId g = 0; g < l.num_groups(); ++g) {
        CHECK(l.requested_tokens_per_page(g) == gs[g].tokens_per_page);
        CHECK(l.group(g).tokens_per_page == (gs[g].is_state() ? gs[g].tokens_per_page : gs[g].tokens_per_page / want));
        CHECK(l.group(g).tokens_per_page >= (gs[g].is_state() ? 1 : floor));
        CHECK(l.small_page_bytes(g) == l.natural_page_bytes(g));
        CHECK(l.large_page_bytes() % l.small_page_bytes(g) == 0);
      }
      continue;
    }
    // No divisor fits (or none was needed): the same plan as with fitting off, or the same error.
    std::uint64_t largest = 0;
    for (const LayerGroup& g : gs) largest = std::max(largest, g.natural_page_bytes());
    if (largest > limit) {
      CHECK_THROWS_AS(KVLayout::plan(gs, on), Error);
      CHECK_THROWS_AS(KVLayout::plan(gs, off), Error);
      continue;
    }
    const KVLayout l = KVLayout::plan(gs, on), p = KVLayout::plan(gs, off);
    (l.padded() ? padded : exact) += 1;
    CHECK_FALSE(l.tokens_per_page_fitted());
    CHECK(l.large_page_bytes() == p.large_page_bytes());
    for (GroupId g = 0; g < l.num_groups(); ++g) {
      CHECK(l.group(g).tokens_per_page == gs[g].tokens_per_page);
      CHECK(l.small_page_bytes(g) == p.small_page_bytes(g));
    }
  }
  // The seed reaches all three outcomes.
  CHECK(fitted > 20);
  CHECK(padded > 5);
  CHECK(exact > 20);
}
