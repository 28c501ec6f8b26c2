// Model description for kvmm-sim: a preset name (kvmm::presets) or a Hugging Face
// config.json of the llama, mllama, gemma2, gemma3, mistral or jamba families, turned
// into a planned kvmm::KVLayout. Reading a config is a one-off parse (milliseconds);
// errors raise kvmm::Error naming the file, the line (for JSON syntax) and the field.
#pragma once

#include "kvmm/spec/presets.hpp"

#include <string>
#include <string_view>

namespace kvmm::sim {

struct ModelOptions {
  std::uint32_t tokens_per_page = 16;
  std::uint32_t dtype_bytes = 2;        // KV element size
  std::uint32_t state_dtype_bytes = 2;  // Mamba state element size
};

// Builds the layout of a Hugging Face config.json text; `file` names it in errors.
KVLayout layout_from_hf_config(std::string_view json_text, std::string_view file,
                               const ModelOptions& o = {});
// Reads the file and calls layout_from_hf_config.
KVLayout layout_from_hf_config_file(const std::string& path, const ModelOptions& o = {});
// A preset name, or a path ending in .json.
KVLayout load_model(const std::string& name_or_path, const ModelOptions& o = {});

}  // namespace kvmm::sim
