// Layouts of published models, built from their Hugging Face config.json values
// (layer counts, KV heads, head dims, windows, Mamba state shapes), and the 2026 lineup's
// (MLA, DSA indexer, recurrent states, chunked and shared-KV layers). Each returns a
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
  // KV element format of the attention groups (parse_kv_cache_dtype's names, "auto" =
  // dtype_bytes unscaled); an MLA latent takes it too.
  std::string kv_cache_dtype = "auto";
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
// Speculative decoding with draft groups (LayerGroup::draft, docs/speculative.md):
// Llama-3.1-8B + its EAGLE-3 head (1 layer, 8 KV heads x 128), keyed with the next token.
KVLayout eagle3_llama3_1_8b(const PresetOptions& o = {});
// Qwen3-Next-80B-A3B + its MTP layer (1 full-attention layer, 2 x 256, next-token keyed);
// the gated-DeltaNet checkpoints are cached only when tagged with their verified count.
KVLayout mtp_qwen3_next_80b_a3b(const PresetOptions& o = {});

// The 2026 lineup (issue 32; sizes from the configs in tests/data, hf_config.hpp's readers).
// 48 layers: 12 full (2 KV heads x 256) + 36 gated-DeltaNet states (conv [8192, 3],
// recurrent [32, 128, 128]); LCM 75 MiB, padded under the default 64 MiB limit.
KVLayout qwen3_next_80b_a3b(const PresetOptions& o = {});
// 61 MLA layers, one latent of 512 + 64 elements per token and layer.
KVLayout deepseek_v3(const PresetOptions& o = {});
// DeepSeek-V3's latents + the DSA indexer: 61 layers of 128 fp8 keys + an fp32 scale.
KVLayout deepseek_v3_2(const PresetOptions& o = {});
// Kimi-K2: DeepSeek-V3's cache shape (61 MLA layers of 512 + 64).
KVLayout kimi_k2(const PresetOptions& o = {});
// gpt-oss-20b: 24 layers, alternating 128-token windows and full, 8 KV heads x 64.
KVLayout gpt_oss_20b(const PresetOptions& o = {});
// Llama-4-Scout: 48 layers, 36 chunked (8192) + 12 global, 8 KV heads x 128.
KVLayout llama4_scout(const PresetOptions& o = {});
// Gemma-3n-E4B: 20 layers with KV (4 global + 16 local, window 512), 2 KV heads x 256;
// its 15 shared-KV layers hold no pages.
KVLayout gemma3n_e4b(const PresetOptions& o = {});
// Nemotron-H-56B: 10 attention (8 x 128) + 54 Mamba2 layers (conv [20480, 3], SSM
// [256, 64, 256]); one request's state is 438 MiB, so unless the caller chose another
// layout.max_large_page_bytes the preset plans under 1 GiB.
KVLayout nemotron_h_56b(const PresetOptions& o = {});
// Falcon-H1-7B: 44 layers each with attention (2 x 128) and a Mamba2 state (conv [3584, 3],
// SSM [24, 128, 256]); planned under 1 GiB unless the caller chose a limit (70 MB state).
KVLayout falcon_h1_7b(const PresetOptions& o = {});
// MiniMax-Text-01: 80 layers, every 8th softmax (8 x 128), the rest lightning attention
// with a [64, 128, 128] state; planned under 1 GiB unless the caller chose a limit.
KVLayout minimax_text_01(const PresetOptions& o = {});
// Phi-3.5-mini: 32 layers sliding (262144, longer than its context), 32 KV heads x 96.
KVLayout phi3_5_mini(const PresetOptions& o = {});
// Mistral-Small-3.1-24B: 40 full layers, 8 KV heads x 128.
KVLayout mistral_small_3_1(const PresetOptions& o = {});
// Qwen3-VL-8B: 36 full layers, 8 KV heads x 128 (+ its 4096-wide vision embedding when
// o.vision_embedding).
KVLayout qwen3_vl_8b(const PresetOptions& o = {});
// GLM-4.5: 92 full layers, 8 KV heads x 128.
KVLayout glm4_5(const PresetOptions& o = {});

// Preset names accepted by by_name(), in a stable order; each plans within the default
// 64 MiB large page.
const std::vector<std::string>& names();
// The speculative presets by_name() also accepts (draft groups, tagged checkpoints).
const std::vector<std::string>& speculative_names();
// The presets by_name() also accepts whose one-request state is past the default large
// page (nemotron-h-56b, falcon-h1-7b, minimax-text-01): they plan under 1 GiB unless the
// caller chose a limit.
const std::vector<std::string>& state_heavy_names();
// Raises kvmm::Error naming the unknown preset and listing the known ones.
KVLayout by_name(std::string_view name, const PresetOptions& o = {});

}  // namespace kvmm::presets
