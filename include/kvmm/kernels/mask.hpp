// Attention masks shared bit-for-bit by the CUDA kernels and their CPU references:
// which keys a query at position q_pos sees (causal, sliding window, chunked local),
// how a key range is cut into split-KV pieces, and Gemma-2 logit soft-capping.
// All O(1), usable from host and device code (no CUDA headers needed).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define KVMM_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define KVMM_HOST_DEVICE inline
#endif

namespace kvmm::kernels {

enum class MaskKind : std::uint8_t {
  kCausal,         // keys 0 .. q_pos
  kSlidingWindow,  // the last `window` keys up to q_pos: q_pos - window < k <= q_pos
  kChunkedLocal,   // keys of q_pos's own chunk: floor(q_pos / chunk) * chunk <= k <= q_pos
};

struct AttentionOptions {
  MaskKind mask = MaskKind::kCausal;
  std::uint32_t window = 0;  // kSlidingWindow only, >= 1
  std::uint32_t chunk = 0;   // kChunkedLocal only, >= 1
  float scale = 0.0f;        // softmax scale; 0 means 1 / sqrt(head_dim)
  float soft_cap = 0.0f;     // > 0: logit = soft_cap * tanh(logit / soft_cap) after scaling
};

// Half-open range of key positions [lo, hi).
struct KeyRange {
  std::uint32_t lo = 0;
  std::uint32_t hi = 0;
};

// Keys visible to the query at q_pos (its own key included).
KVMM_HOST_DEVICE KeyRange key_range(MaskKind mask, std::uint32_t window, std::uint32_t chunk, std::uint32_t q_pos) {
  KeyRange r{0, q_pos + 1};
  if (mask == MaskKind::kSlidingWindow) {
    r.lo = q_pos + 1 > window ? q_pos + 1 - window : 0;
  } else if (mask == MaskKind::kChunkedLocal) {
    r.lo = q_pos / chunk * chunk;
  }
  return r;
}

// Piece `split` of `num_splits` equal pieces of r (the last ones may be short or empty).
KVMM_HOST_DEVICE KeyRange split_range(KeyRange r, std::uint32_t split, std::uint32_t num_splits) {
  const std::uint32_t len = r.hi - r.lo;
  const std::uint32_t per = (len + num_splits - 1) / num_splits;
  const std::uint64_t lo = std::uint64_t{r.lo} + std::uint64_t{per} * split;
  if (lo >= r.hi) return KeyRange{r.hi, r.hi};
  const std::uint64_t hi = lo + per < r.hi ? lo + per : r.hi;
  return KeyRange{static_cast<std::uint32_t>(lo), static_cast<std::uint32_t>(hi)};
}

}  // namespace kvmm::kernels
