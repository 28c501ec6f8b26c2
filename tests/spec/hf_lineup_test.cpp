// Issue 32 item 2: read_hf_config on the lineup's published config.json files (tests/data,
// sources in its README). Each layout's per-token and per-sequence bytes are checked
// against the modelling code's formulas written out here by hand, each decoder layer's
// placement (own, shared, none; second cache) against the model's layer rule, and the
// attention parameters against the config.
#include <kvmm/error.hpp>
#include <kvmm/spec/hf_config.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include "support/error_of.hpp"

using namespace kvmm;
using kvmm::test::error_of;

namespace {

std::string data_path(const std::string& file) { return std::string(KVMM_TEST_DATA_DIR) + "/" + file; }

ModelSpec read_data(const std::string& file, const HfConfigOptions& o = {}) {
  ModelSpec m = read_hf_config_file(data_path(file), o);
  validate_layers(m);
  return m;
}

// K and V of `layers` layers of `kv` heads x `hd`, 2-byte elements, per token.
std::uint64_t kv_bytes(std::uint64_t layers, std::uint64_t kv, std::uint64_t hd) { return layers * 2 * kv * hd * 2; }

void same_group_for(const ModelSpec& m, std::uint32_t layer, GroupId g, std::uint32_t index) {
  INFO("layer " << layer);
  CHECK(m.layers[layer].role == LayerRole::kOwn);
  CHECK(m.layers[layer].group == g);
  CHECK(m.layers[layer].index == index);
}

// Layers placed by `is_a(layer)`: group a in model order where true, group b otherwise.
template <typename F>
void two_groups(const ModelSpec& m, GroupId a, GroupId b, F is_a) {
  std::uint32_t ia = 0, ib = 0;
  for (std::uint32_t i = 0; i < m.layers.size(); ++i) {
    if (is_a(i))
      same_group_for(m, i, a, ia++);
    else
      same_group_for(m, i, b, ib++);
  }
  CHECK(m.layout.group(a).num_layers == ia);
  CHECK(m.layout.group(b).num_layers == ib);
}

double yarn_mscale(double factor, double m) { return 0.1 * m * std::log(factor) + 1.0; }

}  // namespace

TEST_CASE("hf lineup: DeepSeek-V3 and Kimi-K2 cache one MLA latent per token and layer", "[spec][hf_config][lineup]") {
  const ModelSpec v3 = read_data("deepseek-v3.config.json");
  REQUIRE(v3.layout.num_groups() == 1);
  const LayerGroup& g = v3.layout.group(0);
  CHECK(g.name == "mla");
  CHECK(g.storage == KvStorage::kLatent);
  CHECK(g.num_layers == 61);  // the MTP layer (num_nextn_predict_layers) is a draft model's
  // (kv_lora_rank 512 + qk_rope_head_dim 64) bf16 elements per token and layer: no V.
  CHECK(g.bytes_per_token() == std::uint64_t{61} * 576 * 2);
  CHECK(v3.layout.natural_page_bytes(0) == std::uint64_t{61} * 16 * 576 * 2);
  CHECK(v3.layout.v_offset(0, 7) == v3.layout.k_offset(0, 7));
  for (std::uint32_t i = 0; i < 61; ++i) same_group_for(v3, i, 0, i);
  const AttentionParams& a = v3.attention[0];
  CHECK(a.num_q_heads == 128);
  CHECK(a.num_kv_heads == 1);
  CHECK(a.head_dim == 576);
  CHECK(a.kv_lora_rank == 512);
  CHECK(a.qk_rope_head_dim == 64);
  CHECK(a.v_head_dim == 128);
  // softmax_scale = (128 + 64)^-1/2 x yarn_get_mscale(40, 1.0)^2.
  CHECK(a.scale == Approx(std::pow(192.0, -0.5) * std::pow(yarn_mscale(40, 1.0), 2)));

  // vLLM's fp8 MLA cache: the whole latent in e4m3 (one scale per tensor) = 576 B; its
  // fp8_ds_mla layout: 512 e4m3 + 4 fp32 scales + 64 bf16 = 656 B per token and layer.
  HfConfigOptions fp8;
  fp8.kv_cache_dtype = "fp8";
  CHECK(read_data("deepseek-v3.config.json", fp8).layout.group(0).bytes_per_token() == std::uint64_t{61} * 576);
  HfConfigOptions ds;
  ds.kv_cache_dtype = "fp8_ds_mla";
  CHECK(read_data("deepseek-v3.config.json", ds).layout.group(0).bytes_per_token() == std::uint64_t{61} * 656);

  const ModelSpec k2 = read_data("kimi-k2-instruct.config.json");
  CHECK(k2.model_type == "kimi_k2");
  CHECK(k2.layout.group(0).bytes_per_token() == std::uint64_t{61} * 576 * 2);
  CHECK(k2.attention[0].num_q_heads == 64);
  CHECK(k2.attention[0].scale == Approx(std::pow(192.0, -0.5) * std::pow(yarn_mscale(32, 1.0), 2)));
  CHECK_FALSE(k2.layout.padded());
}

TEST_CASE("hf lineup: DeepSeek-V3.2 ties an indexer group to its MLA layers", "[spec][hf_config][lineup]") {
  const ModelSpec m = read_data("deepseek-v3.2.config.json");
  REQUIRE(m.layout.num_groups() == 2);
  const LayerGroup& idx = m.layout.group(1);
  CHECK(idx.storage == KvStorage::kKeyOnly);
  CHECK(idx.tied_to == "mla");
  // index_head_dim 128 e4m3 + one fp32 scale: 132 B per token and layer (vLLM's indexer cache).
  CHECK(idx.bytes_per_token() == std::uint64_t{61} * 132);
  for (std::uint32_t i = 0; i < 61; ++i) {
    same_group_for(m, i, 0, i);
    CHECK(m.layers[i].aux_group == 1);
    CHECK(m.layers[i].aux_index == i);
  }
  CHECK(m.attention[1].num_q_heads == 64);
  CHECK(m.attention[1].head_dim == 128);
  CHECK_FALSE(m.layout.padded());
}

TEST_CASE("hf lineup: gpt-oss alternates 128-token windows and full layers; its sinks cache nothing",
          "[spec][hf_config][lineup]") {
  for (const auto& [file, layers] : {std::pair{"gpt-oss-20b.config.json", 24u}, {"gpt-oss-120b.config.json", 36u}}) {
    INFO(file);
    const ModelSpec m = read_data(file);
    REQUIRE(m.layout.num_groups() == 2);
    CHECK(m.layout.group(1).kind == LayerKind::kSlidingWindow);
    CHECK(m.layout.group(1).window == 128);
    two_groups(m, 1, 0, [](std::uint32_t i) { return i % 2 == 0; });
    CHECK(m.layout.group(0).bytes_per_token() + m.layout.group(1).bytes_per_token() == kv_bytes(layers, 8, 64));
    CHECK(m.attention[0].learned_sinks);
    CHECK(m.attention[1].sliding_window == 128);
  }
}

TEST_CASE("hf lineup: Llama 4 Scout's RoPE layers attend within 8192-token chunks", "[spec][hf_config][lineup]") {
  const ModelSpec m = read_data("llama-4-scout-17b-16e-instruct.config.json");
  REQUIRE(m.layout.num_groups() == 2);
  CHECK(m.layout.group(0).name == "global");
  CHECK(m.layout.group(1).kind == LayerKind::kChunkedLocal);
  CHECK(m.layout.group(1).chunk == 8192);
  two_groups(m, 0, 1, [](std::uint32_t i) { return (i + 1) % 4 == 0; });  // NoPE layers: every 4th
  CHECK(m.layout.group(1).bytes_per_token() == kv_bytes(36, 8, 128));
  CHECK(m.attention[1].attention_chunk == 8192);
  CHECK(m.attention[0].attention_chunk == 0);
}

TEST_CASE("hf lineup: Gemma-3n's last 15 layers read the KV of earlier layers", "[spec][hf_config][lineup]") {
  const ModelSpec m = read_data("gemma-3n-e4b.defaults.json");
  REQUIRE(m.layers.size() == 35);
  // Own KV: layers 0..19; full every 5th (4, 9, 14, 19), the rest sliding (512).
  CHECK(m.layout.group(0).num_layers == 4);
  CHECK(m.layout.group(1).num_layers == 16);
  CHECK(m.layout.group(1).window == 512);
  std::uint32_t full = 0, local = 0;
  for (std::uint32_t i = 0; i < 20; ++i)
    same_group_for(m, i, (i + 1) % 5 == 0 ? 0 : 1, (i + 1) % 5 == 0 ? full++ : local++);
  for (std::uint32_t i = 20; i < 35; ++i) {
    INFO("layer " << i);
    const bool is_full = (i + 1) % 5 == 0;
    CHECK(m.layers[i].role == LayerRole::kSharedKv);
    CHECK(m.layers[i].kv_owner == (is_full ? 19u : 18u));
    CHECK(m.layers[i].group == m.layers[m.layers[i].kv_owner].group);
    CHECK(m.layers[i].index == m.layers[m.layers[i].kv_owner].index);
  }
  // 20 layers of 2 KV heads x 256 hold pages; the 15 shared ones none.
  CHECK(m.layout.group(0).bytes_per_token() + m.layout.group(1).bytes_per_token() == kv_bytes(20, 2, 256));
  CHECK(m.attention[0].scale == 1.0);
}

TEST_CASE("hf lineup: Qwen3-Next and Qwen3.5 hold a gated-DeltaNet state beside full layers",
          "[spec][hf_config][lineup]") {
  HfConfigOptions o;
  o.layout.max_large_page_bytes = std::uint64_t{128} << 20;
  const ModelSpec n = read_data("qwen3-next-80b-a3b.defaults.json", o);
  REQUIRE(n.layout.num_groups() == 2);
  CHECK(n.layout.group(1).name == "linear");
  two_groups(n, 0, 1, [](std::uint32_t i) { return (i + 1) % 4 == 0; });
  CHECK(n.layout.group(0).bytes_per_token() == kv_bytes(12, 2, 256));
  // conv [2 x 16 x 128 + 32 x 128, 4 - 1] + recurrent [32, 128, 128], bf16.
  const std::uint64_t state = (8192 * 3 + 32 * 128 * 128) * 2;
  CHECK(n.layout.group(1).state_bytes_per_layer == state);
  CHECK(n.layout.natural_page_bytes(1) == 36 * state);
  CHECK_FALSE(n.layout.padded());  // LCM 75.4 MiB: within the 128 MiB limit
  CHECK(n.layout.large_page_bytes() == std::uint64_t{79036416});

  // Qwen3.5-27B: text_config, layer_types, mamba_ssm_dtype float32 for the recurrent state:
  // one request's state is 147 MiB, past the default 64 MiB large page.
  CHECK_THAT(error_of([] { read_data("qwen3.5-27b.config.json"); }),
             Catch::Contains("max_large_page_bytes = 67108864: smaller than the largest small page (153944064 bytes)"));
  o.layout.max_large_page_bytes = std::uint64_t{1} << 30;
  const ModelSpec q = read_data("qwen3.5-27b.config.json", o);
  CHECK(q.model_type == "qwen3_5");
  two_groups(q, 0, 1, [](std::uint32_t i) { return (i + 1) % 4 == 0; });
  CHECK(q.layout.group(0).bytes_per_token() == kv_bytes(16, 4, 256));
  CHECK(q.layout.group(1).state_bytes_per_layer == 10240 * 3 * 2 + 48 * 128 * 128 * 4);
  REQUIRE(q.layout.group(1).state_tensors.size() == 2);
  CHECK(q.layout.group(1).state_tensors[1].format.bits() == 32);
  // Its LCM (2.3 GiB) is over the 1 GiB limit: the planner pads, by under 1%.
  INFO(q.layout.describe());
  CHECK(q.layout.padding_fraction() < 0.01);
}

TEST_CASE("hf lineup: Nemotron-H's pattern: Mamba2, attention and cache-less MLP layers", "[spec][hf_config][lineup]") {
  // The published file carries Python's Infinity (time_step_limit): refused unless asked.
  CHECK_THAT(error_of([] { read_hf_config_file(data_path("nemotron-h-56b-base-8k.config.json")); }),
             Catch::Contains("malformed JSON"));
  HfConfigOptions o;
  o.python_literals = true;
  o.layout.max_large_page_bytes = std::uint64_t{1} << 30;  // one request's state is 438 MiB
  const ModelSpec m = read_data("nemotron-h-56b-base-8k.config.json", o);
  REQUIRE(m.layers.size() == 118);
  const std::string pattern =
      "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-"
      "M-M-M-M-";
  std::uint32_t attn = 0, mamba = 0;
  for (std::uint32_t i = 0; i < 118; ++i) {
    INFO("layer " << i);
    if (pattern[i] == '-') {
      CHECK(m.layers[i].role == LayerRole::kNoCache);
    } else {
      same_group_for(m, i, pattern[i] == '*' ? 0 : 1, pattern[i] == '*' ? attn++ : mamba++);
    }
  }
  CHECK(attn == 10);
  CHECK(mamba == 54);
  CHECK(m.layout.group(0).bytes_per_token() == kv_bytes(10, 8, 128));
  // conv [256 x 64 + 2 x 8 x 256, 4 - 1] + SSM [256, 64, 256], bf16.
  CHECK(m.layout.group(1).state_bytes_per_layer == (20480 * 3 + 256 * 64 * 256) * 2);
  // A 438 MiB state (2^14 x 3^3 x 1039 bytes) beside 640 KiB attention pages: their LCM is
  // 17 GiB, so under a 1 GiB limit both are padded, by about 1.2%.
  INFO(m.layout.describe());
  CHECK(m.layout.padding_fraction() < 0.02);
}

TEST_CASE("hf lineup: dense lineup models read with their family's rules", "[spec][hf_config][lineup]") {
  struct Case {
    std::string file, type;
    std::uint32_t layers, kv, hd, window;
  };
  const std::vector<Case> cases{
      {"qwen3-vl-8b-instruct.config.json", "qwen3_vl", 36, 8, 128, 0},
      {"minimax-m2.5.config.json", "minimax_m2", 62, 8, 128, 0},
      {"phi-3.5-mini-instruct.config.json", "phi3", 32, 32, 96, 262144},
      {"ministral-3-3b-2512.config.json", "ministral3", 26, 8, 128, 0},
      {"mistral-small-3.1-24b.config.json", "mistral3", 40, 8, 128, 0},
  };
  for (const Case& c : cases) {
    INFO(c.file);
    const ModelSpec m = read_data(c.file);
    CHECK(m.model_type == c.type);
    REQUIRE(m.layout.num_groups() == 1);
    CHECK(m.layout.group(0).kind == (c.window != 0 ? LayerKind::kSlidingWindow : LayerKind::kFullAttention));
    CHECK(m.layout.group(0).window == c.window);
    CHECK(m.layout.group(0).bytes_per_token() == kv_bytes(c.layers, c.kv, c.hd));
    for (std::uint32_t i = 0; i < c.layers; ++i) same_group_for(m, i, 0, i);
  }
}
