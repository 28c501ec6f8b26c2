// The scheduler thread's cost of KvEventPublisher::publish() per stored page (issue 20
// target: <= 50 ns per page at 1e5 pages/s), against a baseline copy of the same batch
// arrays in the same run; and the publisher thread's encoding cost per page (both
// encodings). A step's batch: 16 stored runs of 64 pages, 16 tokens per page. And the
// manager's own cost of recording the events (record_kv_events on vs off, same run):
// prefill steps of 16 new 1024-token requests, each page newly cached, the pool full, so
// every step also evicts (removed runs).
#include "kvmm/distributed/event_publisher.hpp"
#include "kvmm/distributed/kv_event_encoding.hpp"
#include "kvmm/manager/kv_cache_manager.hpp"

#include <benchmark/benchmark.h>

#include <unistd.h>
#include <cstdlib>
#include <random>
#include <string>

using namespace kvmm;

namespace {

constexpr std::uint32_t kTpp = 16, kRuns = 16, kPagesPerRun = 64;
constexpr std::uint64_t kPages = std::uint64_t{kRuns} * kPagesPerRun;

KVLayout bench_layout() { return KVLayout::plan({LayerGroup::full_attention("full", 32, 8, 128, 2, kTpp)}); }

KvEventBatch step_batch() {
  std::mt19937_64 rng(1);
  KvEventBatch b;
  for (std::uint32_t r = 0; r < kRuns; ++r) {
    KvEvent e;
    e.kind = KvEventKind::kStored;
    e.group = 0;
    e.has_parent = r % 2 == 1;
    e.parent = BlockHash{rng(), rng()};
    e.first_page = e.has_parent ? 10 : 0;
    e.num_pages = kPagesPerRun;
    e.tokens_per_page = kTpp;
    e.hash_begin = static_cast<std::uint32_t>(b.hashes.size());
    e.token_begin = b.tokens.size();
    for (std::uint32_t p = 0; p < kPagesPerRun; ++p) {
      b.hashes.push_back(BlockHash{rng(), rng()});
      for (std::uint32_t t = 0; t < kTpp; ++t) b.tokens.push_back(static_cast<std::uint32_t>(rng() % 150000));
    }
    b.events.push_back(e);
  }
  return b;
}

// publish() on the scheduler thread; every 32 batches the timer stops while the publisher
// thread catches up (the target rate, 1e5 pages/s, is ~100 such batches per second).
void BM_PublishPerPage(benchmark::State& state) {
  const KVLayout layout = bench_layout();
  EventPublisherOptions opt;
  opt.endpoint = "ipc:///tmp/kvmm_bench_events_" + std::to_string(::getpid());
  opt.buffer_steps = 64;
  opt.encoding = state.range(0) == 0 ? EventEncoding::kMap : EventEncoding::kArray;
  KvEventPublisher pub(layout, opt);
  const KvEventBatch batch = step_batch();
  std::uint64_t n = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(pub.publish(batch, 1.0));
    if (++n % 32 == 0) {
      state.PauseTiming();
      pub.flush(std::chrono::seconds(10));
      state.ResumeTiming();
    }
  }
  pub.flush(std::chrono::seconds(10));
  state.counters["dropped"] = static_cast<double>(pub.stats().dropped);
  state.counters["ns_per_page"] = benchmark::Counter(static_cast<double>(state.iterations() * kPages),
                                                     benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * kPages));
}
BENCHMARK(BM_PublishPerPage)->Arg(0)->Arg(1)->UseRealTime();

// Baseline: copying the batch's arrays into a reused batch (what publish() must at least do).
void BM_CopyBatchPerPage(benchmark::State& state) {
  const KvEventBatch batch = step_batch();
  KvEventBatch copy = batch;
  for (auto _ : state) {
    copy.events.assign(batch.events.begin(), batch.events.end());
    copy.hashes.assign(batch.hashes.begin(), batch.hashes.end());
    copy.tokens.assign(batch.tokens.begin(), batch.tokens.end());
    benchmark::DoNotOptimize(copy.tokens.data());
  }
  state.counters["ns_per_page"] = benchmark::Counter(static_cast<double>(state.iterations() * kPages),
                                                     benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_CopyBatchPerPage);

// The publisher thread's work per page: msgpack encoding of the batch.
void BM_EncodePerPage(benchmark::State& state) {
  const KVLayout layout = bench_layout();
  const KvEventBatch batch = step_batch();
  const EventEncodeOptions opt{state.range(0) == 0 ? EventEncoding::kMap : EventEncoding::kArray, EventHashFormat::kU64,
                               0};
  std::vector<std::uint8_t> out;
  for (auto _ : state) {
    out.clear();
    encode_kv_event_batch(batch, layout, 1.0, opt, out);
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["bytes_per_page"] = static_cast<double>(out.size()) / kPages;
  state.counters["ns_per_page"] = benchmark::Counter(static_cast<double>(state.iterations() * kPages),
                                                     benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_EncodePerPage)->Arg(0)->Arg(1);

// A manager's prefill step with record_kv_events off (0) or on (1, the batch taken and
// passed back every step): add, lookup, allocate and commit 16 requests of 1024 new tokens,
// free them. Per stored page; the difference between the two is what recording costs the
// scheduler thread (with publish() above, the issue's <= 50 ns per page).
void BM_ManagerStepPerPage(benchmark::State& state) {
  const bool on = state.range(0) != 0;
  constexpr std::uint32_t kReqs = 16, kTokens = kPagesPerRun * kTpp;
  KVCacheManager kv(bench_layout(),
                    {.num_large_pages = kReqs * kPagesPerRun * 4, .max_requests = kReqs, .record_kv_events = on});
  std::vector<std::uint32_t> prompt(kTokens);
  std::vector<RequestId> ids(kReqs);
  KvEventBatch batch;
  std::uint32_t salt = 0;
  std::uint64_t stored = 0;
  auto step = [&] {
    kv.begin_step();
    for (RequestId& r : ids) {
      ++salt;
      for (std::uint32_t t = 0; t < kTokens; ++t) prompt[t] = salt * 7919u + t;
      r = kv.add_request(prompt, {.max_tokens = kTokens});
      kv.lookup_prefix(r);
      kv.allocate(r, kTokens);
      kv.commit(r, kTokens);
    }
    for (RequestId r : ids) kv.free(r);
    if (on) {
      kv.take_events(batch);
      for (const KvEvent& e : batch.events) stored += e.kind == KvEventKind::kStored ? e.num_pages : 0;
    }
  };
  for (int i = 0; i < 8; ++i) step();  // fill the pool: later steps evict
  stored = 0;
  for (auto _ : state) step();
  if (on && stored != static_cast<std::uint64_t>(state.iterations()) * kReqs * kPagesPerRun)
    state.SkipWithError("a page was not reported stored");
  state.counters["ns_per_page"] = benchmark::Counter(static_cast<double>(state.iterations() * kReqs * kPagesPerRun),
                                                     benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_ManagerStepPerPage)->Arg(0)->Arg(1);

}  // namespace

BENCHMARK_MAIN();
