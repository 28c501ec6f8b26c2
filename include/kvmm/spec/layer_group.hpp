// LayerGroup: the layers of a model that share one per-token memory shape and one
// dependency rule (Jenga §3.1). A group's small page holds tokens_per_page tokens of
// every layer in the group (a state group: one request's state of every layer).
// Beyond K/V pages in whole bytes: per-group element formats with scales (K and V apart),
// a recurrent state described by its tensors, an MLA latent group and an indexer group.
// Everything here is O(1) arithmetic; validation raises kvmm::Error naming the field.
#pragma once

#include "kvmm/spec/element_format.hpp"
#include "kvmm/spec/kv_order.hpp"

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvmm {

enum class LayerKind : std::uint8_t {
  kFullAttention,    // attends to every earlier token
  kSlidingWindow,    // attends to the last `window` tokens
  kChunkedLocal,     // attends to tokens of its own `chunk`-aligned chunk
  kMambaState,       // fixed-size recurrent state, cached at checkpoints
  kCrossAttention,   // attends to encoder (image) tokens, fixed per request
  kVisionEmbedding,  // vision encoder output per image token, consumed by prefill
  // Any fixed-size per-sequence state (Mamba/Mamba2, gated DeltaNet, KDA, lightning
  // attention): the same kind as kMambaState, so the same checkpoint grid and hit rule.
  kRecurrentState = kMambaState,
};

// How an attention-like group stores one token of one layer.
enum class KvStorage : std::uint8_t {
  kKeyValue,  // K and V, each [tokens_per_page][kv_heads][head_dim]
  // MLA (DeepSeek-V2/V3, Kimi-K2): one latent per token, kv_lora_rank (= head_dim) elements
  // plus rope_dim (qk_rope_head_dim) elements; K is the whole latent, V its first head_dim
  // elements. No separate V; kv_heads is 1.
  kLatent,
  // An indexer's keys (DeepSeek-V3.2's DSA): K only, [tokens_per_page][kv_heads][head_dim],
  // one per layer of the attention group named by tied_to, with the same tokens.
  kKeyOnly,
};

std::string_view to_string(KvStorage storage);

// The regions of one layer inside an attention-like small page, in page order: K (the
// latent's first head_dim elements for kLatent) and its scales, the latent's rope part and
// its scales, V and its scales. Scales with ScalePlacement::kSeparate live in the page's
// scale region after every layer's data.
enum class KvPart : std::uint8_t { kK, kKScale, kRope, kRopeScale, kV, kVScale };
inline constexpr std::size_t kNumKvParts = 6;

// Where region starts are aligned once a group's page holds scales (bytes).
inline constexpr std::uint64_t kScaleRegionAlignment = 16;

// One tensor of a recurrent state, per layer and request: e.g. Mamba2's conv state
// [conv_dim, d_conv - 1] and SSM state [heads, head_dim, d_state].
struct StateTensor {
  std::string name = {};
  std::vector<std::uint64_t> shape = {};
  ElementFormat format = ElementFormat::of(ElementType::kBf16);
  // prod(shape) x bits / 8; kvmm::Error naming the tensor when it overflows or is sub-byte.
  std::uint64_t bytes() const;
};

std::string_view to_string(LayerKind kind);

// Speculative decoding: a group that holds a draft's KV (an EAGLE head, MTP layers, a
// separate draft model) for a target group of the same layout. Its pages are cached and
// reused where present, but never shorten the target's hit: where they are missing inside
// a hit the engine recomputes those draft positions (KVCacheManager::draft_recompute).
// The dependence rule per drafter (docs/speculative.md): the draft's KV at position i is
// computed from tokens [0, i + successor_tokens], so a draft page is keyed with the
// successor_tokens ids after it: 0 for a separate draft model, 1 for EAGLE-1/2/3 and an
// MTP module of depth 1 (its input at i is the target's feature at i and token i + 1).
struct DraftRole {
  std::string target;                  // name of the target group (a decoder group, not a draft)
  std::uint32_t successor_tokens = 0;  // 0..kMaxSuccessorTokens
  // Evicted as if last used this many steps earlier, and first among pages of that age; 0:
  // a draft page ages as its target page (the default: an EAGLE / MTP draft position costs
  // a target forward to recompute, its input being the target's hidden state there).
  std::uint32_t evict_sooner_steps = 0;
  static constexpr std::uint32_t kMaxSuccessorTokens = 8;
};

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

  // Attention-like groups: the storage and the element formats. Absent formats mean
  // dtype_bytes per element, unscaled: the layout of a group that sets none of these is
  // exactly the K/V page-layer layout above.
  KvStorage storage = KvStorage::kKeyValue;
  std::uint32_t rope_dim = 0;                     // kLatent: elements of the rope part
  std::optional<ElementFormat> k_format = {};     // K (kLatent: the latent's first head_dim elements)
  std::optional<ElementFormat> v_format = {};     // V (kKeyValue only)
  std::optional<ElementFormat> rope_format = {};  // kLatent: the rope part; absent: k_format without in-page scales
  std::string tied_to = {};                       // kKeyOnly: name of the attention group it indexes
  // kMambaState: the tensors one layer's state is made of (their bytes sum to
  // state_bytes_per_layer); empty when the state was given as a byte count.
  std::vector<StateTensor> state_tensors = {};
  // A draft group (kFullAttention or kSlidingWindow only): see DraftRole.
  std::optional<DraftRole> draft = {};
  // A target group (not a draft) whose KV at position i also depends on the
  // successor_tokens ids after it, as a draft's does (DraftRole::successor_tokens): layers of
  // an EAGLE / MTP head sharing the target's pages. Its page i is keyed with those ids, so it
  // is cached once they are known and hit only where they match; unlike a draft it takes
  // part in the hit as any target group. kFullAttention only; 0..kMaxSuccessorTokens.
  std::uint32_t successor_tokens = 0;
  // kMambaState only, for speculative decoding: a checkpoint page is cached only when the
  // engine tags it with the exact verified token count it holds (KVCacheManager::tag_state),
  // never merely because the verified tokens passed it (a state written in a step with
  // drafts may hold rejected tokens).
  bool tagged_checkpoints = false;
  // The order of (token, kv head) inside each layer's K and V region of the group's pages
  // (kv_order.hpp): kTokenMajor [tokens][kv_heads][head_dim] (the default, every layout
  // before it) or kHeadMajor [kv_heads][tokens][head_dim]. Page sizes and offsets are the
  // same; the bytes inside mean something else, so layout_fingerprint covers a head-major
  // order (and leaves token-major fingerprints as they were). Head-major only on a plain
  // attention group (no element formats, K and V): the formatted-page reference reads
  // token-major pages. kernels::paged_cache(layout, ...) puts it into a PagedKVCache.
  KVOrder kv_order = KVOrder::kTokenMajor;
  // Which model layers the group's page slots hold: layers[k] is the model layer index of
  // slot k (the `layer` of KVLayout::k_offset / state_offset). Empty: KVLayout::plan numbers
  // them (after the largest index any group gives, in group order; an indexer takes its
  // attention group's). Otherwise num_layers distinct indices below kMaxModelLayers; a
  // vision-embedding group holds no model layer (empty). KVLayout::group(g).layers is
  // always filled; the layer map (KVLayout::layer_group) is built from it.
  std::vector<std::uint32_t> layers = {};
  // The largest model layer index + 1 a group may name (the layer map is dense: 1 Mi
  // layers, 4 MiB of map at most).
  static constexpr std::uint32_t kMaxModelLayers = std::uint32_t{1} << 20;

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
  // A recurrent state of the given tensors per layer (state_bytes_per_layer = their sum).
  static LayerGroup recurrent_state(std::string name, std::uint32_t layers, std::vector<StateTensor> tensors,
                                    std::uint32_t checkpoint_interval = 512);
  // An MLA group: full attention over one latent of kv_lora_rank + rope_dim elements.
  static LayerGroup mla(std::string name, std::uint32_t layers, std::uint32_t kv_lora_rank, std::uint32_t rope_dim,
                        ElementFormat latent, std::optional<ElementFormat> rope, std::uint32_t tokens_per_page);
  // An indexer group of `layers` layers of `heads` x `head_dim` keys tied to `attention`
  // (same kind, window and layer count: checked when the layout is planned).
  static LayerGroup indexer(std::string name, std::uint32_t layers, std::uint32_t heads, std::uint32_t head_dim,
                            ElementFormat keys, std::uint32_t tokens_per_page, std::string attention);

  bool is_state() const { return kind == LayerKind::kMambaState; }
  bool is_draft() const { return draft.has_value(); }
  // Groups whose tokens are the decoder's own tokens (grow with every step), as
  // opposed to encoder/image tokens fixed when the request arrives.
  bool is_decoder() const { return kind != LayerKind::kCrossAttention && kind != LayerKind::kVisionEmbedding; }
  std::uint32_t checkpoint_interval() const { return tokens_per_page; }
  // True when the group sets no format, no state tensors and stores K and V: its sizes are
  // the page-layer formulas above (every layout kvmm had before element formats).
  bool is_plain() const;
  bool has_v() const { return storage == KvStorage::kKeyValue; }
  ElementFormat k_element() const;
  ElementFormat v_element() const;
  ElementFormat rope_element() const;
  // Offset and bytes of `part` of `layer` inside the group's (natural) small page;
  // bytes 0 when the group has no such part. Attention-like groups only.
  struct Span {
    std::uint64_t offset = 0;
    std::uint64_t bytes = 0;
  };
  Span part(KvPart part, std::uint32_t layer) const;
  // Bytes of one layer's inline regions (the page-layer stride), and of its share of the
  // separate scale region.
  std::uint64_t layer_stride_bytes() const;
  std::uint64_t separate_scale_bytes_per_layer() const;

  // Sizes below are 64-bit and overflow-checked: a product that does not fit raises
  // kvmm::Error (validate() reports it with every factor named).
  // Bytes of one layer's K (or V) for one token: kv_heads * head_dim * dtype_bytes (with a
  // K format: the K data bytes, scales excluded).
  std::uint64_t head_bytes_per_token() const;
  // Bytes the group needs per token across all its layers (K and V); 0 for state groups.
  // With formats: every part with its in-page scales, rounded up to whole bytes.
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
