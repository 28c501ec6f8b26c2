// Reads a Hugging Face config.json into what an engine needs from kvmm: the planned
// KVLayout, which group (and which page-layer slot) each decoder layer uses, and each
// group's attention parameters (heads, head_dim, window, soft cap, softmax scale).
// Families: llama, qwen2, qwen3, mistral (Ministral too), gemma2, gemma3 / gemma3_text,
// mllama, jamba; anything else raises kvmm::Error naming model_type. Reading is a one-off
// parse of a few KiB (well under a millisecond); errors name the source, the field with
// its path (e.g. text_config.sliding_window) and the value at fault.
#pragma once

#include "kvmm/spec/kv_layout.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvmm {

// The largest config read_hf_config and read_hf_config_file accept: 4 MiB (4,194,304
// bytes; published config.json files are a few KiB). Larger text, and files that are not
// regular files (a directory, /dev/zero, a FIFO), are refused with kvmm::Error naming the
// source and the size.
inline constexpr std::size_t kMaxHfConfigBytes = std::size_t{4} << 20;
// The deepest nesting of objects and arrays accepted (the top-level object counts as one;
// published configs nest 2-4 levels). Deeper text is refused before it is parsed.
inline constexpr std::size_t kMaxHfConfigDepth = 64;

struct HfConfigOptions {
  std::uint32_t tokens_per_page = 16;
  std::uint32_t dtype_bytes = 2;        // KV cache element size: 1, 2 or 4
  std::uint32_t state_dtype_bytes = 2;  // Mamba conv/SSM state element size: 1, 2 or 4
  std::uint32_t mamba_checkpoint_interval = 512;
  LayoutOptions layout = {};
};

// The attention parameters shared by every layer of one group. A state (Mamba) group has
// all fields 0.
struct AttentionParams {
  std::uint32_t num_q_heads = 0;
  std::uint32_t num_kv_heads = 0;
  std::uint32_t head_dim = 0;
  std::uint32_t sliding_window = 0;    // tokens a query attends back; 0 = unbounded
  double softcap = 0.0;                // attn_logit_softcapping (gemma2: 50); 0 = none
  double query_pre_attn_scalar = 0.0;  // gemma's query_pre_attn_scalar; head_dim elsewhere
  double scale = 0.0;                  // softmax scale: query_pre_attn_scalar^-1/2
};

// Where one decoder layer's KV lives: its group, and its layer index inside that group's
// page-layer layout (the `layer` of KVLayout::k_offset / v_offset / state_offset).
struct LayerPlacement {
  GroupId group = 0;
  std::uint32_t index = 0;
};

struct ModelSpec {
  std::string model_type;                  // the config's top-level model_type
  KVLayout layout;                         // groups in a fixed order: full, sliding, cross, state
  std::vector<LayerPlacement> layers;      // one per decoder layer, in model order
  std::vector<AttentionParams> attention;  // one per group of `layout`
};

// Parses `json_text`; `source` names it in errors (a path, or "<memory>"). Fields that
// published configs leave to the Hugging Face class defaults are filled from those
// defaults for gemma2, gemma3_text and mllama's text_config only (docs/layout-and-paging.md
// lists them); every other family must state its sizes. Raises kvmm::Error for malformed
// JSON (with line:column), a missing or invalid field, or bad options.
ModelSpec read_hf_config(std::string_view json_text, std::string_view source, const HfConfigOptions& options = {});
// Reads the file and calls read_hf_config with the path as the source.
ModelSpec read_hf_config_file(const std::string& path, const HfConfigOptions& options = {});
// The model_type values read_hf_config accepts, in a stable order.
const std::vector<std::string>& hf_config_model_types();

}  // namespace kvmm
