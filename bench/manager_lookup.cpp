// lookup_prefix of a fully cached 128k-token prompt, 16-token pages, hashing included:
// add_request (hashes 8192 pages) + lookup_prefix (probes 8191 pages) + allocate(r, 0)
// (pins and maps them: since lookup_prefix became pure, the pin moved there; the same
// three calls time the same work before and after). free() runs untimed. Arg: 1 = full attention only, 2 = full +
// sliding window 4096. The Scattered variant caches the prompt in every other page id
// (two prompts prefilled in turn), so no hit page follows the previous one and every
// probe goes to the prefix index. BM_LookupCached128kHash: the full-attention case under
// each KVCacheManagerOptions::block_hash (arg: 0 XXH3-128, 1 SHA-256, 2 keyed BLAKE2b, 3
// keyed BLAKE2b for salted requests only, the prompt unsalted: XXH3-128's cost).
// BM_LookupCached128kMissReasons: BM_LookupCached128k with the miss reasons on.
#include "kvmm/manager/kv_cache_manager.hpp"
#include "lookup_timing.hpp"

#include <benchmark/benchmark.h>

#include <string>
#include <vector>

namespace {

using namespace kvmm;

constexpr std::uint32_t kTokens = 128 * 1024;

// The timed part (lookup_timing.hpp); every page but the last, partial one is hit.
void time_lookups(benchmark::State& state, KVCacheManager& kv, const std::vector<std::uint32_t>& tokens) {
  if (kvmm::bench::time_lookups(state, kv, tokens) != kTokens - 16) state.SkipWithError("prompt not fully hit");
}

// Prefills the 128k-token prompt once and frees it: every full page is cached.
std::vector<std::uint32_t> cache_prompt(benchmark::State& state, KVCacheManager& kv) {
  std::vector<std::uint32_t> tokens(kTokens);
  for (std::uint32_t i = 0; i < kTokens; ++i) tokens[i] = i * 2654435761u;
  kv.begin_step();
  const RequestId warm = kv.add_request(tokens);
  kv.lookup_prefix(warm);
  if (!kv.allocate(warm, kTokens)) state.SkipWithError("warm-up allocation failed");
  kv.commit(warm, kTokens);
  kv.free(warm);
  return tokens;
}

void BM_LookupCached128k(benchmark::State& state) {
  std::vector<LayerGroup> groups{LayerGroup::full_attention("global", 32, 8, 128, 2, 16)};
  if (state.range(0) == 2) groups.push_back(LayerGroup::sliding_window("local", 32, 8, 128, 2, 16, 4096));
  KVCacheManager kv(KVLayout::plan(groups), {.num_large_pages = 2 * (kTokens / 16 + 16), .max_requests = 4});
  const std::vector<std::uint32_t> tokens = cache_prompt(state, kv);
  time_lookups(state, kv, tokens);
}
BENCHMARK(BM_LookupCached128k)->Arg(1)->Arg(2)->Unit(benchmark::kMicrosecond);

// The same with KVCacheManagerOptions::miss_reasons on (65,536 slots): each lookup also
// classifies where its hit stopped (the page floor here), add_request hashes the first
// page once more.
void BM_LookupCached128kMissReasons(benchmark::State& state) {
  std::vector<LayerGroup> groups{LayerGroup::full_attention("global", 32, 8, 128, 2, 16)};
  if (state.range(0) == 2) groups.push_back(LayerGroup::sliding_window("local", 32, 8, 128, 2, 16, 4096));
  KVCacheManager kv(KVLayout::plan(groups),
                    {.num_large_pages = 2 * (kTokens / 16 + 16), .max_requests = 4, .miss_reasons = 1u << 16});
  const std::vector<std::uint32_t> tokens = cache_prompt(state, kv);
  time_lookups(state, kv, tokens);
}
BENCHMARK(BM_LookupCached128kMissReasons)->Arg(1)->Arg(2)->Unit(benchmark::kMicrosecond);

void BM_LookupCached128kHash(benchmark::State& state) {
  BlockHashOptions o;
  o.function = state.range(0) == 3 ? BlockHashFunction::kBlake2bKeyed : static_cast<BlockHashFunction>(state.range(0));
  o.salted_only = state.range(0) == 3;
  if (o.function == BlockHashFunction::kBlake2bKeyed) o.key = "0123456789abcdef0123456789ABCDEF";
  KVCacheManager kv(KVLayout::plan({LayerGroup::full_attention("global", 32, 8, 128, 2, 16)}),
                    {.num_large_pages = 2 * (kTokens / 16 + 16), .max_requests = 4, .block_hash = o});
  const std::vector<std::uint32_t> tokens = cache_prompt(state, kv);
  time_lookups(state, kv, tokens);
  state.SetLabel(std::string(to_string(o.function)) + (o.salted_only ? " salted_only, unsalted prompt" : ""));
}
BENCHMARK(BM_LookupCached128kHash)->DenseRange(0, 3)->Unit(benchmark::kMicrosecond);

void BM_LookupCached128kScattered(benchmark::State& state) {
  KVCacheManager kv(KVLayout::plan({LayerGroup::full_attention("global", 32, 8, 128, 2, 16)}),
                    {.num_large_pages = 2 * (kTokens / 16 + 16), .max_requests = 4});
  std::vector<std::uint32_t> tokens(kTokens), other(kTokens);
  for (std::uint32_t i = 0; i < kTokens; ++i) {
    tokens[i] = i * 2654435761u;
    other[i] = i * 2246822519u + 1;
  }
  kv.begin_step();
  const RequestId a = kv.add_request(tokens), b = kv.add_request(other);
  kv.lookup_prefix(a);
  kv.lookup_prefix(b);
  for (std::uint32_t done = 0; done < kTokens; done += 16) {
    if (!kv.allocate(a, 16) || !kv.allocate(b, 16)) state.SkipWithError("warm-up allocation failed");
    kv.commit(a, done + 16);
    kv.commit(b, done + 16);
  }
  if (kv.page_table(a, 0)[1] == kv.page_table(a, 0)[0] + 1) state.SkipWithError("pages not scattered");
  kv.free(a);
  kv.free(b);
  time_lookups(state, kv, tokens);
}
BENCHMARK(BM_LookupCached128kScattered)->Unit(benchmark::kMicrosecond);

// A refused admission, as a scheduler retrying a blocked queue head each step does it
// (the 10k arXiv replay refuses about 2 admissions per admitted one): the 128k prompt is
// cached, the pool holds nothing else free, and the request asks for 64k new tokens more
// than exist. Timed: lookup_prefix + the refused allocate + reset (the request is kept,
// ids and hashes too, as the replay keeps it).
void BM_RefusedAdmission128k(benchmark::State& state) {
  KVCacheManager kv(KVLayout::plan({LayerGroup::full_attention("global", 32, 8, 128, 2, 16)}),
                    {.num_large_pages = kTokens / 16 + 16, .max_requests = 4});
  const std::vector<std::uint32_t> tokens = cache_prompt(state, kv);
  const RequestId r = kv.add_request(tokens);
  benchmark::IterationCount refused = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(kv.lookup_prefix(r));
    refused += !kv.allocate(r, 64 * 1024);
    kv.reset(r);
  }
  if (refused != state.iterations()) state.SkipWithError("an admission was not refused");
}
BENCHMARK(BM_RefusedAdmission128k)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
