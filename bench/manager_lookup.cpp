// lookup_prefix of a fully cached 128k-token prompt, 16-token pages, hashing included:
// add_request (copies the ids) + lookup_prefix (hashes 8191 pages, probes the index,
// pins the pages). free() runs untimed. Arg: 1 = full attention only, 2 = full +
// sliding window 4096.
#include "kvmm/manager/kv_cache_manager.hpp"

#include <benchmark/benchmark.h>

#include <vector>

namespace {

using namespace kvmm;

constexpr std::uint32_t kTokens = 128 * 1024;

void BM_LookupCached128k(benchmark::State& state) {
  std::vector<LayerGroup> groups{LayerGroup::full_attention("global", 32, 8, 128, 2, 16)};
  if (state.range(0) == 2) groups.push_back(LayerGroup::sliding_window("local", 32, 8, 128, 2, 16, 4096));
  KVCacheManager kv(KVLayout::plan(groups), {.num_large_pages = 2 * (kTokens / 16 + 16), .max_requests = 4});
  std::vector<std::uint32_t> tokens(kTokens);
  for (std::uint32_t i = 0; i < kTokens; ++i) tokens[i] = i * 2654435761u;
  kv.begin_step();
  const RequestId warm = kv.add_request(tokens);
  kv.lookup_prefix(warm);
  if (!kv.allocate(warm, kTokens)) state.SkipWithError("warm-up allocation failed");
  kv.commit(warm, kTokens);
  kv.free(warm);
  std::uint64_t hit = 0;
  for (auto _ : state) {
    const RequestId r = kv.add_request(tokens);
    hit = kv.lookup_prefix(r);
    benchmark::DoNotOptimize(hit);
    state.PauseTiming();
    kv.free(r);
    state.ResumeTiming();
  }
  if (hit != kTokens - 16) state.SkipWithError("prompt not fully hit");
  state.counters["hit_tokens"] = static_cast<double>(hit);
}
BENCHMARK(BM_LookupCached128k)->Arg(1)->Arg(2)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
