// Layer slicing (kvmm/spec/layer_slicing.hpp): cut layouts' groups and page sizes by hand,
// what is never cut, the planner's default rule (LayoutOptions::slice_layers: only a layout
// with a group of more than 8 pages per large page is cut, so of the presets and the configs
// in tests/data Gemma-3 alone), and that the cut groups keep their layers in order.
#include <kvmm/error.hpp>
#include <kvmm/spec/hf_config.hpp>
#include <kvmm/spec/layer_slicing.hpp>
#include <kvmm/spec/presets.hpp>

#include <catch2/catch.hpp>

#include <filesystem>
#include <string>
#include <vector>

using namespace kvmm;

namespace {

// Gemma-3's shape in small: 2 full-attention and 6 sliding-window layers, 32 B per token
// and layer (1 head of 8, K and V, 2 B), 4 tokens per page: full pages 256 B, window
// pages 768 B, large page 768 B (3 full pages or 1 window page).
KVLayout gemma_like() {
  return KVLayout::plan(
      {LayerGroup::full_attention("global", 2, 1, 8, 2, 4), LayerGroup::sliding_window("local", 6, 1, 8, 2, 4, 8)});
}

// Same groups, names, sizes and layers.
bool same(const KVLayout& a, const KVLayout& b) {
  if (a.num_groups() != b.num_groups() || a.large_page_bytes() != b.large_page_bytes()) return false;
  for (GroupId g = 0; g < a.num_groups(); ++g)
    if (a.group(g).name != b.group(g).name || a.group(g).layers != b.group(g).layers ||
        a.small_page_bytes(g) != b.small_page_bytes(g) || a.group(g).tokens_per_page != b.group(g).tokens_per_page)
      return false;
  return true;
}

}  // namespace

TEST_CASE("slice_layers: equal layer counts give every group one page size", "[spec][layout][slicing]") {
  const KVLayout plain = gemma_like();
  REQUIRE(plain.large_page_bytes() == 768);
  CHECK(auto_slice_layers(plain) == 2);  // gcd(2, 6), both 64 B per token-page layer
  const KVLayout s = slice_layers(plain, kSliceAuto);
  REQUIRE(s.num_groups() == 4);
  CHECK(s.group(0).name == "global");  // 2 layers already: left whole
  CHECK(s.group(1).name == "local.0");
  CHECK(s.group(3).name == "local.2");
  for (GroupId g = 0; g < s.num_groups(); ++g) {
    CAPTURE(g);
    CHECK(s.group(g).num_layers == 2);
    CHECK(s.group(g).tokens_per_page == 4);
    CHECK(s.small_page_bytes(g) == 256);
    CHECK(s.small_pages_per_large_page(g) == 1);
  }
  CHECK(s.group(2).kind == LayerKind::kSlidingWindow);
  CHECK(s.group(2).window == 8);
  CHECK(s.large_page_bytes() == 256);
  // n = 0: the layout as it is; n = 1: every layer its own group.
  CHECK(slice_layers(plain, 0).num_groups() == 2);
  CHECK(slice_layers(plain, 1).num_groups() == 8);
  CHECK(slice_layers(plain, 1).large_page_bytes() == 128);
}

TEST_CASE("slice_layers: what it leaves alone and what it refuses", "[spec][layout][slicing][errors]") {
  // Per-layer pages of different bytes (8 and 4 B per token and layer): no equal pages, auto off.
  const KVLayout unequal = KVLayout::plan(
      {LayerGroup::full_attention("global", 2, 1, 8, 2, 4), LayerGroup::sliding_window("local", 6, 1, 4, 2, 4, 8)});
  CHECK(auto_slice_layers(unequal) == 0);
  CHECK(slice_layers(unequal, kSliceAuto).num_groups() == 2);
  // A Mamba group is never cut, nor counted for auto.
  const KVLayout hybrid =
      KVLayout::plan({LayerGroup::full_attention("attn", 4, 1, 8, 2, 4), LayerGroup::mamba_state("mamba", 6, 512, 16)});
  CHECK(!sliceable(hybrid, 1));
  CHECK(auto_slice_layers(hybrid) == 4);
  const KVLayout h2 = slice_layers(hybrid, 2);
  REQUIRE(h2.num_groups() == 3);
  CHECK(h2.group(2).name == "mamba");
  CHECK(h2.group(2).num_layers == 6);
}

TEST_CASE("slice_layers: a remainder group, and the smallest group's width", "[spec][layout][slicing]") {
  // n = 4 of 6 local layers: local.0 of 4 layers (512 B pages), local.1 of the 2 left (256 B).
  const KVLayout plain = gemma_like();
  const KVLayout s4 = slice_layers(plain, 4);
  REQUIRE(s4.num_groups() == 3);
  CHECK(s4.group(1).name == "local.0");
  CHECK(s4.group(1).num_layers == 4);
  CHECK(s4.group(2).name == "local.1");
  CHECK(s4.group(2).num_layers == 2);
  CHECK(s4.small_page_bytes(1) == 512);
  CHECK(s4.small_page_bytes(2) == 256);
  CHECK(s4.large_page_bytes() == 512);
  // Smallest: 3 full and 8 sliding layers (gcd 1) cut at 3: local 3 + 3 + 2, every page
  // but the remainder's one full page's size.
  const KVLayout odd = KVLayout::plan(
      {LayerGroup::full_attention("global", 3, 1, 8, 2, 4), LayerGroup::sliding_window("local", 8, 1, 8, 2, 4, 8)});
  CHECK(auto_slice_layers(odd) == 1);
  CHECK(smallest_slice_layers(odd) == 3);
  const KVLayout s = slice_layers(odd, kSliceSmallest);
  REQUIRE(s.num_groups() == 4);
  CHECK(s.group(0).num_layers == 3);
  CHECK(s.group(1).num_layers == 3);
  CHECK(s.group(2).num_layers == 3);
  CHECK(s.group(3).name == "local.2");
  CHECK(s.group(3).num_layers == 2);
  CHECK(s.group(3).kind == LayerKind::kSlidingWindow);
  CHECK(s.large_page_bytes() == 3 * 128 * 2);  // lcm of 384 and 256 B
  CHECK(s.small_pages_per_large_page(0) == 2);
  CHECK(s.small_pages_per_large_page(3) == 3);
  // Per-layer pages of different bytes: nothing to cut.
  const KVLayout unequal = KVLayout::plan(
      {LayerGroup::full_attention("global", 2, 1, 8, 2, 4), LayerGroup::sliding_window("local", 6, 1, 4, 2, 4, 8)});
  CHECK(smallest_slice_layers(unequal) == 0);
  CHECK(slice_layers(unequal, kSliceSmallest).num_groups() == 2);
}

TEST_CASE("slice_layers: the default rule cuts a dense group only, at the smallest count", "[spec][layout][slicing]") {
  // gemma_like: 3 global pages per large page, under the default 8: whole.
  CHECK(LayoutOptions{}.slice_layers == SliceLayers::kSmallestWhenDense);
  CHECK(LayoutOptions{}.slice_above_pages_per_large_page == 8);
  CHECK_FALSE(gemma_like().sliced());
  CHECK(dense_slice_layers(gemma_like(), 8) == 0);
  CHECK(dense_slice_layers(gemma_like(), 3) == 0);
  CHECK(dense_slice_layers(gemma_like(), 2) == 2);
  const std::vector<LayerGroup> gs{LayerGroup::full_attention("global", 2, 1, 8, 2, 4),
                                   LayerGroup::sliding_window("local", 6, 1, 8, 2, 4, 8)};
  const KVLayout cut = KVLayout::plan(gs, {.slice_above_pages_per_large_page = 2});
  CHECK(same(cut, slice_layers(gemma_like(), 2)));
  CHECK(cut.num_groups() == 4);
  CHECK(cut.group(3).layers == std::vector<std::uint32_t>{6, 7});  // numbered after global's 0, 1
  // A cut layout is not cut again, and keeps the tokens per page asked for.
  CHECK(cut.requested_tokens_per_page(3) == 4);
  CHECK(same(slice_layers(cut, kSliceSmallest), cut));
  // Gemma-3-27B: 26 global pages per large page, cut at 10; the knobs turn it off.
  const KVLayout g3 = presets::gemma3_27b();
  CHECK(g3.sliced());
  CHECK(g3.num_groups() == 7);
  const KVLayout whole = presets::gemma3_27b({.layout = {.slice_layers = SliceLayers::kOff}});
  CHECK(whole.small_pages_per_large_page(0) == 26);
  CHECK(dense_slice_layers(whole, 8) == 10);
  CHECK(dense_slice_layers(whole, 26) == 0);
  CHECK(same(g3, slice_layers(whole, kSliceSmallest)));
  CHECK_FALSE(presets::gemma3_27b({.layout = {.slice_above_pages_per_large_page = 26}}).sliced());
  CHECK(presets::gemma3_27b({.layout = {.slice_above_pages_per_large_page = 25}}).sliced());
}

TEST_CASE("slice_layers: of the presets and the configs in tests/data only Gemma-3 changes",
          "[spec][layout][slicing]") {
  std::vector<std::string> names = presets::names();
  for (const auto* more : {&presets::speculative_names(), &presets::state_heavy_names()})
    names.insert(names.end(), more->begin(), more->end());
  std::vector<std::string> changed;
  for (const std::string& n : names) {
    INFO(n);
    presets::PresetOptions off, vision;
    off.layout.slice_layers = SliceLayers::kOff;
    vision.vision_embedding = true;
    presets::PresetOptions vision_off = vision;
    vision_off.layout.slice_layers = SliceLayers::kOff;
    const KVLayout d = presets::by_name(n), o = presets::by_name(n, off);
    if (!same(d, o)) changed.push_back(n);
    CHECK(same(presets::by_name(n, vision), presets::by_name(n, vision_off)) == same(d, o));
  }
  CHECK(changed == std::vector<std::string>{"gemma-3-27b"});
  changed.clear();
  for (const auto& e : std::filesystem::directory_iterator(KVMM_TEST_DATA_DIR)) {
    if (e.path().extension() != ".json") continue;
    INFO(e.path());
    HfConfigOptions on;
    on.python_literals = true;
    on.layout.max_large_page_bytes = std::uint64_t{1} << 30;
    HfConfigOptions off = on;
    off.layout.slice_layers = SliceLayers::kOff;
    const KVLayout d = read_hf_config_file(e.path().string(), on).layout;
    if (!same(d, read_hf_config_file(e.path().string(), off).layout)) changed.push_back(e.path().filename().string());
  }
  CHECK(changed == std::vector<std::string>{"gemma-3-27b-it.config.json"});
}
