#include "sim/model_config.hpp"

#include "kvmm/error.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <optional>
#include <sstream>
#include <vector>

namespace kvmm::sim {

namespace {

using nlohmann::json;

// One config object plus the path prefix used in error messages ("text_config.").
struct Cfg {
  const json& j;
  std::string_view file;
  std::string prefix;

  [[noreturn]] void bad(std::string_view field, std::string_view why) const {
    fail("{}: field '{}{}': {}", file, prefix, field, why);
  }
  bool has(std::string_view field) const {
    auto it = j.find(field);
    return it != j.end() && !it->is_null();
  }
  std::uint32_t u32(std::string_view field) const {
    auto it = j.find(field);
    if (it == j.end() || it->is_null()) bad(field, "missing");
    if (!it->is_number_integer() || it->get<std::int64_t>() <= 0 ||
        it->get<std::int64_t>() > std::int64_t{1} << 31)
      bad(field, fmt::format("expected a positive integer, got {}", it->dump()));
    return static_cast<std::uint32_t>(it->get<std::int64_t>());
  }
  std::uint32_t u32_or(std::string_view field, std::uint32_t fallback) const {
    return has(field) ? u32(field) : fallback;
  }
  std::uint32_t u32_or_zero(std::string_view field) const {
    // for offsets that may legitimately be 0
    auto it = j.find(field);
    if (it == j.end() || it->is_null()) bad(field, "missing");
    if (!it->is_number_integer() || it->get<std::int64_t>() < 0)
      bad(field, fmt::format("expected a non-negative integer, got {}", it->dump()));
    return static_cast<std::uint32_t>(it->get<std::int64_t>());
  }
  std::string str(std::string_view field) const {
    auto it = j.find(field);
    if (it == j.end() || it->is_null()) bad(field, "missing");
    if (!it->is_string()) bad(field, fmt::format("expected a string, got {}", it->dump()));
    return it->get<std::string>();
  }
  Cfg sub(std::string_view field) const {
    auto it = j.find(field);
    if (it == j.end() || !it->is_object()) bad(field, "missing or not an object");
    return Cfg{*it, file, prefix + std::string(field) + "."};
  }
  // head_dim, or hidden_size / num_attention_heads.
  std::uint32_t head_dim() const {
    if (has("head_dim")) return u32("head_dim");
    const std::uint32_t hidden = u32("hidden_size"), heads = u32("num_attention_heads");
    if (hidden % heads != 0)
      bad("hidden_size", fmt::format("{} is not a multiple of num_attention_heads = {}", hidden, heads));
    return hidden / heads;
  }
  std::uint32_t kv_heads() const {
    return has("num_key_value_heads") ? u32("num_key_value_heads") : u32("num_attention_heads");
  }
  // Per-layer "is sliding" from layer_types when present; nullopt otherwise.
  std::optional<std::vector<bool>> layer_types(std::uint32_t layers) const {
    if (!has("layer_types")) return std::nullopt;
    const json& lt = j["layer_types"];
    if (!lt.is_array() || lt.size() != layers)
      bad("layer_types", fmt::format("expected an array of num_hidden_layers = {} strings", layers));
    std::vector<bool> sliding(layers);
    for (std::uint32_t i = 0; i < layers; ++i) {
      const json& t = lt[i];
      if (t == "sliding_attention") sliding[i] = true;
      else if (t == "full_attention") sliding[i] = false;
      else
        bad(fmt::format("layer_types[{}]", i),
            fmt::format("expected \"full_attention\" or \"sliding_attention\", got {}", t.dump()));
    }
    return sliding;
  }
};

// Full/sliding split of one attention stack into at most two groups.
std::vector<LayerGroup> full_and_sliding(const Cfg& c, const std::vector<bool>& sliding,
                                         std::uint32_t window, const ModelOptions& o,
                                         const char* full_name, const char* sliding_name) {
  std::uint32_t n_sliding = 0;
  for (bool s : sliding) n_sliding += s ? 1 : 0;
  const auto n_full = static_cast<std::uint32_t>(sliding.size()) - n_sliding;
  const std::uint32_t kvh = c.kv_heads(), hd = c.head_dim();
  std::vector<LayerGroup> g;
  if (n_full > 0)
    g.push_back(LayerGroup::full_attention(full_name, n_full, kvh, hd, o.dtype_bytes, o.tokens_per_page));
  if (n_sliding > 0)
    g.push_back(LayerGroup::sliding_window(sliding_name, n_sliding, kvh, hd, o.dtype_bytes,
                                           o.tokens_per_page, window));
  return g;
}

std::vector<LayerGroup> groups_for(const Cfg& root, const ModelOptions& o) {
  const std::string type = root.str("model_type");
  if (type == "llama") {
    return {LayerGroup::full_attention("full", root.u32("num_hidden_layers"), root.kv_heads(),
                                       root.head_dim(), o.dtype_bytes, o.tokens_per_page)};
  }
  if (type == "mistral" || type == "ministral") {
    const std::uint32_t layers = root.u32("num_hidden_layers");
    std::vector<bool> sliding(layers, false);
    std::uint32_t window = 0;
    if (root.has("sliding_window")) {
      window = root.u32("sliding_window");
      sliding.assign(layers, true);
    }
    if (auto lt = root.layer_types(layers)) {
      sliding = *lt;
      bool any = false;
      for (bool s : sliding) any |= s;
      if (any && window == 0) root.bad("sliding_window", "missing but layer_types has sliding layers");
    }
    return full_and_sliding(root, sliding, window, o, "full", "sliding");
  }
  if (type == "gemma2" || type == "gemma3" || type == "gemma3_text") {
    const Cfg c = (type == "gemma3" && root.has("text_config")) ? root.sub("text_config") : root;
    const std::uint32_t layers = c.u32("num_hidden_layers");
    const std::uint32_t window = c.u32("sliding_window");
    std::vector<bool> sliding(layers);
    if (auto lt = c.layer_types(layers)) {
      sliding = *lt;
    } else if (type == "gemma2") {
      for (std::uint32_t i = 0; i < layers; ++i) sliding[i] = i % 2 == 0;  // even layers local
    } else {
      const std::uint32_t pattern = c.u32_or("sliding_window_pattern", 6);
      for (std::uint32_t i = 0; i < layers; ++i) sliding[i] = (i + 1) % pattern != 0;
    }
    return full_and_sliding(c, sliding, window, o, "global", "local");
  }
  if (type == "mllama") {
    const Cfg c = root.sub("text_config");
    const std::uint32_t layers = c.u32("num_hidden_layers");
    if (!c.has("cross_attention_layers") || !c.j["cross_attention_layers"].is_array())
      c.bad("cross_attention_layers", "missing or not an array");
    const auto& cl = c.j["cross_attention_layers"];
    for (std::size_t i = 0; i < cl.size(); ++i)
      if (!cl[i].is_number_integer() || cl[i].get<std::int64_t>() < 0 || cl[i].get<std::int64_t>() >= layers)
        c.bad(fmt::format("cross_attention_layers[{}]", i),
              fmt::format("expected a layer index below num_hidden_layers = {}, got {}", layers, cl[i].dump()));
    const auto n_cross = static_cast<std::uint32_t>(cl.size());
    if (n_cross >= layers) c.bad("cross_attention_layers", "every layer is a cross-attention layer");
    std::vector<LayerGroup> g{LayerGroup::full_attention("self", layers - n_cross, c.kv_heads(), c.head_dim(),
                                                         o.dtype_bytes, o.tokens_per_page)};
    if (n_cross > 0)
      g.push_back(LayerGroup::cross_attention("cross", n_cross, c.kv_heads(), c.head_dim(), o.dtype_bytes,
                                              o.tokens_per_page));
    return g;
  }
  if (type == "jamba") {
    const std::uint32_t layers = root.u32("num_hidden_layers");
    const std::uint32_t period = root.u32("attn_layer_period");
    const std::uint32_t offset = root.u32_or_zero("attn_layer_offset");
    if (offset >= period)
      root.bad("attn_layer_offset", fmt::format("{} must be below attn_layer_period = {}", offset, period));
    std::uint32_t n_attn = 0;
    for (std::uint32_t i = 0; i < layers; ++i) n_attn += i % period == offset ? 1 : 0;
    const std::uint64_t d_inner = std::uint64_t{root.u32("mamba_expand")} * root.u32("hidden_size");
    const std::uint64_t d_state = root.u32("mamba_d_state"), d_conv = root.u32("mamba_d_conv");
    const std::uint64_t state = (d_inner * (d_conv - 1) + d_inner * d_state) * o.state_dtype_bytes;
    std::vector<LayerGroup> g;
    if (n_attn > 0)
      g.push_back(LayerGroup::full_attention("attention", n_attn, root.kv_heads(), root.head_dim(),
                                             o.dtype_bytes, o.tokens_per_page));
    if (n_attn < layers) g.push_back(LayerGroup::mamba_state("mamba", layers - n_attn, state));
    return g;
  }
  root.bad("model_type",
           fmt::format("'{}' is not supported; supported: llama, mllama, gemma2, gemma3, mistral, jamba", type));
}

}  // namespace

KVLayout layout_from_hf_config(std::string_view json_text, std::string_view file, const ModelOptions& o) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::parse_error& e) {
    // Turn the byte offset into line:column.
    const std::size_t at = std::min<std::size_t>(e.byte > 0 ? e.byte - 1 : 0, json_text.size());
    std::size_t line = 1, col = 1;
    for (std::size_t i = 0; i < at; ++i) {
      if (json_text[i] == '\n') { ++line; col = 1; } else { ++col; }
    }
    fail("{}:{}:{}: malformed JSON: {}", file, line, col, e.what());
  }
  if (!j.is_object()) fail("{}: expected a JSON object at the top level", file);
  const Cfg root{j, file, ""};
  try {
    return KVLayout::plan(groups_for(root, o));
  } catch (const json::exception& e) {
    fail("{}: {}", file, e.what());
  }
}

KVLayout layout_from_hf_config_file(const std::string& path, const ModelOptions& o) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("model = '{}': cannot open the file", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return layout_from_hf_config(ss.str(), path, o);
}

KVLayout with_group_tokens_per_page(const KVLayout& layout,
                                    const std::vector<std::pair<std::string, std::uint32_t>>& overrides) {
  std::vector<LayerGroup> groups = layout.groups();
  for (const auto& [name, tokens] : overrides) {
    const std::optional<GroupId> g = layout.find_group(name);
    if (!g) fail("group = '{}': no such group in the model (tokens per page override)", name);
    if (tokens == 0) fail("group = '{}': tokens per page = 0: must be >= 1", name);
    groups[*g].tokens_per_page = tokens;
  }
  return KVLayout::plan(std::move(groups));
}

KVLayout load_model(const std::string& name_or_path, const ModelOptions& o) {
  KVLayout layout = [&] {
    if (name_or_path.size() > 5 && name_or_path.ends_with(".json")) return layout_from_hf_config_file(name_or_path, o);
    presets::PresetOptions p;
    p.tokens_per_page = o.tokens_per_page;
    p.dtype_bytes = o.dtype_bytes;
    p.state_dtype_bytes = o.state_dtype_bytes;
    return presets::by_name(name_or_path, p);
  }();
  if (o.group_tokens_per_page.empty()) return layout;
  return with_group_tokens_per_page(layout, o.group_tokens_per_page);
}

}  // namespace kvmm::sim
