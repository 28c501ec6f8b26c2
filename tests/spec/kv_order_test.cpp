// LayerGroup::kv_order (kvmm/spec/kv_order.hpp): the default is token-major; a head-major
// plain group plans to the same page sizes and offsets as its token-major twin; the
// planner's copies (layer slicing, fitted tokens_per_page) keep the order; a value out of
// range, and head-major on a group whose pages no head-major reader understands
// (formats, MLA latent, indexer, state, vision), raise kvmm::Error naming the group and
// kv_order, with the group unchanged.
#include <kvmm/error.hpp>
#include <kvmm/spec/kv_layout.hpp>

#include <catch2/catch.hpp>

#include <string>
#include <vector>
#include "support/error_of.hpp"

using namespace kvmm;
using kvmm::test::error_of;

namespace {

LayerGroup head_major(LayerGroup g) {
  g.kv_order = KVOrder::kHeadMajor;
  return g;
}

}  // namespace

TEST_CASE("kv_order: head-major pages have the token-major sizes and offsets; the planner keeps the order") {
  const LayerGroup plain = LayerGroup::full_attention("full", 3, 8, 128, 2, 16);
  CHECK(plain.kv_order == KVOrder::kTokenMajor);
  const KVLayout nhd = KVLayout::plan({plain, LayerGroup::sliding_window("swa", 1, 2, 64, 2, 16, 128)});
  const KVLayout hnd = KVLayout::plan({head_major(plain), LayerGroup::sliding_window("swa", 1, 2, 64, 2, 16, 128)});
  REQUIRE(hnd.num_groups() == nhd.num_groups());
  CHECK(hnd.group(0).kv_order == KVOrder::kHeadMajor);
  CHECK(hnd.group(1).kv_order == KVOrder::kTokenMajor);
  CHECK(hnd.large_page_bytes() == nhd.large_page_bytes());
  for (GroupId g = 0; g < hnd.num_groups(); ++g) {
    CHECK(hnd.small_page_bytes(g) == nhd.small_page_bytes(g));
    for (std::uint32_t l = 0; l < hnd.group(g).num_layers; ++l) {
      CHECK(hnd.k_offset(g, l) == nhd.k_offset(g, l));
      CHECK(hnd.v_offset(g, l) == nhd.v_offset(g, l));
    }
  }

  // Layer slicing: 16 full-attention layers beside a one-layer window group of the same
  // bytes per layer are cut into groups of one layer; every piece of the head-major group
  // stays head-major, the window group token-major.
  const KVLayout sliced = KVLayout::plan({head_major(LayerGroup::full_attention("full", 16, 8, 128, 2, 16)),
                                          LayerGroup::sliding_window("swa", 1, 8, 128, 2, 16, 128)});
  REQUIRE(sliced.num_groups() > 2);
  std::uint32_t full_layers = 0;
  for (GroupId g = 0; g < sliced.num_groups(); ++g) {
    const LayerGroup& grp = sliced.group(g);
    INFO("group " << g << " '" << grp.name << "'");
    const bool is_full = grp.name.rfind("full", 0) == 0;
    CHECK(grp.kv_order == (is_full ? KVOrder::kHeadMajor : KVOrder::kTokenMajor));
    if (is_full) full_layers += grp.num_layers;
  }
  CHECK(full_layers == 16);

  // Fitted tokens_per_page (the LCM over the limit): the fitted group keeps the order.
  LayoutOptions small;
  small.max_large_page_bytes = hnd.large_page_bytes() / 2;
  const KVLayout fitted =
      KVLayout::plan({head_major(plain), LayerGroup::sliding_window("swa", 1, 2, 64, 2, 16, 128)}, small);
  CHECK(fitted.group(0).tokens_per_page < 16);
  CHECK(fitted.group(0).kv_order == KVOrder::kHeadMajor);
}

TEST_CASE("kv_order: out of range, or head-major where no reader understands it, raises kvmm::Error") {
  LayerGroup bad = LayerGroup::full_attention("full", 2, 8, 128, 2, 16);
  bad.kv_order = static_cast<KVOrder>(7);
  const std::string msg = error_of([&] { bad.validate(); });
  CHECK(msg.find("'full'") != std::string::npos);
  CHECK(msg.find("kv_order = 7") != std::string::npos);
  CHECK(error_of([&] { (void)KVLayout::plan({bad}); }) == msg);
  CHECK(static_cast<unsigned>(bad.kv_order) == 7);  // unchanged

  const ElementFormat fp8 = parse_kv_cache_dtype("fp8_e4m3_per_token_head");
  LayerGroup quantized = LayerGroup::full_attention("q", 2, 8, 128, 1, 16);
  quantized.k_format = fp8;
  quantized.v_format = fp8;
  const std::vector<LayerGroup> refused{
      quantized,
      LayerGroup::mla("mla", 2, 512, 64, ElementFormat::of(ElementType::kBf16), std::nullopt, 64),
      LayerGroup::indexer("idx", 2, 1, 128, fp8, 64, "mla"),
      LayerGroup::mamba_state("mamba", 2, 4096),
      LayerGroup::vision_embedding("img", 8192, 16),
  };
  for (const LayerGroup& g : refused) {
    INFO("group '" << g.name << "'");
    REQUIRE_NOTHROW(g.validate());  // token-major it is fine
    const LayerGroup h = head_major(g);
    const std::string e = error_of([&] { h.validate(); });
    CHECK(e.find("'" + g.name + "'") != std::string::npos);
    CHECK(e.find("kv_order = head_major") != std::string::npos);
    CHECK(h.kv_order == KVOrder::kHeadMajor);
  }
  // A plain group of any element size may be head-major.
  CHECK_NOTHROW(head_major(LayerGroup::full_attention("f32", 2, 4, 64, 4, 16)).validate());
  CHECK_NOTHROW(head_major(LayerGroup::cross_attention("x", 2, 4, 64, 2, 16)).validate());
}
