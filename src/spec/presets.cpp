#include "kvmm/spec/presets.hpp"

#include "kvmm/error.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

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
  return o;
}

// Llama-family decoder: every layer full attention.
LayerGroup llama_full(std::string name, std::uint32_t layers, std::uint32_t kv_heads, std::uint32_t head_dim,
                      const PresetOptions& o) {
  return LayerGroup::full_attention(std::move(name), layers, kv_heads, head_dim, o.dtype_bytes, o.tokens_per_page);
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
  std::vector<LayerGroup> g{llama_full("self", 32, 8, 128, o),
                            LayerGroup::cross_attention("cross", 8, 8, 128, o.dtype_bytes, o.tokens_per_page)};
  if (o.vision_embedding)
    g.push_back(LayerGroup::vision_embedding("vision", std::uint64_t{4096} * o.dtype_bytes, o.tokens_per_page));
  return KVLayout::plan(std::move(g), o.layout);
}

KVLayout gemma2_27b(const PresetOptions& o) {
  checked(o);
  // 46 layers, even layers sliding (window 4096), odd layers global; 16 KV heads x 128.
  return KVLayout::plan({LayerGroup::full_attention("global", 23, 16, 128, o.dtype_bytes, o.tokens_per_page),
                         LayerGroup::sliding_window("local", 23, 16, 128, o.dtype_bytes, o.tokens_per_page, 4096)},
                        o.layout);
}

KVLayout gemma3_27b(const PresetOptions& o) {
  checked(o);
  // 62 layers, sliding_window_pattern 6: layers 5, 11, ..., 59 global (10), 52 local.
  return KVLayout::plan({LayerGroup::full_attention("global", 10, 16, 128, o.dtype_bytes, o.tokens_per_page),
                         LayerGroup::sliding_window("local", 52, 16, 128, o.dtype_bytes, o.tokens_per_page, 1024)},
                        o.layout);
}

KVLayout ministral_8b(const PresetOptions& o) {
  checked(o);
  // 36 layers, interleaved 128k full : 32k sliding x 3.
  return KVLayout::plan({LayerGroup::full_attention("full", 9, 8, 128, o.dtype_bytes, o.tokens_per_page),
                         LayerGroup::sliding_window("sliding", 27, 8, 128, o.dtype_bytes, o.tokens_per_page, 32768)},
                        o.layout);
}

KVLayout jamba1_5_mini(const PresetOptions& o) {
  checked(o, /*state=*/true);
  // 32 layers, attn_layer_period 8 / offset 4: 4 attention, 28 Mamba.
  // Mamba state per layer: conv [d_inner, d_conv-1] + SSM [d_inner, d_state].
  constexpr std::uint64_t d_inner = std::uint64_t{2} * 4096, d_state = 16, d_conv = 4;
  const std::uint64_t state = (d_inner * (d_conv - 1) + d_inner * d_state) * o.state_dtype_bytes;
  return KVLayout::plan(
      {llama_full("attention", 4, 8, 128, o), LayerGroup::mamba_state("mamba", 28, state, o.mamba_checkpoint_interval)},
      o.layout);
}

KVLayout speculative_70b_1b(const PresetOptions& o) {
  checked(o);
  return KVLayout::plan({llama_full("target", 80, 8, 128, o), llama_full("draft", 16, 8, 64, o)}, o.layout);
}

const std::vector<std::string>& names() {
  static const std::vector<std::string> kNames{"llama-3.1-8b",         "llama-3.1-70b",  "llama-3.2-1b",
                                               "llama-3.2-11b-vision", "gemma-2-27b",    "gemma-3-27b",
                                               "ministral-8b",         "jamba-1.5-mini", "spec-70b-1b"};
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
  fail("preset = '{}': unknown model; known: {}", name, fmt::join(names(), ", "));
}

}  // namespace kvmm::presets
