// Issue 32 item 1: element formats with scales (K and V apart), recurrent states described
// by their tensors, MLA latent groups, indexer groups tied to their attention group. Sizes
// are checked against the formulas written out by hand (vLLM's per-token figures where it
// has one: 656 B for DeepSeek-V3.2's fp8 latent, 132 B for its indexer key), parts against
// overlap and alignment over random groups, and bad input against its message.
#include <kvmm/error.hpp>
#include <kvmm/spec/kv_layout.hpp>
#include <kvmm/spec/presets.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>
#include "support/error_of.hpp"

using namespace kvmm;
using kvmm::test::error_of;

namespace {

ElementFormat fmt_of(std::string_view name) { return parse_kv_cache_dtype(name); }

LayerGroup kv_group(std::string name, std::uint32_t layers, std::uint32_t heads, std::uint32_t hd, ElementFormat k,
                    ElementFormat v, std::uint32_t tpp = 16) {
  LayerGroup g = LayerGroup::full_attention(std::move(name), layers, heads, hd, 2, tpp);
  g.k_format = k;
  g.v_format = v;
  return g;
}

// Every part of every layer inside the page, none overlapping, 16-byte aligned where the
// group has scales; parts plus alignment bytes make the natural page.
void check_parts(const KVLayout& l, GroupId g) {
  const LayerGroup& grp = l.group(g);
  std::vector<std::pair<std::uint64_t, std::uint64_t>> spans;
  std::uint64_t sum = 0;
  bool scaled = false;
  for (std::uint32_t layer = 0; layer < grp.num_layers; ++layer)
    for (std::size_t p = 0; p < kNumKvParts; ++p) {
      const auto s = l.part(g, layer, static_cast<KvPart>(p));
      if (s.bytes == 0) continue;
      if (p == 1 || p == 3 || p == 5) scaled = true;
      spans.emplace_back(s.offset, s.offset + s.bytes);
      sum += s.bytes;
    }
  std::sort(spans.begin(), spans.end());
  for (std::size_t i = 0; i < spans.size(); ++i) {
    CHECK(spans[i].second <= l.natural_page_bytes(g));
    if (i > 0) CHECK(spans[i - 1].second <= spans[i].first);
    if (scaled) CHECK(spans[i].first % kScaleRegionAlignment == 0);
  }
  CHECK(sum + l.alignment_bytes(g) == l.natural_page_bytes(g));
  if (!scaled) CHECK(l.alignment_bytes(g) == 0);
}

}  // namespace

TEST_CASE("element formats: kv_cache_dtype names, bits and scale bytes", "[spec][formats]") {
  CHECK(fmt_of("bf16").bits() == 16);
  CHECK(fmt_of("fp8").type == ElementType::kFp8E4M3);
  CHECK(fmt_of("fp8").scale.granularity == ScaleGranularity::kPerTensor);
  CHECK(fmt_of("fp8_e5m2").type == ElementType::kFp8E5M2);
  CHECK(fmt_of("int4").bits() == 4);
  const ElementFormat nv = fmt_of("nvfp4");
  CHECK(nv.type == ElementType::kFp4E2M1);
  CHECK(nv.scale.block == 16);
  CHECK(nv.scale.type == ElementType::kFp8E4M3);
  // 16 tokens x 8 heads of 128 elements: 8192 data bytes, one e4m3 scale per 16 elements.
  CHECK(nv.data_bytes(128, 128, "x") == 8192);
  CHECK(nv.scale_bytes(128, 128, "x") == 1024);
  const ElementFormat mx = fmt_of("mxfp8");
  CHECK(mx.data_bytes(128, 128, "x") == 16384);
  CHECK(mx.scale_bytes(128, 128, "x") == 512);
  // Per-tensor scales are not in pages; per token-head ones are (fp32 each).
  CHECK(fmt_of("fp8").scale_bytes(128, 128, "x") == 0);
  CHECK(fmt_of("fp8_e4m3_per_token_head").scale_bytes(128, 128, "x") == 512);
  CHECK(fmt_of("nvfp4:separate").scale.placement == ScalePlacement::kSeparate);
  CHECK(fmt_of("nvfp4").describe() == "fp4_e2m1+fp8_e4m3/16");
  CHECK_THAT(error_of([] { parse_kv_cache_dtype("fp6"); }),
             Catch::Contains("kv_cache_dtype = 'fp6': unknown; known: bf16") && Catch::Contains("nvfp4"));
  CHECK_THAT(error_of([] { parse_kv_cache_dtype("nvfp4:beside"); }),
             Catch::Contains("'nvfp4:beside': the placement after ':' must be 'inline' or 'separate'"));
}

TEST_CASE("element formats: fp8 K with per-token-head scales, nvfp4 V, inline and separate", "[spec][formats]") {
  const std::uint32_t layers = 4, heads = 8, hd = 128, tpp = 16;
  // K: 16 x 8 x 128 fp8 = 16384 B + 16 x 8 fp32 scales = 512 B; V: 8192 B + 1024 B of e4m3 scales.
  const KVLayout inl =
      KVLayout::plan({kv_group("g", layers, heads, hd, fmt_of("fp8_e4m3_per_token_head"), fmt_of("nvfp4"), tpp)});
  const std::uint64_t layer = 16384 + 512 + 8192 + 1024;
  CHECK(inl.group(0).layer_stride_bytes() == layer);
  CHECK(inl.natural_page_bytes(0) == layers * layer);
  CHECK(inl.k_offset(0, 1) == layer);
  CHECK(inl.part(0, 1, KvPart::kKScale).offset == layer + 16384);
  CHECK(inl.v_offset(0, 1) == layer + 16384 + 512);
  CHECK(inl.part(0, 1, KvPart::kVScale).bytes == 1024);
  CHECK(inl.group(0).bytes_per_token() == layers * layer / tpp);
  CHECK_FALSE(inl.padded());
  check_parts(inl, 0);

  // The same formats with scales in the page's scale region: data first, as unscaled pages.
  const KVLayout sep = KVLayout::plan(
      {kv_group("g", layers, heads, hd, fmt_of("fp8_e4m3_per_token_head:separate"), fmt_of("nvfp4:separate"), tpp)});
  CHECK(sep.natural_page_bytes(0) == inl.natural_page_bytes(0));
  CHECK(sep.layer_stride_bytes(0) == 16384 + 8192);
  CHECK(sep.v_offset(0, 2) == 2 * (16384 + 8192) + 16384);
  CHECK(sep.part(0, 0, KvPart::kKScale).offset == layers * (16384 + 8192));
  CHECK(sep.part(0, 3, KvPart::kVScale).offset == layers * (16384 + 8192) + 3 * (512 + 1024) + 512);
  check_parts(sep, 0);

  // Odd scale sizes are aligned, and the alignment is counted, never LCM padding: one
  // token of 3 heads of 16 int4 elements holds 24 B of K, 12 B of fp32 scales.
  const KVLayout odd = KVLayout::plan({kv_group("g", 2, 3, 16, fmt_of("int4"), fmt_of("int4"), 1)});
  CHECK(odd.group(0).layer_stride_bytes() == 32 + 16 + 32 + 16);
  CHECK(odd.alignment_bytes(0) == 2 * (8 + 4 + 8 + 4));
  check_parts(odd, 0);
}

TEST_CASE("element formats: unformatted groups keep the page-layer layout exactly", "[spec][formats]") {
  const KVLayout plain = presets::gemma2_27b();
  LayerGroup g = LayerGroup::full_attention("global", 23, 16, 128, 2, 16);
  g.k_format = ElementFormat::raw_bytes(2);  // an explicit 2-byte unscaled format: same bytes
  g.v_format = ElementFormat::of(ElementType::kBf16);
  const KVLayout l = KVLayout::plan({g});
  CHECK_FALSE(l.group(0).is_plain());
  CHECK(l.natural_page_bytes(0) == plain.natural_page_bytes(0));
  for (std::uint32_t layer : {0u, 7u, 22u}) {
    CHECK(l.k_offset(0, layer) == plain.k_offset(0, layer));
    CHECK(l.v_offset(0, layer) == plain.v_offset(0, layer));
  }
  CHECK(l.group(0).bytes_per_token() == plain.group(0).bytes_per_token());
  CHECK(l.layer_stride_bytes(0) == plain.layer_stride_bytes(0));
}

TEST_CASE("MLA: one latent per token, K and V views of it", "[spec][mla]") {
  // DeepSeek-V3: kv_lora_rank 512 + qk_rope_head_dim 64 = 576 bf16 elements per token and
  // layer (vLLM's MLAAttentionSpec: head_size 576, one KV head, no factor 2).
  const KVLayout bf =
      KVLayout::plan({LayerGroup::mla("mla", 61, 512, 64, ElementFormat::of(ElementType::kBf16), std::nullopt, 64)});
  CHECK(bf.natural_page_bytes(0) == std::uint64_t{61} * 64 * 576 * 2);
  CHECK(bf.group(0).bytes_per_token() == std::uint64_t{61} * 576 * 2);
  CHECK(bf.k_offset(0, 5) == std::uint64_t{5} * 64 * 576 * 2);
  CHECK(bf.v_offset(0, 5) == bf.k_offset(0, 5));
  CHECK(bf.part(0, 5, KvPart::kRope).offset == bf.k_offset(0, 5) + 64 * 512 * 2);
  CHECK(bf.part(0, 5, KvPart::kV).bytes == 0);
  check_parts(bf, 0);

  // DeepSeek-V3.2 in vLLM (fp8_ds_mla): 512 fp8 + 4 fp32 scales (one per 128) + 64 bf16 rope
  // = 656 bytes per token and layer.
  ElementFormat nope = ElementFormat::of(ElementType::kFp8E4M3);
  nope.scale = ScaleLayout{ScaleGranularity::kPerBlock, 128, ElementType::kFp32, ScalePlacement::kInline};
  const KVLayout ds =
      KVLayout::plan({LayerGroup::mla("mla", 61, 512, 64, nope, ElementFormat::of(ElementType::kBf16), 64)});
  CHECK(ds.group(0).bytes_per_token() == std::uint64_t{61} * 656);
  CHECK(ds.natural_page_bytes(0) == std::uint64_t{61} * 64 * 656);
  check_parts(ds, 0);
}

TEST_CASE("indexer: a key-only group tied to its attention group", "[spec][indexer]") {
  // DeepSeek-V3.2's indexer key: 128 fp8 elements + one fp32 scale = 132 B per token and layer.
  const LayerGroup mla = LayerGroup::mla("mla", 61, 512, 64, ElementFormat::of(ElementType::kBf16), std::nullopt, 64);
  const LayerGroup idx = LayerGroup::indexer("indexer", 61, 1, 128, fmt_of("fp8_per_token_head"), 64, "mla");
  const KVLayout l = KVLayout::plan({mla, idx});
  CHECK(l.group(1).bytes_per_token() == std::uint64_t{61} * 132);
  CHECK(l.natural_page_bytes(1) == std::uint64_t{61} * 64 * 132);
  CHECK(l.large_page_bytes() == std::lcm(l.natural_page_bytes(0), l.natural_page_bytes(1)));
  CHECK_FALSE(l.padded());
  CHECK(l.v_offset(1, 3) == l.k_offset(1, 3));  // no values: the V view is the keys
  CHECK(l.part(1, 3, KvPart::kV).bytes == 0);
  check_parts(l, 1);

  CHECK_THAT(error_of([&] {
               KVLayout::plan({mla, LayerGroup::indexer("indexer", 61, 1, 128, fmt_of("fp8"), 64, "attention")});
             }),
             Catch::Contains("LayerGroup 'indexer': tied_to = 'attention': no group of that name"));
  CHECK_THAT(error_of([&] {
               KVLayout::plan({mla, LayerGroup::indexer("indexer", 60, 1, 128, fmt_of("fp8"), 64, "mla")});
             }),
             Catch::Contains("tied_to = 'mla': the indexer (full_attention, window 0, chunk 0, 60 layers) must "
                             "match its attention group"));
  CHECK_THAT(error_of([&] {
               KVLayout::plan({LayerGroup::mamba_state("m", 2, 64),
                               LayerGroup::indexer("indexer", 2, 1, 128, fmt_of("fp8"), 64, "m")});
             }),
             Catch::Contains("tied_to = 'm': a mamba_state key_value group, not a decoder attention group"));
  LayerGroup untied = idx;
  untied.tied_to.clear();
  CHECK_THAT(error_of([&] {
               KVLayout::plan({mla, untied});
             }),
             Catch::Contains("LayerGroup 'indexer': tied_to is empty"));
}

TEST_CASE("recurrent state: a state described by its tensors", "[spec][state]") {
  // Jamba-1.5-Mini's Mamba layer: conv [8192, 3] + SSM [8192, 16] bf16 = the preset's bytes.
  const std::vector<StateTensor> t{{"conv", {8192, 3}, ElementFormat::of(ElementType::kBf16)},
                                   {"ssm", {8192, 16}, ElementFormat::of(ElementType::kBf16)}};
  const LayerGroup g = LayerGroup::recurrent_state("mamba", 28, t, 512);
  CHECK(g.kind == LayerKind::kRecurrentState);
  CHECK(g.kind == LayerKind::kMambaState);
  const KVLayout jamba = presets::jamba1_5_mini();
  CHECK(g.state_bytes_per_layer == jamba.group(1).state_bytes_per_layer);
  const KVLayout l = KVLayout::plan({jamba.group(0), g});
  CHECK(l.natural_page_bytes(1) == jamba.natural_page_bytes(1));
  CHECK(l.large_page_bytes() == jamba.large_page_bytes());
  CHECK(l.state_tensor_offset(1, 2, 1) == 2 * g.state_bytes_per_layer + 8192 * 3 * 2);
  CHECK_THAT(l.describe(), Catch::Contains("conv [8192, 3] bf16, ssm [8192, 16] bf16"));
  CHECK_THAT(error_of([&] { (void)l.state_tensor_offset(1, 0, 2); }),
             Catch::Contains("tensor = 2: group 'mamba' has 2"));

  // A gated-DeltaNet state (Qwen3-Next): fp32 recurrent state beside a bf16 conv state.
  const LayerGroup gdn =
      LayerGroup::recurrent_state("linear", 36,
                                  {{"conv", {8192, 3}, ElementFormat::of(ElementType::kBf16)},
                                   {"recurrent", {32, 128, 128}, ElementFormat::of(ElementType::kFp32)}});
  CHECK(gdn.state_bytes_per_layer == 8192 * 3 * 2 + 32 * 128 * 128 * 4);

  LayerGroup wrong = g;
  wrong.state_bytes_per_layer += 1;
  CHECK_THAT(error_of([&] { wrong.validate(); }),
             Catch::Contains("state_bytes_per_layer = 311297, but its state_tensors hold 311296 bytes"));
  LayerGroup zero = g;
  zero.state_tensors[1].shape[1] = 0;
  CHECK_THAT(error_of([&] { zero.validate(); }), Catch::Contains("state_tensors[1] ('ssm'): shape[1] = 0"));
}

TEST_CASE("layer kinds: bad storage fields name the field", "[spec][formats][errors]") {
  LayerGroup mla = LayerGroup::mla("mla", 2, 512, 64, ElementFormat::of(ElementType::kBf16), std::nullopt, 16);
  LayerGroup x = mla;
  x.kv_heads = 2;
  CHECK_THAT(error_of([&] { x.validate(); }), Catch::Contains("kv_heads = 2: a latent (MLA) group stores one latent"));
  x = mla;
  x.v_format = ElementFormat::of(ElementType::kBf16);
  CHECK_THAT(error_of([&] { x.validate(); }), Catch::Contains("v_format set on a latent group"));
  LayerGroup kv = kv_group("g", 2, 8, 128, fmt_of("nvfp4"), fmt_of("nvfp4"));
  x = kv;
  x.k_format->scale.block = 48;
  CHECK_THAT(error_of([&] { x.validate(); }),
             Catch::Contains("LayerGroup 'g': k_format.scale.block = 48: does not divide the row of 128 elements"));
  x = kv;
  x.v_format->type = ElementType::kE8M0;
  CHECK_THAT(error_of([&] { x.validate(); }), Catch::Contains("v_format.type = e8m0: a scale type"));
  x = kv;
  x.head_dim = 3;
  x.k_format = fmt_of("int4");
  CHECK_THAT(error_of([&] { x.validate(); }),
             Catch::Contains("k_format: a row of 3 elements of 4 bits is not a whole number of bytes"));
  x = kv;
  x.rope_dim = 64;
  CHECK_THAT(error_of([&] { x.validate(); }), Catch::Contains("rope_dim = 64: only a latent (MLA) group"));
  x = kv;
  x.tied_to = "other";
  CHECK_THAT(error_of([&] { x.validate(); }), Catch::Contains("tied_to = 'other': only an indexer"));
  x = kv;
  x.storage = static_cast<KvStorage>(9);
  CHECK_THAT(error_of([&] { x.validate(); }), Catch::Contains("storage = 9: not a KvStorage"));
}

TEST_CASE("layer kinds: random formatted groups plan without padding, parts disjoint and aligned",
          "[spec][formats][random]") {
  std::mt19937 rng(32);
  const std::vector<std::string> names{"bf16", "fp16",  "fp8",   "fp8_e5m2", "fp8_per_token_head", "int8",
                                       "int4", "nvfp4", "mxfp8", "mxfp4",    "nvfp4:separate",     "int8:separate"};
  auto pick = [&] { return fmt_of(names[rng() % names.size()]); };
  for (int iter = 0; iter < 300; ++iter) {
    INFO("iteration " << iter);
    const std::uint32_t tpp = 1u << (rng() % 7);
    const std::uint32_t hd = 32u * (1 + rng() % 8);
    std::vector<LayerGroup> groups;
    groups.push_back(kv_group("kv", 1 + rng() % 6, 1 + rng() % 8, hd, pick(), pick(), tpp));
    groups.push_back(LayerGroup::mla("mla", 1 + rng() % 4, hd * 4, hd / 2, pick(),
                                     rng() % 2 ? std::optional(ElementFormat::of(ElementType::kBf16)) : std::nullopt,
                                     tpp));
    groups.push_back(LayerGroup::indexer("idx", groups[1].num_layers, 1, hd, pick(), tpp, "mla"));
    groups.push_back(LayerGroup::recurrent_state("state", 1 + rng() % 4,
                                                 {{"conv", {hd * 2, 3}, ElementFormat::of(ElementType::kBf16)},
                                                  {"rec", {4, hd, hd}, ElementFormat::of(ElementType::kFp32)}}));
    LayoutOptions o;
    o.max_large_page_bytes = LayoutOptions::kMaxLargePageBytes;
    const KVLayout l = KVLayout::plan(groups, o);
    // No padding wherever the LCM fits (random sizes can make it pass 2^40).
    CHECK(l.padded() == (l.natural_lcm_bytes() > o.max_large_page_bytes));
    for (GroupId g = 0; g < 3; ++g) check_parts(l, g);
    for (GroupId g = 0; g < l.num_groups(); ++g) CHECK(l.large_page_bytes() % l.small_page_bytes(g) == 0);
  }
}
