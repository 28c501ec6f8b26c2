// The 2026 lineup's config readers (hf_reader.hpp): linear-attention and Mamba2 hybrids
// (Qwen3-Next / Qwen3.5, Nemotron-H, Falcon-H1, MiniMax-Text-01), MLA (DeepSeek-V3,
// Kimi-K2) with DeepSeek-V3.2's indexer, gpt-oss's alternating windows, Llama 4's chunked
// layers and Gemma-3n's shared-KV layers. Each reader cites the Hugging Face modelling file
// whose cache it sizes; where vLLM keeps a different shape, the comment says which kvmm
// follows. The simpler families (phi3, glm4_moe, minimax_m2, mistral3, the VLMs) reuse the
// llama / mistral / qwen rules in hf_config.cpp. A few field look-ups per layer.
#include "hf_reader.hpp"

#include <fmt/format.h>

namespace kvmm::hf {

namespace {

// layer_types with the given names for "true" and "false" layers; std::nullopt when absent.
std::optional<std::vector<bool>> typed_layers(const Cfg& c, std::uint32_t layers, std::string_view yes,
                                              std::string_view no) {
  if (!c.has("layer_types")) return std::nullopt;
  const json& lt = *c.find("layer_types");
  if (!lt.is_array() || lt.size() != layers)
    c.bad("layer_types", fmt::format("expected an array of num_hidden_layers = {} strings", layers));
  std::vector<bool> out(layers);
  for (std::uint32_t i = 0; i < layers; ++i) {
    if (lt[i] == yes)
      out[i] = true;
    else if (lt[i] != no)
      c.bad(fmt::format("layer_types[{}]", i),
            fmt::format("expected \"{}\" or \"{}\", got {}", no, yes, describe(lt[i])));
  }
  return out;
}

// A kernel width of at least 2 (the cached conv state keeps width - 1 columns).
std::uint64_t conv_columns(const Cfg& c, std::string_view field) {
  const std::uint32_t k = c.u32(field);
  if (k < 2) c.bad(field, fmt::format("{}: a causal conv state needs a kernel of at least 2", k));
  return k - 1;
}

// A short-conv + recurrent state: conv [conv_dim, kernel - 1] (vLLM's layout; transformers'
// cache keeps `kernel` columns, the newest of which is the current input) and the
// recurrent / SSM state of the given shape.
void set_state(Reading& r, std::uint64_t conv_dim, std::uint64_t conv_cols, std::vector<std::uint64_t> ssm_shape,
               const char* ssm_name) {
  r.state_tensors = {StateTensor{"conv", {conv_dim, conv_cols}, {}}, StateTensor{ssm_name, std::move(ssm_shape), {}}};
  r.state_tensor_role = {0, 1};
}

std::uint32_t dtype_size(const Cfg& c, std::string_view field) {
  const std::string s = c.str(field);
  if (s == "float32") return 4;
  if (s == "bfloat16" || s == "float16") return 2;
  c.bad(field, fmt::format("'{}': expected \"float32\", \"bfloat16\" or \"float16\"", printable(s)));
}

// Qwen3-Next / Qwen3.5 (transformers models/qwen3_next/modeling_qwen3_next.py,
// Qwen3NextGatedDeltaNet): full attention every full_attention_interval-th layer (or as
// layer_types says), gated DeltaNet elsewhere. Its state per layer: conv over
// conv_dim = 2 * key_dim + value_dim channels (key_dim = linear_num_key_heads x
// linear_key_head_dim, value_dim = linear_num_value_heads x linear_value_head_dim) and the
// recurrent state [linear_num_value_heads, linear_key_head_dim, linear_value_head_dim].
Reading read_qwen3_next(const Cfg& c) {
  const std::uint32_t layers = c.num_layers();
  std::vector<bool> full(layers);
  if (auto lt = typed_layers(c, layers, "full_attention", "linear_attention")) {
    full = *lt;
  } else {
    const std::uint32_t every = c.u32_or("full_attention_interval", 4);  // Qwen3NextConfig's default
    for (std::uint32_t i = 0; i < layers; ++i) full[i] = (i + 1) % every == 0;
  }
  Reading r;
  for (bool f : full) r.kinds.push_back(f ? LayerKind::kFullAttention : LayerKind::kRecurrentState);
  r.attn = attention(c, {}, {});
  const std::uint64_t kh = c.u32("linear_num_key_heads"), kd = c.u32("linear_key_head_dim");
  const std::uint64_t vh = c.u32("linear_num_value_heads"), vd = c.u32("linear_value_head_dim");
  set_state(r, 2 * kh * kd + vh * vd, conv_columns(c, "linear_conv_kernel_dim"), {vh, kd, vd}, "recurrent");
  if (c.has("mamba_ssm_dtype")) r.ssm_dtype_bytes = dtype_size(c, "mamba_ssm_dtype");
  r.names = {"full", "sliding", "cross", "linear"};
  return r;
}

// yarn_get_mscale of transformers' DeepSeek-V3 modelling.
double yarn_mscale(double factor, double mscale) { return factor <= 1 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0; }

// DeepSeek-V3 / Kimi-K2 / DeepSeek-V3.2 (transformers models/deepseek_v3/modeling_deepseek_v3.py,
// DeepseekV3Attention; vLLM's MLAAttentionSpec): every layer caches one latent per token,
// kv_a_proj's kv_lora_rank compressed elements plus qk_rope_head_dim rotary ones, read as K
// and (its first kv_lora_rank elements) as V. Softmax scale qk_head_dim^-1/2, times
// yarn_get_mscale(factor, mscale_all_dim)^2 under yarn rope scaling. The MTP layers
// (num_nextn_predict_layers) are a draft model's, not counted here. V3.2 adds the DSA
// indexer (models/deepseek_v32): index_head_dim keys per token and layer, one head.
Reading read_deepseek(const Cfg& c, bool indexer) {
  const std::uint32_t layers = c.num_layers();
  Reading r;
  r.kinds.assign(layers, LayerKind::kFullAttention);
  r.mla = true;
  r.kv_lora_rank = c.u32("kv_lora_rank");
  r.rope_dim = c.u32("qk_rope_head_dim");
  const std::uint32_t nope = c.u32("qk_nope_head_dim");
  AttentionParams& a = r.attn;
  a.num_q_heads = c.u32("num_attention_heads");
  a.num_kv_heads = 1;
  a.head_dim = r.kv_lora_rank + r.rope_dim;
  a.kv_lora_rank = r.kv_lora_rank;
  a.qk_rope_head_dim = r.rope_dim;
  a.v_head_dim = c.u32("v_head_dim");
  a.query_pre_attn_scalar = static_cast<double>(nope) + r.rope_dim;
  a.scale = 1.0 / std::sqrt(a.query_pre_attn_scalar);
  if (c.has("rope_scaling")) {
    const json& rs = *c.find("rope_scaling");
    if (!rs.is_object()) c.bad("rope_scaling", fmt::format("expected an object or null, got {}", describe(rs)));
    const Cfg s{rs, c.source, c.prefix + "rope_scaling.", nullptr};
    if (const auto m = s.positive("mscale_all_dim")) {
      const double factor = s.positive("factor").value_or(1.0);
      a.scale *= yarn_mscale(factor, *m) * yarn_mscale(factor, *m);
    }
  }
  r.names = {"mla", "sliding", "cross", "mamba"};
  if (indexer) {
    r.indexer = true;
    r.indexer_attn.num_q_heads = c.u32("index_n_heads");
    r.indexer_attn.num_kv_heads = 1;
    r.indexer_attn.head_dim = c.u32("index_head_dim");
    r.indexer_attn.query_pre_attn_scalar = r.indexer_attn.head_dim;
    r.indexer_attn.scale = 1.0 / std::sqrt(static_cast<double>(r.indexer_attn.head_dim));
  }
  return r;
}

// gpt-oss (transformers models/gpt_oss/modeling_gpt_oss.py): layer_types alternate
// sliding_window (128) and full layers (GptOssConfig's default: even layers slide). Its
// sinks are an nn.Parameter of one logit per head added to the softmax's denominator:
// weights, not cached tokens, so no page holds them (vLLM and SGLang treat them alike).
Reading read_gpt_oss(const Cfg& c) {
  const std::uint32_t layers = c.num_layers();
  std::vector<bool> sliding(layers);
  for (std::uint32_t i = 0; i < layers; ++i) sliding[i] = i % 2 == 0;
  if (auto lt = c.layer_types(layers)) sliding = *lt;
  const std::uint32_t window = c.has("sliding_window") ? c.u32("sliding_window") : 0;
  AttentionParams a = attention(c, {}, {});
  a.learned_sinks = true;
  return full_or_sliding(c, sliding, window, a);
}

// Llama 4 (transformers models/llama4/modeling_llama4.py, Llama4TextAttention): layers with
// RoPE attend within attention_chunk_size-token chunks, the NoPE layers (every 4th by
// Llama4TextConfig's default no_rope_layers) attend to everything. layer_types
// ("chunked_attention" / "full_attention") or no_rope_layers (1 = RoPE = chunked) say which.
Reading read_llama4(const Cfg& root) {
  const Cfg c = root.j.contains("text_config") ? root.sub("text_config", nullptr) : root;
  const std::uint32_t layers = c.num_layers();
  const std::uint32_t chunk = c.has("attention_chunk_size") ? c.u32("attention_chunk_size") : 0;
  std::vector<bool> chunked(layers);
  for (std::uint32_t i = 0; i < layers; ++i) chunked[i] = (i + 1) % 4 != 0;
  if (auto lt = typed_layers(c, layers, "chunked_attention", "full_attention")) {
    chunked = *lt;
  } else if (c.has("no_rope_layers")) {
    const json& nr = *c.find("no_rope_layers");
    if (!nr.is_array() || nr.size() != layers)
      c.bad("no_rope_layers", fmt::format("expected an array of num_hidden_layers = {} integers", layers));
    for (std::uint32_t i = 0; i < layers; ++i) {
      if (nr[i] != 0 && nr[i] != 1)
        c.bad(fmt::format("no_rope_layers[{}]", i), fmt::format("expected 0 or 1, got {}", describe(nr[i])));
      chunked[i] = nr[i] == 1;
    }
  }
  Reading r;
  r.attn = attention(c, {}, {});
  r.attn.attention_chunk = chunk;
  for (bool x : chunked) r.kinds.push_back(x && chunk != 0 ? LayerKind::kChunkedLocal : LayerKind::kFullAttention);
  r.names = {"global", "sliding", "cross", "mamba"};
  return r;
}

// Gemma3nTextConfig's defaults (transformers models/gemma3n/configuration_gemma3n.py, the
// google/gemma-3n-E4B checkpoint) for the keys kvmm reads.
const json& gemma3n_defaults() {
  static const json d = {{"num_hidden_layers", 35},   {"num_attention_heads", 8}, {"num_key_value_heads", 2},
                         {"head_dim", 256},           {"hidden_size", 2048},      {"sliding_window", 512},
                         {"num_kv_shared_layers", 15}};
  return d;
}

// Gemma-3n (transformers models/gemma3n: configuration_gemma3n.py's kv_sharing_roles and
// modeling_gemma3n.py): every 5th layer full, the others sliding; the last
// num_kv_shared_layers layers compute no K/V and read those of the last earlier layer of
// their type. Queries and keys are RMS-normed and the attention scaling is 1.0.
Reading read_gemma3n(const Cfg& c) {
  const std::uint32_t layers = c.num_layers();
  std::vector<bool> sliding(layers);
  for (std::uint32_t i = 0; i < layers; ++i) sliding[i] = (i + 1) % 5 != 0;
  if (auto lt = c.layer_types(layers)) sliding = *lt;
  const std::uint32_t shared = c.index("num_kv_shared_layers");
  if (shared >= layers)
    c.bad("num_kv_shared_layers", fmt::format("{}: at least one of the {} layers must own its KV", shared, layers));
  Reading r = full_or_sliding(c, sliding, c.u32("sliding_window"), attention(c, 1.0, {}));
  r.kv_owner.assign(layers, -1);
  const std::uint32_t first = layers - shared;
  for (std::uint32_t i = first; i < layers; ++i) {
    std::int64_t owner = -1;
    for (std::uint32_t j = 0; j < first; ++j)
      if (sliding[j] == sliding[i]) owner = j;
    if (owner < 0)
      c.bad("num_kv_shared_layers", fmt::format("{}: shared layer {} ({}) has no earlier {} layer to read", shared, i,
                                                sliding[i] ? "sliding" : "full", sliding[i] ? "sliding" : "full"));
    r.kv_owner[i] = owner;
  }
  r.names = {"global", "local", "cross", "mamba"};
  return r;
}

// Nemotron-H (its modeling_nemotron_h.py, published beside the config; vLLM's
// nemotron_h.py): hybrid_override_pattern gives one character per layer, 'M' Mamba2,
// '*' attention, '-' MLP and 'E' MoE (no cache). A Mamba2 layer's state: conv over
// d_inner + 2 x n_groups x ssm_state_size channels (d_inner = mamba_num_heads x
// mamba_head_dim) and the SSM state [mamba_num_heads, mamba_head_dim, ssm_state_size].
Reading read_nemotron_h(const Cfg& c) {
  const std::uint32_t layers = c.num_layers();
  const std::string pattern = c.str("hybrid_override_pattern");
  if (pattern.size() != layers)
    c.bad("hybrid_override_pattern", fmt::format("{} characters for num_hidden_layers = {}", pattern.size(), layers));
  Reading r;
  r.no_cache.assign(layers, false);
  for (std::uint32_t i = 0; i < layers; ++i) {
    switch (pattern[i]) {
      case 'M':
        r.kinds.push_back(LayerKind::kRecurrentState);
        break;
      case '*':
        r.kinds.push_back(LayerKind::kFullAttention);
        break;
      case '-':
      case 'E':
        r.kinds.push_back(LayerKind::kFullAttention);
        r.no_cache[i] = true;
        break;
      default:
        c.bad("hybrid_override_pattern",
              fmt::format("character {} is '{}': expected 'M', '*', '-' or 'E'", i, printable(pattern.substr(i, 1))));
    }
  }
  r.attn = attention(c, {}, {});
  if (!c.has("head_dim") && c.has("attention_head_dim")) {
    r.attn.head_dim = c.u32("attention_head_dim");
    r.attn.query_pre_attn_scalar = r.attn.head_dim;
    r.attn.scale = 1.0 / std::sqrt(r.attn.query_pre_attn_scalar);
  }
  const std::uint64_t heads = c.u32("mamba_num_heads"), hd = c.u32("mamba_head_dim");
  const std::uint64_t groups = c.u32("n_groups"), state = c.u32("ssm_state_size");
  set_state(r, heads * hd + 2 * groups * state, conv_columns(c, "conv_kernel"), {heads, hd, state}, "ssm");
  r.names = {"attention", "sliding", "cross", "mamba"};
  return r;
}

// Falcon-H1 (transformers models/falcon_h1/modeling_falcon_h1.py, FalconH1DecoderLayer):
// every layer runs attention and a Mamba2 mixer side by side, so each holds K/V pages and a
// state. mamba_d_ssm (null: mamba_expand x hidden_size) channels in mamba_n_heads heads of
// mamba_d_head ("auto": d_ssm / n_heads); conv over d_ssm + 2 x mamba_n_groups x
// mamba_d_state channels, SSM state [mamba_n_heads, mamba_d_head, mamba_d_state].
Reading read_falcon_h1(const Cfg& c) {
  const std::uint32_t layers = c.num_layers();
  Reading r;
  r.kinds.assign(layers, LayerKind::kFullAttention);
  r.aux_state.assign(layers, true);
  r.attn = attention(c, {}, {});
  const std::uint64_t d_ssm = c.has("mamba_d_ssm")
                                  ? c.u32("mamba_d_ssm")
                                  : checked_mul(c.u32("mamba_expand"), c.u32("hidden_size"), "mamba d_ssm");
  const std::uint64_t heads = c.u32("mamba_n_heads");
  std::uint64_t head_dim = 0;
  if (c.has("mamba_d_head") && c.find("mamba_d_head")->is_string()) {
    if (c.str("mamba_d_head") != "auto") c.bad("mamba_d_head", "expected a positive integer or \"auto\"");
    head_dim = d_ssm / heads;
  } else {
    head_dim = c.u32("mamba_d_head");
  }
  if (head_dim * heads != d_ssm)
    c.bad("mamba_d_head", fmt::format("{} x mamba_n_heads {} is not mamba_d_ssm = {}", head_dim, heads, d_ssm));
  const std::uint64_t groups = c.u32("mamba_n_groups"), state = c.u32("mamba_d_state");
  set_state(r, d_ssm + 2 * groups * state, conv_columns(c, "mamba_d_conv"), {heads, head_dim, state}, "ssm");
  r.names = {"attention", "sliding", "cross", "mamba"};
  return r;
}

// MiniMax-Text-01 (transformers models/minimax/modeling_minimax.py,
// MiniMaxLightningAttention; vLLM's minimax_text_01.py): softmax layers where layer_types
// says "full_attention" (the published config's attn_type_list: 1), lightning attention
// elsewhere, whose state is one [num_attention_heads, head_dim, head_dim] matrix per layer
// (vLLM keeps it in fp32: set ssm_state_dtype_bytes = 4 to match).
Reading read_minimax(const Cfg& c) {
  const std::uint32_t layers = c.num_layers();
  std::vector<bool> full(layers);
  for (std::uint32_t i = 0; i < layers; ++i) full[i] = (i + 1) % 2 != 0;  // MiniMaxConfig's default
  if (auto lt = typed_layers(c, layers, "full_attention", "linear_attention")) {
    full = *lt;
  } else if (c.has("attn_type_list")) {
    const json& at = *c.find("attn_type_list");
    if (!at.is_array() || at.size() != layers)
      c.bad("attn_type_list", fmt::format("expected an array of num_hidden_layers = {} integers", layers));
    for (std::uint32_t i = 0; i < layers; ++i) {
      if (at[i] != 0 && at[i] != 1)
        c.bad(fmt::format("attn_type_list[{}]", i), fmt::format("expected 0 or 1, got {}", describe(at[i])));
      full[i] = at[i] == 1;
    }
  }
  Reading r;
  for (bool f : full) r.kinds.push_back(f ? LayerKind::kFullAttention : LayerKind::kRecurrentState);
  r.attn = attention(c, {}, {});
  r.state_tensors = {StateTensor{"kv", {r.attn.num_q_heads, r.attn.head_dim, r.attn.head_dim}, {}}};
  r.state_tensor_role = {1};
  r.names = {"full", "sliding", "cross", "linear"};
  return r;
}

}  // namespace

const std::vector<std::string>& lineup_model_types() {
  static const std::vector<std::string> kTypes{
      "qwen3_next",   "qwen3_5",  "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text", "deepseek_v3",
      "deepseek_v32", "kimi_k2",  "glm4_moe",     "minimax_m2",  "gpt_oss",          "llama4",
      "llama4_text",  "gemma3n",  "gemma3n_text", "nemotron_h",  "falcon_h1",        "minimax",
      "phi3",         "mistral3", "ministral3",   "qwen2_5_vl",  "qwen3_vl"};
  return kTypes;
}

std::optional<Reading> read_lineup(const Cfg& root, const std::string& type, const HfConfigOptions& /*o*/) {
  if (type == "qwen3_next" || type == "qwen3_5_text" || type == "qwen3_5_moe_text") return read_qwen3_next(root);
  if (type == "qwen3_5" || type == "qwen3_5_moe") return read_qwen3_next(root.sub("text_config", nullptr));
  if (type == "deepseek_v3" || type == "kimi_k2") return read_deepseek(root, false);
  if (type == "deepseek_v32") return read_deepseek(root, true);
  if (type == "gpt_oss") return read_gpt_oss(root);
  if (type == "llama4" || type == "llama4_text") return read_llama4(root);
  if (type == "gemma3n") return read_gemma3n(root.sub("text_config", &gemma3n_defaults()));
  if (type == "gemma3n_text") return read_gemma3n(Cfg{root.j, root.source, "", &gemma3n_defaults()});
  if (type == "nemotron_h") return read_nemotron_h(root);
  if (type == "falcon_h1") return read_falcon_h1(root);
  if (type == "minimax") return read_minimax(root);
  return std::nullopt;
}

}  // namespace kvmm::hf
