// The Hugging Face config.json reader: each supported family gives the same layout as
// the hand-written preset, and malformed configs name the file, line and field.
#include "sim/model_config.hpp"

#include "kvmm/error.hpp"

#include <catch2/catch.hpp>

#include <fmt/format.h>

#include <string>

using kvmm::sim::layout_from_hf_config;

namespace {

void same_layout(const kvmm::KVLayout& a, const kvmm::KVLayout& b) {
  REQUIRE(a.num_groups() == b.num_groups());
  for (kvmm::GroupId g = 0; g < a.num_groups(); ++g) {
    INFO("group " << g);
    CHECK(a.group(g).name == b.group(g).name);
    CHECK(a.group(g).kind == b.group(g).kind);
    CHECK(a.group(g).num_layers == b.group(g).num_layers);
    CHECK(a.group(g).window == b.group(g).window);
    CHECK(a.natural_page_bytes(g) == b.natural_page_bytes(g));
  }
  CHECK(a.large_page_bytes() == b.large_page_bytes());
}

std::string ministral_layer_types() {
  std::string s;
  for (int i = 0; i < 36; ++i)
    s += fmt::format("{}\"{}\"", i ? "," : "", i % 4 == 0 ? "full_attention" : "sliding_attention");
  return s;
}

}  // namespace

TEST_CASE("HF config reader matches the presets for every family", "[sim][config]") {
  namespace p = kvmm::presets;
  same_layout(layout_from_hf_config(R"({"model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32,
      "num_key_value_heads": 8, "hidden_size": 4096})",
                                    "llama.json"),
              p::llama3_1_8b());
  same_layout(layout_from_hf_config(R"({"model_type": "mllama", "text_config": {"num_hidden_layers": 40,
      "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096,
      "cross_attention_layers": [3, 8, 13, 18, 23, 28, 33, 38]}})",
                                    "mllama.json"),
              p::llama3_2_11b_vision());
  same_layout(layout_from_hf_config(R"({"model_type": "gemma2", "num_hidden_layers": 46, "num_attention_heads": 32,
      "num_key_value_heads": 16, "head_dim": 128, "hidden_size": 4608, "sliding_window": 4096})",
                                    "g2.json"),
              p::gemma2_27b());
  same_layout(layout_from_hf_config(R"({"model_type": "gemma3", "text_config": {"num_hidden_layers": 62,
      "num_attention_heads": 32, "num_key_value_heads": 16, "head_dim": 128, "hidden_size": 5376,
      "sliding_window": 1024, "sliding_window_pattern": 6}})",
                                    "g3.json"),
              p::gemma3_27b({.layout = {.slice_layers = kvmm::SliceLayers::kOff}}));  // kvmm-sim plans unsliced
  same_layout(layout_from_hf_config(R"({"model_type": "mistral", "num_hidden_layers": 36, "num_attention_heads": 32,
      "num_key_value_heads": 8, "head_dim": 128, "hidden_size": 4096, "sliding_window": 32768,
      "layer_types": [)" + ministral_layer_types() +
                                        "]}",
                                    "ministral.json"),
              p::ministral_8b());
  same_layout(layout_from_hf_config(R"({"model_type": "jamba", "num_hidden_layers": 32, "attn_layer_period": 8,
      "attn_layer_offset": 4, "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
      "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2})",
                                    "jamba.json"),
              p::jamba1_5_mini());
}

TEST_CASE("HF config reader: Mistral without layer_types slides every layer", "[sim][config]") {
  const auto l = layout_from_hf_config(R"({"model_type": "mistral", "num_hidden_layers": 32,
      "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096, "sliding_window": 4096})",
                                       "m.json");
  REQUIRE(l.num_groups() == 1);
  CHECK(l.group(0).kind == kvmm::LayerKind::kSlidingWindow);
  CHECK(l.group(0).window == 4096);
  const auto full = layout_from_hf_config(R"({"model_type": "mistral", "num_hidden_layers": 32,
      "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096, "sliding_window": null})",
                                          "m.json");
  CHECK(full.group(0).kind == kvmm::LayerKind::kFullAttention);
}

TEST_CASE("HF config reader: errors name the file, line and field", "[sim][config][errors]") {
  CHECK_THROWS_WITH(
      layout_from_hf_config("{\n  \"model_type\": \"llama\",\n  \"num_hidden_layers\": 32,,\n}", "bad.json"),
      Catch::StartsWith("bad.json:3:"));
  CHECK_THROWS_WITH(layout_from_hf_config(R"({"model_type": "gpt2"})", "c.json"),
                    Catch::Contains("c.json: field 'model_type': 'gpt2' is not supported"));
  CHECK_THROWS_WITH(layout_from_hf_config(R"({"num_hidden_layers": 2})", "c.json"),
                    Catch::Contains("field 'model_type': missing"));
  CHECK_THROWS_WITH(layout_from_hf_config(R"({"model_type": "llama", "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": "8", "hidden_size": 64})",
                                          "c.json"),
                    Catch::Contains("field 'num_key_value_heads': expected a positive integer, got \"8\""));
  // (A text_config without cross_attention_layers gets transformers' default list, as in
  // MllamaTextConfig; a value that is not a list is an error.)
  CHECK_THROWS_WITH(layout_from_hf_config(R"({"model_type": "mllama", "text_config": {"num_hidden_layers": 4,
      "num_attention_heads": 4, "hidden_size": 64, "cross_attention_layers": "3"}})",
                                          "v.json"),
                    Catch::Contains("field 'text_config.cross_attention_layers': missing or not an array"));
  CHECK_THROWS_WITH(layout_from_hf_config(R"({"model_type": "mllama", "text_config": {"num_hidden_layers": 4,
      "num_attention_heads": 4, "hidden_size": 64, "cross_attention_layers": [1, 9]}})",
                                          "v.json"),
                    Catch::Contains("field 'text_config.cross_attention_layers[1]'"));
  CHECK_THROWS_WITH(layout_from_hf_config(R"({"model_type": "gemma2", "num_hidden_layers": 2, "num_attention_heads": 4,
      "hidden_size": 64, "sliding_window": 8, "layer_types": ["full_attention", "local"]})",
                                          "g.json"),
                    Catch::Contains("field 'layer_types[1]'"));
  CHECK_THROWS_WITH(layout_from_hf_config(R"({"model_type": "jamba", "num_hidden_layers": 8, "attn_layer_period": 4,
      "attn_layer_offset": 4})",
                                          "j.json"),
                    Catch::Contains("field 'attn_layer_offset': 4 must be below"));
  CHECK_THROWS_WITH(layout_from_hf_config("[1, 2]", "a.json"), Catch::Contains("a.json: expected a JSON object"));
  CHECK_THROWS_WITH(kvmm::sim::load_model("/nonexistent/config.json"), Catch::Contains("cannot open"));
  CHECK_THROWS_WITH(kvmm::sim::load_model("llama-9b"), Catch::Contains("preset = 'llama-9b'"));
}

TEST_CASE("per-group tokens per page: only the named group changes", "[sim][config]") {
  // Llama-3.2-11B-Vision: self 32 layers x 4 KiB per token, cross 8 layers x 4 KiB.
  // self=8: self pages 8 x 32 x 4 KiB = 1 MiB, cross stays 16 x 8 x 4 KiB = 512 KiB, so
  // the LCM large page is 1 MiB holding one self page or two cross pages.
  kvmm::sim::ModelOptions o;
  o.group_tokens_per_page = {{"self", 8}};
  const kvmm::KVLayout l = kvmm::sim::load_model("llama-3.2-11b-vision", o);
  const kvmm::KVLayout base = kvmm::sim::load_model("llama-3.2-11b-vision");
  REQUIRE(l.num_groups() == 2);
  CHECK(l.group(0).name == "self");
  CHECK(l.group(0).tokens_per_page == 8);
  CHECK(l.group(1).tokens_per_page == 16);
  CHECK(l.small_page_bytes(0) == std::uint64_t{1} << 20);
  CHECK(l.small_page_bytes(1) == base.small_page_bytes(1));
  CHECK(l.small_page_bytes(1) == std::uint64_t{512} << 10);
  CHECK(l.large_page_bytes() == std::uint64_t{1} << 20);
  CHECK(l.small_pages_per_large_page(1) == 2);
  // Errors name the group and leave nothing half-built.
  CHECK_THROWS_WITH(kvmm::sim::with_group_tokens_per_page(base, {{"vision", 8}}), Catch::Contains("group = 'vision'"));
  CHECK_THROWS_WITH(kvmm::sim::with_group_tokens_per_page(base, {{"cross", 0}}),
                    Catch::Contains("group = 'cross': tokens per page = 0"));
  CHECK(base.group(1).tokens_per_page == 16);
}

TEST_CASE("the planner's limit and the KV format reach presets, configs and overrides", "[sim][config][lineup]") {
  // Qwen3-Next's natural LCM (79,036,416 B) passes the default 64 MiB: kvmm fits 8-token
  // attention pages (one state page per large page), or pads the 16-token ones with
  // fitting off (the other engines' policies); under a 76 MiB limit it plans 16-token
  // pages unpadded, also after a per-group override.
  kvmm::sim::ModelOptions o;
  const kvmm::KVLayout fitted = kvmm::sim::load_model("qwen3-next-80b-a3b", o);
  CHECK_FALSE(fitted.padded());
  CHECK(fitted.group(0).tokens_per_page == 8);
  CHECK(fitted.large_page_bytes() == 39518208);
  o.fit_tokens_per_page = false;
  CHECK(kvmm::sim::load_model("qwen3-next-80b-a3b", o).padded());
  CHECK(kvmm::sim::load_model(KVMM_TEST_DATA_DIR "/qwen3-next-80b-a3b.defaults.json", o).padded());
  o.fit_tokens_per_page = true;
  // Per-group sizes are kept as asked (padded, not fitted), starting from the requested
  // sizes: the attention group is back at 16 tokens.
  o.group_tokens_per_page = {{"linear", 512}};
  const kvmm::KVLayout asked = kvmm::sim::load_model("qwen3-next-80b-a3b", o);
  CHECK(asked.group(0).tokens_per_page == 16);
  CHECK(asked.padded());
  o.group_tokens_per_page.clear();
  o.max_large_page_bytes = std::uint64_t{76} << 20;
  const kvmm::KVLayout q = kvmm::sim::load_model("qwen3-next-80b-a3b", o);
  CHECK_FALSE(q.padded());
  CHECK(q.large_page_bytes() == 79036416);
  o.group_tokens_per_page = {{"full", 16}};
  CHECK_FALSE(kvmm::sim::load_model("qwen3-next-80b-a3b", o).padded());
  // kv_cache_dtype: DeepSeek-V3's latent in fp8_ds_mla is 656 B per token and layer, from
  // the preset and from the published config alike.
  kvmm::sim::ModelOptions f;
  f.kv_cache_dtype = "fp8_ds_mla";
  CHECK(kvmm::sim::load_model("deepseek-v3", f).group(0).bytes_per_token() == std::uint64_t{61} * 656);
  CHECK(kvmm::sim::load_model(KVMM_TEST_DATA_DIR "/deepseek-v3.config.json", f).group(0).bytes_per_token() ==
        std::uint64_t{61} * 656);
  f.kv_cache_dtype = "fp9";
  CHECK_THROWS_WITH(kvmm::sim::load_model("deepseek-v3", f), Catch::Contains("kv_cache_dtype = 'fp9'"));
}
