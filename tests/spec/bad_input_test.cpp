// Bad input against every public class of kvmm/spec (LayerGroup, KVLayout and its
// planner, the presets): each case asserts the documented kvmm::Error naming the field,
// that the objects involved are unchanged afterwards, and that they still serve a
// request end to end (a good layout plans; an existing layout answers its accessors).
#include <kvmm/error.hpp>
#include <kvmm/spec/kv_layout.hpp>
#include <kvmm/spec/presets.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>
#include "support/error_of.hpp"

using namespace kvmm;

namespace {

constexpr std::uint32_t kMax32 = std::numeric_limits<std::uint32_t>::max();
constexpr std::uint64_t kMax64 = std::numeric_limits<std::uint64_t>::max();

using kvmm::test::error_of;

// Everything observable of a layout, to prove a rejected call changed nothing.
std::string fingerprint(const KVLayout& l) {
  std::string s = l.describe();
  for (GroupId g = 0; g < l.num_groups(); ++g)
    s += std::to_string(l.natural_page_bytes(g)) + "/" + std::to_string(l.small_pages_per_large_page(g)) + ";";
  return s + std::to_string(l.natural_lcm_bytes());
}

// The layout still serves: every group's pages divide the large page and the K/V or
// state offsets of its last layer lie inside its small page.
void serves(const KVLayout& l) {
  for (GroupId g = 0; g < l.num_groups(); ++g) {
    const LayerGroup& grp = l.group(g);
    REQUIRE(l.large_page_bytes() % l.small_page_bytes(g) == 0);
    const std::uint32_t last = grp.num_layers - 1;
    if (grp.is_state()) {
      REQUIRE(l.state_offset(g, last) + grp.state_bytes_per_layer <= l.small_page_bytes(g));
    } else if (grp.kind != LayerKind::kVisionEmbedding) {
      REQUIRE(l.v_offset(g, last) + grp.tokens_per_page * grp.head_bytes_per_token() <= l.small_page_bytes(g));
    }
  }
}

LayerGroup good_group() { return LayerGroup::full_attention("good", 2, 2, 64, 2, 16); }

}  // namespace

TEST_CASE("LayerGroup: page sizes that overflow 64 bits are rejected, naming the fields", "[spec][bad-input]") {
  // kv_heads = head_dim = 2^31: the page size wraps to 0 (a division by zero in the planner).
  LayerGroup huge = LayerGroup::full_attention("huge", 1, 1u << 31, 1u << 31, 2, 16);
  CHECK_THAT(error_of([&] { huge.validate(); }), Catch::Contains("LayerGroup 'huge'") && Catch::Contains("overflows"));
  CHECK_THAT(error_of([&] { KVLayout::plan({huge}); }), Catch::Contains("'huge'") && Catch::Contains("overflows"));
  // 4 layers x (2^62 + 1) bytes of state wraps to 4 bytes: accepted as a 4-byte page before.
  LayerGroup mamba = LayerGroup::mamba_state("m", 4, (std::uint64_t{1} << 62) + 1, 64);
  CHECK_THAT(error_of([&] { KVLayout::plan({mamba}); }),
             Catch::Contains("'m'") && Catch::Contains("state_bytes_per_layer") && Catch::Contains("overflows"));
  // 16 tokens x (2^60 + 1) bytes of embedding wraps to 16 bytes.
  LayerGroup vision = LayerGroup::vision_embedding("v", (std::uint64_t{1} << 60) + 1, 16);
  CHECK_THAT(error_of([&] { KVLayout::plan({vision}); }),
             Catch::Contains("'v'") && Catch::Contains("embedding_bytes_per_token") && Catch::Contains("overflows"));
  // The arithmetic accessors raise instead of wrapping.
  CHECK_THAT(error_of([&] { (void)huge.natural_page_bytes(); }), Catch::Contains("overflows"));
  CHECK_THAT(error_of([&] { (void)mamba.natural_page_bytes(); }), Catch::Contains("overflows"));
  // pages_for_tokens near 2^64 tokens rounds up without wrapping.
  CHECK(good_group().pages_for_tokens(kMax64) == kMax64 / 16 + 1);
  // The largest values that fit still plan (one layer, one token per page).
  LayerGroup wide = LayerGroup::full_attention("wide", 1, 1u << 20, 1u << 10, 4, 1);
  CHECK_NOTHROW(wide.validate());
  CHECK(wide.natural_page_bytes() == std::uint64_t{2} << 32);
}

TEST_CASE("LayerGroup: every invalid field is named", "[spec][bad-input]") {
  struct Case {
    std::function<void(LayerGroup&)> edit;
    const char* message;
  };
  const std::vector<Case> cases{
      {[](LayerGroup& g) { g.name.clear(); }, "LayerGroup.name"},
      {[](LayerGroup& g) { g.num_layers = 0; }, "num_layers = 0"},
      {[](LayerGroup& g) { g.tokens_per_page = 0; }, "tokens_per_page = 0"},
      {[](LayerGroup& g) { g.kv_heads = 0; }, "kv_heads = 0"},
      {[](LayerGroup& g) { g.head_dim = 0; }, "head_dim = 0"},
      {[](LayerGroup& g) { g.dtype_bytes = 3; }, "dtype_bytes = 3"},
      {[](LayerGroup& g) { g.kind = static_cast<LayerKind>(77); }, "kind = 77"},
      {[](LayerGroup& g) {
         g.kind = LayerKind::kSlidingWindow;
         g.window = 0;
       },
       "window = 0"},
      {[](LayerGroup& g) {
         g.kind = LayerKind::kChunkedLocal;
         g.chunk = 0;
       },
       "chunk = 0"},
      {[](LayerGroup& g) {
         g.kind = LayerKind::kMambaState;
         g.state_bytes_per_layer = 0;
       },
       "state_bytes_per_layer = 0"},
      {[](LayerGroup& g) {
         g.kind = LayerKind::kVisionEmbedding;
         g.embedding_bytes_per_token = 0;
       },
       "embedding_bytes_per_token = 0"},
  };
  for (const Case& c : cases) {
    INFO(c.message);
    LayerGroup g = good_group();
    c.edit(g);
    const LayerGroup before = g;
    CHECK_THAT(error_of([&] { g.validate(); }), Catch::Contains(c.message));
    LayerGroup renamed = g;  // next to a valid group of another name
    if (!renamed.name.empty()) renamed.name = "bad";
    CHECK_THAT(error_of([&] { KVLayout::plan({good_group(), renamed}); }), Catch::Contains(c.message));
    CHECK(g.num_layers == before.num_layers);
    // The valid group next to it still plans.
    serves(KVLayout::plan({good_group()}));
  }
  CHECK(to_string(static_cast<LayerKind>(77)) == "unknown");
}

TEST_CASE("KVLayout::plan: extreme limits terminate with an error naming the option", "[spec][bad-input]") {
  const std::vector<LayerGroup> groups{LayerGroup::vision_embedding("a", 96, 1),
                                       LayerGroup::vision_embedding("b", 160, 1)};
  // Pages of about 2^30 bytes with coprime factors: their LCM (about 2^90) overflows 64
  // bits, so the planner must pad. Under a limit of 2^62 the search looped without end
  // (its 7-smooth multipliers wrapped); under 2^64-1 it used a saturated LCM that the
  // small pages do not divide.
  const std::vector<LayerGroup> coprime{LayerGroup::vision_embedding("p", 1000003, 1024),
                                        LayerGroup::vision_embedding("q", 999983, 1024),
                                        LayerGroup::vision_embedding("r", 999979, 1024)};
  for (const std::uint64_t limit : {std::uint64_t{1} << 62, kMax64, (std::uint64_t{1} << 40) + 1}) {
    INFO("limit " << limit);
    for (const auto* gs : {&groups, &coprime})
      CHECK_THAT(error_of([&] { KVLayout::plan(*gs, {.max_large_page_bytes = limit}); }),
                 Catch::Contains("max_large_page_bytes = " + std::to_string(limit)));
  }
  CHECK_THAT(error_of([&] { KVLayout::plan(groups, {.max_large_page_bytes = 0}); }),
             Catch::Contains("max_large_page_bytes = 0"));
  CHECK_THAT(error_of([&] { KVLayout::plan(groups, {.padded_page_alignment = 0}); }),
             Catch::Contains("padded_page_alignment = 0"));
  CHECK_THAT(error_of([&] { KVLayout::plan(groups, {.max_large_page_bytes = 400, .padded_page_alignment = 1000}); }),
             Catch::Contains("max_large_page_bytes = 400") && Catch::Contains("no padded layout"));
  // The largest accepted limit plans (unpadded LCM) and a padded search under it finishes.
  serves(KVLayout::plan(groups, {.max_large_page_bytes = std::uint64_t{1} << 40}));
  const auto t0 = std::chrono::steady_clock::now();
  const KVLayout padded = KVLayout::plan(coprime, {.max_large_page_bytes = std::uint64_t{1} << 40});
  INFO("planning took " << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() << " s");
  CHECK(padded.padded());
  CHECK(padded.natural_lcm_bytes() == kMax64);  // saturated: the LCM does not fit 64 bits
  CHECK(padded.large_page_bytes() <= std::uint64_t{1} << 40);
  serves(padded);
}

TEST_CASE("KVLayout accessors: bad group or layer raise and change nothing", "[spec][bad-input]") {
  const KVLayout l = presets::jamba1_5_mini({.tokens_per_page = 4, .mamba_checkpoint_interval = 64});
  const std::string before = fingerprint(l);
  const std::vector<std::pair<std::function<void()>, const char*>> calls{
      {[&] { (void)l.group(2); }, "group = 2"},
      {[&] { (void)l.small_page_bytes(kMax32); }, "group = 4294967295"},
      {[&] { (void)l.natural_page_bytes(9); }, "group = 9"},
      {[&] { (void)l.small_pages_per_large_page(2); }, "group = 2"},
      {[&] { (void)l.padding_fraction(3); }, "group = 3"},
      {[&] { (void)l.k_offset(1, 0); }, "no K/V layout"},
      {[&] { (void)l.k_offset(0, 4); }, "layer = 4"},
      {[&] { (void)l.v_offset(0, kMax32); }, "layer = 4294967295"},
      {[&] { (void)l.state_offset(0, 0); }, "not a state group"},
      {[&] { (void)l.state_offset(1, 28); }, "layer = 28"},
  };
  for (const auto& [call, message] : calls) {
    INFO(message);
    CHECK_THAT(error_of(call), Catch::Contains(message));
    CHECK(fingerprint(l) == before);
  }
  CHECK_FALSE(l.find_group("nope").has_value());
  serves(l);
}

TEST_CASE("presets: bad options name the option, never a derived field", "[spec][bad-input]") {
  using presets::PresetOptions;
  // state_dtype_bytes = 3 was accepted silently (a Mamba state of 3-byte elements).
  CHECK_THAT(error_of([] { presets::jamba1_5_mini({.state_dtype_bytes = 3}); }),
             Catch::Contains("PresetOptions.state_dtype_bytes = 3"));
  CHECK_THAT(error_of([] { presets::jamba1_5_mini({.state_dtype_bytes = 0}); }),
             Catch::Contains("PresetOptions.state_dtype_bytes = 0"));
  // A zero checkpoint interval was reported as the group's tokens_per_page.
  CHECK_THAT(error_of([] { presets::jamba1_5_mini({.mamba_checkpoint_interval = 0}); }),
             Catch::Contains("PresetOptions.mamba_checkpoint_interval = 0"));
  for (const std::string& name : presets::names()) {
    INFO(name);
    CHECK_THAT(error_of([&] { presets::by_name(name, {.tokens_per_page = 0}); }),
               Catch::Contains("PresetOptions.tokens_per_page = 0"));
    CHECK_THAT(error_of([&] { presets::by_name(name, {.dtype_bytes = 3}); }),
               Catch::Contains("PresetOptions.dtype_bytes = 3"));
    PresetOptions o;
    o.layout.max_large_page_bytes = 0;
    CHECK_THAT(error_of([&] { presets::by_name(name, o); }), Catch::Contains("max_large_page_bytes = 0"));
    serves(presets::by_name(name));  // and the preset still builds
  }
  CHECK_THAT(error_of([] { presets::by_name(""); }), Catch::Contains("preset = ''"));
}

TEST_CASE("planner: random hostile groups either plan consistently or raise kvmm::Error", "[spec][bad-input]") {
  // Fields drawn from edge values (0, 1, powers of two, 2^32-1, 2^64-1) and ordinary
  // ones; every outcome is a consistent layout or a kvmm::Error, never a crash or a hang.
  std::mt19937_64 rng(2024);
  const std::vector<std::uint64_t> edges{0,        1,          2,      3,          16,         255,   4096,
                                         1u << 20, 1ull << 31, kMax32, 1ull << 32, 1ull << 62, kMax64};
  auto pick32 = [&](std::uint32_t ordinary) {
    const std::uint64_t v = rng() % 3 == 0 ? edges[rng() % edges.size()] : ordinary;
    return static_cast<std::uint32_t>(std::min<std::uint64_t>(v, kMax32));
  };
  int planned = 0, rejected = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::vector<LayerGroup> gs;
    const int n = 1 + static_cast<int>(rng() % 3);
    for (int i = 0; i < n; ++i) {
      LayerGroup g = good_group();
      g.name = "g" + std::to_string(i);
      g.kind = static_cast<LayerKind>(rng() % 7);  // 6 is out of range
      g.num_layers = pick32(1 + rng() % 40);
      g.kv_heads = pick32(1 + rng() % 16);
      g.head_dim = pick32(64);
      g.dtype_bytes = pick32(2);
      g.tokens_per_page = pick32(1 + rng() % 32);
      g.window = pick32(4096);
      g.chunk = pick32(1024);
      g.state_bytes_per_layer = rng() % 3 == 0 ? edges[rng() % edges.size()] : 1 + rng() % 100000;
      g.embedding_bytes_per_token = rng() % 3 == 0 ? edges[rng() % edges.size()] : 1 + rng() % 10000;
      gs.push_back(g);
    }
    LayoutOptions o;
    if (rng() % 4 == 0) o.max_large_page_bytes = edges[rng() % edges.size()];
    if (rng() % 8 == 0) o.padded_page_alignment = edges[rng() % edges.size()];
    try {
      const KVLayout l = KVLayout::plan(gs, o);
      ++planned;
      REQUIRE(l.large_page_bytes() <= o.max_large_page_bytes);
      for (GroupId g = 0; g < l.num_groups(); ++g) {
        REQUIRE(l.small_page_bytes(g) >= l.natural_page_bytes(g));
        REQUIRE(l.small_page_bytes(g) * l.small_pages_per_large_page(g) == l.large_page_bytes());
      }
      serves(l);
    } catch (const Error&) {
      ++rejected;
    }
  }
  CHECK(planned > 100);
  CHECK(rejected > 100);
}
