// Model description for kvmm-sim: a preset name (kvmm::presets) or a Hugging Face
// config.json (any family kvmm::read_hf_config reads), turned into a planned
// kvmm::KVLayout. Reading a config is a one-off parse (well under a millisecond); errors
// raise kvmm::Error naming the file, the line (for JSON syntax) and the field.
#pragma once

#include "kvmm/spec/presets.hpp"

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvmm::sim {

struct ModelOptions {
  std::uint32_t tokens_per_page = 16;
  std::uint32_t dtype_bytes = 2;        // KV element size
  std::uint32_t state_dtype_bytes = 2;  // Mamba state element size
  // (group name, tokens per page): overrides tokens_per_page for those groups only
  // (Jenga's allocator takes a page size per group); applied by load_model.
  std::vector<std::pair<std::string, std::uint32_t>> group_tokens_per_page;
  // LayoutOptions::max_large_page_bytes for the planner (0: the library's default).
  std::uint64_t max_large_page_bytes = 0;
  // KV element format of the attention groups (parse_kv_cache_dtype's names; "auto" keeps
  // dtype_bytes), as PresetOptions / HfConfigOptions::kv_cache_dtype.
  std::string kv_cache_dtype = "auto";
  // LayoutOptions::fit_tokens_per_page: kvmm's plan shrinks the attention pages rather than
  // pad when the LCM passes the limit. Off for the policies of other engines' managers,
  // which page the model at the tokens per page asked for (kvmm-sim's main).
  bool fit_tokens_per_page = true;
  // LayoutOptions::max_state_pages_per_large_page for the planner (unset: the library's
  // default); applies where fit_tokens_per_page does (kvmm's plan).
  std::optional<std::uint32_t> max_state_pages_per_large_page;
};

// Builds the layout of a Hugging Face config.json text; `file` names it in errors.
KVLayout layout_from_hf_config(std::string_view json_text, std::string_view file, const ModelOptions& o = {});
// Reads the file and calls layout_from_hf_config.
KVLayout layout_from_hf_config_file(const std::string& path, const ModelOptions& o = {});
// The layout re-planned (with `options`) from the tokens per page each group was asked for
// (requested_tokens_per_page), the named groups' replaced. Raises kvmm::Error for an
// unknown group name or 0 tokens.
KVLayout with_group_tokens_per_page(const KVLayout& layout,
                                    const std::vector<std::pair<std::string, std::uint32_t>>& overrides,
                                    const LayoutOptions& options = {});
// A preset name, or a path ending in .json; then o.group_tokens_per_page.
KVLayout load_model(const std::string& name_or_path, const ModelOptions& o = {});

}  // namespace kvmm::sim
