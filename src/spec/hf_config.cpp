// Hugging Face config.json reader (kvmm/spec/hf_config.hpp). Each family's reader turns
// its fields into one kind per decoder layer plus the attention parameters its layers
// share; one assembler turns that into groups, layer placements and the planned layout.
// nlohmann-json is used in this file only (a private, build-time dependency of kvmm).
// Hostile text is bounded before nlohmann parses it (size, nesting depth, numbers past
// double's range: json_scan.hpp), and every message renders values without recursion,
// cut to a few dozen bytes of printable ASCII.
#include "kvmm/spec/hf_config.hpp"

#include "hf_reader.hpp"
#include "json_scan.hpp"

#include "kvmm/checked.hpp"
#include "kvmm/error.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <optional>

namespace kvmm {

namespace {

using namespace hf;  // NOLINT(google-build-using-namespace): the private reader toolkit
using nlohmann::json;

Reading read_llama(const Cfg& c) {
  const std::uint32_t layers = c.num_layers();  // first: errors name fields in config order
  return full_or_sliding(c, std::vector<bool>(layers, false), 0, attention(c, {}, {}));
}

// Mistral: a non-null sliding_window slides every layer (as transformers does), unless
// layer_types says which. Ministral-8B's config has sliding_window 32768 and no
// layer_types, so it reads as 36 sliding layers; vLLM's 1 full : 3 sliding interleaving
// (the ministral_8b preset) is not in the config.
Reading read_mistral(const Cfg& c) {
  const std::uint32_t layers = c.num_layers();
  const std::uint32_t window = c.has("sliding_window") ? c.u32("sliding_window") : 0;
  std::vector<bool> sliding(layers, window != 0);
  if (auto lt = c.layer_types(layers)) sliding = *lt;
  return full_or_sliding(c, sliding, window, attention(c, {}, {}));
}

// Qwen2 / Qwen3: sliding only with use_sliding_window, then for layers at or past
// max_window_layers (transformers' rule), unless layer_types says which.
Reading read_qwen(const Cfg& c) {
  const std::uint32_t layers = c.num_layers();
  const bool use_sliding = c.flag_or("use_sliding_window", false);
  const std::uint32_t window = use_sliding && c.has("sliding_window") ? c.u32("sliding_window") : 0;
  std::vector<bool> sliding(layers, false);
  if (window != 0) {
    const std::uint32_t first = c.index("max_window_layers");
    for (std::uint32_t i = first; i < layers; ++i) sliding[i] = true;
  }
  if (auto lt = c.layer_types(layers)) sliding = *lt;
  return full_or_sliding(c, sliding, window, attention(c, {}, {}));
}

// Gemma2Config / Gemma3TextConfig defaults (transformers) for the keys kvmm reads.
const json& gemma2_defaults() {
  static const json d = {{"num_hidden_layers", 26}, {"num_attention_heads", 8},      {"num_key_value_heads", 4},
                         {"head_dim", 256},         {"hidden_size", 2304},           {"query_pre_attn_scalar", 256},
                         {"sliding_window", 4096},  {"attn_logit_softcapping", 50.0}};
  return d;
}
const json& gemma3_defaults() {
  static const json d = {{"num_hidden_layers", 26},    {"num_attention_heads", 8},
                         {"num_key_value_heads", 4},   {"head_dim", 256},
                         {"hidden_size", 2304},        {"query_pre_attn_scalar", 256},
                         {"sliding_window", 4096},     {"attn_logit_softcapping", nullptr},
                         {"sliding_window_pattern", 6}};
  return d;
}

// Gemma 2: even layers sliding. Gemma 3: every sliding_window_pattern-th layer global.
// layer_types, when present, decides for both.
Reading read_gemma(const Cfg& c, bool gemma3) {
  const std::uint32_t layers = c.num_layers();
  const std::uint32_t window = c.u32("sliding_window");
  std::vector<bool> sliding(layers);
  if (auto lt = c.layer_types(layers)) {
    sliding = *lt;
  } else {
    const std::uint32_t pattern = gemma3 ? c.u32("sliding_window_pattern") : 2;
    for (std::uint32_t i = 0; i < layers; ++i) sliding[i] = (i + 1) % pattern != 0;
  }
  Reading r = full_or_sliding(c, sliding, window,
                              attention(c, c.positive("query_pre_attn_scalar"), c.positive("attn_logit_softcapping")));
  r.names = {"global", "local", "cross", "mamba"};
  return r;
}

// MllamaTextConfig defaults (transformers): the Llama-3.2-11B-Vision text model.
const json& mllama_text_defaults() {
  static const json d = {{"num_hidden_layers", 40},
                         {"num_attention_heads", 32},
                         {"num_key_value_heads", 8},
                         {"hidden_size", 4096},
                         {"cross_attention_layers", {3, 8, 13, 18, 23, 28, 33, 38}}};
  return d;
}

// Glm4MoeConfig defaults (transformers, src/transformers/models/glm4_moe/configuration_glm4_moe.py)
// for the keys kvmm reads: an absent num_key_value_heads is 8 there, not llama's "same as
// num_attention_heads". head_dim has no class default: the modelling code takes
// getattr(config, "head_dim", hidden_size // num_attention_heads), as attention() does
// (which refuses a hidden_size that is no multiple, where Python would round down).
const json& glm4_moe_defaults() {
  static const json d = {
      {"num_hidden_layers", 46}, {"num_attention_heads", 96}, {"num_key_value_heads", 8}, {"hidden_size", 4096}};
  return d;
}

// Mllama: text_config's cross_attention_layers attend to image tokens, the rest to text.
Reading read_mllama(const Cfg& root) {
  const Cfg c = root.sub("text_config", &mllama_text_defaults());
  const std::uint32_t layers = c.num_layers();
  if (!c.has("cross_attention_layers") || !c.find("cross_attention_layers")->is_array())
    c.bad("cross_attention_layers", "missing or not an array");
  const json& cl = *c.find("cross_attention_layers");
  std::vector<bool> cross(layers, false);
  for (std::size_t i = 0; i < cl.size(); ++i) {
    const std::string field = fmt::format("cross_attention_layers[{}]", i);
    if (!cl[i].is_number_integer() || cl[i].get<std::int64_t>() < 0 || cl[i].get<std::int64_t>() >= layers)
      c.bad(field, fmt::format("expected a layer index below num_hidden_layers = {}, got {}", layers, describe(cl[i])));
    const auto layer = static_cast<std::uint32_t>(cl[i].get<std::int64_t>());
    if (cross[layer]) c.bad(field, fmt::format("layer {} is listed twice", layer));
    cross[layer] = true;
  }
  if (cl.size() >= layers) c.bad("cross_attention_layers", "every layer is a cross-attention layer");
  Reading r;
  for (bool x : cross) r.kinds.push_back(x ? LayerKind::kCrossAttention : LayerKind::kFullAttention);
  r.attn = attention(c, {}, {});
  r.names = {"self", "sliding", "cross", "mamba"};
  return r;
}

// Jamba: attention where layer % attn_layer_period == attn_layer_offset, Mamba elsewhere;
// a Mamba layer's state is conv [d_inner, d_conv - 1] + SSM [d_inner, d_state] elements.
Reading read_jamba(const Cfg& c, const HfConfigOptions& o) {
  const std::uint32_t layers = c.num_layers();
  const std::uint32_t period = c.u32("attn_layer_period");
  const std::uint32_t offset = c.index("attn_layer_offset");
  if (offset >= period)
    c.bad("attn_layer_offset", fmt::format("{} must be below attn_layer_period = {}", offset, period));
  Reading r;
  for (std::uint32_t i = 0; i < layers; ++i)
    r.kinds.push_back(i % period == offset ? LayerKind::kFullAttention : LayerKind::kMambaState);
  r.attn = attention(c, {}, {});
  const std::uint64_t d_inner = checked_mul(c.u32("mamba_expand"), c.u32("hidden_size"), "mamba d_inner");
  const std::uint64_t d_conv = c.u32("mamba_d_conv"), d_state = c.u32("mamba_d_state");
  const std::uint64_t elems = checked_add(checked_mul(d_inner, d_conv - 1, "mamba conv state"),
                                          checked_mul(d_inner, d_state, "mamba SSM state"), "mamba state");
  r.state_bytes = checked_mul(elems, o.state_dtype_bytes, "mamba state bytes");
  r.names = {"attention", "sliding", "cross", "mamba"};
  return r;
}

Reading read_family(const Cfg& root, const std::string& type, const HfConfigOptions& o) {
  if (type == "llama") return read_llama(root);
  if (type == "mistral" || type == "ministral") return read_mistral(root);
  if (type == "qwen2" || type == "qwen3") return read_qwen(root);
  if (type == "gemma2") return read_gemma(Cfg{root.j, root.source, "", &gemma2_defaults()}, false);
  if (type == "gemma3_text") return read_gemma(Cfg{root.j, root.source, "", &gemma3_defaults()}, true);
  if (type == "gemma3") {
    // The multimodal config nests the text model; a bare one is read as the text model.
    const Cfg c = root.j.contains("text_config") ? root.sub("text_config", &gemma3_defaults())
                                                 : Cfg{root.j, root.source, "", &gemma3_defaults()};
    return read_gemma(c, true);
  }
  if (type == "mllama") return read_mllama(root);
  if (type == "jamba") return read_jamba(root, o);
  // Lineup families whose caches follow the rules above: GLM-4.5 (models/glm4_moe, with
  // its class defaults) and MiniMax-M2 are GQA on every layer (head_dim stated; their MTP
  // layers are a draft model's); Phi-3 slides every layer when sliding_window is set
  // (models/phi3, as mistral); Mistral-Small-3.x and Ministral-3 nest a mistral text_config;
  // the Qwen VLMs nest (qwen3_vl) or flatten (qwen2_5_vl) a qwen text model (their M-RoPE
  // changes no cache).
  if (type == "glm4_moe") return read_llama(Cfg{root.j, root.source, "", &glm4_moe_defaults()});
  if (type == "minimax_m2") return read_llama(root);
  if (type == "phi3") return read_mistral(root);
  if (type == "mistral3" || type == "ministral3") return read_mistral(root.sub("text_config", nullptr));
  if (type == "qwen2_5_vl" || type == "qwen3_vl")
    return read_qwen(root.j.contains("text_config") ? root.sub("text_config", nullptr) : root);
  if (auto r = read_lineup(root, type, o)) return *std::move(r);
  root.bad("model_type", fmt::format("'{}' is not supported; supported: {}", printable(type),
                                     fmt::join(hf_config_model_types(), ", ")));
}

// "line:column" of byte `at` (0-based) of `text`.
std::string line_col(std::string_view text, std::size_t at) {
  std::size_t line = 1, col = 1;
  for (std::size_t i = 0; i < std::min(at, text.size()); ++i) {
    if (text[i] == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
  }
  return fmt::format("{}:{}", line, col);
}

std::string field_at(std::string_view text, std::size_t at) {
  const std::string path = json_scan::path_at(text, at, kMaxHfConfigDepth);
  return path.empty() ? std::string() : fmt::format(" (field '{}')", path);
}

// Python's json module writes float("inf") and float("nan") as the bare words Infinity,
// -Infinity and NaN, and published configs carry them (Nemotron-H's time_step_limit is
// [0.0, Infinity]). Outside strings they become null (padded with spaces, so positions in
// later error messages stay right; NaN's null is one byte longer). kvmm reads none of
// those fields as a number.
std::string python_literals_as_null(std::string_view text) {
  std::string out;
  out.reserve(text.size() + 8);
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      out += c;
      if (c == '\\' && i + 1 < text.size()) {
        out += text[++i];
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') in_string = true;
    const std::string_view tail = text.substr(i);
    std::size_t word = 0;
    if (tail.starts_with("-Infinity"))
      word = 9;
    else if (tail.starts_with("Infinity"))
      word = 8;
    else if (tail.starts_with("NaN"))
      word = 3;
    if (word != 0) {
      out += "null";
      if (word > 4) out.append(word - 4, ' ');
      i += word - 1;
      continue;
    }
    out += c;
  }
  return out;
}

// Size, depth and number range first (json_scan), then nlohmann; every failure is a
// kvmm::Error with the source, line:column and the field.
json parse(std::string_view raw_text, std::string_view source, bool python_literals) {
  if (raw_text.size() > kMaxHfConfigBytes)
    fail("{}: {} bytes, over the limit of {} bytes (kMaxHfConfigBytes)", source, raw_text.size(), kMaxHfConfigBytes);
  const std::string converted = python_literals ? python_literals_as_null(raw_text) : std::string();
  const std::string_view text = python_literals ? std::string_view(converted) : raw_text;
  if (auto p = json_scan::find_problem(text, kMaxHfConfigDepth))
    fail("{}:{}: {}: {}", source, line_col(text, p->offset),
         p->path.empty() ? std::string("top level") : fmt::format("field '{}'", p->path), p->what);
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    // nlohmann reports the 1-based byte it stopped at.
    const std::size_t at = std::min<std::size_t>(e.byte > 0 ? e.byte - 1 : 0, text.size());
    const std::string_view here = text.substr(at);
    const bool literal = here.starts_with("Infinity") || here.starts_with("-Infinity") || here.starts_with("NaN");
    fail("{}:{}: malformed JSON{}: {}{}", source, line_col(text, at), field_at(text, at), printable(e.what(), 200),
         literal ? " (HfConfigOptions.python_literals reads Python's Infinity and NaN as null)" : "");
  } catch (const json::exception& e) {
    fail("{}: malformed JSON: {}", source, printable(e.what(), 200));
  }
}

}  // namespace

const std::vector<std::string>& hf_config_model_types() {
  static const std::vector<std::string> kTypes = [] {
    std::vector<std::string> t{"llama",  "qwen2",  "qwen3",       "mistral", "ministral",
                               "gemma2", "gemma3", "gemma3_text", "mllama",  "jamba"};
    t.insert(t.end(), hf::lineup_model_types().begin(), hf::lineup_model_types().end());
    return t;
  }();
  return kTypes;
}

ModelSpec read_hf_config(std::string_view json_text, std::string_view source, const HfConfigOptions& options) {
  hf::check_options(options);
  const json j = parse(json_text, source, options.python_literals);
  if (!j.is_object()) fail("{}: expected a JSON object at the top level", source);
  const Cfg root{j, source, "", nullptr};
  try {
    const std::string type = root.str("model_type");
    return hf::assemble(type, read_family(root, type, options), options);
  } catch (const json::exception& e) {
    fail("{}: {}", source, printable(e.what(), 200));
  }
}

namespace {

const char* file_type(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a file";
}

// Closes the descriptor on every path out.
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

// Opened without blocking (a FIFO would wait for a writer), checked to be a regular file
// of at most kMaxHfConfigBytes, and read up to one byte past the limit (a file that grows
// after the check is refused too).
ModelSpec read_hf_config_file(const std::string& path, const HfConfigOptions& options) {
  const Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY)};
  if (f.fd < 0) fail("config file = '{}': cannot open the file: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) fail("config file = '{}': cannot stat the file: {}", path, std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail("config file = '{}': not a regular file ({})", path, file_type(st.st_mode));
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (size > kMaxHfConfigBytes)
    fail("config file = '{}': {} bytes, over the limit of {} bytes (kMaxHfConfigBytes)", path, size, kMaxHfConfigBytes);
  std::string text(static_cast<std::size_t>(size) + 1, '\0');
  std::size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = ::read(f.fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("config file = '{}': cannot read the file: {}", path, std::strerror(errno));
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  if (got > size) fail("config file = '{}': grew past its {} bytes while being read", path, size);
  text.resize(got);
  return read_hf_config(text, path, options);
}

}  // namespace kvmm
