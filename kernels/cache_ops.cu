// write_kv (paged and contiguous), copy_pages and swap_pages. All are dtype-agnostic
// byte movers: rows of kv_heads * head_dim * 2 bytes (a multiple of 16) are moved as
// 16-byte vectors by grid-stride loops, so one launch covers a whole step.
#include "common.cuh"

#include "kvmm/kernels/cache_ops.hpp"

#include <algorithm>

namespace kvmm::kernels {
namespace device {
namespace {

constexpr int kCopyThreads = 256;

struct PagedDst {
  const std::uint32_t* page_ids;
  const std::uint32_t* offsets;
  std::uint64_t page_stride;
  std::uint32_t row_bytes;
  __device__ __forceinline__ long long offset(std::uint32_t token) const {
    const std::uint32_t page = __ldg(page_ids + token);
    if (page == kNull) return -1;
    return static_cast<long long>(page * page_stride + std::uint64_t{__ldg(offsets + token)} * row_bytes);
  }
};

struct ContiguousDst {
  const std::uint32_t* slots;
  const std::uint32_t* positions;
  std::uint64_t slot_stride;
  std::uint32_t row_bytes;
  __device__ __forceinline__ long long offset(std::uint32_t token) const {
    return static_cast<long long>(__ldg(slots + token) * slot_stride +
                                  std::uint64_t{__ldg(positions + token)} * row_bytes);
  }
};

// Vector v of the flat [2][num_tokens][row_vecs] index space: K rows, then V rows.
template <typename Dst>
__global__ void write_kv_kernel(char* k, char* v, const uint4* k_new, const uint4* v_new, std::uint32_t num_tokens,
                                std::uint32_t row_vecs, Dst dst) {
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
    *reinterpret_cast<uint4*>((is_v ? v : k) + off + std::uint64_t{vec} * 16) = x;
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

template <typename Dst>
void launch_write(void* k, void* v, const void* k_new, const void* v_new, std::uint32_t num_tokens,
                  std::uint32_t row_bytes, const Dst& dst, Stream stream) {
  const std::uint32_t row_vecs = row_bytes / 16;
  const std::uint64_t total = 2ull * num_tokens * row_vecs;
  const auto blocks = static_cast<unsigned>(std::min<std::uint64_t>((total + kCopyThreads - 1) / kCopyThreads, 65535));
  write_kv_kernel<Dst><<<blocks, kCopyThreads, 0, to_cuda(stream)>>>(
      static_cast<char*>(k), static_cast<char*>(v), static_cast<const uint4*>(k_new), static_cast<const uint4*>(v_new),
      num_tokens, row_vecs, dst);
  check_launch("write_kv");
}

void launch_copy(const PageCopyParams& p, Stream stream, const char* name) {
  check_params(p);
  if (p.num_pages == 0 || p.page_bytes == 0) return;
  const auto addr = [](const void* x) { return reinterpret_cast<std::uintptr_t>(x); };
  const bool vectors = addr(p.dst_base) % 16 == 0 && addr(p.src_base) % 16 == 0 && p.dst_page_stride % 16 == 0 &&
                       p.src_page_stride % 16 == 0 && p.page_bytes % 16 == 0;
  const std::uint64_t units = vectors ? p.page_bytes / 16 : p.page_bytes;
  const auto parts = static_cast<unsigned>(std::clamp<std::uint64_t>(units / (kCopyThreads * 4), 1, 1024));
  copy_pages_kernel<<<dim3(p.num_pages, parts), kCopyThreads, 0, to_cuda(stream)>>>(
      static_cast<char*>(p.dst_base), static_cast<const char*>(p.src_base), p.dst_page_stride, p.src_page_stride,
      p.page_bytes, p.src_pages, p.dst_pages, vectors);
  check_launch(name);
}

}  // namespace
}  // namespace device

void write_kv(const PagedWriteParams& p, Stream stream) {
  check_params(p);
  if (p.num_tokens == 0) return;
  const auto row = static_cast<std::uint32_t>(token_row_bytes(p.cache.kv_heads, p.cache.head_dim, p.cache.dtype));
  device::launch_write(p.cache.k, p.cache.v, p.k_new, p.v_new, p.num_tokens, row,
                       device::PagedDst{p.page_ids, p.page_offsets, p.cache.page_stride_bytes, row}, stream);
}

void write_kv(const ContiguousWriteParams& p, Stream stream) {
  check_params(p);
  if (p.num_tokens == 0) return;
  const auto row = static_cast<std::uint32_t>(token_row_bytes(p.cache.kv_heads, p.cache.head_dim, p.cache.dtype));
  device::launch_write(p.cache.k, p.cache.v, p.k_new, p.v_new, p.num_tokens, row,
                       device::ContiguousDst{p.slot_idx, p.positions, p.cache.slot_stride_bytes, row}, stream);
}

void copy_pages(const PageCopyParams& p, Stream stream) { device::launch_copy(p, stream, "copy_pages"); }
void swap_pages(const PageCopyParams& p, Stream stream) { device::launch_copy(p, stream, "swap_pages"); }

}  // namespace kvmm::kernels
