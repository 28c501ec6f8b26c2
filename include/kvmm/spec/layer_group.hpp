// LayerGroup: the layers of a model that share one per-token memory shape and one
// dependency rule (Jenga §3.1). A group's small page holds tokens_per_page tokens of
// every layer in the group (a state group: one request's state of every layer).
// Everything here is O(1) arithmetic; validation raises kvmm::Error naming the field.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace kvmm {

enum class LayerKind : std::uint8_t {
  kFullAttention,    // attends to every earlier token
  kSlidingWindow,    // attends to the last `window` tokens
  kChunkedLocal,     // attends to tokens of its own `chunk`-aligned chunk
  kMambaState,       // fixed-size recurrent state, cached at checkpoints
  kCrossAttention,   // attends to encoder (image) tokens, fixed per request
  kVisionEmbedding,  // vision encoder output per image token, consumed by prefill
};

std::string_view to_string(LayerKind kind);

struct LayerGroup {
  std::string name;
  LayerKind kind = LayerKind::kFullAttention;
  std::uint32_t num_layers = 0;
  std::uint32_t kv_heads = 0;
  std::uint32_t head_dim = 0;
  std::uint32_t dtype_bytes = 2;
  // Tokens covered by one small page. For a Mamba group it is the checkpoint interval:
  // one state page stands for that many tokens of the prefix.
  std::uint32_t tokens_per_page = 16;
  std::uint32_t window = 0;                     // kSlidingWindow only
  std::uint32_t chunk = 0;                      // kChunkedLocal only
  std::uint64_t state_bytes_per_layer = 0;      // kMambaState only
  std::uint64_t embedding_bytes_per_token = 0;  // kVisionEmbedding only

  static LayerGroup full_attention(std::string name, std::uint32_t layers, std::uint32_t kv_heads,
                                   std::uint32_t head_dim, std::uint32_t dtype_bytes, std::uint32_t tokens_per_page);
  static LayerGroup sliding_window(std::string name, std::uint32_t layers, std::uint32_t kv_heads,
                                   std::uint32_t head_dim, std::uint32_t dtype_bytes, std::uint32_t tokens_per_page,
                                   std::uint32_t window);
  static LayerGroup chunked_local(std::string name, std::uint32_t layers, std::uint32_t kv_heads,
                                  std::uint32_t head_dim, std::uint32_t dtype_bytes, std::uint32_t tokens_per_page,
                                  std::uint32_t chunk);
  static LayerGroup mamba_state(std::string name, std::uint32_t layers, std::uint64_t state_bytes_per_layer,
                                std::uint32_t checkpoint_interval = 512);
  static LayerGroup cross_attention(std::string name, std::uint32_t layers, std::uint32_t kv_heads,
                                    std::uint32_t head_dim, std::uint32_t dtype_bytes, std::uint32_t tokens_per_page);
  static LayerGroup vision_embedding(std::string name, std::uint64_t bytes_per_token, std::uint32_t tokens_per_page);

  bool is_state() const { return kind == LayerKind::kMambaState; }
  // Groups whose tokens are the decoder's own tokens (grow with every step), as
  // opposed to encoder/image tokens fixed when the request arrives.
  bool is_decoder() const { return kind != LayerKind::kCrossAttention && kind != LayerKind::kVisionEmbedding; }
  std::uint32_t checkpoint_interval() const { return tokens_per_page; }

  // Sizes below are 64-bit and overflow-checked: a product that does not fit raises
  // kvmm::Error (validate() reports it with every factor named).
  // Bytes of one layer's K (or V) for one token: kv_heads * head_dim * dtype_bytes.
  std::uint64_t head_bytes_per_token() const;
  // Bytes the group needs per token across all its layers (K and V); 0 for state groups.
  std::uint64_t bytes_per_token() const;
  // Unpadded small page size in the page-layer layout.
  std::uint64_t natural_page_bytes() const;
  // Pages a request of `num_tokens` tokens holds in this group (no window applied).
  std::uint64_t pages_for_tokens(std::uint64_t num_tokens) const;

  // Raises kvmm::Error naming the first invalid field and its value, including a kind
  // outside LayerKind and a small page size that overflows 64 bits.
  void validate() const;
};

}  // namespace kvmm
