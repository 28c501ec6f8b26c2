// Device code of write_kv (paged and contiguous destinations) and of copy/swap pages:
// grid-stride loops moving 16-byte vectors, kept apart from the launchers so that the
// host emulation test can run them too. write_kv places each head's part of a token's
// [kv_heads][head_dim] row at its cache order's position (HeadScatter: a shift, a mask and
// a multiply-add per 16-byte vector; token-major rows land in one piece).
#pragma once

#include "common.cuh"

#include "kvmm/kernels/cache_ops.hpp"

namespace kvmm::kernels::device {

inline constexpr int kCopyThreads = 256;

// row_bytes: the token stride of the cache's order (kv_strides).
struct PagedDst {
  const std::uint32_t* page_ids;
  const std::uint32_t* offsets;
  std::uint64_t page_stride;
  std::uint32_t row_bytes;
  __device__ __forceinline__ long long offset(std::uint32_t token) const {
    const std::uint32_t page = __ldg(page_ids + token);
    if (page == kNull) return -1;
    return page_row_offset(page, __ldg(offsets + token), page_stride, row_bytes);
  }
};

struct ContiguousDst {
  const std::uint32_t* slots;
  const std::uint32_t* positions;
  std::uint64_t slot_stride;
  std::uint32_t row_bytes;
  __device__ __forceinline__ long long offset(std::uint32_t token) const {
    return slot_row_offset(__ldg(slots + token), slot_stride, __ldg(positions + token), row_bytes);
  }
};

// Where 16-byte vector `vec` of a token's [kv_heads][head_dim] source row lands, from
// the cache position of the token's head 0: its head's stride times the head, plus its
// place in the head (token-major: head_stride = head_vecs x 16, so vec x 16).
struct HeadScatter {
  std::uint32_t head_shift;   // log2 of the 16-byte vectors per head (head_dim x 2 / 16: 8, 16, 32)
  std::uint64_t head_stride;  // kv_strides(...).head
  __device__ __forceinline__ std::uint64_t at(std::uint32_t vec) const {
    const std::uint32_t h = vec >> head_shift;
    return h * head_stride + std::uint64_t{vec & ((1u << head_shift) - 1u)} * 16;
  }
};

// The destinations of a write_kv call (host).
inline PagedDst paged_dst(const PagedWriteParams& p) {
  return PagedDst{p.page_ids, p.page_offsets, p.cache.page_stride_bytes,
                  static_cast<std::uint32_t>(kv_strides(p.cache).token)};
}
inline ContiguousDst contiguous_dst(const ContiguousWriteParams& p) {
  return ContiguousDst{p.slot_idx, p.positions, p.cache.slot_stride_bytes,
                       static_cast<std::uint32_t>(kv_strides(p.cache).token)};
}
// (check_params allows head dims 64, 128 and 256 only: a power-of-two vector count.)
template <typename Cache>
HeadScatter head_scatter(const Cache& c) {
  std::uint32_t shift = 0;
  while ((32u << shift) <= c.head_dim * dtype_bytes(c.dtype)) ++shift;  // 16 << shift = head bytes
  return HeadScatter{shift, kv_strides(c).head};
}

// Vector v of the flat [2][num_tokens][row_vecs] index space: K rows, then V rows.
template <typename Dst>
__global__ void write_kv_kernel(char* k, char* v, const uint4* k_new, const uint4* v_new, std::uint32_t num_tokens,
                                std::uint32_t row_vecs, Dst dst, HeadScatter heads) {
  const std::uint64_t per_side = std::uint64_t{num_tokens} * row_vecs;
  const std::uint64_t stride = std::uint64_t{gridDim.x} * blockDim.x;
  for (std::uint64_t idx = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; idx < 2 * per_side; idx += stride) {
    const bool is_v = idx >= per_side;
    const std::uint64_t rel = is_v ? idx - per_side : idx;
    const auto token = static_cast<std::uint32_t>(rel / row_vecs);
    const auto vec = static_cast<std::uint32_t>(rel % row_vecs);
    const long long off = dst.offset(token);
    if (off < 0) continue;
    const uint4 x = __ldg((is_v ? v_new : k_new) + rel);
    *reinterpret_cast<uint4*>((is_v ? v : k) + off + heads.at(vec)) = x;
  }
}

// Block (page i, part y) copies its share of page i; 16-byte vectors when every base,
// stride and the size allow it, bytes otherwise.
__global__ void copy_pages_kernel(char* dst, const char* src, std::uint64_t dst_stride, std::uint64_t src_stride,
                                  std::uint64_t page_bytes, const std::uint32_t* src_pages,
                                  const std::uint32_t* dst_pages, bool vectors) {
  const std::uint32_t i = blockIdx.x;
  char* d = dst + __ldg(dst_pages + i) * dst_stride;
  const char* s = src + __ldg(src_pages + i) * src_stride;
  const std::uint64_t step = std::uint64_t{gridDim.y} * blockDim.x;
  const std::uint64_t first = std::uint64_t{blockIdx.y} * blockDim.x + threadIdx.x;
  if (vectors) {
    const std::uint64_t n = page_bytes / 16;
    for (std::uint64_t j = first; j < n; j += step)
      reinterpret_cast<uint4*>(d)[j] = reinterpret_cast<const uint4*>(s)[j];
  } else {
    for (std::uint64_t j = first; j < page_bytes; j += step) d[j] = s[j];
  }
}

}  // namespace kvmm::kernels::device
