// Replay speed of kvmm-sim: wall time of one simulation (workload generated outside the
// timed region, no CSV). The target: 10k arXiv-QA requests with the kvmm policy
// in <= 10 s on the 2-core CI machine.
#include "sim/model_config.hpp"
#include "sim/policy.hpp"
#include "sim/scheduler.hpp"
#include "sim/workload.hpp"

#include <benchmark/benchmark.h>

#include <string>

namespace {

void replay(benchmark::State& state, const char* model, const char* workload, const char* policy, double memory_gib) {
  const kvmm::KVLayout layout = kvmm::sim::load_model(model);
  kvmm::sim::WorkloadOptions wo;
  wo.num_requests = static_cast<std::uint32_t>(state.range(0));
  const kvmm::sim::Workload w = kvmm::sim::make_workload(workload, wo);
  kvmm::sim::PolicyOptions po;
  po.memory_bytes = static_cast<std::uint64_t>(memory_gib * 1073741824.0);
  std::uint64_t steps = 0;
  for (auto _ : state) {
    auto p = kvmm::sim::make_policy(policy, layout, po);
    const kvmm::sim::Summary s = kvmm::sim::simulate(w, layout, *p, {}, nullptr);
    steps = s.steps;
    benchmark::DoNotOptimize(s.mean_wasted);
  }
  state.counters["steps"] = static_cast<double>(steps);
  state.counters["requests/s"] = benchmark::Counter(
      static_cast<double>(state.range(0)) * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}

void BM_ArxivKvmmMinistral(benchmark::State& s) { replay(s, "ministral-8b", "arxiv-qa", "kvmm", 55); }
void BM_ArxivKvmmGemma2(benchmark::State& s) { replay(s, "gemma-2-27b", "arxiv-qa", "kvmm", 80); }
void BM_ShareGptKvmmJamba(benchmark::State& s) { replay(s, "jamba-1.5-mini", "sharegpt", "kvmm", 4); }
void BM_MmmuKvmmLlamaVision(benchmark::State& s) { replay(s, "llama-3.2-11b-vision", "mmmu-pro", "kvmm", 50); }

}  // namespace

BENCHMARK(BM_ArxivKvmmMinistral)->Arg(10000)->Unit(benchmark::kSecond)->Iterations(1);
BENCHMARK(BM_ArxivKvmmGemma2)->Arg(10000)->Unit(benchmark::kSecond)->Iterations(1);
BENCHMARK(BM_ShareGptKvmmJamba)->Arg(10000)->Unit(benchmark::kMillisecond)->Iterations(1);
BENCHMARK(BM_MmmuKvmmLlamaVision)->Arg(10000)->Unit(benchmark::kMillisecond)->Iterations(1);

BENCHMARK_MAIN();
