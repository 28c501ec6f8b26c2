// C++ twin of bench/python/step.py's decode step: 256 running requests (2048-token
// prompts, two groups: full attention + sliding window 1024, 16-token pages), each step
// append_token + allocate(r, 1) per request, an export of both groups and commit. Arg 0:
// no export; 1: the CSR export (FlashInfer's plan() input, O(pages)); 2: the incremental
// dense export (FlashAttention's block table, O(batch + changed)); 3: the same step as one
// decode_step call (commit of the previous step + append + allocate + export). Reported
// as ns per request.
#include "kvmm/manager/kernel_exports.hpp"
#include "kvmm/manager/kv_cache_manager.hpp"

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace {

using namespace kvmm;

constexpr std::uint32_t kBatch = 256, kPrompt = 2048, kMaxDecode = 2048;

void BM_DecodeStepExport(benchmark::State& state) {
  const std::int64_t mode = state.range(0);
  KVCacheManager kv(KVLayout::plan({LayerGroup::full_attention("global", 23, 16, 128, 2, 16),
                                    LayerGroup::sliding_window("local", 23, 16, 128, 2, 16, 1024)}),
                    {.num_large_pages = kBatch * (256 + 80), .max_requests = kBatch});
  std::vector<RequestId> ids(kBatch);
  std::vector<std::uint32_t> prompt(kPrompt);
  std::uint32_t wave = 0;
  auto start_wave = [&] {
    ++wave;
    kv.begin_step();
    for (std::uint32_t i = 0; i < kBatch; ++i) {
      for (std::uint32_t t = 0; t < kPrompt; ++t) prompt[t] = wave * 7919u + i * 104729u + t;
      ids[i] = kv.add_request(prompt, {.max_tokens = kPrompt + kMaxDecode});
      kv.lookup_prefix(ids[i]);
      if (!kv.allocate(ids[i], kPrompt)) state.SkipWithError("prefill allocation failed");
      kv.commit(ids[i], kPrompt);
    }
  };
  std::vector<std::int32_t> indptr(kBatch + 1), indices(kBatch * (kPrompt + kMaxDecode) / 16), last(kBatch);
  constexpr std::uint32_t kMaxPages = (kPrompt + kMaxDecode) / 16;
  std::vector<std::int32_t> dense[2] = {std::vector<std::int32_t>(kBatch * kMaxPages),
                                        std::vector<std::int32_t>(kBatch * kMaxPages)};
  const BlockTableOut tables[2] = {{.group = 0, .table = dense[0]}, {.group = 1, .table = dense[1]}};
  std::vector<std::uint32_t> tokens(kBatch);
  auto step = [&](std::uint32_t s) {
    kv.begin_step();
    if (mode == 3) {
      std::fill(tokens.begin(), tokens.end(), s);
      return KernelExports(kv).decode_step(ids, tokens, tables, kMaxPages, {.null_page = 0}) == kBatch;
    }
    for (RequestId r : ids) {
      kv.append_token(r, s);
      if (!kv.allocate(r, 1)) return false;
    }
    for (GroupId g = 0; g < 2; ++g) {
      if (mode == 1) KernelExports(kv).export_csr(g, ids, indptr, indices, last);
      if (mode == 2) KernelExports(kv).export_dense_incremental(g, ids, dense[g], kMaxPages, {.null_page = 0});
    }
    for (RequestId r : ids) kv.commit(r, KernelExports(kv).kv_len(r, 0));  // as commit_batch(ids) does
    return true;
  };
  start_wave();  // an untimed wave to full length sizes every row (steady state)
  for (std::uint32_t s = 0; s < kMaxDecode; ++s)
    if (!step(s)) state.SkipWithError("warm-up allocation failed");
  for (RequestId r : ids) kv.free(r);
  start_wave();
  std::uint32_t s = 0;
  for (auto _ : state) {
    if (s == kMaxDecode) {
      state.PauseTiming();
      for (RequestId r : ids) kv.free(r);
      start_wave();
      s = 0;
      state.ResumeTiming();
    }
    if (!step(s++)) {
      state.SkipWithError("decode allocation failed");
      break;
    }
    benchmark::DoNotOptimize(indices.data());
  }
  state.counters["ns_per_request"] = benchmark::Counter(static_cast<double>(state.iterations()) * kBatch,
                                                        benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_DecodeStepExport)->Arg(1)->Arg(0)->Arg(2)->Arg(3)->Unit(benchmark::kMicrosecond)->Iterations(2048);

}  // namespace

BENCHMARK_MAIN();
