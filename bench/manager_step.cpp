// KVCacheManager per-step cost: one decode step (append_token + allocate(r, 1) + commit)
// for each of 1024 running requests, two groups (full attention + sliding window 1024,
// 16-token pages). Counts heap allocations inside the timed loop (operator new hook).
#include "kvmm/manager/kv_cache_manager.hpp"
#include "support/count_new.hpp"

#include <benchmark/benchmark.h>

#include <vector>

namespace {

using namespace kvmm;

constexpr std::uint32_t kBatch = 1024, kPrompt = 2048, kMaxDecode = 2048;

KVLayout two_groups() {
  return KVLayout::plan({LayerGroup::full_attention("global", 23, 16, 128, 2, 16),
                         LayerGroup::sliding_window("local", 23, 16, 128, 2, 16, 1024)});
}

void BM_DecodeStep(benchmark::State& state) {
  const bool caching = state.range(0) != 0;
  // Full: (2048 + 2048) / 16 pages per request; sliding: ~1024 / 16 + 2; plus slack.
  KVCacheManager kv(two_groups(),
                    {.num_large_pages = kBatch * (256 + 80), .max_requests = kBatch, .prefix_caching = caching});
  std::vector<RequestId> ids(kBatch);
  std::vector<std::uint32_t> prompt(kPrompt);
  std::uint32_t wave = 0;
  auto start_wave = [&] {
    ++wave;
    for (std::uint32_t i = 0; i < kBatch; ++i) {
      for (std::uint32_t t = 0; t < kPrompt; ++t) prompt[t] = wave * 7919u + i * 104729u + t;
      ids[i] = kv.add_request(prompt, {.max_tokens = kPrompt + kMaxDecode});
      kv.lookup_prefix(ids[i]);
      if (!kv.allocate(ids[i], kPrompt)) state.SkipWithError("prefill allocation failed");
      kv.commit(ids[i], kPrompt);
    }
  };
  start_wave();
  // One untimed wave to full length sizes every slot's page-table rows (steady state).
  for (std::uint32_t s = 0; s < kMaxDecode; ++s) {
    kv.begin_step();
    for (RequestId r : ids) {
      kv.append_token(r, s);
      if (!kv.allocate(r, 1)) state.SkipWithError("warm-up allocation failed");
      kv.commit(r, kv.num_computed(r) + 1);
    }
  }
  for (RequestId r : ids) kv.free(r);
  start_wave();
  std::uint32_t step = 0;
  std::uint64_t allocs = 0, steps = 0;
  for (auto _ : state) {
    if (step == kMaxDecode) {  // requests finished: a new wave (untimed)
      state.PauseTiming();
      for (RequestId r : ids) kv.free(r);
      start_wave();
      step = 0;
      state.ResumeTiming();
    }
    const std::uint64_t before = kvmm::test::heap_allocations();
    kv.begin_step();
    for (RequestId r : ids) {
      kv.append_token(r, step);
      if (!kv.allocate(r, 1)) {
        state.SkipWithError("decode allocation failed");
        break;
      }
      kv.commit(r, kv.num_computed(r) + 1);
    }
    allocs += kvmm::test::heap_allocations() - before;
    ++steps;
    ++step;
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) * kBatch);
  state.counters["evicted_pages"] = static_cast<double>(kv.page_counts(0).evicted + kv.page_counts(1).evicted);
  state.counters["ns_per_request"] = benchmark::Counter(static_cast<double>(state.iterations()) * kBatch,
                                                        benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["heap_allocs_per_step"] = static_cast<double>(allocs) / static_cast<double>(steps ? steps : 1);
}
BENCHMARK(BM_DecodeStep)->Arg(1)->Arg(0)->Unit(benchmark::kMicrosecond)->Iterations(2048);

}  // namespace

BENCHMARK_MAIN();
