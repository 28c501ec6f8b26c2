// vAttention step() latency for a decode batch of 256 on HostMemory, with and without
// the background mapper. A phase runs 256 decode steps over requests at staggered
// lengths, so 8 requests cross a page-group boundary every step; a simulated forward
// pass (a sleep: the scheduler thread waits for the device) separates steps. Reports p50/p99/max of step() alone and
// how many steps mapped on the calling thread.
#include "kvmm/memory/chunk_pool.hpp"
#include "kvmm/memory/host_memory.hpp"
#include "kvmm/memory/virtual_kv_cache.hpp"

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

using namespace kvmm;

namespace {
using Clock = std::chrono::steady_clock;
constexpr std::uint32_t kBatch = 256, kSteps = 256;

// The forward pass: on a GPU engine the scheduler thread mostly waits for the device.
void forward_pass(std::chrono::microseconds d) {
  if (d.count() > 0) std::this_thread::sleep_for(d);
}

// Args: background mapper (0/1), simulated forward pass in µs, tokens added per step
// (1: decode; 0: lengths frozen, so no step ever needs memory - the floor of step()
// latency on this machine, including being descheduled), prefetch_tokens.
void BM_DecodeStep(benchmark::State& state) {
  const bool mapper = state.range(0) != 0;
  const auto forward = std::chrono::microseconds(state.range(1));
  const std::uint32_t grow = std::uint32_t(state.range(2));
  const std::uint32_t ahead = std::uint32_t(state.range(3));
  // 2 layers, 2 KV heads x 128 dims x fp16 = 512 bytes per token per tensor; 16 KiB
  // page groups hold 32 tokens, so 256 staggered requests cross 8 boundaries a step.
  VirtualKVCacheOptions o;
  o.num_layers = 2;
  o.max_batch = kBatch;
  o.max_context = 1024;
  o.kv_heads = 2;
  o.head_dim = 128;
  o.dtype_bytes = 2;
  o.page_group_bytes = 16 << 10;
  o.background_mapper = mapper;
  o.prefetch_tokens = ahead;
  HostMemory mem({.chunk_bytes = 16 << 10});
  std::vector<double> lat;
  lat.reserve(std::size_t(kSteps) * 64);
  std::uint64_t sync_steps = 0, steps = 0;
  for (auto _ : state) {
    ChunkPool pool(mem, {.max_chunks = kBatch * 32 * 4});
    VirtualKVCache cache(pool, o);
    std::vector<std::uint32_t> lens(kBatch);
    for (std::uint32_t s = 0; s < kBatch; ++s) {
      cache.alloc_reqid();
      lens[s] = 1 + s;
    }
    cache.step(lens);  // prefill, not measured
    cache.wait_idle();
    const auto sync0 = cache.stats().sync_steps;
    double total = 0;
    for (std::uint32_t t = 0; t < kSteps; ++t) {
      for (auto& l : lens) l += grow;
      const auto t0 = Clock::now();
      const bool ok = cache.step(lens);
      const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
      if (!ok) state.SkipWithError("step failed");
      lat.push_back(us);
      total += us;
      forward_pass(forward);
    }
    state.SetIterationTime(total * 1e-6);
    sync_steps += cache.stats().sync_steps - sync0;
    steps += kSteps;
  }
  std::sort(lat.begin(), lat.end());
  auto pct = [&](double p) { return lat[std::min(lat.size() - 1, std::size_t(p * double(lat.size())))]; };
  state.counters["p50_us"] = pct(0.50);
  state.counters["p99_us"] = pct(0.99);
  state.counters["max_us"] = lat.back();
  state.counters["sync_step_frac"] = double(sync_steps) / double(steps);
}
BENCHMARK(BM_DecodeStep)
    ->Args({0, 0, 1, 1})
    ->Args({0, 1000, 1, 1})
    ->Args({1, 0, 1, 1})
    ->Args({1, 1000, 1, 1})
    ->Args({1, 1000, 1, 8})
    ->Args({1, 5000, 1, 1})
    ->Args({1, 5000, 1, 8})
    ->Args({1, 5000, 0, 1})
    ->Iterations(4)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// The fast path alone: 256 active slots, all backed, lengths unchanged: step() is the
// validation loop and one atomic load per slot.
void BM_StepFastPath(benchmark::State& state) {
  VirtualKVCacheOptions o;
  o.num_layers = 2;
  o.max_batch = kBatch;
  o.max_context = 1024;
  o.kv_heads = 2;
  o.head_dim = 128;
  o.dtype_bytes = 2;
  o.page_group_bytes = 16 << 10;
  o.background_mapper = true;
  HostMemory mem({.chunk_bytes = 16 << 10});
  ChunkPool pool(mem, {.max_chunks = kBatch * 32 * 4});
  VirtualKVCache cache(pool, o);
  std::vector<std::uint32_t> lens(kBatch);
  for (std::uint32_t s = 0; s < kBatch; ++s) {
    cache.alloc_reqid();
    lens[s] = 1 + s;
  }
  cache.step(lens);
  cache.wait_idle();
  cache.step(lens);
  cache.wait_idle();
  for (auto _ : state) benchmark::DoNotOptimize(cache.step(lens));
  state.counters["sync_steps"] = double(cache.stats().sync_steps);
}
BENCHMARK(BM_StepFastPath);

}  // namespace

BENCHMARK_MAIN();
