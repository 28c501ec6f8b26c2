// Backend costs on HostMemory: per-chunk map + set-access and unmap, batched vs
// per-chunk set-access, and allocation bandwidth (GB/s made usable through ChunkPool,
// with and without first touch). CUDA numbers need a GPU task (see docs/results/memory.md).
#include "kvmm/memory/chunk_pool.hpp"
#include "kvmm/memory/host_memory.hpp"

#include <benchmark/benchmark.h>

#include <chrono>
#include <cstring>
#include <vector>

using namespace kvmm;

namespace {
constexpr int kChunks = 64;
using Clock = std::chrono::steady_clock;

void set_per_chunk(benchmark::State& state, std::int64_t chunks) {
  state.counters["per_chunk"] =
      benchmark::Counter(double(chunks), benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

// Args: chunk KiB, batched access (1: one set_access per run, 0: one per chunk).
void BM_HostMapAccess(benchmark::State& state) {
  const std::uint64_t chunk = std::uint64_t(state.range(0)) << 10;
  const bool batched = state.range(1) != 0;
  HostMemory mem({.chunk_bytes = chunk});
  VirtualRange r;
  mem.reserve(kChunks * chunk, &r);
  std::vector<ChunkHandle> h(kChunks);
  for (auto& c : h) mem.create_chunk(&c);
  for (auto _ : state) {
    const auto t0 = Clock::now();
    for (int i = 0; i < kChunks; ++i) {
      mem.map(h[i], r.base + i * chunk);
      if (!batched) mem.set_access(r.base + i * chunk, chunk);
    }
    if (batched) mem.set_access(r.base, kChunks * chunk);
    const auto t1 = Clock::now();
    state.SetIterationTime(std::chrono::duration<double>(t1 - t0).count());
    mem.unmap(r.base, kChunks * chunk);
  }
  set_per_chunk(state, kChunks);
  for (auto c : h) mem.release_chunk(c);
  mem.free_range(r);
}
BENCHMARK(BM_HostMapAccess)->ArgsProduct({{64, 2048, 16384}, {0, 1}})->UseManualTime();

// Args: chunk KiB, batched unmap (1: one call per run, 0: one per chunk).
void BM_HostUnmap(benchmark::State& state) {
  const std::uint64_t chunk = std::uint64_t(state.range(0)) << 10;
  const bool batched = state.range(1) != 0;
  HostMemory mem({.chunk_bytes = chunk});
  VirtualRange r;
  mem.reserve(kChunks * chunk, &r);
  std::vector<ChunkHandle> h(kChunks);
  for (auto& c : h) mem.create_chunk(&c);
  for (auto _ : state) {
    for (int i = 0; i < kChunks; ++i) mem.map(h[i], r.base + i * chunk);
    mem.set_access(r.base, kChunks * chunk);
    const auto t0 = Clock::now();
    if (batched) {
      mem.unmap(r.base, kChunks * chunk);
    } else {
      for (int i = 0; i < kChunks; ++i) mem.unmap(r.base + i * chunk, chunk);
    }
    state.SetIterationTime(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  set_per_chunk(state, kChunks);
  for (auto c : h) mem.release_chunk(c);
  mem.free_range(r);
}
BENCHMARK(BM_HostUnmap)->ArgsProduct({{64, 2048, 16384}, {0, 1}})->UseManualTime();

// Allocation bandwidth through ChunkPool: create (or reuse) + map + one set_access per
// batch, then (touch=1) write every byte once, as a KV prefill would. Released after.
// Args: chunk KiB, touch, reuse idle handles (1) or create/release each time (0).
void BM_PoolAllocate(benchmark::State& state) {
  const std::uint64_t chunk = std::uint64_t(state.range(0)) << 10;
  const bool touch = state.range(1) != 0, reuse = state.range(2) != 0;
  const int n = int((std::uint64_t{256} << 20) / chunk);  // 256 MiB per iteration
  HostMemory mem({.chunk_bytes = chunk});
  ChunkPool pool(mem, {.max_chunks = std::uint32_t(n), .precreate_chunks = reuse ? std::uint32_t(n) : 0});
  VirtualRange r;
  pool.reserve(std::uint64_t(n) * chunk, &r);
  std::vector<std::uint64_t> addrs(n);
  std::vector<ChunkId> ids(n);
  for (int i = 0; i < n; ++i) addrs[i] = r.base + i * chunk;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    if (!pool.map_batch(ChunkOwner::kKVArena, addrs, ids)) state.SkipWithError("map_batch failed");
    if (touch) std::memset(reinterpret_cast<void*>(r.base), 1, std::size_t(n) * chunk);
    state.SetIterationTime(std::chrono::duration<double>(Clock::now() - t0).count());
    pool.unmap_batch(ids);
    if (!reuse) pool.trim(0);
  }
  state.SetBytesProcessed(std::int64_t(state.iterations()) * n * std::int64_t(chunk));
  pool.free_range(r);
}
BENCHMARK(BM_PoolAllocate)->ArgsProduct({{64, 2048, 16384}, {0, 1}, {0, 1}})->UseManualTime();

}  // namespace

BENCHMARK_MAIN();
