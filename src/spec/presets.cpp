#include "kvmm/spec/presets.hpp"

#include "kvmm/error.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <utility>
#include <vector>

namespace kvmm::presets {

namespace {

bool is_element_size(std::uint32_t bytes) { return bytes == 1 || bytes == 2 || bytes == 4; }

// Checks the options every preset reads (and, for hybrid models, the state options), so
// an error names the option the caller set rather than a group field derived from it.
const PresetOptions& checked(const PresetOptions& o, bool state = false) {
  if (o.tokens_per_page == 0) fail("PresetOptions.tokens_per_page = 0: must be >= 1");
  if (!is_element_size(o.dtype_bytes)) fail("PresetOptions.dtype_bytes = {}: must be 1, 2 or 4", o.dtype_bytes);
  if (state && !is_element_size(o.state_dtype_bytes))
    fail("PresetOptions.state_dtype_bytes = {}: must be 1, 2 or 4", o.state_dtype_bytes);
  if (state && o.mamba_checkpoint_interval == 0) fail("PresetOptions.mamba_checkpoint_interval = 0: must be >= 1");
  if (o.kv_cache_dtype != "auto") (void)parse_kv_cache_dtype(o.kv_cache_dtype, "PresetOptions.kv_cache_dtype");
  return o;
}

// Llama-family decoder: every layer full attention.
LayerGroup llama_full(std::string name, std::uint32_t layers, std::uint32_t kv_heads, std::uint32_t head_dim,
                      const PresetOptions& o) {
  return LayerGroup::full_attention(std::move(name), layers, kv_heads, head_dim, o.dtype_bytes, o.tokens_per_page);
}

// The decoder layers of `total` for which pred(i) holds, in model order (the
// LayerGroup::layers of an interleaved model's groups; the others by default are numbered
// in group order).
template <typename Pred>
std::vector<std::uint32_t> layers_where(std::uint32_t total, Pred pred) {
  std::vector<std::uint32_t> out;
  for (std::uint32_t i = 0; i < total; ++i)
    if (pred(i)) out.push_back(i);
  return out;
}

LayerGroup holding(LayerGroup g, std::vector<std::uint32_t> layers) {
  g.layers = std::move(layers);
  return g;
}

}  // namespace

KVLayout llama3_1_8b(const PresetOptions& o) {
  checked(o);
  return KVLayout::plan({llama_full("full", 32, 8, 128, o)}, o.layout);
}

KVLayout llama3_1_70b(const PresetOptions& o) {
  checked(o);
  return KVLayout::plan({llama_full("full", 80, 8, 128, o)}, o.layout);
}

KVLayout llama3_2_1b(const PresetOptions& o) {
  checked(o);
  return KVLayout::plan({llama_full("full", 16, 8, 64, o)}, o.layout);
}

KVLayout llama3_2_11b_vision(const PresetOptions& o) {
  checked(o);
  // text_config: 40 layers, cross_attention_layers = [3, 8, 13, 18, 23, 28, 33, 38].
  const auto cross = [](std::uint32_t i) { return i % 5 == 3; };
  std::vector<LayerGroup> g{
      holding(llama_full("self", 32, 8, 128, o), layers_where(40, [&](std::uint32_t i) { return !cross(i); })),
      holding(LayerGroup::cross_attention("cross", 8, 8, 128, o.dtype_bytes, o.tokens_per_page),
              layers_where(40, cross))};
  if (o.vision_embedding)
    g.push_back(LayerGroup::vision_embedding("vision", std::uint64_t{4096} * o.dtype_bytes, o.tokens_per_page));
  return KVLayout::plan(std::move(g), o.layout);
}

KVLayout gemma2_27b(const PresetOptions& o) {
  checked(o);
  // 46 layers, even layers sliding (window 4096), odd layers global; 16 KV heads x 128.
  const auto odd = [](std::uint32_t i) { return i % 2 == 1; };
  return KVLayout::plan(
      {holding(LayerGroup::full_attention("global", 23, 16, 128, o.dtype_bytes, o.tokens_per_page),
               layers_where(46, odd)),
       holding(LayerGroup::sliding_window("local", 23, 16, 128, o.dtype_bytes, o.tokens_per_page, 4096),
               layers_where(46, [&](std::uint32_t i) { return !odd(i); }))},
      o.layout);
}

KVLayout gemma3_27b(const PresetOptions& o) {
  checked(o);
  // 62 layers, sliding_window_pattern 6: layers 5, 11, ..., 59 global (10), 52 local.
  const auto global = [](std::uint32_t i) { return i % 6 == 5; };
  return KVLayout::plan(
      {holding(LayerGroup::full_attention("global", 10, 16, 128, o.dtype_bytes, o.tokens_per_page),
               layers_where(62, global)),
       holding(LayerGroup::sliding_window("local", 52, 16, 128, o.dtype_bytes, o.tokens_per_page, 1024),
               layers_where(62, [&](std::uint32_t i) { return !global(i); }))},
      o.layout);
}

KVLayout ministral_8b(const PresetOptions& o) {
  checked(o);
  // 36 layers, interleaved 128k full : 32k sliding x 3 (layers 0, 4, ..., 32 full).
  const auto full = [](std::uint32_t i) { return i % 4 == 0; };
  return KVLayout::plan(
      {holding(LayerGroup::full_attention("full", 9, 8, 128, o.dtype_bytes, o.tokens_per_page), layers_where(36, full)),
       holding(LayerGroup::sliding_window("sliding", 27, 8, 128, o.dtype_bytes, o.tokens_per_page, 32768),
               layers_where(36, [&](std::uint32_t i) { return !full(i); }))},
      o.layout);
}

KVLayout jamba1_5_mini(const PresetOptions& o) {
  checked(o, /*state=*/true);
  // 32 layers, attn_layer_period 8 / offset 4: 4 attention, 28 Mamba.
  // Mamba state per layer: conv [d_inner, d_conv-1] + SSM [d_inner, d_state].
  constexpr std::uint64_t d_inner = std::uint64_t{2} * 4096, d_state = 16, d_conv = 4;
  const std::uint64_t state = (d_inner * (d_conv - 1) + d_inner * d_state) * o.state_dtype_bytes;
  const auto attn = [](std::uint32_t i) { return i % 8 == 4; };
  return KVLayout::plan({holding(llama_full("attention", 4, 8, 128, o), layers_where(32, attn)),
                         holding(LayerGroup::mamba_state("mamba", 28, state, o.mamba_checkpoint_interval),
                                 layers_where(32, [&](std::uint32_t i) { return !attn(i); }))},
                        o.layout);
}

KVLayout speculative_70b_1b(const PresetOptions& o) {
  checked(o);
  return KVLayout::plan({llama_full("target", 80, 8, 128, o), llama_full("draft", 16, 8, 64, o)}, o.layout);
}

namespace {

LayerGroup as_draft(LayerGroup g, std::string target, std::uint32_t successor_tokens) {
  g.draft = DraftRole{.target = std::move(target), .successor_tokens = successor_tokens};
  return g;
}

}  // namespace

KVLayout eagle3_llama3_1_8b(const PresetOptions& o) {
  checked(o);
  return KVLayout::plan({llama_full("full", 32, 8, 128, o), as_draft(llama_full("eagle", 1, 8, 128, o), "full", 1)},
                        o.layout);
}

namespace {

// The lineup presets' attention groups in o.kv_cache_dtype ("auto": dtype_bytes, plain).
LayerGroup in_format(LayerGroup g, const PresetOptions& o) {
  if (o.kv_cache_dtype == "auto") return g;
  const ElementFormat f = parse_kv_cache_dtype(o.kv_cache_dtype, "PresetOptions.kv_cache_dtype");
  g.k_format = f;
  g.v_format = f;
  return g;
}

ElementFormat latent_format(const PresetOptions& o) {
  return o.kv_cache_dtype == "auto" ? ElementFormat::raw_bytes(o.dtype_bytes)
                                    : parse_kv_cache_dtype(o.kv_cache_dtype, "PresetOptions.kv_cache_dtype");
}

// Conv state [conv_dim, kernel - 1] and a recurrent / SSM state, in state_dtype_bytes.
std::vector<StateTensor> conv_and_state(std::uint64_t conv_dim, std::uint64_t kernel, std::vector<std::uint64_t> state,
                                        const char* state_name, const PresetOptions& o) {
  const ElementFormat f = ElementFormat::raw_bytes(o.state_dtype_bytes);
  return {{"conv", {conv_dim, kernel - 1}, f}, {state_name, std::move(state), f}};
}

// States of tens to hundreds of MiB per request: unless the caller chose a limit, plan
// under 1 GiB.
LayoutOptions state_heavy(const PresetOptions& o) {
  LayoutOptions l = o.layout;
  if (l.max_large_page_bytes == LayoutOptions{}.max_large_page_bytes) l.max_large_page_bytes = std::uint64_t{1} << 30;
  return l;
}

KVLayout mla_model(std::uint32_t layers, bool indexer, const PresetOptions& o) {
  std::optional<ElementFormat> rope;
  const ElementFormat latent = latent_format(o);
  if (latent.scale.in_pages()) rope = ElementFormat::of(ElementType::kBf16);
  std::vector<LayerGroup> g{LayerGroup::mla("mla", layers, 512, 64, latent, rope, o.tokens_per_page)};
  if (indexer)
    g.push_back(
        LayerGroup::indexer("indexer", layers, 1, 128, parse_kv_cache_dtype("fp8_ds_mla"), o.tokens_per_page, "mla"));
  return KVLayout::plan(std::move(g), o.layout);
}

}  // namespace

KVLayout qwen3_next_80b_a3b(const PresetOptions& o) {
  checked(o, /*state=*/true);
  // key_dim = 16 x 128, value_dim = 32 x 128: conv over 2 key_dim + value_dim = 8192 channels.
  return KVLayout::plan(
      {in_format(llama_full("full", 12, 2, 256, o), o),
       LayerGroup::recurrent_state("linear", 36, conv_and_state(8192, 4, {32, 128, 128}, "recurrent", o),
                                   o.mamba_checkpoint_interval)},
      o.layout);
}

KVLayout mtp_qwen3_next_80b_a3b(const PresetOptions& o) {
  checked(o, /*state=*/true);
  LayerGroup state = LayerGroup::recurrent_state("linear", 36, conv_and_state(8192, 4, {32, 128, 128}, "recurrent", o),
                                                 o.mamba_checkpoint_interval);
  state.tagged_checkpoints = true;
  return KVLayout::plan({in_format(llama_full("full", 12, 2, 256, o), o), std::move(state),
                         as_draft(in_format(llama_full("mtp", 1, 2, 256, o), o), "full", 1)},
                        o.layout);
}

KVLayout deepseek_v3(const PresetOptions& o) {
  checked(o);
  return mla_model(61, false, o);
}

KVLayout deepseek_v3_2(const PresetOptions& o) {
  checked(o);
  return mla_model(61, true, o);
}

KVLayout kimi_k2(const PresetOptions& o) {
  checked(o);
  return mla_model(61, false, o);
}

KVLayout gpt_oss_20b(const PresetOptions& o) {
  checked(o);
  return KVLayout::plan(
      {in_format(llama_full("full", 12, 8, 64, o), o),
       in_format(LayerGroup::sliding_window("sliding", 12, 8, 64, o.dtype_bytes, o.tokens_per_page, 128), o)},
      o.layout);
}

KVLayout llama4_scout(const PresetOptions& o) {
  checked(o);
  return KVLayout::plan(
      {in_format(llama_full("global", 12, 8, 128, o), o),
       in_format(LayerGroup::chunked_local("chunked", 36, 8, 128, o.dtype_bytes, o.tokens_per_page, 8192), o)},
      o.layout);
}

KVLayout gemma3n_e4b(const PresetOptions& o) {
  checked(o);
  return KVLayout::plan(
      {in_format(llama_full("global", 4, 2, 256, o), o),
       in_format(LayerGroup::sliding_window("local", 16, 2, 256, o.dtype_bytes, o.tokens_per_page, 512), o)},
      o.layout);
}

KVLayout nemotron_h_56b(const PresetOptions& o) {
  checked(o, /*state=*/true);
  // d_inner 256 x 64 = 16384, conv over d_inner + 2 x 8 groups x 256 = 20480 channels.
  return KVLayout::plan({in_format(llama_full("attention", 10, 8, 128, o), o),
                         LayerGroup::recurrent_state("mamba", 54, conv_and_state(20480, 4, {256, 64, 256}, "ssm", o),
                                                     o.mamba_checkpoint_interval)},
                        state_heavy(o));
}

KVLayout falcon_h1_7b(const PresetOptions& o) {
  checked(o, /*state=*/true);
  return KVLayout::plan({in_format(llama_full("attention", 44, 2, 128, o), o),
                         LayerGroup::recurrent_state("mamba", 44, conv_and_state(3584, 4, {24, 128, 256}, "ssm", o),
                                                     o.mamba_checkpoint_interval)},
                        state_heavy(o));
}

KVLayout minimax_text_01(const PresetOptions& o) {
  checked(o, /*state=*/true);
  return KVLayout::plan({in_format(llama_full("full", 10, 8, 128, o), o),
                         LayerGroup::recurrent_state(
                             "linear", 70, {{"kv", {64, 128, 128}, ElementFormat::raw_bytes(o.state_dtype_bytes)}},
                             o.mamba_checkpoint_interval)},
                        state_heavy(o));
}

KVLayout phi3_5_mini(const PresetOptions& o) {
  checked(o);
  return KVLayout::plan(
      {in_format(LayerGroup::sliding_window("sliding", 32, 32, 96, o.dtype_bytes, o.tokens_per_page, 262144), o)},
      o.layout);
}

KVLayout mistral_small_3_1(const PresetOptions& o) {
  checked(o);
  return KVLayout::plan({in_format(llama_full("full", 40, 8, 128, o), o)}, o.layout);
}

KVLayout qwen3_vl_8b(const PresetOptions& o) {
  checked(o);
  std::vector<LayerGroup> g{in_format(llama_full("full", 36, 8, 128, o), o)};
  if (o.vision_embedding)
    g.push_back(LayerGroup::vision_embedding("vision", std::uint64_t{4096} * o.dtype_bytes, o.tokens_per_page));
  return KVLayout::plan(std::move(g), o.layout);
}

KVLayout glm4_5(const PresetOptions& o) {
  checked(o);
  return KVLayout::plan({in_format(llama_full("full", 92, 8, 128, o), o)}, o.layout);
}

const std::vector<std::string>& names() {
  static const std::vector<std::string> kNames{
      "llama-3.1-8b", "llama-3.1-70b", "llama-3.2-1b",      "llama-3.2-11b-vision", "gemma-2-27b",
      "gemma-3-27b",  "ministral-8b",  "jamba-1.5-mini",    "spec-70b-1b",          "qwen3-next-80b-a3b",
      "deepseek-v3",  "deepseek-v3.2", "kimi-k2",           "gpt-oss-20b",          "llama-4-scout",
      "gemma-3n-e4b", "phi-3.5-mini",  "mistral-small-3.1", "qwen3-vl-8b",          "glm-4.5"};
  return kNames;
}

const std::vector<std::string>& speculative_names() {
  static const std::vector<std::string> kNames{"eagle3-llama-3.1-8b", "mtp-qwen3-next-80b-a3b"};
  return kNames;
}

const std::vector<std::string>& state_heavy_names() {
  static const std::vector<std::string> kNames{"nemotron-h-56b", "falcon-h1-7b", "minimax-text-01"};
  return kNames;
}

KVLayout by_name(std::string_view name, const PresetOptions& o) {
  if (name == "llama-3.1-8b") return llama3_1_8b(o);
  if (name == "llama-3.1-70b") return llama3_1_70b(o);
  if (name == "llama-3.2-1b") return llama3_2_1b(o);
  if (name == "llama-3.2-11b-vision") return llama3_2_11b_vision(o);
  if (name == "gemma-2-27b") return gemma2_27b(o);
  if (name == "gemma-3-27b") return gemma3_27b(o);
  if (name == "ministral-8b") return ministral_8b(o);
  if (name == "jamba-1.5-mini") return jamba1_5_mini(o);
  if (name == "spec-70b-1b") return speculative_70b_1b(o);
  if (name == "eagle3-llama-3.1-8b") return eagle3_llama3_1_8b(o);
  if (name == "mtp-qwen3-next-80b-a3b") return mtp_qwen3_next_80b_a3b(o);
  if (name == "qwen3-next-80b-a3b") return qwen3_next_80b_a3b(o);
  if (name == "deepseek-v3") return deepseek_v3(o);
  if (name == "deepseek-v3.2") return deepseek_v3_2(o);
  if (name == "kimi-k2") return kimi_k2(o);
  if (name == "gpt-oss-20b") return gpt_oss_20b(o);
  if (name == "llama-4-scout") return llama4_scout(o);
  if (name == "gemma-3n-e4b") return gemma3n_e4b(o);
  if (name == "nemotron-h-56b") return nemotron_h_56b(o);
  if (name == "falcon-h1-7b") return falcon_h1_7b(o);
  if (name == "minimax-text-01") return minimax_text_01(o);
  if (name == "phi-3.5-mini") return phi3_5_mini(o);
  if (name == "mistral-small-3.1") return mistral_small_3_1(o);
  if (name == "qwen3-vl-8b") return qwen3_vl_8b(o);
  if (name == "glm-4.5") return glm4_5(o);
  fail("preset = '{}': unknown model; known: {}, {}, {}", name, fmt::join(names(), ", "),
       fmt::join(state_heavy_names(), ", "), fmt::join(speculative_names(), ", "));
}

}  // namespace kvmm::presets
