// CUDA VMM backend on a real device. Every case returns early with a WARN when the
// driver is unavailable (the gpu test binary's main exits 77 without a device).
#include "kvmm/memory/chunk_pool.hpp"
#include "kvmm/memory/cuda_memory.hpp"
#include "kvmm/memory/virtual_kv_cache.hpp"

#include <cuda_runtime.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

using namespace kvmm;

namespace {
void* dptr(std::uint64_t a) { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(a)); }
bool skip() {
  if (CudaMemory::available()) return false;
  WARN("CUDA backend unavailable: " << CudaMemory::unavailable_reason());
  return true;
}
}  // namespace

TEST_CASE("CudaMemory: a chunk mapped at two addresses aliases the same device memory") {
  if (skip()) return;
  CudaMemory mem({.chunk_bytes = 2 << 20});
  CHECK(mem.granularity() > 0);
  CHECK(mem.chunk_bytes() % mem.granularity() == 0);
  VirtualRange a, b;
  REQUIRE(mem.reserve(4 << 20, &a));
  REQUIRE(mem.reserve(2 << 20, &b));
  ChunkHandle h;
  REQUIRE(mem.create_chunk(&h));
  REQUIRE(mem.map(h, a.base + (2 << 20)));
  REQUIRE(mem.map(h, b.base));
  REQUIRE(mem.set_access(a.base + (2 << 20), 2 << 20));
  REQUIRE(mem.set_access(b.base, 2 << 20));
  std::vector<unsigned char> in(4096), out(4096, 0);
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<unsigned char>(i * 13);
  REQUIRE(cudaMemcpy(dptr(a.base + (2 << 20) + 8192), in.data(), in.size(), cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(cudaMemcpy(out.data(), dptr(b.base + 8192), out.size(), cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(in == out);
  mem.unmap(a.base + (2 << 20), 2 << 20);
  mem.unmap(b.base, 2 << 20);
  mem.release_chunk(h);
  mem.free_range(a);
  mem.free_range(b);
}

TEST_CASE("CudaMemory: unmaps wait for an event on the consuming stream") {
  if (skip()) return;
  CudaMemory mem;
  ChunkPool pool(mem, {.max_chunks = 8, .precreate_chunks = 4});
  VirtualRange r;
  REQUIRE(pool.reserve(8 << 20, &r));
  std::vector<std::uint64_t> addrs = {r.base, r.base + (2 << 20), r.base + (4 << 20)};
  std::vector<ChunkId> ids(3);
  REQUIRE(pool.map_batch(ChunkOwner::kVirtualTensor, addrs, ids));
  cudaStream_t stream;
  REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
  REQUIRE(cudaMemsetAsync(dptr(r.base), 7, 6 << 20, stream) == cudaSuccess);
  mem.set_consumer_stream(stream);
  pool.unmap_batch(ids);
  CHECK(mem.pending_unmaps() == 1);  // one contiguous run, one event
  // The range can be mapped again right away: map() completes the retiring unmap first.
  REQUIRE(pool.map_batch(ChunkOwner::kVirtualTensor, addrs, ids));
  CHECK(mem.pending_unmaps() == 0);
  pool.unmap_batch(ids);
  REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
  mem.poll();
  CHECK(mem.pending_unmaps() == 0);
  mem.clear_consumer_stream();
  cudaStreamDestroy(stream);
  pool.free_range(r);
}

TEST_CASE("CudaMemory: a chunk exported as a POSIX fd imports as the same memory") {
  if (skip()) return;
  CudaMemory mem;
  VirtualRange a, b;
  REQUIRE(mem.reserve(2 << 20, &a));
  REQUIRE(mem.reserve(2 << 20, &b));
  ChunkHandle h;
  REQUIRE(mem.create_chunk(&h));
  REQUIRE(mem.map(h, a.base));
  REQUIRE(mem.set_access(a.base, 2 << 20));
  REQUIRE(cudaMemset(dptr(a.base), 0x3B, 2 << 20) == cudaSuccess);
  const int fd = mem.export_chunk(h);
  REQUIRE(fd >= 0);
  const ChunkHandle imported = mem.import_chunk(fd);
  close(fd);
  REQUIRE(mem.map(imported, b.base));
  REQUIRE(mem.set_access(b.base, 2 << 20));
  unsigned char byte = 0;
  REQUIRE(cudaMemcpy(&byte, dptr(b.base + 12345), 1, cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(byte == 0x3B);
  mem.unmap(b.base, 2 << 20);
  mem.unmap(a.base, 2 << 20);
  mem.release_chunk(imported);
  mem.release_chunk(h);
  mem.free_range(a);
  mem.free_range(b);
}

TEST_CASE("CudaMemory: virtual KV tensors grow on the device under the background mapper") {
  if (skip()) return;
  CudaMemory mem;
  ChunkPool pool(mem, {.max_chunks = 256, .precreate_chunks = 32});
  VirtualKVCacheOptions o;
  o.num_layers = 4;
  o.max_batch = 8;
  o.max_context = 4096;
  o.kv_heads = 8;
  o.head_dim = 128;
  o.dtype_bytes = 2;  // 2 KiB per token per tensor: 1024 tokens per 2 MiB group
  VirtualKVCache cache(pool, o);
  std::vector<std::uint32_t> lens(8, 0);
  const auto s = cache.alloc_reqid();
  REQUIRE(s);
  for (std::uint32_t len = 1; len <= 2100; len += 7) {
    lens[*s] = len;
    REQUIRE(cache.step(lens));
    const TensorView v = cache.v(3);
    const std::uint64_t last = v.base + *s * v.slot_stride + (len - 1) * v.token_stride;
    REQUIRE(cudaMemset(dptr(last), 1, v.token_stride) == cudaSuccess);
  }
  CHECK(cache.backed_groups(*s) >= 3);
  cache.wait_idle();
  cache.check_invariants();
}
