// Hugging Face config.json reader (kvmm/spec/hf_config.hpp). Each family's reader turns
// its fields into one kind per decoder layer plus the attention parameters its layers
// share; one assembler turns that into groups, layer placements and the planned layout.
// nlohmann-json is used in this file only (a private, build-time dependency of kvmm).
// Hostile text is bounded before nlohmann parses it (size, nesting depth, numbers past
// double's range: json_scan.hpp), and every message renders values without recursion,
// cut to a few dozen bytes of printable ASCII.
#include "kvmm/spec/hf_config.hpp"

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

using nlohmann::json;

// More decoder layers than any published model has by far; bounds what a config can make
// the reader allocate.
constexpr std::uint32_t kMaxLayers = 1u << 16;

using json_scan::printable;

// A value for an error message: scalars as JSON, strings cut to 64 bytes, containers by
// their size only (never dumped: a dump recurses as deep as the value).
std::string describe(const json& v) {
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
};

// Heads, head_dim and the softmax scale; `qpas` is gemma's query_pre_attn_scalar.
AttentionParams attention(const Cfg& c, std::optional<double> qpas, std::optional<double> softcap) {
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
Reading full_or_sliding(const Cfg& c, const std::vector<bool>& sliding, std::uint32_t window, AttentionParams a) {
  Reading r;
  for (bool s : sliding) r.kinds.push_back(s ? LayerKind::kSlidingWindow : LayerKind::kFullAttention);
  a.sliding_window = window;
  r.attn = a;
  for (bool s : sliding)
    if (s && window == 0) c.bad("sliding_window", "missing or null but some layers slide");
  return r;
}

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
  root.bad("model_type", fmt::format("'{}' is not supported; supported: {}", printable(type),
                                     fmt::join(hf_config_model_types(), ", ")));
}

constexpr std::array<LayerKind, 4> kGroupOrder{LayerKind::kFullAttention, LayerKind::kSlidingWindow,
                                               LayerKind::kCrossAttention, LayerKind::kMambaState};

std::size_t slot_of(LayerKind k) {
  for (std::size_t s = 0; s < kGroupOrder.size(); ++s)
    if (kGroupOrder[s] == k) return s;
  fail("LayerKind {} has no group slot", to_string(k));
}

LayerGroup make_group(std::size_t slot, const Reading& r, std::uint32_t layers, const HfConfigOptions& o) {
  const AttentionParams& a = r.attn;
  switch (kGroupOrder[slot]) {
    case LayerKind::kSlidingWindow:
      return LayerGroup::sliding_window(r.names[slot], layers, a.num_kv_heads, a.head_dim, o.dtype_bytes,
                                        o.tokens_per_page, a.sliding_window);
    case LayerKind::kCrossAttention:
      return LayerGroup::cross_attention(r.names[slot], layers, a.num_kv_heads, a.head_dim, o.dtype_bytes,
                                         o.tokens_per_page);
    case LayerKind::kMambaState:
      return LayerGroup::mamba_state(r.names[slot], layers, r.state_bytes, o.mamba_checkpoint_interval);
    default:
      return LayerGroup::full_attention(r.names[slot], layers, a.num_kv_heads, a.head_dim, o.dtype_bytes,
                                        o.tokens_per_page);
  }
}

// Groups in kGroupOrder (those with layers), each layer's placement, and the layout.
ModelSpec assemble(std::string model_type, const Reading& r, const HfConfigOptions& o) {
  std::array<std::uint32_t, 4> count{};
  for (LayerKind k : r.kinds) ++count[slot_of(k)];
  ModelSpec m;
  m.model_type = std::move(model_type);
  std::vector<LayerGroup> groups;
  std::array<GroupId, 4> group_of{};
  for (std::size_t s = 0; s < kGroupOrder.size(); ++s) {
    if (count[s] == 0) continue;
    group_of[s] = static_cast<GroupId>(groups.size());
    groups.push_back(make_group(s, r, count[s], o));
    AttentionParams a = kGroupOrder[s] == LayerKind::kMambaState ? AttentionParams{} : r.attn;
    if (kGroupOrder[s] != LayerKind::kSlidingWindow) a.sliding_window = 0;
    m.attention.push_back(a);
  }
  std::array<std::uint32_t, 4> next{};
  m.layers.reserve(r.kinds.size());
  for (LayerKind k : r.kinds) {
    const std::size_t s = slot_of(k);
    m.layers.push_back(LayerPlacement{group_of[s], next[s]++});
  }
  m.layout = KVLayout::plan(std::move(groups), o.layout);
  return m;
}

bool is_element_size(std::uint32_t bytes) { return bytes == 1 || bytes == 2 || bytes == 4; }

void check_options(const HfConfigOptions& o) {
  if (o.tokens_per_page == 0) fail("HfConfigOptions.tokens_per_page = 0: must be >= 1");
  if (!is_element_size(o.dtype_bytes)) fail("HfConfigOptions.dtype_bytes = {}: must be 1, 2 or 4", o.dtype_bytes);
  if (!is_element_size(o.state_dtype_bytes))
    fail("HfConfigOptions.state_dtype_bytes = {}: must be 1, 2 or 4", o.state_dtype_bytes);
  if (o.mamba_checkpoint_interval == 0) fail("HfConfigOptions.mamba_checkpoint_interval = 0: must be >= 1");
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

// Size, depth and number range first (json_scan), then nlohmann; every failure is a
// kvmm::Error with the source, line:column and the field.
json parse(std::string_view text, std::string_view source) {
  if (text.size() > kMaxHfConfigBytes)
    fail("{}: {} bytes, over the limit of {} bytes (kMaxHfConfigBytes)", source, text.size(), kMaxHfConfigBytes);
  if (auto p = json_scan::find_problem(text, kMaxHfConfigDepth))
    fail("{}:{}: {}: {}", source, line_col(text, p->offset),
         p->path.empty() ? std::string("top level") : fmt::format("field '{}'", p->path), p->what);
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    // nlohmann reports the 1-based byte it stopped at.
    const std::size_t at = std::min<std::size_t>(e.byte > 0 ? e.byte - 1 : 0, text.size());
    fail("{}:{}: malformed JSON{}: {}", source, line_col(text, at), field_at(text, at), printable(e.what(), 200));
  } catch (const json::exception& e) {
    fail("{}: malformed JSON: {}", source, printable(e.what(), 200));
  }
}

}  // namespace

const std::vector<std::string>& hf_config_model_types() {
  static const std::vector<std::string> kTypes{"llama",  "qwen2",  "qwen3",       "mistral", "ministral",
                                               "gemma2", "gemma3", "gemma3_text", "mllama",  "jamba"};
  return kTypes;
}

ModelSpec read_hf_config(std::string_view json_text, std::string_view source, const HfConfigOptions& options) {
  check_options(options);
  const json j = parse(json_text, source);
  if (!j.is_object()) fail("{}: expected a JSON object at the top level", source);
  const Cfg root{j, source, "", nullptr};
  try {
    const std::string type = root.str("model_type");
    return assemble(type, read_family(root, type, options), options);
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
