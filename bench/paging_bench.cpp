// Microbenchmarks of the two-level allocator (issue 2 targets): small-page and
// large-page allocate+free pairs, one decode step over 256/1024 requests and 3 groups,
// and page-table export (CSR, dense, incremental dense) for 256 x 2k pages.
#include <kvmm/paging/kv_allocator.hpp>
#include <kvmm/paging/large_page_pool.hpp>
#include <kvmm/paging/small_page_allocator.hpp>
#include <kvmm/spec/kv_layout.hpp>

#include <benchmark/benchmark.h>

#include <random>
#include <vector>

using namespace kvmm;

namespace {

void BM_LargePageAllocFree(benchmark::State& state) {
  LargePagePool pool(4096);
  for (int i = 0; i < 2048; ++i) (void)pool.allocate(0);  // half full
  for (auto _ : state) {
    const LargePageId p = *pool.allocate(1);
    benchmark::DoNotOptimize(p);
    pool.free(p);
  }
}
BENCHMARK(BM_LargePageAllocFree);

// range(0) = 8: each of 1024 requests has a half-full large page, so the pair is served
// by step 1 (the common case). range(0) = 16: every request's large page is full, so
// each pair opens a fresh large page and returns it to the pool (the worst case).
void BM_SmallPageAllocFree(benchmark::State& state) {
  LargePagePool pool(4096);
  SmallPageAllocator alloc(0, 16, pool, 1024);
  const auto per_request = static_cast<int>(state.range(0));
  for (int i = 0; i < per_request * 1024; ++i) (void)alloc.allocate(Row{static_cast<std::uint32_t>(i % 1024)});
  Row r{0};
  for (auto _ : state) {
    const PageId p = *alloc.allocate(r);
    benchmark::DoNotOptimize(p);
    alloc.free(p);
    r.index = (r.index + 1) & 1023;
  }
}
BENCHMARK(BM_SmallPageAllocFree)->Arg(8)->Arg(16);

// Three decoder groups of different page sizes (a target model, a sliding-window
// group and a draft model), 16 tokens per page: one decode step appends one token to
// every request, so about 1 in 16 requests needs a new page in each group. Requests
// that reach 2048 tokens finish and are replaced by a new one with a 256-token prompt
// (contexts of 256-2048 tokens: 1024 of them fill an 80 GB GPU for an 8B model).
void BM_DecodeStep(benchmark::State& state) {
  const auto batch = static_cast<std::uint32_t>(state.range(0));
  KVLayout layout = KVLayout::plan({LayerGroup::full_attention("target", 32, 8, 128, 2, 16),
                                    LayerGroup::sliding_window("local", 16, 8, 128, 2, 16, 4096),
                                    LayerGroup::full_attention("draft", 8, 8, 64, 2, 16)});
  const std::uint32_t pages = batch * 2048 / 16;  // per group, worst case
  std::uint32_t large = 0;
  for (GroupId g = 0; g < 3; ++g) large += pages / layout.small_pages_per_large_page(g) + batch;
  PagedKVAllocator kv(layout, {.num_large_pages = large, .max_requests = batch});
  std::vector<RequestId> reqs;
  std::mt19937 rng(1);
  for (std::uint32_t i = 0; i < batch; ++i) {
    reqs.push_back(kv.add_request());
    (void)kv.append_tokens(reqs.back(), 256 + rng() % 1792);
  }
  // range(1) = 0: requests that finish are replaced outside the timed region, so the
  // time is the decode step alone; range(1) = 1: finishing and admitting are timed too.
  const bool timed_churn = state.range(1) != 0;
  std::uint64_t failed = 0;
  for (auto _ : state) {
    for (RequestId& r : reqs) {
      if (kv.num_tokens(r) >= 2048) {
        if (!timed_churn) state.PauseTiming();
        kv.free_request(r);
        r = kv.add_request();
        failed += !kv.append_tokens(r, 256);
        if (!timed_churn) state.ResumeTiming();
      }
      failed += !kv.append_tokens(r, 1);
    }
  }
  state.counters["failed"] = static_cast<double>(failed);
}
BENCHMARK(BM_DecodeStep)->ArgsProduct({{256, 1024}, {0, 1}})->Unit(benchmark::kMicrosecond);

struct ExportFixture {
  static constexpr std::uint32_t kBatch = 256, kPages = 2048;
  PageTableSet tables{kBatch, 16};
  std::vector<Row> batch;
  ExportFixture() {
    std::mt19937 rng(3);
    for (Row r{0}; r.index < kBatch; ++r.index) {
      batch.push_back(r);
      for (std::uint32_t i = 0; i < kPages - 1; ++i) tables.append(r, rng() % 1000000);
      tables.set_num_tokens(r, std::uint64_t{kPages - 1} * 16);
    }
  }
};

void BM_ExportCsr(benchmark::State& state) {
  ExportFixture f;
  std::vector<std::uint32_t> indptr(f.kBatch + 1), last(f.kBatch);
  std::vector<PageId> indices(std::size_t{f.kBatch} * f.kPages);
  for (auto _ : state) {
    benchmark::DoNotOptimize(f.tables.export_csr(f.batch, indptr, indices, last));
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * f.kBatch * (f.kPages - 1) * 4);
}
BENCHMARK(BM_ExportCsr)->Unit(benchmark::kMicrosecond);

void BM_ExportDense(benchmark::State& state) {
  ExportFixture f;
  std::vector<PageId> table(std::size_t{f.kBatch} * f.kPages);
  for (auto _ : state) {
    f.tables.export_dense(f.batch, table, f.kPages);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * f.kBatch * f.kPages * 4);
}
BENCHMARK(BM_ExportDense)->Unit(benchmark::kMicrosecond);

// Each step every row gains one page (one changed entry per row), then the same
// buffer is refreshed incrementally; the page is popped outside the timed region.
void BM_ExportDenseIncremental(benchmark::State& state) {
  ExportFixture f;
  std::vector<PageId> table(std::size_t{f.kBatch} * f.kPages);
  f.tables.export_dense_incremental(f.batch, table, f.kPages);
  std::size_t written = 0;
  for (auto _ : state) {
    state.PauseTiming();
    for (Row r : f.batch) {
      f.tables.pop_back(r);
      f.tables.append(r, 7);
    }
    state.ResumeTiming();
    written += f.tables.export_dense_incremental(f.batch, table, f.kPages);
    benchmark::ClobberMemory();
  }
  state.counters["entries_per_export"] = static_cast<double>(written) / static_cast<double>(state.iterations());
}
BENCHMARK(BM_ExportDenseIncremental)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
