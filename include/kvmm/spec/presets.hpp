// Layouts of published models, built from their Hugging Face config.json values
// (layer counts, KV heads, head dims, windows, Mamba state shapes). Each returns a
// planned KVLayout; by_name() maps the CLI/demo names to them.
#pragma once

#include "kvmm/spec/kv_layout.hpp"

#include <string>
#include <string_view>
#include <vector>

namespace kvmm::presets {

struct PresetOptions {
  std::uint32_t tokens_per_page = 16;
  std::uint32_t dtype_bytes = 2;        // KV cache element size (bf16/fp16)
  std::uint32_t state_dtype_bytes = 2;  // Mamba conv/SSM state element size
  std::uint32_t mamba_checkpoint_interval = 512;
  bool vision_embedding = false;  // add a vision-embedding group (VLMs)
  LayoutOptions layout = {};
};

KVLayout llama3_1_8b(const PresetOptions& o = {});
KVLayout llama3_1_70b(const PresetOptions& o = {});
KVLayout llama3_2_1b(const PresetOptions& o = {});
// 32 self-attention layers over text tokens + 8 cross-attention layers over image
// tokens (+ the 4096-wide projected vision embedding when o.vision_embedding).
KVLayout llama3_2_11b_vision(const PresetOptions& o = {});
// 46 layers alternating global / 4096-token sliding window.
KVLayout gemma2_27b(const PresetOptions& o = {});
// 62 layers, 5 local (window 1024) : 1 global.
KVLayout gemma3_27b(const PresetOptions& o = {});
// 36 layers, 1 full : 3 sliding (window 32768), interleaved.
KVLayout ministral_8b(const PresetOptions& o = {});
// 32 layers, Mamba : attention 7 : 1 (d_inner 8192, d_state 16, d_conv 4).
KVLayout jamba1_5_mini(const PresetOptions& o = {});
// Speculative decoding: Llama-3.1-70B target + Llama-3.2-1B draft in one layout.
KVLayout speculative_70b_1b(const PresetOptions& o = {});

// Preset names accepted by by_name(), in a stable order.
const std::vector<std::string>& names();
// Raises kvmm::Error naming the unknown preset and listing the known ones.
KVLayout by_name(std::string_view name, const PresetOptions& o = {});

}  // namespace kvmm::presets
