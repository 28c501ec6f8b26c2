// write_kv (paged and contiguous), copy_pages and swap_pages. All are dtype-agnostic
// byte movers: rows of kv_heads * head_dim * 2 bytes (a multiple of 16) are moved as
// 16-byte vectors by grid-stride loops (each head's vectors to its place in the cache's
// order), so one launch covers a whole step.
#include "cache_ops.cuh"
#include "launch.cuh"

#include <algorithm>

namespace kvmm::kernels {
namespace device {
namespace {

template <typename Dst>
void launch_write(void* k, void* v, const void* k_new, const void* v_new, std::uint32_t num_tokens,
                  std::uint32_t row_bytes, const Dst& dst, HeadScatter heads, Stream stream) {
  const std::uint32_t row_vecs = row_bytes / 16;
  const std::uint64_t total = 2ull * num_tokens * row_vecs;
  const auto blocks = static_cast<unsigned>(std::min<std::uint64_t>((total + kCopyThreads - 1) / kCopyThreads, 65535));
  write_kv_kernel<Dst><<<blocks, kCopyThreads, 0, to_cuda(stream)>>>(
      static_cast<char*>(k), static_cast<char*>(v), static_cast<const uint4*>(k_new), static_cast<const uint4*>(v_new),
      num_tokens, row_vecs, dst, heads);
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
  device::launch_write(p.cache.k, p.cache.v, p.k_new, p.v_new, p.num_tokens, row, device::paged_dst(p),
                       device::head_scatter(p.cache), stream);
}

void write_kv(const ContiguousWriteParams& p, Stream stream) {
  check_params(p);
  if (p.num_tokens == 0) return;
  const auto row = static_cast<std::uint32_t>(token_row_bytes(p.cache.kv_heads, p.cache.head_dim, p.cache.dtype));
  device::launch_write(p.cache.k, p.cache.v, p.k_new, p.v_new, p.num_tokens, row, device::contiguous_dst(p),
                       device::head_scatter(p.cache), stream);
}

void copy_pages(const PageCopyParams& p, Stream stream) { device::launch_copy(p, stream, "copy_pages"); }
void swap_pages(const PageCopyParams& p, Stream stream) { device::launch_copy(p, stream, "swap_pages"); }

}  // namespace kvmm::kernels
