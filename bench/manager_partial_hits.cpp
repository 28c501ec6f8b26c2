// The bookkeeping of hits finer than a page (KVCacheManagerOptions::hit_unit, issue 34
// item 3), 64-token pages, full attention. Arg 0 is the hit unit (0: off, the baseline).
// BM_PartialIndexPrefill: allocate + commit + free of a fresh 8,192-token prompt (128
// pages, each indexed at commit, the partial last page at free; older prompts evicted as
// the pool turns over): the indexing cost per cached page. BM_PartialLookup: add_request +
// lookup_prefix + allocate(r, 0) + free of a follower whose prompt leaves a cached page
// 40 tokens in (the hit ends inside it, a copy planned), with arg 1 other cached pages
// after the same parent page (siblings a lookup may have to tell apart); free() untimed.
#include "kvmm/manager/kv_cache_manager.hpp"
#include "lookup_timing.hpp"

#include <benchmark/benchmark.h>

#include <vector>

namespace {

using namespace kvmm;

constexpr std::uint32_t kP = 64;

KVLayout layout() { return KVLayout::plan({LayerGroup::full_attention("global", 32, 8, 128, 2, kP)}); }

std::vector<std::uint32_t> prompt(std::uint32_t n, std::uint32_t seed) {
  std::vector<std::uint32_t> t(n);
  for (std::uint32_t i = 0; i < n; ++i) t[i] = (i + 1) * 2654435761u + seed * 40503u;
  return t;
}

// Prefills t in one step and frees it: its pages cached.
bool prefill(KVCacheManager& kv, const std::vector<std::uint32_t>& t) {
  const RequestId r = kv.add_request(t);
  const std::uint64_t hit = kv.lookup_prefix(r);
  if (!kv.allocate(r, static_cast<std::uint32_t>(t.size() - hit))) return false;
  kv.begin_step();
  kv.commit(r, t.size());
  kv.free(r);
  return true;
}

void BM_PartialIndexPrefill(benchmark::State& state) {
  constexpr std::uint32_t kTokens = 8192 + 40;  // 128 full pages and a partial one
  KVCacheManager kv(layout(), {.num_large_pages = 8 * (kTokens / kP + 1),
                               .max_requests = 4,
                               .hit_unit = static_cast<std::uint32_t>(state.range(0))});
  std::uint32_t seed = 0;
  std::vector<std::uint32_t> t = prompt(kTokens, seed);
  for (auto _ : state) {
    if (!prefill(kv, t)) state.SkipWithError("allocation failed");
    state.PauseTiming();
    t = prompt(kTokens, ++seed);
    state.ResumeTiming();
  }
  state.counters["pages"] = benchmark::Counter(static_cast<double>(state.iterations()) * (kTokens / kP + 1),
                                               benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_PartialIndexPrefill)->Arg(0)->Arg(16)->Arg(4)->Arg(1)->Unit(benchmark::kMicrosecond);

void BM_PartialLookup(benchmark::State& state) {
  const auto unit = static_cast<std::uint32_t>(state.range(0));
  const auto siblings = static_cast<std::uint32_t>(state.range(1));
  KVCacheManager kv(layout(), {.num_large_pages = 4 * (siblings + 8), .max_requests = 4, .hit_unit = unit});
  // The shared first page, then a second page: the source's (its first 48 tokens are the
  // follower's) and each sibling's (its first 8 tokens are, then it parts).
  const std::vector<std::uint32_t> head = prompt(kP, 1);
  auto with = [&](const std::vector<std::uint32_t>& tail) {
    std::vector<std::uint32_t> t = head;
    t.insert(t.end(), tail.begin(), tail.end());
    return t;
  };
  const std::vector<std::uint32_t> second = prompt(kP, 2);
  for (std::uint32_t k = 0; k < siblings; ++k) {
    std::vector<std::uint32_t> s = second;
    for (std::uint32_t i = 8; i < kP; ++i) s[i] = 7'000'000 + k * kP + i;
    if (!prefill(kv, with(s))) state.SkipWithError("sibling prefill failed");
  }
  if (!prefill(kv, with(second))) state.SkipWithError("source prefill failed");
  std::vector<std::uint32_t> f = second;
  for (std::uint32_t i = 40; i < kP; ++i) f[i] = 9'000'000 + i;
  const std::vector<std::uint32_t> follower = with(f);
  const std::uint64_t hit = kvmm::bench::time_lookups(state, kv, follower);
  const std::uint64_t want = unit == 0 ? kP : kP + 40 / unit * unit;
  if (hit != want) state.SkipWithError("unexpected hit length");
}
BENCHMARK(BM_PartialLookup)->ArgsProduct({{0, 16, 4, 1}, {0, 64}})->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
