#include "kvmm/spec/layer_group.hpp"

#include "kvmm/checked.hpp"
#include "kvmm/error.hpp"

#include <optional>
#include <utility>

namespace kvmm {

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

std::uint64_t LayerGroup::head_bytes_per_token() const {
  // kv_heads * head_dim fits 64 bits (two 32-bit factors); the dtype factor may not.
  return checked_mul(std::uint64_t{kv_heads} * head_dim, dtype_bytes, "head_bytes_per_token");
}

std::uint64_t LayerGroup::bytes_per_token() const {
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
  if (!try_page_bytes(*this)) page_overflow(*this);
}

}  // namespace kvmm
