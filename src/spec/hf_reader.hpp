// Private to src/spec (hf_config.cpp, hf_assemble.cpp, hf_lineup.cpp): the config object
// with its field checks (Cfg), what a family reader extracts (Reading), and the helpers the
// readers share. nlohmann-json stays inside src/spec. Everything is a few field look-ups.
#pragma once

#include "json_scan.hpp"

#include "kvmm/checked.hpp"
#include "kvmm/error.hpp"
#include "kvmm/spec/hf_config.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <array>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvmm::hf {

using nlohmann::json;

// More decoder layers than any published model has by far; bounds what a config can make
// the reader allocate.
inline constexpr std::uint32_t kMaxLayers = 1u << 16;

using json_scan::printable;

// A value for an error message: scalars as JSON, strings cut to 64 bytes, containers by
// their size only (never dumped: a dump recurses as deep as the value).
inline std::string describe(const json& v) {
  switch (v.type()) {
    case json::value_t::object:
      return fmt::format("an object of {} keys", v.size());
    case json::value_t::array:
      return fmt::format("an array of {} elements", v.size());
    case json::value_t::string:
      return fmt::format("\"{}\"", printable(v.get_ref<const std::string&>()));  // not "\"" + s: GCC 12 -O3 -Wrestrict
    default:
      return v.dump();  // null, boolean, number: a few bytes
  }
}

// One config object, the path prefix used in error messages ("text_config.") and, for
// the families whose published configs rely on them, the Hugging Face class defaults
// that stand in for absent keys (an explicit null is kept: it means "none").
struct Cfg {
  const json& j;
  std::string_view source;
  std::string prefix;
  const json* defaults = nullptr;

  [[noreturn]] void bad(std::string_view field, std::string_view why) const {
    fail("{}: field '{}{}': {}", source, prefix, field, why);
  }
  const json* find(std::string_view field) const {
    if (auto it = j.find(field); it != j.end()) return &*it;
    if (defaults != nullptr) {
      if (auto it = defaults->find(field); it != defaults->end()) return &*it;
    }
    return nullptr;
  }
  bool has(std::string_view field) const {
    const json* v = find(field);
    return v != nullptr && !v->is_null();
  }
  std::uint32_t to_u32(std::string_view field, const json& v, std::int64_t min) const {
    if (!v.is_number_integer() || v.get<std::int64_t>() < min || v.get<std::int64_t>() > (std::int64_t{1} << 31))
      bad(field, fmt::format("expected {} integer, got {}", min > 0 ? "a positive" : "a non-negative", describe(v)));
    return static_cast<std::uint32_t>(v.get<std::int64_t>());
  }
  // A positive integer (below 2^31); kvmm::Error when missing, null or anything else.
  std::uint32_t u32(std::string_view field) const {
    if (!has(field)) bad(field, "missing");
    return to_u32(field, *find(field), 1);
  }
  std::uint32_t u32_or(std::string_view field, std::uint32_t fallback) const {
    return has(field) ? u32(field) : fallback;
  }
  // A non-negative integer (offsets and thresholds that may be 0).
  std::uint32_t index(std::string_view field) const {
    if (!has(field)) bad(field, "missing");
    return to_u32(field, *find(field), 0);
  }
  std::uint32_t num_layers() const {
    const std::uint32_t n = u32("num_hidden_layers");
    if (n > kMaxLayers) bad("num_hidden_layers", fmt::format("{} is more than {} layers", n, kMaxLayers));
    return n;
  }
  // A positive finite number, std::nullopt when null or absent.
  std::optional<double> positive(std::string_view field) const {
    if (!has(field)) return std::nullopt;
    const json& v = *find(field);
    if (!v.is_number() || !std::isfinite(v.get<double>()) || !(v.get<double>() > 0))
      bad(field, fmt::format("expected a positive number or null, got {}", describe(v)));
    return v.get<double>();
  }
  bool flag_or(std::string_view field, bool fallback) const {
    if (!has(field)) return fallback;
    if (!find(field)->is_boolean()) bad(field, fmt::format("expected true or false, got {}", describe(*find(field))));
    return find(field)->get<bool>();
  }
  std::string str(std::string_view field) const {
    if (!has(field)) bad(field, "missing");
    if (!find(field)->is_string()) bad(field, fmt::format("expected a string, got {}", describe(*find(field))));
    return find(field)->get<std::string>();
  }
  Cfg sub(std::string_view field, const json* sub_defaults) const {
    auto it = j.find(field);
    if (it == j.end() || !it->is_object()) bad(field, "missing or not an object");
    return Cfg{*it, source, prefix + std::string(field) + ".", sub_defaults};
  }
  // Per-layer "is sliding" from layer_types, std::nullopt when the config has none.
  std::optional<std::vector<bool>> layer_types(std::uint32_t layers) const {
    if (!has("layer_types")) return std::nullopt;
    const json& lt = *find("layer_types");
    if (!lt.is_array() || lt.size() != layers)
      bad("layer_types", fmt::format("expected an array of num_hidden_layers = {} strings", layers));
    std::vector<bool> sliding(layers);
    for (std::uint32_t i = 0; i < layers; ++i) {
      if (lt[i] == "sliding_attention")
        sliding[i] = true;
      else if (lt[i] != "full_attention")
        bad(fmt::format("layer_types[{}]", i),
            fmt::format("expected \"full_attention\" or \"sliding_attention\", got {}", describe(lt[i])));
    }
    return sliding;
  }
};

// What a family reader extracts: one kind per decoder layer, the attention parameters the
// attention layers share (sliding_window applies to the sliding ones only), the bytes of
// one Mamba layer's state, and the group names (full, sliding, cross, state).
struct Reading {
  std::vector<LayerKind> kinds;
  AttentionParams attn;
  std::uint64_t state_bytes = 0;
  std::array<const char*, 4> names{"full", "sliding", "cross", "mamba"};

  // The lineup's additions (empty / false for the families above).
  const char* chunked_name = "chunked";  // kChunkedLocal layers' group (llama4)
  std::vector<std::int64_t> kv_owner;    // per layer: -1, or the layer whose KV it reads
  std::vector<bool> no_cache;            // per layer: caches nothing (kinds[i] unused)
  std::vector<bool> aux_state;           // per layer: also holds a recurrent state
  // A recurrent state described by its tensors (formats set by the assembler from the
  // options); state_bytes is their sum. state_tensor_role: 0 = conv (state_dtype_bytes),
  // 1 = SSM / recurrent (ssm_state_dtype_bytes).
  std::vector<StateTensor> state_tensors;
  std::vector<int> state_tensor_role;
  std::uint32_t ssm_dtype_bytes = 0;  // the config's own SSM dtype (Qwen3.5's mamba_ssm_dtype), 0 = none
  // MLA: the full-attention group stores one latent of kv_lora_rank + rope_dim elements.
  bool mla = false;
  std::uint32_t kv_lora_rank = 0, rope_dim = 0;
  // DSA: every full-attention layer also holds index_head_dim indexer keys.
  bool indexer = false;
  AttentionParams indexer_attn;
};

// Heads, head_dim and the softmax scale; `qpas` is gemma's query_pre_attn_scalar.
inline AttentionParams attention(const Cfg& c, std::optional<double> qpas, std::optional<double> softcap) {
  AttentionParams a;
  a.num_q_heads = c.u32("num_attention_heads");
  a.num_kv_heads = c.u32_or("num_key_value_heads", a.num_q_heads);
  if (a.num_q_heads % a.num_kv_heads != 0)
    c.bad("num_key_value_heads",
          fmt::format("{} does not divide num_attention_heads = {}", a.num_kv_heads, a.num_q_heads));
  if (c.has("head_dim")) {
    a.head_dim = c.u32("head_dim");
  } else {
    const std::uint32_t hidden = c.u32("hidden_size");
    if (hidden % a.num_q_heads != 0)
      c.bad("hidden_size", fmt::format("{} is not a multiple of num_attention_heads = {}", hidden, a.num_q_heads));
    a.head_dim = hidden / a.num_q_heads;
  }
  a.query_pre_attn_scalar = qpas.value_or(a.head_dim);
  a.scale = 1.0 / std::sqrt(a.query_pre_attn_scalar);
  a.softcap = softcap.value_or(0.0);
  return a;
}

// Full layers where `sliding` is false, sliding (window `window`) where it is true.
inline Reading full_or_sliding(const Cfg& c, const std::vector<bool>& sliding, std::uint32_t window,
                               AttentionParams a) {
  Reading r;
  for (bool s : sliding) r.kinds.push_back(s ? LayerKind::kSlidingWindow : LayerKind::kFullAttention);
  a.sliding_window = window;
  r.attn = a;
  for (bool s : sliding)
    if (s && window == 0) c.bad("sliding_window", "missing or null but some layers slide");
  return r;
}

// The lineup's readers (hf_lineup.cpp): std::nullopt when `type` is none of theirs.
std::optional<Reading> read_lineup(const Cfg& root, const std::string& type, const HfConfigOptions& o);
// Their model_type values, in a stable order.
const std::vector<std::string>& lineup_model_types();
// Groups, placements and the planned layout from a reading (hf_assemble.cpp).
ModelSpec assemble(std::string model_type, const Reading& r, const HfConfigOptions& o);
void check_options(const HfConfigOptions& o);

}  // namespace kvmm::hf
