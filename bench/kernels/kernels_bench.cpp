// GPU benchmarks of the kvmm kernels with Llama-3-8B attention shapes (32 query heads,
// 8 kv heads, head_dim 128, bf16): batch decode over paged (page sizes 1/16/64/256,
// page-layer layout, randomly permuted pages) and contiguous caches, reported as KV
// bytes read per second in decimal GB/s (KV_GBps, 1 GB = 1e9 B) and as the fraction of a
// device-to-device copy measured in the same run (of_copy; the copy rate counts bytes read
// plus written, copy_GBps); prefill throughput; copy_pages bandwidth. K/V and Q hold
// random bf16 data (fill.cu), never a constant. Times come from CUDA events (manual time).
#include "../../kernels/hopper_prefill_api.hpp"  // the sm_90a prefill scaffold
#include "../../kernels/tc_decode_api.hpp"       // the tensor-core decode, selectable beside the default
#include "../../kernels/tc_prefill_api.hpp"      // the tensor-core prefill, likewise
#include "fill.hpp"
#ifdef KVMM_BENCH_CUDNN
#include "../../kernels/cudnn_prefill.hpp"  // cuDNN's paged SDPA over the same pages (issue 37 item 3)
#endif

#include <kvmm/error.hpp>
#include <kvmm/kernels/attention.hpp>
#include <kvmm/kernels/cache_ops.hpp>

#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

using namespace kvmm;
using namespace kvmm::kernels;

namespace {

constexpr std::uint32_t kQHeads = 32, kKvHeads = 8, kDim = 128, kLayers = 2;
constexpr std::uint64_t kRowBytes = std::uint64_t{kKvHeads} * kDim * 2;
constexpr std::uint64_t kMaxTokens = std::uint64_t{2} << 20;  // keeps every cache under ~17 GB
int g_sms = 0;
double g_copy_gbps = 0.0;  // device-to-device copy, (read + written) bytes per second

bool ok(cudaError_t e, benchmark::State& state) {
  if (e == cudaSuccess) return true;
  state.SkipWithError(cudaGetErrorString(e));
  return false;
}

struct Device {
  void* p = nullptr;
  explicit Device(std::size_t bytes) {
    if (cudaMalloc(&p, std::max<std::size_t>(bytes, 16)) != cudaSuccess) p = nullptr;
  }
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  ~Device() {
    if (p != nullptr) cudaFree(p);
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

template <typename T>
void upload(Device& d, const std::vector<T>& v) {
  cudaMemcpy(d.p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
}

// Times `launch` with CUDA events, one event pair per iteration.
template <typename F>
void time_loop(benchmark::State& state, F&& launch) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  launch();  // warm-up
  cudaDeviceSynchronize();
  for (auto _ : state) {
    cudaEventRecord(start);
    launch();
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, start, stop);
    state.SetIterationTime(ms / 1e3);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  ok(cudaGetLastError(), state);
}

void BM_copy_d2d(benchmark::State& state) {
  const std::size_t bytes = std::size_t{1} << 30;
  Device a(bytes), b(bytes);
  if (a.p == nullptr || b.p == nullptr) return state.SkipWithError("cudaMalloc failed");
  cudaMemset(a.p, 1, bytes);
  time_loop(state, [&] { cudaMemcpyAsync(b.p, a.p, bytes, cudaMemcpyDeviceToDevice); });
  state.counters["GBps"] = benchmark::Counter(2.0 * double(bytes) * static_cast<double>(state.iterations()) / 1e9,
                                              benchmark::Counter::kIsRate);  // read + written
}

// A decode batch with every request at context `ctx`; Llama-3-8B's heads, or `kv_heads` kv
// heads with its group of 4 (the _kv1 rows: one kv head, 256-byte token rows); the split
// count fills the GPU with the CTAs `shape` launches (heads across warps: one CTA per 4 kv
// heads).
struct DecodeSetup {
  std::uint32_t batch, ctx, kv_heads, q_heads, splits;
  Device q, o, lens, ws, counters;
  DecodeSetup(std::uint32_t b, std::uint32_t c, std::uint32_t kvh = kKvHeads,
              const experimental::TcDecodeShape& shape = {})
      : batch(b),
        ctx(c),
        kv_heads(kvh),
        q_heads(kvh * (kQHeads / kKvHeads)),
        splits(experimental::tc_choose_num_splits(b, q_heads, kv_heads, c, static_cast<std::uint32_t>(g_sms), shape)),
        q(std::size_t{b} * q_heads * kDim * 2),
        o(std::size_t{b} * q_heads * kDim * 2),
        lens(b * 4),
        ws(attention_workspace_bytes(b, q_heads, kDim, splits)),
        counters(experimental::tc_merge_counters(b, q_heads) * 4) {
    if (counters.p != nullptr) cudaMemset(counters.p, 0, experimental::tc_merge_counters(b, q_heads) * 4);
    bench::fill_random_bf16(q.p, std::size_t{b} * q_heads * kDim * 2, 11);
    upload(lens, std::vector<std::uint32_t>(b, c));
  }
  QueryBatch query() const { return QueryBatch{q.p, o.p, batch, batch, q_heads, lens.as<std::uint32_t>(), nullptr}; }
  std::uint64_t row_bytes() const { return std::uint64_t{kv_heads} * kDim * 2; }
  double kv_bytes() const { return double(batch) * ctx * double(row_bytes()) * 2; }
};

void report(benchmark::State& state, double bytes, std::uint32_t splits) {
  const double iters = static_cast<double>(state.iterations());
  state.counters["KV_GBps"] = benchmark::Counter(bytes * iters / 1e9, benchmark::Counter::kIsRate);
  state.counters["of_copy"] =
      benchmark::Counter(g_copy_gbps > 0 ? bytes * iters / g_copy_gbps : 0.0, benchmark::Counter::kIsRate);
  state.counters["splits"] = splits;
  state.counters["copy_GBps"] = g_copy_gbps / 1e9;
}

// tc: 0 the default kernel, else the tensor-core kernel with a ring of `tc` stages per warp;
// in_kernel: its split pieces merged by the last CTA of each (request, kv head), one launch;
// shape: its warp tiles and grid order (TcDecodeShape; {} the default); order: inside the
// pages (KVOrder; head-major: the _hnd rows); kv1: ONE kv head (group 4) at 8x the batch
// (the _kv1 rows: the same K/V bytes and CTAs as 8 kv heads, token rows of 256 contiguous
// bytes, no new layout: issue 36's read-pattern hypothesis tested by the default order).
void decode_paged_at(benchmark::State& state, int tc, bool in_kernel, experimental::TcDecodeShape shape, KVOrder order,
                     bool kv1) {
  const auto batch = static_cast<std::uint32_t>(state.range(0)) * (kv1 ? kKvHeads : 1u);
  const auto ctx = static_cast<std::uint32_t>(state.range(1));
  const auto tpp = static_cast<std::uint32_t>(state.range(2));
  if (std::uint64_t{batch} * ctx > kMaxTokens * (kv1 ? kKvHeads : 1u))
    return state.SkipWithError("over the memory budget");
  DecodeSetup d(batch, ctx, kv1 ? 1u : kKvHeads, shape);
  const std::uint32_t per_req = (ctx + tpp - 1) / tpp;
  const std::uint32_t pages = batch * per_req;
  // Page-layer layout of a kLayers-layer group: per layer K then V, each [tpp][8][128]
  // (head-major: [8][tpp][128]).
  const std::uint64_t row_bytes = d.row_bytes();
  const std::uint64_t stride = std::uint64_t{kLayers} * 2 * tpp * row_bytes;
  Device arena(pages * stride), table(std::size_t{pages} * 4);
  if (arena.p == nullptr) return state.SkipWithError("cudaMalloc failed");
  bench::fill_random_bf16(arena.p, pages * stride, 1);
  std::vector<PageId> ids(pages);
  std::iota(ids.begin(), ids.end(), PageId{0});
  std::shuffle(ids.begin(), ids.end(), std::mt19937_64(1));
  upload(table, ids);
  PagedAttentionParams p;
  p.query = d.query();
  // Layer 1 of the group: its K and V sit behind layer 0's inside every page.
  p.cache = PagedKVCache{arena.as<char>() + 2 * tpp * row_bytes,
                         arena.as<char>() + 3 * tpp * row_bytes,
                         stride,
                         tpp,
                         d.kv_heads,
                         kDim,
                         DType::kBF16,
                         order};
  p.table = PageTableView{nullptr, table.as<PageId>(), per_req};
  p.split = SplitKV{d.splits, d.ws.p};
  time_loop(state, [&] {
    if (tc != 0)
      experimental::paged_decode_attention_tc(p, nullptr, static_cast<std::uint32_t>(tc),
                                              in_kernel ? d.counters.as<std::uint32_t>() : nullptr, shape);
    else
      paged_decode_attention(p, nullptr);
  });
  report(state, d.kv_bytes(), d.splits);
}
void decode_paged(benchmark::State& state, int tc, bool in_kernel, experimental::TcDecodeShape shape) {
  decode_paged_at(state, tc, in_kernel, shape, KVOrder::kTokenMajor, false);
}

// order: head-major slots [kv_heads][ctx][128] for the _hnd rows; shape: the tensor-core
// kernel's (TcDecodeShape; {} the default).
void decode_contiguous_at(benchmark::State& state, bool tc, KVOrder order, experimental::TcDecodeShape shape) {
  const auto batch = static_cast<std::uint32_t>(state.range(0));
  const auto ctx = static_cast<std::uint32_t>(state.range(1));
  if (std::uint64_t{batch} * ctx > kMaxTokens) return state.SkipWithError("over the memory budget");
  DecodeSetup d(batch, ctx, kKvHeads, shape);
  const std::uint64_t slot = ctx * kRowBytes;
  Device k(batch * slot), v(batch * slot), slots(batch * 4);
  if (k.p == nullptr || v.p == nullptr) return state.SkipWithError("cudaMalloc failed");
  bench::fill_random_bf16(k.p, batch * slot, 2);
  bench::fill_random_bf16(v.p, batch * slot, 3);
  std::vector<std::uint32_t> idx(batch);
  std::iota(idx.begin(), idx.end(), 0u);
  std::shuffle(idx.begin(), idx.end(), std::mt19937_64(2));
  upload(slots, idx);
  ContiguousAttentionParams p;
  p.query = d.query();
  p.cache = ContiguousKVCache{k.p, v.p, slot, ctx, kKvHeads, kDim, DType::kBF16, order};
  p.slot_idx = slots.as<std::uint32_t>();
  p.split = SplitKV{d.splits, d.ws.p};
  time_loop(state, [&] {
    if (tc)
      experimental::contiguous_decode_attention_tc(p, nullptr, 2, nullptr, shape);
    else
      contiguous_decode_attention(p, nullptr);
  });
  report(state, d.kv_bytes(), d.splits);
}
void decode_contiguous(benchmark::State& state, bool tc, experimental::TcDecodeShape shape) {
  decode_contiguous_at(state, tc, KVOrder::kTokenMajor, shape);
}

// One request: a chunk of `chunk` new tokens at the end of a `ctx`-token context, 16-token pages.
// tc: the tensor-core prefill (issue 37) instead of the default kernel; round_p_once: its
// FA2-numerics variant (P rounded once); wide: 32 rows per warp (TcPrefillRows::k32).
// hopper: the sm_90a kernel (experimental::paged_prefill_attention_hopper, issue 37 item
// 2) instead, round_p_once its P-once instance; skipped on devices other than compute
// capability 9.0.
void BM_prefill_paged(benchmark::State& state, bool tc, bool round_p_once, bool wide, bool hopper) {
  const auto chunk = static_cast<std::uint32_t>(state.range(0));
  const auto ctx = static_cast<std::uint32_t>(state.range(1));
  const std::uint32_t tpp = 16, pages = (ctx + tpp - 1) / tpp;
  const std::uint64_t stride = std::uint64_t{kLayers} * 2 * tpp * kRowBytes;
  Device arena(pages * stride), table(pages * 4), q(std::size_t{chunk} * kQHeads * kDim * 2),
      o(std::size_t{chunk} * kQHeads * kDim * 2), lens(4), indptr(8);
  if (arena.p == nullptr) return state.SkipWithError("cudaMalloc failed");
  bench::fill_random_bf16(arena.p, pages * stride, 4);
  bench::fill_random_bf16(q.p, std::size_t{chunk} * kQHeads * kDim * 2, 5);
  std::vector<PageId> ids(pages);
  std::iota(ids.begin(), ids.end(), PageId{0});
  upload(table, ids);
  upload(lens, std::vector<std::uint32_t>{ctx});
  upload(indptr, std::vector<std::uint32_t>{0, chunk});
  PagedAttentionParams p;
  p.query = QueryBatch{q.p, o.p, chunk, 1, kQHeads, lens.as<std::uint32_t>(), indptr.as<std::uint32_t>()};
  p.cache = PagedKVCache{arena.p, arena.as<char>() + tpp * kRowBytes, stride, tpp, kKvHeads, kDim, DType::kBF16};
  p.table = PageTableView{nullptr, table.as<PageId>(), pages};
  if (hopper) {
    try {
      experimental::paged_prefill_attention_hopper(p, nullptr, pages, round_p_once);
    } catch (const kvmm::Error& e) {
      return state.SkipWithError(e.what());
    }
  }
  time_loop(state, [&] {
    if (hopper)
      experimental::paged_prefill_attention_hopper(p, nullptr, pages, round_p_once);
    else if (tc)
      experimental::paged_prefill_attention_tc(
          p, nullptr, round_p_once, wide ? experimental::TcPrefillRows::k32 : experimental::TcPrefillRows::k16);
    else
      paged_prefill_attention(p, nullptr);
  });
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) * chunk);  // query tokens per second
  // Causal chunk: query i sees ctx - chunk + i + 1 keys; 4 flops per (query head, key, dim).
  const double keys = double(chunk) * (ctx - chunk) + double(chunk) * (chunk + 1) / 2;
  state.counters["TFLOPs"] =
      benchmark::Counter(4.0 * keys * kQHeads * kDim * double(state.iterations()) / 1e12, benchmark::Counter::kIsRate);
}

#ifdef KVMM_BENCH_CUDNN
// BM_prefill_paged's request through cuDNN's paged SDPA (kernels/cudnn_prefill.hpp), the
// graph built once before the loop: the page-layer arena itself (head_major false: the
// strides of kvmm's layout) or a head-major packed container of the same pages (the layout
// of cuDNN's samples). A refused graph skips the row with cuDNN's message.
void BM_prefill_cudnn(benchmark::State& state, bool head_major) {
  const auto chunk = static_cast<std::uint32_t>(state.range(0));
  const auto ctx = static_cast<std::uint32_t>(state.range(1));
  const std::uint32_t tpp = 16, pages = (ctx + tpp - 1) / tpp;
  const std::uint64_t stride = head_major ? 2 * tpp * kRowBytes : std::uint64_t{kLayers} * 2 * tpp * kRowBytes;
  Device arena(pages * stride), table(pages * 4), q(std::size_t{chunk} * kQHeads * kDim * 2),
      o(std::size_t{chunk} * kQHeads * kDim * 2), seq_q(4), seq_kv(4), offsets(8);
  if (arena.p == nullptr) return state.SkipWithError("cudaMalloc failed");
  bench::fill_random_bf16(arena.p, pages * stride, 4);
  bench::fill_random_bf16(q.p, std::size_t{chunk} * kQHeads * kDim * 2, 5);
  std::vector<std::int32_t> ids(pages);
  std::iota(ids.begin(), ids.end(), 0);
  upload(table, ids);
  upload(seq_q, std::vector<std::int32_t>{static_cast<std::int32_t>(chunk)});
  upload(seq_kv, std::vector<std::int32_t>{static_cast<std::int32_t>(ctx)});
  upload(offsets, std::vector<std::int32_t>{0, static_cast<std::int32_t>(chunk * kQHeads * kDim)});
  experimental::CudnnPrefillShape shape;
  shape.q_heads = kQHeads;
  shape.kv_heads = kKvHeads;
  shape.head_dim = kDim;
  shape.tokens_per_page = tpp;
  shape.max_q_len = chunk;
  shape.pages_per_seq = pages;
  shape.num_pages = pages;
  shape.page_stride = stride;
  shape.layout = head_major ? CudnnKVLayout::kHeadMajor : CudnnKVLayout::kPageLayer;
  experimental::CudnnPrefillArgs a;
  a.q = q.p;
  a.o = o.p;
  // Page-layer: K then V of layer 0 inside each page; head-major: two packed containers.
  a.k = arena.p;
  a.v = head_major ? arena.as<char>() + std::uint64_t{pages} * tpp * kRowBytes : arena.as<char>() + tpp * kRowBytes;
  a.page_table = table.as<std::int32_t>();
  a.seq_len_q = seq_q.as<std::int32_t>();
  a.seq_len_kv = seq_kv.as<std::int32_t>();
  a.q_offsets = offsets.as<std::int32_t>();
  try {
    const experimental::CudnnPagedPrefill graph(shape);
    Device ws(graph.workspace_bytes());
    graph.run(a, ws.p, nullptr);
    if (!ok(cudaDeviceSynchronize(), state)) return;
    time_loop(state, [&] { graph.run(a, ws.p, nullptr); });
  } catch (const std::exception& e) {
    return state.SkipWithError(e.what());
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) * chunk);
  const double keys = double(chunk) * (ctx - chunk) + double(chunk) * (chunk + 1) / 2;  // as BM_prefill_paged
  state.counters["TFLOPs"] =
      benchmark::Counter(4.0 * keys * kQHeads * kDim * double(state.iterations()) / 1e12, benchmark::Counter::kIsRate);
}
#endif

// All copy-on-write copies of a step in one launch: `n` 16-token pages of a 32-layer group.
void BM_copy_pages(benchmark::State& state) {
  const auto n = static_cast<std::uint32_t>(state.range(0));
  const std::uint64_t page = 32ull * 2 * 16 * kRowBytes;  // 8 MiB
  const std::uint32_t pages = 2 * n;
  Device arena(pages * page), src(n * 4), dst(n * 4);
  if (arena.p == nullptr) return state.SkipWithError("cudaMalloc failed");
  std::vector<PageId> ids(pages);
  std::iota(ids.begin(), ids.end(), PageId{0});
  std::shuffle(ids.begin(), ids.end(), std::mt19937_64(3));
  upload(src, std::vector<PageId>(ids.begin(), ids.begin() + n));
  upload(dst, std::vector<PageId>(ids.begin() + n, ids.end()));
  const PageCopyParams p{arena.p, arena.p, page, page, page, src.as<PageId>(), dst.as<PageId>(), n};
  time_loop(state, [&] { copy_pages(p, nullptr); });
  const double moved = 2.0 * double(page) * n * static_cast<double>(state.iterations());  // read + written
  state.counters["GBps"] = benchmark::Counter(moved / 1e9, benchmark::Counter::kIsRate);
  state.counters["of_copy"] =
      benchmark::Counter(g_copy_gbps > 0 ? moved / g_copy_gbps : 0.0, benchmark::Counter::kIsRate);
  state.counters["copy_GBps"] = g_copy_gbps / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("bench_kernels: no CUDA device; nothing to measure\n");
    return 0;
  }
  cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, 0);
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("bench_kernels: %s, %d SMs\n", prop.name, g_sms);
  {
    // The copy bandwidth the decode numbers are compared with, measured first.
    const std::size_t bytes = std::size_t{1} << 30;
    void *a = nullptr, *b = nullptr;
    if (cudaMalloc(&a, bytes) == cudaSuccess && cudaMalloc(&b, bytes) == cudaSuccess) {
      cudaEvent_t s, e;
      cudaEventCreate(&s);
      cudaEventCreate(&e);
      cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
      cudaEventRecord(s);
      for (int i = 0; i < 10; ++i) cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice);
      cudaEventRecord(e);
      cudaEventSynchronize(e);
      float ms = 0.0f;
      cudaEventElapsedTime(&ms, s, e);
      g_copy_gbps = 10.0 * 2 * bytes / (ms / 1e3);
      cudaEventDestroy(s);
      cudaEventDestroy(e);
    }
    cudaFree(a);
    cudaFree(b);
  }
  benchmark::RegisterBenchmark("copy_d2d", BM_copy_d2d)->UseManualTime()->Unit(benchmark::kMicrosecond);
  for (std::int64_t tpp : {1, 16, 64, 256})
    for (std::int64_t batch : {1, 16, 64, 256})
      for (std::int64_t ctx : {1024, 4096, 32768})
        benchmark::RegisterBenchmark("decode_paged", decode_paged, 0, false, experimental::TcDecodeShape{})
            ->Args({batch, ctx, tpp})
            ->ArgNames({"batch", "ctx", "tpp"})
            ->UseManualTime()
            ->Unit(benchmark::kMicrosecond);
  for (std::int64_t batch : {1, 16, 64, 256})
    for (std::int64_t ctx : {1024, 4096, 32768})
      benchmark::RegisterBenchmark("decode_contiguous", decode_contiguous, false, experimental::TcDecodeShape{})
          ->Args({batch, ctx})
          ->ArgNames({"batch", "ctx"})
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond);
  // The tensor-core decode (issue 36) on the same shapes: 16-token and 1-token pages, contiguous.
  for (std::int64_t tpp : {1, 16})
    for (std::int64_t batch : {1, 16, 64, 256})
      for (std::int64_t ctx : {1024, 4096, 32768})
        benchmark::RegisterBenchmark("decode_paged_tc", decode_paged, 2, false, experimental::TcDecodeShape{})
            ->Args({batch, ctx, tpp})
            ->ArgNames({"batch", "ctx", "tpp"})
            ->UseManualTime()
            ->Unit(benchmark::kMicrosecond);
  // Its split pieces merged inside the kernel by the last CTA (one launch, not two).
  for (std::int64_t batch : {1, 16, 64, 256})
    for (std::int64_t ctx : {1024, 4096, 32768})
      benchmark::RegisterBenchmark("decode_paged_tcm", decode_paged, 2, true, experimental::TcDecodeShape{})
          ->Args({batch, ctx, 16})
          ->ArgNames({"batch", "ctx", "tpp"})
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond);
  // Its deeper rings (3 and 4 stages per warp: 2 and 1 CTAs per SM at head dim 128).
  for (int stages : {3, 4})
    for (std::int64_t batch : {1, 16, 64, 256})
      for (std::int64_t ctx : {1024, 4096, 32768})
        benchmark::RegisterBenchmark(stages == 3 ? "decode_paged_tc3" : "decode_paged_tc4", decode_paged, stages, false,
                                     experimental::TcDecodeShape{})
            ->Args({batch, ctx, 16})
            ->ArgNames({"batch", "ctx", "tpp"})
            ->UseManualTime()
            ->Unit(benchmark::kMicrosecond);
  // Its CTA shapes (issue 36, the H200 run of 2026-11-28: one CTA of 4 warps per SM at the
  // default 128 KiB ring): _t16 16-token warp tiles (64 KiB, 3 CTAs per SM), _hf the grid
  // with kv heads along x (a request's kv heads side by side), _t16hf both.
  for (const char* name : {"decode_paged_tc_t16", "decode_paged_tc_hf", "decode_paged_tc_t16hf"}) {
    const std::string n = name;
    const experimental::TcDecodeShape shape{n.find("t16") != std::string::npos ? 16u : 0u,
                                            n.find("hf") != std::string::npos};
    for (std::int64_t batch : {1, 16, 64, 256})
      for (std::int64_t ctx : {1024, 4096, 32768})
        benchmark::RegisterBenchmark(name, decode_paged, 2, false, shape)
            ->Args({batch, ctx, 16})
            ->ArgNames({"batch", "ctx", "tpp"})
            ->UseManualTime()
            ->Unit(benchmark::kMicrosecond);
  }
  // Its limiter probes (issue 36, TcDecodeShape::probe, the default shape otherwise):
  // _loadonly the same cp.async ring with no math (the memory pipeline's ceiling; outputs
  // wrong), _mathonly the same loop with no K/V loads (the math chain's ceiling; outputs
  // wrong; "of copy" as if it had read the K/V), _plain the copy lane map shipped before the
  // sector map (24 L1 sectors per K/V request, not 16; the same bits as decode_paged_tc).
  for (const auto& [name, probe] : {std::pair{"decode_paged_tc_loadonly", 1u},
                                    std::pair{"decode_paged_tc_mathonly", 2u}, std::pair{"decode_paged_tc_plain", 3u}})
    for (std::int64_t batch : {16, 64, 256})
      for (std::int64_t ctx : {4096, 32768})
        benchmark::RegisterBenchmark(name, decode_paged, 2, false, experimental::TcDecodeShape{0, false, probe})
            ->Args({batch, ctx, 16})
            ->ArgNames({"batch", "ctx", "tpp"})
            ->UseManualTime()
            ->Unit(benchmark::kMicrosecond);
  for (std::int64_t batch : {1, 16, 64, 256})
    for (std::int64_t ctx : {1024, 4096, 32768})
      benchmark::RegisterBenchmark("decode_contiguous_tc", decode_contiguous, true, experimental::TcDecodeShape{})
          ->Args({batch, ctx})
          ->ArgNames({"batch", "ctx"})
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond);
  // Issue 36's read-pattern hypothesis (H2): head-major pages and slots (KVOrder::kHeadMajor,
  // a CTA's 16-token page tile one 4 KiB run) for the tensor-core decode (_tc_hnd, paged and
  // contiguous) and the default kernel (decode_paged_hnd); and without any new layout, one kv
  // head at 8x the batch (_kv1: the same bytes and CTAs, 256-byte token rows).
  for (std::int64_t batch : {16, 64, 256})
    for (std::int64_t ctx : {1024, 4096, 32768}) {
      for (const auto& [name, tc, order, kv1] : {std::tuple{"decode_paged_tc_hnd", 2, KVOrder::kHeadMajor, false},
                                                 std::tuple{"decode_paged_hnd", 0, KVOrder::kHeadMajor, false},
                                                 std::tuple{"decode_paged_tc_kv1", 2, KVOrder::kTokenMajor, true}})
        benchmark::RegisterBenchmark(name, decode_paged_at, tc, false, experimental::TcDecodeShape{}, order, kv1)
            ->Args({batch, ctx, 16})
            ->ArgNames({"batch", "ctx", "tpp"})
            ->UseManualTime()
            ->Unit(benchmark::kMicrosecond);
      benchmark::RegisterBenchmark("decode_contiguous_tc_hnd", decode_contiguous_at, true, KVOrder::kHeadMajor,
                                   experimental::TcDecodeShape{})
          ->Args({batch, ctx})
          ->ArgNames({"batch", "ctx"})
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond);
    }
  // Heads across warps (TcDecodeShape::warp_heads, issue 36's read-pattern hypothesis): one CTA
  // per (request, 4 kv heads, split), the warps on adjacent heads of the same tokens (1 KiB of
  // each 2 KiB token row), on the heads-first grid (a request's two CTAs side by side, the
  // whole row between them); the split count for its 4x fewer CTAs (tc_choose_num_splits).
  experimental::TcDecodeShape hw;
  hw.heads_first = true;
  hw.warp_heads = true;
  for (std::int64_t batch : {1, 16, 64, 256})
    for (std::int64_t ctx : {1024, 4096, 32768}) {
      benchmark::RegisterBenchmark("decode_paged_tc_hw", decode_paged, 2, false, hw)
          ->Args({batch, ctx, 16})
          ->ArgNames({"batch", "ctx", "tpp"})
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond);
      benchmark::RegisterBenchmark("decode_contiguous_tc_hw", decode_contiguous, true, hw)
          ->Args({batch, ctx})
          ->ArgNames({"batch", "ctx"})
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond);
    }
  for (std::int64_t chunk : {512, 2048})
    for (std::int64_t ctx : {2048, 8192})
      // default; tensor-core (16 rows per warp) with P split / rounded once; the same at 32
      // rows per warp
      for (int kind = 0; kind < 5; ++kind)
        benchmark::RegisterBenchmark(kind == 0   ? "prefill_paged"
                                     : kind == 1 ? "prefill_paged_tc"
                                     : kind == 2 ? "prefill_paged_tc1"
                                     : kind == 3 ? "prefill_paged_tc32"
                                                 : "prefill_paged_tc32_1",
                                     BM_prefill_paged, kind > 0, kind == 2 || kind == 4, kind >= 3, false)
            ->Args({chunk, ctx})
            ->ArgNames({"chunk", "ctx"})
            ->UseManualTime()
            ->Unit(benchmark::kMicrosecond);
#ifdef KVMM_BENCH_CUDNN
  std::printf("bench_kernels: cuDNN runtime %d, headers %d\n", experimental::cudnn_runtime_version(),
              experimental::cudnn_header_version());
  for (std::int64_t chunk : {512, 2048})
    for (std::int64_t ctx : {2048, 8192})
      for (const bool hm : {false, true})
        benchmark::RegisterBenchmark(hm ? "prefill_paged_cudnn_hm" : "prefill_paged_cudnn", BM_prefill_cudnn, hm)
            ->Args({chunk, ctx})
            ->ArgNames({"chunk", "ctx"})
            ->UseManualTime()
            ->Unit(benchmark::kMicrosecond);
#endif
  for (std::int64_t n : {1, 16, 64})
    benchmark::RegisterBenchmark("copy_pages", BM_copy_pages)->Arg(n)->UseManualTime()->Unit(benchmark::kMicrosecond);
  // Last: the sm_90a scaffold, not yet run on a GPU (a trapped launch spoils the context
  // for whatever runs after it in this process).
  for (const bool once : {false, true})
    for (std::int64_t chunk : {512, 2048})
      for (std::int64_t ctx : {2048, 8192})
        benchmark::RegisterBenchmark(once ? "prefill_paged_h90_1" : "prefill_paged_h90", BM_prefill_paged, false, once,
                                     false, true)
            ->Args({chunk, ctx})
            ->ArgNames({"chunk", "ctx"})
            ->UseManualTime()
            ->Unit(benchmark::kMicrosecond);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
