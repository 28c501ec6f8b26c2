// LayoutOptions::max_state_pages_per_large_page (issue 34): a large page holding more than
// that many pages of a recurrent-state group makes the planner fit the token groups'
// tokens_per_page (the smallest common divisor that brings it there, never padding); with
// no such divisor the plan is as without the option. Exact sizes on Jamba-1.5-Mini and
// Qwen3-Next, and a seeded comparison against a brute-force search.
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

TEST_CASE("state pages: Jamba-1.5-Mini at 2 states per large page plans 8-token attention pages",
          "[spec][layout][fit][state]") {
  // Attention: 4 layers x 2 (K, V) x 8 KV heads x 128 x 2 B = 16 KiB per token; the Mamba
  // state is 8,716,288 B = 133 x 64 KiB: 133 16-token pages = 4 states per 33.25 MiB
  // with the option off (0).
  const KVLayout plain = presets::jamba1_5_mini({.layout = {.max_state_pages_per_large_page = 0}});
  CHECK(plain.group(0).tokens_per_page == 16);
  CHECK(plain.large_page_bytes() == 34865152);
  CHECK(plain.small_pages_per_large_page(1) == 4);
  CHECK_FALSE(plain.tokens_per_page_fitted());

  const KVLayout two = presets::jamba1_5_mini({.layout = {.max_state_pages_per_large_page = 2}});
  CHECK(two.tokens_per_page_fitted());
  CHECK(two.requested_tokens_per_page(0) == 16);
  CHECK(two.group(0).tokens_per_page == 8);
  CHECK(two.group(1).tokens_per_page == 512);  // the checkpoint interval is never fitted
  CHECK(two.small_page_bytes(0) == 131072);
  CHECK(two.small_page_bytes(1) == 8716288);
  CHECK(two.large_page_bytes() == 17432576);
  CHECK(two.small_pages_per_large_page(0) == 133);
  CHECK(two.small_pages_per_large_page(1) == 2);
  CHECK_FALSE(two.padded());
  // 2 is the default: the preset's plain plan is this one.
  const KVLayout dflt = presets::jamba1_5_mini();
  CHECK(LayoutOptions{}.max_state_pages_per_large_page == 2);
  CHECK(dflt.tokens_per_page_fitted());
  CHECK(dflt.group(0).tokens_per_page == 8);
  CHECK(dflt.large_page_bytes() == two.large_page_bytes());
  CHECK(dflt.small_pages_per_large_page(1) == 2);

  // One state per large page needs 4-token pages: under the default floor of 8 there is no
  // such divisor, and the plan is the plain one.
  const KVLayout one = presets::jamba1_5_mini({.layout = {.max_state_pages_per_large_page = 1}});
  CHECK_FALSE(one.tokens_per_page_fitted());
  CHECK(one.large_page_bytes() == plain.large_page_bytes());
  const KVLayout one4 =
      presets::jamba1_5_mini({.layout = {.min_fitted_tokens_per_page = 4, .max_state_pages_per_large_page = 1}});
  CHECK(one4.group(0).tokens_per_page == 4);
  CHECK(one4.large_page_bytes() == 8716288);
  CHECK(one4.small_pages_per_large_page(1) == 1);
  // Already within the bound, or fitting off: nothing changes.
  CHECK_FALSE(presets::jamba1_5_mini({.layout = {.max_state_pages_per_large_page = 4}}).tokens_per_page_fitted());
  const KVLayout off =
      presets::jamba1_5_mini({.layout = {.fit_tokens_per_page = false, .max_state_pages_per_large_page = 2}});
  CHECK(off.group(0).tokens_per_page == 16);
  CHECK(off.large_page_bytes() == plain.large_page_bytes());
  // Qwen3-Next holds one state per large page already (fitted to 8 tokens by the size limit).
  const KVLayout q = presets::qwen3_next_80b_a3b({.layout = {.max_state_pages_per_large_page = 1}});
  CHECK(q.group(0).tokens_per_page == 8);
  CHECK(q.large_page_bytes() == presets::qwen3_next_80b_a3b().large_page_bytes());
  CHECK(q.small_pages_per_large_page(1) == 1);
}

TEST_CASE("state pages: random hybrids take the smallest divisor that bounds the states, else the plain plan",
          "[spec][layout][fit][state]") {
  std::mt19937_64 rng(34);
  int fitted = 0, unchanged = 0;
  for (int iter = 0; iter < 400; ++iter) {
    const std::uint32_t base = std::vector<std::uint32_t>{8, 16, 32, 48, 64}[rng() % 5];
    std::vector<LayerGroup> gs;
    const int n = 1 + static_cast<int>(rng() % 2);
    for (int i = 0; i < n; ++i)
      gs.push_back(LayerGroup::full_attention("a" + std::to_string(i), 1 + rng() % 8, 1 + rng() % 8,
                                              64 * (1 + rng() % 2), 2, base * (1 + static_cast<std::uint32_t>(i % 2))));
    gs.push_back(LayerGroup::mamba_state("s", 1 + rng() % 8, 4096 * (1 + rng() % 64), 512));
    const std::uint32_t k = 1 + static_cast<std::uint32_t>(rng() % 4);
    const std::uint32_t floor = 1 + static_cast<std::uint32_t>(rng() % 8);
    // A size limit that never binds: only the state bound fits.
    const LayoutOptions on{.max_large_page_bytes = std::uint64_t{1} << 40,
                           .min_fitted_tokens_per_page = floor,
                           .max_state_pages_per_large_page = k,
                           .slice_layers = SliceLayers::kOff};
    const LayoutOptions plain{.max_large_page_bytes = std::uint64_t{1} << 40,
                              .min_fitted_tokens_per_page = floor,
                              .max_state_pages_per_large_page = 0,
                              .slice_layers = SliceLayers::kOff};
    const std::uint64_t bound = k * gs.back().natural_page_bytes();

    const std::uint32_t want = fit_divisor(gs, bound, floor);
    INFO("iter " << iter << " k " << k << " floor " << floor << " want d " << want);
    const KVLayout l = KVLayout::plan(gs, on);
    if (want > 1) {
      ++fitted;
      CHECK(l.tokens_per_page_fitted());
      CHECK_FALSE(l.padded());
      CHECK(l.large_page_bytes() == lcm_of(divided(gs, want)));
      CHECK(l.small_pages_per_large_page(static_cast<GroupId>(gs.size() - 1)) <= k);
      for (GroupId g = 0; g < l.num_groups(); ++g)
        CHECK(l.group(g).tokens_per_page == (gs[g].is_state() ? gs[g].tokens_per_page : gs[g].tokens_per_page / want));
      continue;
    }
    ++unchanged;
    const KVLayout p = KVLayout::plan(gs, plain);
    CHECK(l.large_page_bytes() == p.large_page_bytes());
    for (GroupId g = 0; g < l.num_groups(); ++g) CHECK(l.group(g).tokens_per_page == p.group(g).tokens_per_page);
  }
  // The seed reaches both outcomes.
  CHECK(fitted > 20);
  CHECK(unchanged > 20);
}
