// Issue 32 item 2 on hand-written configs: the families without a vendored published
// config (Falcon-H1, MiniMax-Text-01, GLM-4.5: tests/data/README.md says why), the KV
// quantization options (fp8 / nvfp4, K and V apart, per-layer overrides), the layer map's
// own checks, each reader's rule against a plain reference over random configs, and bad
// input naming the field.
#include <kvmm/error.hpp>
#include <kvmm/spec/hf_config.hpp>
#include <kvmm/spec/presets.hpp>

#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <random>
#include <string>
#include "support/error_of.hpp"

using namespace kvmm;
using kvmm::test::error_of;

namespace {

ModelSpec read(const std::string& json, const HfConfigOptions& o = {}) {
  ModelSpec m = read_hf_config(json, "edge.json", o);
  validate_layers(m);
  return m;
}

const std::string kLlama = R"({"model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "hidden_size": 4096})";

// Falcon-H1-7B's sizes (44 layers, 12 query / 2 KV heads of 128, Mamba2 d_ssm 3072 in 24
// heads of 128, one group, d_state 256, d_conv 4), written as its config spells them.
const std::string kFalconH1 = R"({"model_type": "falcon_h1", "num_hidden_layers": 44, "num_attention_heads": 12,
    "num_key_value_heads": 2, "head_dim": 128, "hidden_size": 3072, "mamba_d_ssm": 3072, "mamba_n_heads": 24,
    "mamba_d_head": 128, "mamba_n_groups": 1, "mamba_d_state": 256, "mamba_d_conv": 4, "mamba_expand": 2})";

std::string minimax(const std::string& types) {
  return R"({"model_type": "minimax", "num_hidden_layers": 8, "num_attention_heads": 64, "num_key_value_heads": 8,
    "head_dim": 128, "hidden_size": 6144, )" +
         types + "}";
}

}  // namespace

TEST_CASE("hf lineup edge: Falcon-H1 holds K/V pages and a Mamba2 state in every layer", "[spec][hf_config][lineup]") {
  HfConfigOptions o;
  o.layout.max_large_page_bytes = std::uint64_t{1} << 30;
  const ModelSpec m = read(kFalconH1, o);
  REQUIRE(m.layout.num_groups() == 2);
  CHECK(m.layout.group(0).num_layers == 44);
  CHECK(m.layout.group(1).num_layers == 44);
  // conv [3072 + 2 x 1 x 256, 3] + SSM [24, 128, 256], bf16.
  CHECK(m.layout.group(1).state_bytes_per_layer == (3584 * 3 + 24 * 128 * 256) * 2);
  CHECK(m.layout.group(0).bytes_per_token() == std::uint64_t{44} * 2 * 2 * 128 * 2);
  for (std::uint32_t i = 0; i < 44; ++i) {
    CHECK(m.layers[i].group == 0);
    CHECK(m.layers[i].index == i);
    CHECK(m.layers[i].aux_group == 1);
    CHECK(m.layers[i].aux_index == i);
  }
  // "auto" head size: d_ssm / n_heads; a head size that does not multiply out is refused.
  std::string a = kFalconH1;
  a.replace(a.find("\"mamba_d_head\": 128"), 19, "\"mamba_d_head\": \"auto\"");
  CHECK(read(a, o).layout.group(1).state_bytes_per_layer == m.layout.group(1).state_bytes_per_layer);
  std::string b = kFalconH1;
  b.replace(b.find("\"mamba_d_head\": 128"), 19, "\"mamba_d_head\": 100");
  CHECK_THAT(error_of([&] { read(b, o); }),
             Catch::Contains("field 'mamba_d_head': 100 x mamba_n_heads 24 is not mamba_d_ssm = 3072"));
}

TEST_CASE("hf lineup edge: MiniMax-Text-01's lightning layers hold one head_dim^2 state per head",
          "[spec][hf_config][lineup]") {
  HfConfigOptions o;
  o.ssm_state_dtype_bytes = 4;  // vLLM keeps the lightning state in fp32
  o.layout.max_large_page_bytes = std::uint64_t{1} << 30;
  const ModelSpec m = read(minimax(R"("attn_type_list": [0, 0, 0, 0, 0, 0, 0, 1])"), o);
  REQUIRE(m.layout.num_groups() == 2);
  CHECK(m.layout.group(0).num_layers == 1);
  CHECK(m.layout.group(1).name == "linear");
  CHECK(m.layout.group(1).state_bytes_per_layer == std::uint64_t{64} * 128 * 128 * 4);
  const ModelSpec t = read(minimax(R"("layer_types": ["linear_attention", "linear_attention", "linear_attention",
      "linear_attention", "linear_attention", "linear_attention", "linear_attention", "full_attention"])"),
                           o);
  CHECK(t.layout.group(0).num_layers == 1);
  CHECK(t.layers[7].group == 0);
  CHECK_THAT(error_of([&] { read(minimax(R"("attn_type_list": [0, 0, 0, 2, 0, 0, 0, 1])"), o); }),
             Catch::Contains("field 'attn_type_list[3]': expected 0 or 1, got 2"));
}

TEST_CASE("hf lineup edge: GLM-4.5 reads as GQA on every layer", "[spec][hf_config][lineup]") {
  // GLM-4.5's sizes as zyzshishui/slime's scripts/models/glm4.5-355B-A32B.sh gives them.
  const ModelSpec m = read(R"({"model_type": "glm4_moe", "num_hidden_layers": 92, "num_attention_heads": 96,
      "num_key_value_heads": 8, "head_dim": 128, "hidden_size": 5120, "partial_rotary_factor": 0.5,
      "num_nextn_predict_layers": 1})");
  REQUIRE(m.layout.num_groups() == 1);
  CHECK(m.layout.group(0).bytes_per_token() == std::uint64_t{92} * 2 * 8 * 128 * 2);
}

TEST_CASE("hf lineup edge: kv_cache_dtype, K and V apart, per-layer overrides", "[spec][hf_config][quant]") {
  const ModelSpec plain = read(kLlama);
  HfConfigOptions fp8;
  fp8.kv_cache_dtype = "fp8";
  const ModelSpec f = read(kLlama, fp8);
  CHECK(f.layout.group(0).bytes_per_token() * 2 == plain.layout.group(0).bytes_per_token());
  CHECK(f.layout.group(0).k_format->type == ElementType::kFp8E4M3);

  // fp8 K with per-token-head scales, nvfp4 V: per token and layer 8 x 128 + 8 x 4 B of K,
  // 8 x 64 + 8 x 8 B of V.
  HfConfigOptions kv;
  kv.k_cache_dtype = "fp8_per_token_head";
  kv.v_cache_dtype = "nvfp4";
  const ModelSpec s = read(kLlama, kv);
  CHECK(s.layout.group(0).bytes_per_token() == std::uint64_t{32} * (1024 + 32 + 512 + 64));
  CHECK_FALSE(s.layout.padded());

  // Layer 0 and 31 kept in bf16 (a common recipe), the rest fp8: two groups.
  HfConfigOptions mixed = fp8;
  mixed.layer_kv_cache_dtype = {{0, "bf16"}, {31, "bf16"}};
  const ModelSpec x = read(kLlama, mixed);
  REQUIRE(x.layout.num_groups() == 2);
  CHECK(x.layout.group(0).name == "full");
  CHECK(x.layout.group(0).num_layers == 30);
  CHECK(x.layout.group(1).name == "full.bf16");
  CHECK(x.layout.group(1).num_layers == 2);
  CHECK(x.layers[0].group == 1);
  CHECK(x.layers[31].group == 1);
  CHECK(x.layers[31].index == 1);
  CHECK(x.layers[1].group == 0);

  // "auto" (the default) leaves every existing layout as it was.
  HfConfigOptions autos;
  autos.kv_cache_dtype = "auto";
  CHECK(read(kLlama, autos).layout.group(0).is_plain());
  CHECK(read(kLlama, autos).layout.large_page_bytes() == presets::llama3_1_8b().large_page_bytes());

  HfConfigOptions bad;
  bad.kv_cache_dtype = "fp7";
  CHECK_THAT(error_of([&] { read(kLlama, bad); }),
             Catch::Contains("HfConfigOptions.kv_cache_dtype = 'fp7': unknown; known:"));
  bad = {};
  bad.layer_kv_cache_dtype = {{32, "fp8"}};
  CHECK_THAT(error_of([&] { read(kLlama, bad); }),
             Catch::Contains("HfConfigOptions.layer_kv_cache_dtype[0].layer = 32: the model has 32 decoder layers"));
  bad = {};
  bad.ssm_state_dtype_bytes = 3;
  CHECK_THAT(error_of([&] { read(kLlama, bad); }),
             Catch::Contains("HfConfigOptions.ssm_state_dtype_bytes = 3: must be 0, 1, 2 or 4"));
  const std::string dsa = R"({"model_type": "deepseek_v32", "num_hidden_layers": 4, "num_attention_heads": 16,
      "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
      "index_n_heads": 64, "index_head_dim": 128})";
  bad = {};
  bad.layer_kv_cache_dtype = {{0, "fp8"}};
  CHECK_THAT(error_of([&] { read(dsa, bad); }),
             Catch::Contains("splits the MLA layers of an indexed (DSA) model into 2 groups"));
  CHECK(read(dsa).layout.num_groups() == 2);
}

TEST_CASE("hf lineup edge: the layer map's checks", "[spec][hf_config][lineup][errors]") {
  const ModelSpec good = read(R"({"model_type": "gemma3n", "text_config": {"num_hidden_layers": 10,
      "num_kv_shared_layers": 4}})");
  CHECK(good.layers[9].role == LayerRole::kSharedKv);
  CHECK(good.layers[9].kv_owner == 4);  // the last full layer before layer 6
  ModelSpec m = good;
  m.layers[9].kv_owner = 10;
  CHECK_THAT(error_of([&] { validate_layers(m); }), Catch::Contains("layers[9].kv_owner = 10: no such layer"));
  m = good;
  m.layers[9].kv_owner = 8;
  CHECK_THAT(error_of([&] { validate_layers(m); }),
             Catch::Contains("layers[9].kv_owner = 8: that layer does not own its KV"));
  m = good;
  m.layers[9].kv_owner = 3;
  CHECK_THAT(error_of([&] { validate_layers(m); }), Catch::Contains("differ from its kv_owner 3's"));
  m = good;
  m.layers[1].index = 0;
  CHECK_THAT(error_of([&] { validate_layers(m); }),
             Catch::Contains("layers[1]: slot 0 of group 'local' is already taken"));
  m = good;
  m.layers[0].role = LayerRole::kNoCache;
  CHECK_THAT(error_of([&] { validate_layers(m); }),
             Catch::Contains("group 'local': layer slot 0 is used by no decoder"));

  CHECK_THAT(
      error_of([] {
        read(R"({"model_type": "gemma3n", "text_config": {"num_hidden_layers": 10, "num_kv_shared_layers": 10}})");
      }),
      Catch::Contains("field 'text_config.num_kv_shared_layers': 10: at least one of the 10 layers must own"));
  CHECK_THAT(
      error_of([] {
        read(R"({"model_type": "gemma3n", "text_config": {"num_hidden_layers": 10, "num_kv_shared_layers": 7}})");
      }),
      Catch::Contains("shared layer 4 (full) has no earlier full layer to read"));
}

TEST_CASE("hf lineup edge: bad fields name the field", "[spec][hf_config][lineup][errors]") {
  struct Case {
    std::string json, expect;
  };
  const std::string qn = R"("model_type": "qwen3_next", "num_hidden_layers": 4, "num_attention_heads": 16,
      "num_key_value_heads": 2, "head_dim": 256, "linear_num_key_heads": 16, "linear_key_head_dim": 128,
      "linear_num_value_heads": 32, "linear_value_head_dim": 128)";
  const std::vector<Case> cases{
      {"{" + qn + R"(, "linear_conv_kernel_dim": 1})", "field 'linear_conv_kernel_dim': 1: a causal conv state needs"},
      {"{" + qn + "}", "field 'linear_conv_kernel_dim': missing"},
      {"{" + qn + R"(, "linear_conv_kernel_dim": 4, "layer_types": ["linear_attention", "x", "a", "b"]})",
       "field 'layer_types[1]': expected \"linear_attention\" or \"full_attention\", got \"x\""},
      {R"({"model_type": "qwen3_5", "num_hidden_layers": 4})", "field 'text_config': missing or not an object"},
      {R"({"model_type": "deepseek_v3", "num_hidden_layers": 4, "num_attention_heads": 16, "qk_rope_head_dim": 64})",
       "field 'kv_lora_rank': missing"},
      {R"({"model_type": "deepseek_v3", "num_hidden_layers": 4, "num_attention_heads": 16, "kv_lora_rank": 512,
        "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128, "rope_scaling": 4})",
       "field 'rope_scaling': expected an object or null, got 4"},
      {R"({"model_type": "deepseek_v32", "num_hidden_layers": 4, "num_attention_heads": 16, "kv_lora_rank": 512,
        "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128, "index_n_heads": 64})",
       "field 'index_head_dim': missing"},
      {R"({"model_type": "nemotron_h", "num_hidden_layers": 3, "hybrid_override_pattern": "M*"})",
       "field 'hybrid_override_pattern': 2 characters for num_hidden_layers = 3"},
      {R"({"model_type": "nemotron_h", "num_hidden_layers": 3, "hybrid_override_pattern": "M*X"})",
       "field 'hybrid_override_pattern': character 2 is 'X'"},
      {R"({"model_type": "llama4", "text_config": {"num_hidden_layers": 2, "attention_chunk_size": 8192,
        "no_rope_layers": [1, 7], "num_attention_heads": 8, "hidden_size": 1024}})",
       "field 'text_config.no_rope_layers[1]': expected 0 or 1, got 7"},
      {R"({"model_type": "gpt_oss", "num_hidden_layers": 2, "num_attention_heads": 8, "hidden_size": 512})",
       "field 'sliding_window': missing or null but some layers slide"},
      {R"({"model_type": "falcon_h1", "num_hidden_layers": 2, "num_attention_heads": 8, "hidden_size": 512,
        "mamba_n_heads": 8, "mamba_d_head": "half"})",
       "field 'mamba_expand': missing"},  // mamba_d_ssm absent: mamba_expand x hidden_size
      {R"({"model_type": "falcon_h1", "num_hidden_layers": 2, "num_attention_heads": 8, "hidden_size": 512,
        "mamba_d_ssm": 512, "mamba_n_heads": 8, "mamba_d_head": "half"})",
       "field 'mamba_d_head': expected a positive integer or \"auto\""},
      {R"({"model_type": "mistral3", "num_hidden_layers": 2})", "field 'text_config': missing or not an object"},
      {R"({"model_type": "qwen3_vl", "text_config": {"num_hidden_layers": 0}})",
       "field 'text_config.num_hidden_layers': expected a positive integer, got 0"},
      {R"({"model_type": "glm5"})", "'glm5' is not supported; supported: llama, qwen2"},
  };
  for (const Case& c : cases) {
    INFO(c.json);
    CHECK_THAT(error_of([&] { read(c.json); }), Catch::Contains(c.expect));
  }
  // The supported list names every lineup family.
  const std::string e = error_of([] { read(R"({"model_type": "glm5"})"); });
  for (const char* t : {"qwen3_next", "deepseek_v32", "kimi_k2", "gpt_oss", "llama4", "gemma3n", "nemotron_h",
                        "falcon_h1", "minimax", "phi3", "mistral3", "qwen2_5_vl", "qwen3_vl", "glm4_moe"})
    CHECK_THAT(e, Catch::Contains(std::string(t)));
}

TEST_CASE("hf lineup edge: hybrid layer rules against a plain reference over random configs",
          "[spec][hf_config][lineup][random]") {
  std::mt19937 rng(3202);
  for (int iter = 0; iter < 200; ++iter) {
    const std::uint32_t layers = 1 + rng() % 40;
    const std::uint32_t every = 1 + rng() % 6;
    std::string pattern;
    for (std::uint32_t i = 0; i < layers; ++i) pattern += "M*-E"[rng() % 4];
    INFO("iteration " << iter << " layers " << layers << " every " << every << " pattern " << pattern);
    HfConfigOptions o;
    o.layout.max_large_page_bytes = LayoutOptions::kMaxLargePageBytes;
    // Qwen3-Next: full where (i + 1) % interval == 0.
    const ModelSpec q =
        read(fmt::format(R"({{"model_type": "qwen3_next", "num_hidden_layers": {}, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 64, "full_attention_interval": {}, "linear_num_key_heads": 2,
        "linear_key_head_dim": 32, "linear_num_value_heads": 4, "linear_value_head_dim": 32,
        "linear_conv_kernel_dim": 4}})",
                         layers, every),
             o);
    std::uint32_t full = 0;
    for (std::uint32_t i = 0; i < layers; ++i)
      if ((i + 1) % every == 0) ++full;
    for (std::uint32_t i = 0; i < layers; ++i) {
      const GroupId g = q.layers[i].group;
      CHECK(q.layout.group(g).is_state() == ((i + 1) % every != 0));
    }
    if (full > 0) CHECK(q.layout.group(0).num_layers == full);
    // Nemotron-H: 'M' state, '*' attention, '-' and 'E' nothing.
    std::uint32_t attn = 0, mamba = 0;
    for (char ch : pattern) {
      attn += ch == '*' ? 1 : 0;
      mamba += ch == 'M' ? 1 : 0;
    }
    if (attn + mamba == 0) continue;
    const ModelSpec n = read(fmt::format(R"({{"model_type": "nemotron_h", "num_hidden_layers": {},
        "hybrid_override_pattern": "{}", "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
        "mamba_num_heads": 4, "mamba_head_dim": 16, "n_groups": 1, "ssm_state_size": 16, "conv_kernel": 4}})",
                                         layers, pattern),
                             o);
    std::uint32_t seen_attn = 0, seen_mamba = 0;
    for (std::uint32_t i = 0; i < layers; ++i) {
      const LayerPlacement& p = n.layers[i];
      if (pattern[i] == '-' || pattern[i] == 'E') {
        CHECK(p.role == LayerRole::kNoCache);
      } else if (pattern[i] == '*') {
        CHECK(p.index == seen_attn++);
        CHECK_FALSE(n.layout.group(p.group).is_state());
      } else {
        CHECK(p.index == seen_mamba++);
        CHECK(n.layout.group(p.group).is_state());
      }
    }
  }
}
