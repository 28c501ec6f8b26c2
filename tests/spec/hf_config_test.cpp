// kvmm::read_hf_config on the published config.json of every preset's model plus
// Qwen2.5-7B, Qwen3-8B and gemma-2-9b (tests/data, sources in its README): the layout
// equals the preset's, each decoder layer lands in the right group and page-layer slot,
// and the attention parameters are the model's. Then each family's layer rule against a
// plain reference over random configs, and bad input naming the field at fault.
#include <kvmm/error.hpp>
#include <kvmm/spec/hf_config.hpp>
#include <kvmm/spec/presets.hpp>

#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>
#include <sstream>
#include "support/error_of.hpp"

using namespace kvmm;

namespace {

std::string data_path(const std::string& file) { return std::string(KVMM_TEST_DATA_DIR) + "/" + file; }

std::string read_text(const std::string& file) {
  std::ifstream in(data_path(file));
  REQUIRE(in.good());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

ModelSpec read_data(const std::string& file, const HfConfigOptions& o = {}) {
  return read_hf_config_file(data_path(file), o);
}

void same_layout(const KVLayout& a, const KVLayout& b) {
  REQUIRE(a.num_groups() == b.num_groups());
  for (GroupId g = 0; g < a.num_groups(); ++g) {
    INFO("group " << g);
    const LayerGroup &x = a.group(g), &y = b.group(g);
    CHECK(x.name == y.name);
    CHECK(x.kind == y.kind);
    CHECK(x.num_layers == y.num_layers);
    CHECK(x.kv_heads == y.kv_heads);
    CHECK(x.head_dim == y.head_dim);
    CHECK(x.dtype_bytes == y.dtype_bytes);
    CHECK(x.tokens_per_page == y.tokens_per_page);
    CHECK(x.window == y.window);
    CHECK(x.state_bytes_per_layer == y.state_bytes_per_layer);
    CHECK(a.natural_page_bytes(g) == b.natural_page_bytes(g));
    CHECK(a.small_page_bytes(g) == b.small_page_bytes(g));
  }
  CHECK(a.large_page_bytes() == b.large_page_bytes());
}

void check_attention(const AttentionParams& a, std::uint32_t q, std::uint32_t kv, std::uint32_t hd,
                     std::uint32_t window, double softcap, double qpas) {
  CHECK(a.num_q_heads == q);
  CHECK(a.num_kv_heads == kv);
  CHECK(a.head_dim == hd);
  CHECK(a.sliding_window == window);
  CHECK(a.softcap == softcap);
  CHECK(a.query_pre_attn_scalar == qpas);
  CHECK(a.scale == Approx(1.0 / std::sqrt(qpas)));
}

// Every decoder layer in group 0 at its own index (single-group models).
void all_in_group0(const ModelSpec& m, std::uint32_t layers) {
  REQUIRE(m.layers.size() == layers);
  for (std::uint32_t i = 0; i < layers; ++i) {
    CHECK(m.layers[i].group == 0);
    CHECK(m.layers[i].index == i);
  }
}

using kvmm::test::error_of;

}  // namespace

TEST_CASE("hf config: Llama 3.1 / 3.2 configs give the presets' layouts", "[spec][hf_config]") {
  const ModelSpec l8 = read_data("llama-3.1-8b.config.json");
  CHECK(l8.model_type == "llama");
  same_layout(l8.layout, presets::llama3_1_8b());
  all_in_group0(l8, 32);
  REQUIRE(l8.attention.size() == 1);
  check_attention(l8.attention[0], 32, 8, 128, 0, 0.0, 128.0);

  const ModelSpec l70 = read_data("llama-3.1-70b.config.json");
  same_layout(l70.layout, presets::llama3_1_70b());
  all_in_group0(l70, 80);
  check_attention(l70.attention[0], 64, 8, 128, 0, 0.0, 128.0);

  const ModelSpec l1 = read_data("llama-3.2-1b.config.json");
  same_layout(l1.layout, presets::llama3_2_1b());
  all_in_group0(l1, 16);
  check_attention(l1.attention[0], 32, 8, 64, 0, 0.0, 64.0);
}

TEST_CASE("hf config: Llama-3.2-11B-Vision (mllama) splits self and cross layers", "[spec][hf_config]") {
  // An excerpt: its text_config names cross_attention_layers only, the sizes come from
  // MllamaTextConfig's defaults (tests/data/README.md).
  const ModelSpec m = read_data("llama-3.2-11b-vision.excerpt.json");
  CHECK(m.model_type == "mllama");
  same_layout(m.layout, presets::llama3_2_11b_vision());
  REQUIRE(m.layers.size() == 40);
  const std::vector<std::uint32_t> cross{3, 8, 13, 18, 23, 28, 33, 38};
  std::uint32_t self_index = 0;
  for (std::uint32_t i = 0; i < 40; ++i) {
    INFO("layer " << i);
    const auto it = std::find(cross.begin(), cross.end(), i);
    if (it != cross.end()) {
      CHECK(m.layers[i].group == 1);
      CHECK(m.layers[i].index == static_cast<std::uint32_t>(it - cross.begin()));
    } else {
      CHECK(m.layers[i].group == 0);
      CHECK(m.layers[i].index == self_index++);
    }
  }
  CHECK(m.layout.group(1).kind == LayerKind::kCrossAttention);
  check_attention(m.attention[0], 32, 8, 128, 0, 0.0, 128.0);
  check_attention(m.attention[1], 32, 8, 128, 0, 0.0, 128.0);
}

TEST_CASE("hf config: Gemma 2 alternates local and global with soft cap and scalar", "[spec][hf_config]") {
  const ModelSpec g27 = read_data("gemma-2-27b.config.json");
  same_layout(g27.layout, presets::gemma2_27b());
  REQUIRE(g27.layers.size() == 46);
  for (std::uint32_t i = 0; i < 46; ++i) {
    INFO("layer " << i);
    CHECK(g27.layers[i].group == (i % 2 == 0 ? 1u : 0u));  // even layers local (group 1)
    CHECK(g27.layers[i].index == i / 2);
  }
  check_attention(g27.attention[0], 32, 16, 128, 0, 50.0, 144.0);
  check_attention(g27.attention[1], 32, 16, 128, 4096, 50.0, 144.0);
  CHECK(g27.attention[0].scale == Approx(1.0 / 12.0));

  // gemma-2-9b (no preset): 42 layers, 8 KV heads of 256, query_pre_attn_scalar 256.
  const ModelSpec g9 = read_data("gemma-2-9b.config.json");
  REQUIRE(g9.layout.num_groups() == 2);
  CHECK(g9.layout.group(0).name == "global");
  CHECK(g9.layout.group(0).num_layers == 21);
  CHECK(g9.layout.group(1).kind == LayerKind::kSlidingWindow);
  CHECK(g9.layout.group(1).num_layers == 21);
  CHECK(g9.layout.group(1).window == 4096);
  // 16 tokens x 21 layers x (K + V) x 8 heads x 256 x 2 bytes.
  CHECK(g9.layout.natural_page_bytes(0) == 16ull * 21 * 2 * 8 * 256 * 2);
  check_attention(g9.attention[0], 16, 8, 256, 0, 50.0, 256.0);
  check_attention(g9.attention[1], 16, 8, 256, 4096, 50.0, 256.0);
}

TEST_CASE("hf config: gemma-3-27b-it reads its text_config, 5 local : 1 global", "[spec][hf_config]") {
  // Unsliced here (layer_map_test.cpp checks the default: the local layers cut at 10).
  HfConfigOptions whole;
  whole.layout.slice_layers = SliceLayers::kOff;
  const ModelSpec g = read_data("gemma-3-27b-it.config.json", whole);
  CHECK(g.model_type == "gemma3");
  same_layout(g.layout, presets::gemma3_27b({.layout = {.slice_layers = SliceLayers::kOff}}));
  REQUIRE(g.layers.size() == 62);
  std::uint32_t global = 0, local = 0;
  for (std::uint32_t i = 0; i < 62; ++i) {
    INFO("layer " << i);
    const bool is_global = (i + 1) % 6 == 0;
    CHECK(g.layers[i].group == (is_global ? 0u : 1u));
    CHECK(g.layers[i].index == (is_global ? global++ : local++));
  }
  check_attention(g.attention[0], 32, 16, 128, 0, 0.0, 168.0);  // attn_logit_softcapping: null
  check_attention(g.attention[1], 32, 16, 128, 1024, 0.0, 168.0);
}

TEST_CASE("hf config: Ministral-8B follows its config, not vLLM's interleaving", "[spec][hf_config]") {
  // The published config has sliding_window 32768 and no layer_types, so transformers (and
  // kvmm) slide every layer; the ministral_8b preset models vLLM's 1 full : 3 sliding.
  const std::string text = read_text("ministral-8b-instruct-2410.config.json");
  const ModelSpec m = read_hf_config(text, "ministral-8b");
  REQUIRE(m.layout.num_groups() == 1);
  CHECK(m.layout.group(0).kind == LayerKind::kSlidingWindow);
  CHECK(m.layout.group(0).num_layers == 36);
  CHECK(m.layout.group(0).window == 32768);
  all_in_group0(m, 36);
  check_attention(m.attention[0], 32, 8, 128, 32768, 0.0, 128.0);
  CHECK(presets::ministral_8b().num_groups() == 2);

  // The same config with vLLM's pattern stated in layer_types gives the preset.
  std::string types;
  for (int i = 0; i < 36; ++i)
    types += fmt::format("{}\"{}\"", i ? "," : "", i % 4 == 0 ? "full_attention" : "sliding_attention");
  const std::string with_types = "{\"layer_types\": [" + types + "]," + text.substr(text.find('{') + 1);
  const ModelSpec v = read_hf_config(with_types, "ministral-8b+layer_types");
  same_layout(v.layout, presets::ministral_8b());
  CHECK(v.layers[0].group == 0);
  CHECK(v.layers[1].group == 1);
  CHECK(v.layers[35].group == 1);
  CHECK(v.layers[35].index == 26);
}

TEST_CASE("hf config: Jamba-1.5-Mini maps attention and Mamba layers", "[spec][hf_config]") {
  const ModelSpec j = read_data("jamba-1.5-mini.config.json");
  same_layout(j.layout, presets::jamba1_5_mini());
  REQUIRE(j.layers.size() == 32);
  std::uint32_t attn = 0, mamba = 0;
  for (std::uint32_t i = 0; i < 32; ++i) {
    INFO("layer " << i);
    const bool is_attn = i % 8 == 4;
    CHECK(j.layers[i].group == (is_attn ? 0u : 1u));
    CHECK(j.layers[i].index == (is_attn ? attn++ : mamba++));
  }
  check_attention(j.attention[0], 32, 8, 128, 0, 0.0, 128.0);
  CHECK(j.attention[1].num_q_heads == 0);  // a state group has no attention
  CHECK(j.layout.group(1).state_bytes_per_layer == (8192ull * 3 + 8192ull * 16) * 2);
}

TEST_CASE("hf config: Qwen2.5-7B and Qwen3-8B are full attention", "[spec][hf_config]") {
  const ModelSpec q25 = read_data("qwen2.5-7b-instruct.config.json");
  CHECK(q25.model_type == "qwen2");
  REQUIRE(q25.layout.num_groups() == 1);
  CHECK(q25.layout.group(0).kind == LayerKind::kFullAttention);
  CHECK(q25.layout.group(0).num_layers == 28);
  all_in_group0(q25, 28);
  check_attention(q25.attention[0], 28, 4, 128, 0, 0.0, 128.0);  // head_dim = 3584 / 28
  CHECK(q25.layout.natural_page_bytes(0) == 16ull * 28 * 2 * 4 * 128 * 2);

  const ModelSpec q3 = read_data("qwen3-8b.config.json");
  CHECK(q3.model_type == "qwen3");
  REQUIRE(q3.layout.num_groups() == 1);
  CHECK(q3.layout.group(0).num_layers == 36);
  check_attention(q3.attention[0], 32, 8, 128, 0, 0.0, 128.0);
}

TEST_CASE("hf config: GLM-4.7-FP8's config (glm4_moe) gives the GLM-4.5 preset", "[spec][hf_config][lineup]") {
  // An abbreviated copy as ai-dynamo/aiconfigurator vendored it (tests/data/README.md): no
  // rope or partial_rotary_factor keys, which change no cache. GLM-4.7 is GLM-4.5's shape.
  const ModelSpec m = read_data("glm-4.7-fp8.excerpt.json");
  validate_layers(m);
  CHECK(m.model_type == "glm4_moe");
  same_layout(m.layout, presets::glm4_5());
  all_in_group0(m, 92);
  CHECK(m.layout.group(0).kind == LayerKind::kFullAttention);
  check_attention(m.attention[0], 96, 8, 128, 0, 0.0, 128.0);
  // transformers' models/glm4_moe/modeling_glm4_moe.py (Glm4MoeAttention): k_proj and v_proj
  // each give num_key_value_heads x head_dim per token, both cached on every decoder layer:
  // 92 layers x (K + V) x 8 heads x 128 x 2 bytes.
  CHECK(m.layout.group(0).bytes_per_token() == std::uint64_t{92} * 2 * 8 * 128 * 2);
  CHECK(m.layout.natural_page_bytes(0) == 16 * m.layout.group(0).bytes_per_token());
  CHECK(m.layout.padding_fraction() == 0.0);
}

TEST_CASE("hf config: options reach every group", "[spec][hf_config]") {
  HfConfigOptions o;
  o.tokens_per_page = 32;
  o.dtype_bytes = 1;
  o.state_dtype_bytes = 4;
  o.mamba_checkpoint_interval = 256;
  presets::PresetOptions p;
  p.tokens_per_page = 32;
  p.dtype_bytes = 1;
  p.state_dtype_bytes = 4;
  p.mamba_checkpoint_interval = 256;
  same_layout(read_data("jamba-1.5-mini.config.json", o).layout, presets::jamba1_5_mini(p));
  same_layout(read_data("gemma-2-27b.config.json", o).layout, presets::gemma2_27b(p));
}

TEST_CASE("hf config: sparse configs take the transformers class defaults", "[spec][hf_config]") {
  // gemma-3-4b-it's text_config names few keys; Gemma3TextConfig supplies 8 heads, 4 KV
  // heads, head_dim 256, query_pre_attn_scalar 256 and sliding_window_pattern 6. Its 5
  // global layers put 29 pages in a large page, so by default the 29 local layers are cut
  // at 5 (5 x 5 + 4: 7 groups, LayoutOptions::slice_layers); whole here.
  const std::string g34 = R"({"model_type": "gemma3", "text_config": {"hidden_size": 2560,
      "intermediate_size": 10240, "model_type": "gemma3_text", "num_hidden_layers": 34, "sliding_window": 1024}})";
  CHECK(read_hf_config(g34, "gemma-3-4b").layout.num_groups() == 7);
  HfConfigOptions whole;
  whole.layout.slice_layers = SliceLayers::kOff;
  const ModelSpec g = read_hf_config(g34, "gemma-3-4b", whole);
  REQUIRE(g.layout.num_groups() == 2);
  CHECK(g.layout.group(0).num_layers == 5);  // layers 5, 11, 17, 23, 29
  CHECK(g.layout.group(1).num_layers == 29);
  check_attention(g.attention[1], 8, 4, 256, 1024, 0.0, 256.0);
  // gemma3_text at the top level, with layer_types deciding.
  const ModelSpec t = read_hf_config(R"({"model_type": "gemma3_text", "num_hidden_layers": 3,
      "layer_types": ["full_attention", "sliding_attention", "full_attention"]})",
                                     "t");
  CHECK(t.layout.group(0).num_layers == 2);
  CHECK(t.layers[2].group == 0);
  CHECK(t.layers[2].index == 1);
  CHECK(t.layers[1].group == 1);
}

TEST_CASE("hf config: glm4_moe takes Glm4MoeConfig's defaults", "[spec][hf_config][lineup]") {
  // No num_key_value_heads: 8 as in Glm4MoeConfig, not llama's 96 (one per query head); no
  // num_hidden_layers: its 46. Stated keys win.
  const ModelSpec d = read_hf_config(R"({"model_type": "glm4_moe", "head_dim": 128})", "glm");
  all_in_group0(d, 46);
  check_attention(d.attention[0], 96, 8, 128, 0, 0.0, 128.0);
  CHECK(d.layout.group(0).bytes_per_token() == std::uint64_t{46} * 2 * 8 * 128 * 2);
  const ModelSpec s = read_hf_config(
      R"({"model_type": "glm4_moe", "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
          "hidden_size": 512})",
      "glm");
  all_in_group0(s, 4);
  check_attention(s.attention[0], 8, 2, 64, 0, 0.0, 64.0);  // head_dim = 512 / 8
  // The default hidden_size 4096 is no multiple of 96 heads: head_dim must be stated.
  CHECK_THAT(error_of([] { read_hf_config(R"({"model_type": "glm4_moe"})", "glm"); }),
             Catch::Contains("field 'hidden_size': 4096 is not a multiple of num_attention_heads = 96"));
}

TEST_CASE("hf config: Qwen sliding windows start at max_window_layers", "[spec][hf_config]") {
  const std::string base = R"("model_type": "qwen2", "num_hidden_layers": 4, "num_attention_heads": 4,
      "num_key_value_heads": 2, "hidden_size": 256, "sliding_window": 64, "max_window_layers": 2)";
  const ModelSpec off = read_hf_config("{" + base + ", \"use_sliding_window\": false}", "q");
  REQUIRE(off.layout.num_groups() == 1);
  CHECK(off.layout.group(0).kind == LayerKind::kFullAttention);
  const ModelSpec on = read_hf_config("{" + base + ", \"use_sliding_window\": true}", "q");
  REQUIRE(on.layout.num_groups() == 2);
  CHECK(on.layers[1].group == 0);
  CHECK(on.layers[2].group == 1);
  CHECK(on.layers[3].index == 1);
  CHECK(on.attention[1].sliding_window == 64);
  CHECK(on.attention[0].sliding_window == 0);
}
