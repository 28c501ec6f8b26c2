#include "kvmm/spec/layer_group.hpp"

#include "kvmm/checked.hpp"
#include "kvmm/error.hpp"

#include <fmt/format.h>

#include <numeric>
#include <optional>
#include <utility>

namespace kvmm {

std::string_view to_string(KvStorage storage) {
  switch (storage) {
    case KvStorage::kKeyValue:
      return "key_value";
    case KvStorage::kLatent:
      return "latent";
    case KvStorage::kKeyOnly:
      return "key_only";
  }
  return "unknown";
}

std::uint64_t StateTensor::bytes() const {
  const std::string what = "state tensor '" + name + "'";
  std::uint64_t elems = 1;
  for (std::uint64_t d : shape) elems = checked_mul(elems, d, what);
  return format.data_bytes(1, elems, what);
}

std::string_view to_string(LayerKind kind) {
  switch (kind) {
    case LayerKind::kFullAttention:
      return "full_attention";
    case LayerKind::kSlidingWindow:
      return "sliding_window";
    case LayerKind::kChunkedLocal:
      return "chunked_local";
    case LayerKind::kMambaState:
      return "mamba_state";
    case LayerKind::kCrossAttention:
      return "cross_attention";
    case LayerKind::kVisionEmbedding:
      return "vision_embedding";
  }
  return "unknown";
}

namespace {
LayerGroup attention_like(std::string name, LayerKind kind, std::uint32_t layers, std::uint32_t kv_heads,
                          std::uint32_t head_dim, std::uint32_t dtype_bytes, std::uint32_t tokens_per_page) {
  LayerGroup g;
  g.name = std::move(name);
  g.kind = kind;
  g.num_layers = layers;
  g.kv_heads = kv_heads;
  g.head_dim = head_dim;
  g.dtype_bytes = dtype_bytes;
  g.tokens_per_page = tokens_per_page;
  return g;
}
}  // namespace

LayerGroup LayerGroup::full_attention(std::string name, std::uint32_t layers, std::uint32_t kv_heads,
                                      std::uint32_t head_dim, std::uint32_t dtype_bytes,
                                      std::uint32_t tokens_per_page) {
  return attention_like(std::move(name), LayerKind::kFullAttention, layers, kv_heads, head_dim, dtype_bytes,
                        tokens_per_page);
}

LayerGroup LayerGroup::sliding_window(std::string name, std::uint32_t layers, std::uint32_t kv_heads,
                                      std::uint32_t head_dim, std::uint32_t dtype_bytes, std::uint32_t tokens_per_page,
                                      std::uint32_t window) {
  LayerGroup g = attention_like(std::move(name), LayerKind::kSlidingWindow, layers, kv_heads, head_dim, dtype_bytes,
                                tokens_per_page);
  g.window = window;
  return g;
}

LayerGroup LayerGroup::chunked_local(std::string name, std::uint32_t layers, std::uint32_t kv_heads,
                                     std::uint32_t head_dim, std::uint32_t dtype_bytes, std::uint32_t tokens_per_page,
                                     std::uint32_t chunk) {
  LayerGroup g = attention_like(std::move(name), LayerKind::kChunkedLocal, layers, kv_heads, head_dim, dtype_bytes,
                                tokens_per_page);
  g.chunk = chunk;
  return g;
}

LayerGroup LayerGroup::mamba_state(std::string name, std::uint32_t layers, std::uint64_t state_bytes_per_layer,
                                   std::uint32_t checkpoint_interval) {
  LayerGroup g;
  g.name = std::move(name);
  g.kind = LayerKind::kMambaState;
  g.num_layers = layers;
  g.kv_heads = 0;
  g.head_dim = 0;
  g.dtype_bytes = 0;
  g.tokens_per_page = checkpoint_interval;
  g.state_bytes_per_layer = state_bytes_per_layer;
  return g;
}

LayerGroup LayerGroup::cross_attention(std::string name, std::uint32_t layers, std::uint32_t kv_heads,
                                       std::uint32_t head_dim, std::uint32_t dtype_bytes,
                                       std::uint32_t tokens_per_page) {
  return attention_like(std::move(name), LayerKind::kCrossAttention, layers, kv_heads, head_dim, dtype_bytes,
                        tokens_per_page);
}

LayerGroup LayerGroup::vision_embedding(std::string name, std::uint64_t bytes_per_token,
                                        std::uint32_t tokens_per_page) {
  LayerGroup g;
  g.name = std::move(name);
  g.kind = LayerKind::kVisionEmbedding;
  g.num_layers = 1;
  g.tokens_per_page = tokens_per_page;
  g.embedding_bytes_per_token = bytes_per_token;
  return g;
}

LayerGroup LayerGroup::recurrent_state(std::string name, std::uint32_t layers, std::vector<StateTensor> tensors,
                                       std::uint32_t checkpoint_interval) {
  std::uint64_t bytes = 0;
  for (const StateTensor& t : tensors) bytes = checked_add(bytes, t.bytes(), "state_bytes_per_layer");
  LayerGroup g = mamba_state(std::move(name), layers, bytes, checkpoint_interval);
  g.state_tensors = std::move(tensors);
  return g;
}

namespace {
// dtype_bytes of a group described by a format: its element size where whole, else 1.
std::uint32_t element_bytes(const ElementFormat& f) { return f.bits() >= 8 ? f.bits() / 8 : 1; }
}  // namespace

LayerGroup LayerGroup::mla(std::string name, std::uint32_t layers, std::uint32_t kv_lora_rank, std::uint32_t rope_dim,
                           ElementFormat latent, std::optional<ElementFormat> rope, std::uint32_t tokens_per_page) {
  LayerGroup g = attention_like(std::move(name), LayerKind::kFullAttention, layers, 1, kv_lora_rank,
                                element_bytes(latent), tokens_per_page);
  g.storage = KvStorage::kLatent;
  g.rope_dim = rope_dim;
  g.k_format = latent;
  g.rope_format = rope;
  return g;
}

LayerGroup LayerGroup::indexer(std::string name, std::uint32_t layers, std::uint32_t heads, std::uint32_t head_dim,
                               ElementFormat keys, std::uint32_t tokens_per_page, std::string attention) {
  LayerGroup g = attention_like(std::move(name), LayerKind::kFullAttention, layers, heads, head_dim,
                                element_bytes(keys), tokens_per_page);
  g.storage = KvStorage::kKeyOnly;
  g.k_format = keys;
  g.tied_to = std::move(attention);
  return g;
}

bool LayerGroup::is_plain() const {
  return storage == KvStorage::kKeyValue && !k_format && !v_format && !rope_format && rope_dim == 0 &&
         tied_to.empty() && state_tensors.empty();
}

ElementFormat LayerGroup::k_element() const { return k_format ? *k_format : ElementFormat::raw_bytes(dtype_bytes); }
ElementFormat LayerGroup::v_element() const { return v_format ? *v_format : ElementFormat::raw_bytes(dtype_bytes); }
ElementFormat LayerGroup::rope_element() const {
  if (rope_format) return *rope_format;
  ElementFormat f = k_element();
  if (f.scale.in_pages()) f.scale = {};  // a per-tensor scale covers the whole latent
  return f;
}

namespace {

struct PartSize {
  std::uint64_t bytes = 0;
  bool separate = false;
};

// Bytes of each part of one layer for tokens_per_page tokens (attention-like groups).
std::array<PartSize, kNumKvParts> part_sizes(const LayerGroup& g) {
  std::array<PartSize, kNumKvParts> p{};
  const std::uint64_t rows = std::uint64_t{g.tokens_per_page} * g.kv_heads;
  auto put = [&](KvPart data, KvPart scale, const ElementFormat& f, std::uint32_t elems, std::string_view what) {
    p[static_cast<std::size_t>(data)].bytes = f.data_bytes(rows, elems, what);
    p[static_cast<std::size_t>(scale)].bytes = f.scale_bytes(rows, elems, what);
    p[static_cast<std::size_t>(scale)].separate = f.scale.placement == ScalePlacement::kSeparate;
  };
  const std::string n = "LayerGroup '" + g.name + "'";
  put(KvPart::kK, KvPart::kKScale, g.k_element(), g.head_dim, n + " K");
  if (g.storage == KvStorage::kLatent && g.rope_dim > 0)
    put(KvPart::kRope, KvPart::kRopeScale, g.rope_element(), g.rope_dim, n + " rope");
  if (g.storage == KvStorage::kKeyValue) put(KvPart::kV, KvPart::kVScale, g.v_element(), g.head_dim, n + " V");
  return p;
}

bool has_scales(const std::array<PartSize, kNumKvParts>& p) {
  for (KvPart s : {KvPart::kKScale, KvPart::kRopeScale, KvPart::kVScale})
    if (p[static_cast<std::size_t>(s)].bytes > 0) return true;
  return false;
}

struct LayerLayout {
  std::array<std::uint64_t, kNumKvParts> offset{};  // inline: from the layer's start; separate: from its scale slot
  std::uint64_t stride = 0;                         // inline bytes per layer
  std::uint64_t separate = 0;                       // separate-scale bytes per layer
};

LayerLayout layer_layout(const LayerGroup& g) {
  const auto p = part_sizes(g);
  const std::uint64_t align = has_scales(p) ? kScaleRegionAlignment : 1;
  const std::string what = "LayerGroup '" + g.name + "' page";
  LayerLayout l;
  for (std::size_t i = 0; i < kNumKvParts; ++i) {
    if (p[i].bytes == 0) continue;
    std::uint64_t& cur = p[i].separate ? l.separate : l.stride;
    cur = checked_round_up(cur, align, what);
    l.offset[i] = cur;
    cur = checked_add(cur, p[i].bytes, what);
  }
  l.stride = checked_round_up(l.stride, align, what);
  l.separate = checked_round_up(l.separate, align, what);
  return l;
}

}  // namespace

std::uint64_t LayerGroup::layer_stride_bytes() const {
  if (is_state() || kind == LayerKind::kVisionEmbedding)
    fail("LayerGroup '{}': kind {} has no K/V layers", name, to_string(kind));
  return layer_layout(*this).stride;
}

std::uint64_t LayerGroup::separate_scale_bytes_per_layer() const {
  if (is_state() || kind == LayerKind::kVisionEmbedding)
    fail("LayerGroup '{}': kind {} has no K/V layers", name, to_string(kind));
  return layer_layout(*this).separate;
}

LayerGroup::Span LayerGroup::part(KvPart which, std::uint32_t layer) const {
  if (is_state() || kind == LayerKind::kVisionEmbedding)
    fail("LayerGroup '{}': kind {} has no K/V layout", name, to_string(kind));
  if (layer >= num_layers) fail("layer = {}: group '{}' has {} layers", layer, name, num_layers);
  const auto i = static_cast<std::size_t>(which);
  if (i >= kNumKvParts) fail("part = {}: not a KvPart", i);
  const auto p = part_sizes(*this);
  if (p[i].bytes == 0) return Span{};
  const LayerLayout l = layer_layout(*this);
  if (!p[i].separate) return Span{std::uint64_t{layer} * l.stride + l.offset[i], p[i].bytes};
  const std::uint64_t base = std::uint64_t{num_layers} * l.stride;
  return Span{base + std::uint64_t{layer} * l.separate + l.offset[i], p[i].bytes};
}

std::uint64_t LayerGroup::head_bytes_per_token() const {
  if (!is_plain() && !is_state() && kind != LayerKind::kVisionEmbedding)
    return k_element().data_bytes(kv_heads, head_dim, "head_bytes_per_token");
  // kv_heads * head_dim fits 64 bits (two 32-bit factors); the dtype factor may not.
  return checked_mul(std::uint64_t{kv_heads} * head_dim, dtype_bytes, "head_bytes_per_token");
}

std::uint64_t LayerGroup::bytes_per_token() const {
  if (!is_plain() && !is_state() && kind != LayerKind::kVisionEmbedding) {
    std::uint64_t sum = 0;
    for (const PartSize& p : part_sizes(*this)) sum = checked_add(sum, p.bytes, "bytes_per_token");
    return ceil_div(checked_mul(sum, num_layers, "bytes_per_token"), tokens_per_page);
  }
  switch (kind) {
    case LayerKind::kMambaState:
      return 0;
    case LayerKind::kVisionEmbedding:
      return embedding_bytes_per_token;
    default:
      return checked_mul(head_bytes_per_token(), std::uint64_t{2} * num_layers, "bytes_per_token");
  }
}

std::uint64_t LayerGroup::natural_page_bytes() const {
  if (!is_plain() && !is_state() && kind != LayerKind::kVisionEmbedding) {
    const LayerLayout l = layer_layout(*this);
    return checked_mul(checked_add(l.stride, l.separate, "natural_page_bytes"), num_layers, "natural_page_bytes");
  }
  if (kind == LayerKind::kMambaState)
    return checked_mul(state_bytes_per_layer, num_layers, "natural_page_bytes (state_bytes_per_layer x num_layers)");
  return checked_mul(bytes_per_token(), tokens_per_page, "natural_page_bytes (bytes_per_token x tokens_per_page)");
}

std::uint64_t LayerGroup::pages_for_tokens(std::uint64_t num_tokens) const {
  if (kind == LayerKind::kMambaState) return num_tokens > 0 ? 1 : 0;
  return checked_ceil_div(num_tokens, tokens_per_page, "pages_for_tokens (tokens_per_page = 0)");
}

namespace {

// The small page size of a group whose fields are otherwise valid, or std::nullopt when
// it does not fit 64 bits: the product of up to six 32-bit fields.
std::optional<std::uint64_t> try_page_bytes(const LayerGroup& g) {
  switch (g.kind) {
    case LayerKind::kMambaState:
      return try_mul<std::uint64_t>(g.state_bytes_per_layer, g.num_layers);
    case LayerKind::kVisionEmbedding:
      return try_mul<std::uint64_t>(g.embedding_bytes_per_token, g.tokens_per_page);
    default:
      break;
  }
  std::optional<std::uint64_t> v = std::uint64_t{2} * g.num_layers;  // K and V: fits
  for (const std::uint64_t f : {std::uint64_t{g.tokens_per_page}, std::uint64_t{g.kv_heads}, std::uint64_t{g.head_dim},
                                std::uint64_t{g.dtype_bytes}})
    if (v) v = try_mul(*v, f);
  return v;
}

[[noreturn]] void page_overflow(const LayerGroup& g) {
  switch (g.kind) {
    case LayerKind::kMambaState:
      fail("LayerGroup '{}': state_bytes_per_layer {} x num_layers {} overflows 64 bits", g.name,
           g.state_bytes_per_layer, g.num_layers);
    case LayerKind::kVisionEmbedding:
      fail("LayerGroup '{}': embedding_bytes_per_token {} x tokens_per_page {} overflows 64 bits", g.name,
           g.embedding_bytes_per_token, g.tokens_per_page);
    default:
      fail(
          "LayerGroup '{}': small page of num_layers {} x 2 (K, V) x tokens_per_page {} x kv_heads {} x "
          "head_dim {} x dtype_bytes {} overflows 64 bits",
          g.name, g.num_layers, g.tokens_per_page, g.kv_heads, g.head_dim, g.dtype_bytes);
  }
}

void validate_state_tensors(const LayerGroup& g) {
  if (g.state_tensors.empty()) return;
  if (!g.is_state())
    fail("LayerGroup '{}': state_tensors: {} tensors on a {} group, only a state group has them", g.name,
         g.state_tensors.size(), to_string(g.kind));
  std::uint64_t sum = 0;
  for (std::size_t i = 0; i < g.state_tensors.size(); ++i) {
    const StateTensor& t = g.state_tensors[i];
    const std::string field = fmt::format("LayerGroup '{}': state_tensors[{}] ('{}')", g.name, i, t.name);
    if (t.shape.empty()) fail("{}: shape is empty", field);
    for (std::size_t d = 0; d < t.shape.size(); ++d)
      if (t.shape[d] == 0) fail("{}: shape[{}] = 0, must be >= 1", field, d);
    t.format.validate(field + ".format", 0);
    if (t.format.scale.granularity != ScaleGranularity::kNone)
      fail("{}.format: scales on a state tensor are not supported", field);
    sum = checked_add(sum, t.bytes(), field);
  }
  if (sum != g.state_bytes_per_layer)
    fail("LayerGroup '{}': state_bytes_per_layer = {}, but its state_tensors hold {} bytes", g.name,
         g.state_bytes_per_layer, sum);
}

void validate_storage(const LayerGroup& g) {
  const auto& n = g.name;
  if (static_cast<unsigned>(g.storage) > static_cast<unsigned>(KvStorage::kKeyOnly))
    fail("LayerGroup '{}': storage = {}: not a KvStorage", n, static_cast<unsigned>(g.storage));
  if (!g.state_tensors.empty()) fail("LayerGroup '{}': state_tensors set on a {} group", n, to_string(g.kind));
  if (g.storage != KvStorage::kLatent && (g.rope_dim != 0 || g.rope_format))
    fail("LayerGroup '{}': rope_dim = {}{}: only a latent (MLA) group has a rope part", n, g.rope_dim,
         g.rope_format ? " and a rope_format" : "");
  if (g.storage != KvStorage::kKeyValue && g.v_format)
    fail("LayerGroup '{}': v_format set on a {} group, which has no separate V", n, to_string(g.storage));
  if (g.storage != KvStorage::kKeyOnly && !g.tied_to.empty())
    fail("LayerGroup '{}': tied_to = '{}': only an indexer (key_only) group is tied to another", n, g.tied_to);
  if (g.storage == KvStorage::kLatent && g.kv_heads != 1)
    fail("LayerGroup '{}': kv_heads = {}: a latent (MLA) group stores one latent per token, kv_heads must be 1", n,
         g.kv_heads);
  if (g.storage == KvStorage::kKeyOnly && g.tied_to.empty())
    fail("LayerGroup '{}': tied_to is empty: an indexer (key_only) group names the attention group it indexes", n);
  if (g.storage == KvStorage::kKeyOnly && g.tied_to == g.name)
    fail("LayerGroup '{}': tied_to = '{}': an indexer cannot be tied to itself", n, g.tied_to);
  g.k_element().validate(fmt::format("LayerGroup '{}': k_format", n), g.head_dim);
  if (g.storage == KvStorage::kKeyValue)
    g.v_element().validate(fmt::format("LayerGroup '{}': v_format", n), g.head_dim);
  if (g.storage == KvStorage::kLatent)
    g.rope_element().validate(fmt::format("LayerGroup '{}': rope_format", n), g.rope_dim);
}

// The order inside a page (kv_order.hpp): a KVOrder, head-major only where a kernel or
// reference reads it (a plain K/V attention group).
void validate_order(const LayerGroup& g) {
  const auto& n = g.name;
  if (g.kv_order != KVOrder::kTokenMajor && g.kv_order != KVOrder::kHeadMajor)
    fail("LayerGroup '{}': kv_order = {}: not a KVOrder (0 token_major, 1 head_major)", n,
         static_cast<unsigned>(g.kv_order));
  if (g.kv_order == KVOrder::kTokenMajor) return;
  if (g.is_state() || g.kind == LayerKind::kVisionEmbedding)
    fail("LayerGroup '{}': kv_order = {}: a {} group has no K/V heads to order", n, to_string(g.kv_order),
         to_string(g.kind));
  if (!g.is_plain())
    fail(
        "LayerGroup '{}': kv_order = {}: only a plain K/V group (no k/v/rope formats, storage key_value) "
        "may be head-major; this one is {} with K {} (the formatted-page reference reads token-major pages)",
        n, to_string(g.kv_order), to_string(g.storage), g.k_element().describe());
}

// A draft group's role and a target group's successor keys (docs/speculative.md).
void validate_speculative(const LayerGroup& g) {
  const auto& n = g.name;
  if (g.draft) {
    if (g.kind != LayerKind::kFullAttention && g.kind != LayerKind::kSlidingWindow)
      fail("LayerGroup '{}': draft: a {} group cannot be a draft (full attention or sliding window only)", n,
           to_string(g.kind));
    if (g.draft->target.empty()) fail("LayerGroup '{}': draft.target: must name the target group", n);
    if (g.draft->successor_tokens > DraftRole::kMaxSuccessorTokens)
      fail("LayerGroup '{}': draft.successor_tokens = {}: at most {}", n, g.draft->successor_tokens,
           DraftRole::kMaxSuccessorTokens);
  }
  if (g.successor_tokens > 0) {
    if (g.draft)
      fail("LayerGroup '{}': successor_tokens = {}: a draft group's are draft.successor_tokens", n, g.successor_tokens);
    if (g.kind != LayerKind::kFullAttention)
      fail(
          "LayerGroup '{}': successor_tokens = {}: a {} group cannot be keyed with successor ids (full attention only)",
          n, g.successor_tokens, to_string(g.kind));
    if (g.successor_tokens > DraftRole::kMaxSuccessorTokens)
      fail("LayerGroup '{}': successor_tokens = {}: at most {}", n, g.successor_tokens, DraftRole::kMaxSuccessorTokens);
  }
}

}  // namespace

void LayerGroup::validate() const {
  const auto& n = name;
  if (n.empty()) fail("LayerGroup.name: must not be empty");
  if (static_cast<std::uint8_t>(kind) > static_cast<std::uint8_t>(LayerKind::kVisionEmbedding))
    fail("LayerGroup '{}': kind = {}: not a LayerKind", n, static_cast<unsigned>(kind));
  if (num_layers == 0) fail("LayerGroup '{}': num_layers = 0, must be >= 1", n);
  if (tokens_per_page == 0) fail("LayerGroup '{}': tokens_per_page = 0, must be >= 1", n);
  switch (kind) {
    case LayerKind::kMambaState:
      if (state_bytes_per_layer == 0) fail("LayerGroup '{}': state_bytes_per_layer = 0, must be >= 1", n);
      break;
    case LayerKind::kVisionEmbedding:
      if (embedding_bytes_per_token == 0) fail("LayerGroup '{}': embedding_bytes_per_token = 0, must be >= 1", n);
      break;
    default:
      if (kv_heads == 0) fail("LayerGroup '{}': kv_heads = 0, must be >= 1", n);
      if (head_dim == 0) fail("LayerGroup '{}': head_dim = 0, must be >= 1", n);
      if (dtype_bytes != 1 && dtype_bytes != 2 && dtype_bytes != 4)
        fail("LayerGroup '{}': dtype_bytes = {}, must be 1, 2 or 4", n, dtype_bytes);
      if (kind == LayerKind::kSlidingWindow && window == 0)
        fail("LayerGroup '{}': window = 0, a sliding-window group needs window >= 1", n);
      if (kind == LayerKind::kChunkedLocal && chunk == 0)
        fail("LayerGroup '{}': chunk = 0, a chunked-local group needs chunk >= 1", n);
  }
  if (kind == LayerKind::kVisionEmbedding && !layers.empty())
    fail("LayerGroup '{}': layers has {} entries: a vision-embedding group holds no model layer (must be empty)", n,
         layers.size());
  if (!layers.empty() && layers.size() != num_layers)
    fail("LayerGroup '{}': layers has {} entries, num_layers = {}: one model layer index per slot", n, layers.size(),
         num_layers);
  for (std::size_t k = 0; k < layers.size(); ++k)
    if (layers[k] >= kMaxModelLayers)
      fail("LayerGroup '{}': layers[{}] = {}: model layer indices must be below {}", n, k, layers[k], kMaxModelLayers);
  validate_speculative(*this);
  if (tagged_checkpoints && !is_state())
    fail("LayerGroup '{}': tagged_checkpoints: a {} group has no checkpoints (recurrent-state groups only)", n,
         to_string(kind));
  validate_order(*this);
  if (is_plain() || is_state() || kind == LayerKind::kVisionEmbedding) {
    validate_state_tensors(*this);
    if (!try_page_bytes(*this)) page_overflow(*this);
    return;
  }
  validate_storage(*this);
  (void)natural_page_bytes();  // kvmm::Error naming the group when a size overflows or is sub-byte
}

}  // namespace kvmm
