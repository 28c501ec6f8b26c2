// kvmm-sim's model loading: presets by name, Hugging Face configs through the library's
// reader (kvmm::read_hf_config), per-group tokens-per-page overrides. One-off, milliseconds.
// Layouts are planned unsliced (LayoutOptions::slice_layers off): the engines' models page
// the model's own groups, and kvmm's policy applies the library's slicing rule itself.
#include "sim/model_config.hpp"

#include "kvmm/error.hpp"
#include "kvmm/spec/hf_config.hpp"

#include <optional>
#include <vector>

namespace kvmm::sim {

namespace {

HfConfigOptions hf_options(const ModelOptions& o) {
  HfConfigOptions h;
  h.tokens_per_page = o.tokens_per_page;
  h.dtype_bytes = o.dtype_bytes;
  h.state_dtype_bytes = o.state_dtype_bytes;
  h.kv_cache_dtype = o.kv_cache_dtype;
  if (o.max_large_page_bytes > 0) h.layout.max_large_page_bytes = o.max_large_page_bytes;
  h.layout.fit_tokens_per_page = o.fit_tokens_per_page;
  if (o.max_state_pages_per_large_page) h.layout.max_state_pages_per_large_page = *o.max_state_pages_per_large_page;
  h.layout.slice_layers = SliceLayers::kOff;  // kvmm's policy slices (PolicyOptions::slice_layers)
  return h;
}

}  // namespace

// The library's reader (kvmm/spec/hf_config.hpp) does the work; the simulator needs the
// layout only.
KVLayout layout_from_hf_config(std::string_view json_text, std::string_view file, const ModelOptions& o) {
  return read_hf_config(json_text, file, hf_options(o)).layout;
}

KVLayout layout_from_hf_config_file(const std::string& path, const ModelOptions& o) {
  return read_hf_config_file(path, hf_options(o)).layout;
}

KVLayout with_group_tokens_per_page(const KVLayout& layout,
                                    const std::vector<std::pair<std::string, std::uint32_t>>& overrides,
                                    const LayoutOptions& options) {
  std::vector<LayerGroup> groups = layout.groups();
  for (GroupId g = 0; g < groups.size(); ++g) groups[g].tokens_per_page = layout.requested_tokens_per_page(g);
  for (const auto& [name, tokens] : overrides) {
    const std::optional<GroupId> g = layout.find_group(name);
    if (!g) fail("group = '{}': no such group in the model (tokens per page override)", name);
    if (tokens == 0) fail("group = '{}': tokens per page = 0: must be >= 1", name);
    groups[*g].tokens_per_page = tokens;
  }
  return KVLayout::plan(std::move(groups), options);
}

KVLayout load_model(const std::string& name_or_path, const ModelOptions& o) {
  KVLayout layout = [&] {
    if (name_or_path.size() > 5 && name_or_path.ends_with(".json")) return layout_from_hf_config_file(name_or_path, o);
    presets::PresetOptions p;
    p.tokens_per_page = o.tokens_per_page;
    p.dtype_bytes = o.dtype_bytes;
    p.state_dtype_bytes = o.state_dtype_bytes;
    p.kv_cache_dtype = o.kv_cache_dtype;
    if (o.max_large_page_bytes > 0) p.layout.max_large_page_bytes = o.max_large_page_bytes;
    p.layout.fit_tokens_per_page = o.fit_tokens_per_page;
    if (o.max_state_pages_per_large_page) p.layout.max_state_pages_per_large_page = *o.max_state_pages_per_large_page;
    p.layout.slice_layers = SliceLayers::kOff;
    return presets::by_name(name_or_path, p);
  }();
  if (o.group_tokens_per_page.empty()) return layout;
  // Sizes chosen per group are kept: padded rather than fitted.
  LayoutOptions lo;
  lo.fit_tokens_per_page = false;
  lo.slice_layers = SliceLayers::kOff;
  if (o.max_large_page_bytes > 0) lo.max_large_page_bytes = o.max_large_page_bytes;
  return with_group_tokens_per_page(layout, o.group_tokens_per_page, lo);
}

}  // namespace kvmm::sim
