// Reads a Hugging Face config.json into what an engine needs from kvmm: the planned
// KVLayout, which group (and which page-layer slot) each decoder layer uses, and each
// group's attention parameters (heads, head_dim, window, soft cap, softmax scale).
// Families: llama, qwen2, qwen3, mistral (Ministral too), gemma2, gemma3 / gemma3_text,
// mllama, jamba, and the 2026 lineup (hf_config_model_types() lists them all: hybrids with a
// recurrent state, MLA, DSA indexers, shared-KV layers, chunked and sliding windows, VLMs);
// anything else raises kvmm::Error naming model_type and the supported ones. A KV cache
// dtype (fp8, nvfp4, ..., K and V apart, per layer) is passed beside the config. Reading is a one-off
// parse of a few KiB (well under a millisecond); errors name the source, the field with
// its path (e.g. text_config.sliding_window) and the value at fault.
#pragma once

#include "kvmm/spec/element_format.hpp"
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
  // KV quantization, named as vLLM's --kv-cache-dtype (parse_kv_cache_dtype lists the
  // names): "auto" keeps dtype_bytes, unscaled (the layouts above, unchanged). k_cache_dtype
  // and v_cache_dtype ("" = kv_cache_dtype) set K and V apart (fp8 K, nvfp4 V); an MLA
  // latent takes the K format. layer_kv_cache_dtype overrides single decoder layers: their
  // layers form a group of their own, named "<group>.<dtype>".
  std::string kv_cache_dtype = "auto";
  std::string k_cache_dtype = {};
  std::string v_cache_dtype = {};
  struct LayerDtype {
    std::uint32_t layer = 0;
    std::string kv_cache_dtype = {};
  };
  std::vector<LayerDtype> layer_kv_cache_dtype = {};
  // DeepSeek-V3.2's indexer keys: vLLM keeps them fp8 with one fp32 scale per 128 elements.
  std::string indexer_cache_dtype = "fp8_ds_mla";
  // Element size of a recurrent state's SSM / recurrent tensor (1, 2 or 4); 0 = the
  // config's mamba_ssm_dtype where it has one (Qwen3.5: float32), else state_dtype_bytes
  // (the conv state's).
  std::uint32_t ssm_state_dtype_bytes = 0;
  // Read Python's json literals Infinity, -Infinity and NaN (outside strings) as null:
  // published configs carry them (Nemotron-H's time_step_limit), JSON has none. Off: they
  // are malformed JSON, as before.
  bool python_literals = false;
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
  std::uint32_t attention_chunk = 0;   // chunked local attention (llama4): tokens per chunk
  bool learned_sinks = false;          // gpt-oss: per-head sink logits in the weights, nothing cached
  // MLA: head_dim is kv_lora_rank + qk_rope_head_dim (the latent read as K), num_kv_heads 1;
  // V is the latent's first kv_lora_rank elements, up-projected to v_head_dim per head.
  std::uint32_t kv_lora_rank = 0;
  std::uint32_t qk_rope_head_dim = 0;
  std::uint32_t v_head_dim = 0;
};

// What a decoder layer caches: its own pages, another layer's (shared KV: Gemma-3n's last
// layers), or nothing (an MLP-only layer of Nemotron-H's pattern).
enum class LayerRole : std::uint8_t { kOwn, kSharedKv, kNoCache };
// LayerPlacement::aux_group of a layer without a second cache (the value of paging's kNoGroup).
inline constexpr GroupId kNoAuxGroup = ~GroupId{0};

// Where one decoder layer's KV lives: its group, and its layer index inside that group's
// page-layer layout (the `layer` of KVLayout::k_offset / v_offset / state_offset).
struct LayerPlacement {
  GroupId group = 0;
  std::uint32_t index = 0;
  LayerRole role = LayerRole::kOwn;
  // kSharedKv: the decoder layer whose KV this layer reads; group and index are that layer's.
  std::uint32_t kv_owner = 0;
  // A second cache of the layer: DeepSeek-V3.2's indexer keys, Falcon-H1's Mamba state
  // (its attention and SSM run side by side); kNoAuxGroup when none.
  GroupId aux_group = kNoAuxGroup;
  std::uint32_t aux_index = 0;
};

struct ModelSpec {
  std::string model_type;                  // the config's top-level model_type
  KVLayout layout;                         // groups in a fixed order: full, sliding, chunked, cross, state, indexer
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
// Checks a ModelSpec's layer map against its layout: every group and index in range, each
// group's indices used exactly once and holding that layer in the layout's map
// (KVLayout::model_layer), every shared layer's owner an owning layer of the same group and
// slot. kvmm::Error naming the layer and field otherwise (read_hf_config's output
// always passes; an engine that edits the map calls it).
void validate_layers(const ModelSpec& spec);

}  // namespace kvmm
