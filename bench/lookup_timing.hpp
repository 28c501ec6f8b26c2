// The timed loop shared by the manager's lookup benchmarks: add_request + lookup_prefix +
// allocate(r, 0) of one prompt, free() untimed. Returns the last hit length so each
// benchmark checks it against what its setup cached. Costs nothing beyond those calls.
#pragma once

#include "kvmm/manager/kv_cache_manager.hpp"

#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

namespace kvmm::bench {

inline std::uint64_t time_lookups(benchmark::State& state, KVCacheManager& kv,
                                  const std::vector<std::uint32_t>& tokens) {
  std::uint64_t hit = 0;
  for (auto _ : state) {
    const RequestId r = kv.add_request(tokens);
    hit = kv.lookup_prefix(r);
    if (!kv.allocate(r, 0)) state.SkipWithError("admission refused");
    benchmark::DoNotOptimize(hit);
    state.PauseTiming();
    kv.free(r);
    state.ResumeTiming();
  }
  state.counters["hit_tokens"] = static_cast<double>(hit);
  return hit;
}

}  // namespace kvmm::bench
