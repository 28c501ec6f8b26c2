// The planner's layer map (KVLayout::layer_group, layer_slots, model_layer, source_group;
// LayerGroup::layers): exact maps of Gemma-3 (sliced by default), Gemma-2, Ministral-8B,
// Jamba, Llama-3.2-Vision, DeepSeek-V3.2 (indexer), Gemma-3n (shared KV) and the draft
// presets from their configs in tests/data and the presets; a seeded check that every
// model layer lands in exactly one slot with the layer counts kept, sliced or not; and bad
// input naming the argument and its value.
#include <kvmm/error.hpp>
#include <kvmm/spec/hf_config.hpp>
#include <kvmm/spec/layer_slicing.hpp>
#include <kvmm/spec/presets.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "support/error_of.hpp"

using namespace kvmm;
using kvmm::test::error_of;

namespace {

std::string data_path(const std::string& file) { return std::string(KVMM_TEST_DATA_DIR) + "/" + file; }

HfConfigOptions unsliced() {
  HfConfigOptions o;
  o.layout.slice_layers = SliceLayers::kOff;
  return o;
}

// The ModelSpec's placements are the layout's map, and the map is consistent both ways.
void map_agrees(const ModelSpec& m) {
  validate_layers(m);
  const KVLayout& l = m.layout;
  for (std::uint32_t i = 0; i < m.layers.size(); ++i) {
    INFO("layer " << i);
    const LayerPlacement& p = m.layers[i];
    if (p.role != LayerRole::kOwn) {
      CHECK_FALSE(l.holds_layer(i));
      continue;
    }
    CHECK(l.layer_group(i) == LayerSlot{p.group, p.index});
    CHECK(l.model_layer(p.group, p.index) == i);
    if (p.aux_group != kNoAuxGroup) {
      REQUIRE(l.layer_slots(i).size() == 2);
      CHECK(l.layer_slots(i)[1] == LayerSlot{p.aux_group, p.aux_index});
    }
  }
  for (GroupId g = 0; g < l.num_groups(); ++g) CHECK(l.group(g).layers.size() == l.group(g).num_layers);
}

// The slots of `pattern`-selected layers of `total`, in model order.
std::vector<std::uint32_t> where(std::uint32_t total, bool (*pred)(std::uint32_t)) {
  std::vector<std::uint32_t> out;
  for (std::uint32_t i = 0; i < total; ++i)
    if (pred(i)) out.push_back(i);
  return out;
}

}  // namespace

TEST_CASE("layer map: Gemma-3-27B is cut at its 10 global layers by default", "[spec][layout][layer_map]") {
  const ModelSpec m = read_hf_config_file(data_path("gemma-3-27b-it.config.json"));
  const KVLayout& l = m.layout;
  map_agrees(m);
  REQUIRE(l.num_groups() == 7);
  CHECK(l.sliced());
  CHECK(l.num_model_layers() == 62);
  CHECK(l.group(0).name == "global");
  CHECK(l.group(0).layers == where(62, [](std::uint32_t i) { return i % 6 == 5; }));
  // The 52 local layers in model order, 10 to a group, the last 2 in local.5.
  const std::vector<std::uint32_t> local = where(62, [](std::uint32_t i) { return i % 6 != 5; });
  for (GroupId g = 1; g < 7; ++g) {
    INFO("group " << g);
    CHECK(l.group(g).name == "local." + std::to_string(g - 1));
    CHECK(l.group(g).kind == LayerKind::kSlidingWindow);
    CHECK(l.group(g).window == 1024);
    CHECK(l.source_group(g) == 1);
    CHECK(m.attention[g].sliding_window == 1024);
    const auto first = local.begin() + (g - 1) * 10;
    CHECK(l.group(g).layers == std::vector<std::uint32_t>(first, first + l.group(g).num_layers));
  }
  CHECK(l.source_group(0) == 0);
  CHECK(m.attention[0].sliding_window == 0);
  CHECK(l.group(6).num_layers == 2);
  CHECK(l.layer_group(5) == LayerSlot{0, 0});
  CHECK(l.layer_group(59) == LayerSlot{0, 9});
  CHECK(l.layer_group(0) == LayerSlot{1, 0});
  CHECK(l.layer_group(10) == LayerSlot{1, 9});
  CHECK(l.layer_group(12) == LayerSlot{2, 0});
  CHECK(l.layer_group(61) == LayerSlot{6, 1});
  // Pages: 10 layers x 2 x 16 tokens x 16 heads x 128 x 2 B = 1.25 MiB, the remainder 0.25 MiB.
  CHECK(l.small_page_bytes(0) == 1310720);
  CHECK(l.small_page_bytes(3) == 1310720);
  CHECK(l.small_page_bytes(6) == 262144);
  CHECK(l.large_page_bytes() == 1310720);
  CHECK(l.small_pages_per_large_page(6) == 5);
  // The slot a kernel addresses is the map's: layer 61's K is the remainder page's second.
  CHECK(l.k_offset(6, l.layer_group(61).slot) == l.layer_stride_bytes(6));

  // Unsliced: two groups, 26 global pages per 32.5 MiB large page; the preset agrees both ways.
  const ModelSpec u = read_hf_config_file(data_path("gemma-3-27b-it.config.json"), unsliced());
  map_agrees(u);
  REQUIRE(u.layout.num_groups() == 2);
  CHECK_FALSE(u.layout.sliced());
  CHECK(u.layout.small_pages_per_large_page(0) == 26);
  CHECK(u.layout.layer_group(61) == LayerSlot{1, 51});
  const KVLayout preset = presets::gemma3_27b();
  REQUIRE(preset.num_groups() == 7);
  for (GroupId g = 0; g < 7; ++g) CHECK(preset.group(g).layers == l.group(g).layers);
  CHECK(presets::gemma3_27b({.layout = {.slice_layers = SliceLayers::kOff}}).group(1).layers ==
        u.layout.group(1).layers);
}

TEST_CASE("layer map: Gemma-2, Ministral, Jamba and Llama-Vision stay whole and match their presets",
          "[spec][layout][layer_map]") {
  struct Case {
    std::string file;
    KVLayout preset;
    std::vector<std::vector<std::uint32_t>> layers;  // per group
  };
  const std::vector<Case> cases{
      {"gemma-2-27b.config.json",
       presets::gemma2_27b(),
       {where(46, [](std::uint32_t i) { return i % 2 == 1; }), where(46, [](std::uint32_t i) { return i % 2 == 0; })}},
      {"jamba-1.5-mini.config.json",
       presets::jamba1_5_mini(),
       {where(32, [](std::uint32_t i) { return i % 8 == 4; }), where(32, [](std::uint32_t i) { return i % 8 != 4; })}},
      {"llama-3.2-11b-vision.excerpt.json",
       presets::llama3_2_11b_vision(),
       {where(40, [](std::uint32_t i) { return i % 5 != 3; }), where(40, [](std::uint32_t i) { return i % 5 == 3; })}},
  };
  for (const Case& c : cases) {
    INFO(c.file);
    const ModelSpec m = read_hf_config_file(data_path(c.file));
    map_agrees(m);
    CHECK_FALSE(m.layout.sliced());
    REQUIRE(m.layout.num_groups() == c.layers.size());
    for (GroupId g = 0; g < m.layout.num_groups(); ++g) {
      CHECK(m.layout.group(g).layers == c.layers[g]);
      CHECK(c.preset.group(g).layers == c.layers[g]);
    }
  }
  // Ministral-8B: vLLM's 1 full : 3 sliding (the preset; its config read with layer_types).
  // The full group has 3 pages per large page: below the threshold, never cut.
  const KVLayout mi = presets::ministral_8b();
  CHECK_FALSE(mi.sliced());
  CHECK(mi.small_pages_per_large_page(0) == 3);
  CHECK(mi.group(0).layers == where(36, [](std::uint32_t i) { return i % 4 == 0; }));
  CHECK(mi.layer_group(35) == LayerSlot{1, 26});
  const ModelSpec cfg = read_hf_config_file(data_path("ministral-8b-instruct-2410.config.json"));
  map_agrees(cfg);
  CHECK(cfg.layout.layer_group(35) == LayerSlot{0, 35});  // the config slides every layer
}

TEST_CASE("layer map: indexers, shared KV and draft groups", "[spec][layout][layer_map]") {
  // DeepSeek-V3.2: every layer in the MLA group and in the indexer, at the same slot.
  const ModelSpec ds = read_hf_config_file(data_path("deepseek-v3.2.config.json"));
  map_agrees(ds);
  const GroupId indexer = *ds.layout.find_group("indexer");
  for (std::uint32_t i = 0; i < 61; ++i) {
    REQUIRE(ds.layout.layer_slots(i).size() == 2);
    CHECK(ds.layout.layer_slots(i)[1] == LayerSlot{indexer, i});
  }
  // Gemma-3n: its last 15 layers read other layers' KV and hold no pages.
  HfConfigOptions o;
  const ModelSpec g3n = read_hf_config_file(data_path("gemma-3n-e4b.defaults.json"), o);
  map_agrees(g3n);
  CHECK(g3n.layout.holds_layer(19));
  CHECK_FALSE(g3n.layout.holds_layer(20));
  CHECK(g3n.layout.layer_slots(34).empty());
  CHECK(g3n.layout.num_model_layers() == 20);  // the shared layers come last
  CHECK_THAT(error_of([&] { (void)g3n.layout.layer_group(20); }),
             Catch::Contains("model_layer = 20: the layout maps 20 model layers"));
  // Nemotron-H: MLP-only layers between cached ones are gaps in the map.
  HfConfigOptions lit;
  lit.python_literals = true;
  lit.layout.max_large_page_bytes = std::uint64_t{1} << 30;
  const ModelSpec nh = read_hf_config_file(data_path("nemotron-h-56b-base-8k.config.json"), lit);
  map_agrees(nh);
  CHECK_THAT(error_of([&] { (void)nh.layout.layer_group(1); }), Catch::Contains("model_layer = 1: no group holds it"));
  // Draft layers are numbered after the target's (EAGLE-3: layer 32; MTP: after 48).
  const KVLayout eagle = presets::eagle3_llama3_1_8b();
  CHECK(eagle.layer_group(31) == LayerSlot{0, 31});
  CHECK(eagle.layer_group(32) == LayerSlot{1, 0});
  CHECK(eagle.group(1).is_draft());
  const KVLayout mtp = presets::mtp_qwen3_next_80b_a3b();
  CHECK(mtp.num_model_layers() == 49);
  CHECK_FALSE(mtp.sliced());
  // Cross attention keeps its place in the map (Llama-Vision layer 3 is cross slot 0).
  CHECK(presets::llama3_2_11b_vision().layer_group(3) == LayerSlot{1, 0});
  // A vision-embedding group holds no model layer.
  const KVLayout vis = presets::llama3_2_11b_vision({.vision_embedding = true});
  CHECK(vis.group(2).layers.empty());
  CHECK(vis.num_model_layers() == 40);
}

TEST_CASE("layer map: random groups, given or numbered, cut or whole: each layer in one slot",
          "[spec][layout][layer_map][slicing]") {
  std::mt19937_64 rng(1434);
  int sliced = 0;
  for (int iter = 0; iter < 300; ++iter) {
    INFO("iter " << iter);
    const std::uint32_t n_groups = 1 + static_cast<std::uint32_t>(rng() % 4);
    std::vector<std::uint32_t> counts;
    std::uint32_t total = 0;
    for (std::uint32_t g = 0; g < n_groups; ++g) total += counts.emplace_back(1 + rng() % 40);
    std::vector<std::uint32_t> perm(total);
    std::iota(perm.begin(), perm.end(), 0u);
    std::shuffle(perm.begin(), perm.end(), rng);
    const bool given = rng() % 3 != 0;
    std::vector<LayerGroup> gs;
    for (std::uint32_t g = 0, at = 0; g < n_groups; at += counts[g++]) {
      const std::string name = "g" + std::to_string(g);
      gs.push_back(g % 2 == 0 ? LayerGroup::full_attention(name, counts[g], 2, 64, 2, 16)
                              : LayerGroup::sliding_window(name, counts[g], 2, 64, 2, 16, 256));
      if (given) {
        gs.back().layers.assign(perm.begin() + at, perm.begin() + at + counts[g]);
        std::sort(gs.back().layers.begin(), gs.back().layers.end());
      }
    }
    LayoutOptions o;
    o.slice_layers = rng() % 4 == 0 ? SliceLayers::kOff : SliceLayers::kSmallestWhenDense;
    o.slice_above_pages_per_large_page = 1 + static_cast<std::uint32_t>(rng() % 12);
    const KVLayout l = KVLayout::plan(gs, o);
    sliced += l.sliced();
    REQUIRE(l.num_model_layers() == total);
    std::vector<int> seen(total, 0);
    std::map<std::size_t, std::vector<std::uint32_t>> by_source;
    for (GroupId g = 0; g < l.num_groups(); ++g) {
      const LayerGroup& grp = l.group(g);
      REQUIRE(grp.layers.size() == grp.num_layers);
      for (std::uint32_t k = 0; k < grp.num_layers; ++k) {
        ++seen[grp.layers[k]];
        CHECK(l.layer_group(grp.layers[k]) == LayerSlot{g, k});
        CHECK(l.model_layer(g, k) == grp.layers[k]);
      }
      auto& s = by_source[l.source_group(g)];
      s.insert(s.end(), grp.layers.begin(), grp.layers.end());
    }
    CHECK(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }));
    // Each source group's layers, in slot order, are the sliced groups' in group order.
    REQUIRE(by_source.size() == gs.size());
    for (std::size_t s = 0; s < gs.size(); ++s) {
      if (given) CHECK(by_source[s] == gs[s].layers);
      CHECK(by_source[s].size() == counts[s]);
    }
    // Sliced exactly when the rule says so, at the smallest group's count.
    const KVLayout whole = KVLayout::plan(gs, {.slice_layers = SliceLayers::kOff});
    const std::uint32_t n =
        o.slice_layers == SliceLayers::kOff ? 0 : dense_slice_layers(whole, o.slice_above_pages_per_large_page);
    CHECK(l.sliced() == (n > 0));
    if (n > 0) {
      CHECK(n == *std::min_element(counts.begin(), counts.end()));
      for (GroupId g = 0; g < l.num_groups(); ++g) CHECK(l.group(g).num_layers <= n);
    }
  }
  CHECK(sliced > 20);  // the seeded draw does cut layouts
}

TEST_CASE("layer map: bad layers and options name the field and its value", "[spec][layout][layer_map][errors]") {
  auto full = [](std::vector<std::uint32_t> layers, std::uint32_t n = 2, std::string name = "a") {
    LayerGroup g = LayerGroup::full_attention(std::move(name), n, 1, 8, 2, 4);
    g.layers = std::move(layers);
    return g;
  };
  CHECK_THAT(error_of([&] {
               KVLayout::plan({full({0, 1, 2})});
             }),
             Catch::Contains("LayerGroup 'a': layers has 3 entries, num_layers = 2"));
  CHECK_THAT(error_of([&] {
               KVLayout::plan({full({4, 4})});
             }),
             Catch::Contains("layers[1] = 4: model layer 4 is already held by this group"));
  CHECK_THAT(error_of([&] {
               KVLayout::plan({full({0, 1}), full({1, 2}, 2, "b")});
             }),
             Catch::Contains("LayerGroup 'b': layers[0] = 1: model layer 1 is already held by group 'a'"));
  CHECK_THAT(error_of([&] {
               KVLayout::plan({full({0, LayerGroup::kMaxModelLayers})});
             }),
             Catch::Contains("layers[1] = 1048576: model layer indices must be below 1048576"));
  LayerGroup vision = LayerGroup::vision_embedding("v", 64, 4);
  vision.layers = {0};
  CHECK_THAT(error_of([&] {
               KVLayout::plan({full({}), vision});
             }),
             Catch::Contains("LayerGroup 'v': layers has 1 entries: a vision-embedding group holds no model layer"));
  // An attention layer may also hold a state (Falcon-H1) but not a second attention group.
  LayerGroup state = LayerGroup::mamba_state("s", 2, 512, 16);
  state.layers = {0, 1};
  const KVLayout hybrid = KVLayout::plan({full({0, 1}), state});
  CHECK(hybrid.layer_slots(1).size() == 2);
  CHECK(hybrid.layer_slots(1)[1] == LayerSlot{1, 1});
  // An indexer's layers are its attention group's.
  LayerGroup mla = LayerGroup::mla("mla", 2, 64, 16, ElementFormat::of(ElementType::kBf16), std::nullopt, 4);
  mla.layers = {3, 7};
  LayerGroup idx = LayerGroup::indexer("idx", 2, 1, 32, ElementFormat::of(ElementType::kBf16), 4, "mla");
  CHECK(KVLayout::plan({mla, idx}).group(1).layers == std::vector<std::uint32_t>{3, 7});
  idx.layers = {3, 8};
  CHECK_THAT(error_of([&] {
               KVLayout::plan({mla, idx});
             }),
             Catch::Contains("LayerGroup 'idx': layers [3, 8] differ from those of its attention group 'mla' [3, 7]"));
  // Options.
  CHECK_THAT(error_of([&] { KVLayout::plan({full({})}, {.slice_above_pages_per_large_page = 0}); }),
             Catch::Contains("slice_above_pages_per_large_page = 0: must be >= 1"));
  CHECK_THAT(error_of([&] { KVLayout::plan({full({})}, {.slice_layers = static_cast<SliceLayers>(7)}); }),
             Catch::Contains("slice_layers = 7: not a SliceLayers"));
  CHECK(error_of([&] {
          KVLayout::plan({full({})}, {.slice_layers = SliceLayers::kOff, .slice_above_pages_per_large_page = 0});
        }) == "no error");
  // Accessors.
  const KVLayout l = KVLayout::plan({full({5, 9})});
  CHECK(l.num_model_layers() == 10);
  CHECK_THAT(error_of([&] { (void)l.model_layer(0, 2); }), Catch::Contains("slot = 2: group 'a' holds 2 model layers"));
  CHECK_THAT(error_of([&] { (void)l.model_layer(1, 0); }), Catch::Contains("group = 1"));
  CHECK_THAT(error_of([&] { (void)l.source_group(3); }), Catch::Contains("group = 3"));
  // validate_layers: a placement the layout's map disagrees with.
  ModelSpec m = read_hf_config_file(data_path("gemma-2-27b.config.json"));
  std::swap(m.layers[0], m.layers[2]);
  CHECK_THAT(error_of([&] { validate_layers(m); }),
             Catch::Contains("layers[0]: slot 1 of group 'local' holds model layer 2 in the layout's layer map"));
}
