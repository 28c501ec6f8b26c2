// Steady state makes no heap allocation: a counting global operator new watches a second
// wave of requests (add, lookup, prefill, reset and lookup again, decode steps with
// evictions, free) after a first wave sized every slot. With record_kv_events, the batch
// taken after every call and passed back: the third wave is watched (the second is the
// first to evict, so the first whose batches hold removed runs).
#include "kvmm/manager/kv_cache_manager.hpp"
#include "support/count_new.hpp"

#include <catch2/catch.hpp>

#include <vector>

using namespace kvmm;

TEST_CASE("no heap allocation per step in steady state", "[manager][alloc]") {
#if defined(KVMM_DEBUG_CHECKS) && KVMM_DEBUG_CHECKS >= 2
  // Tier 2 replays every fast path against its generic path (the in-order probe against
  // longest_valid_prefix with a scratch memo, the refusal before the pin against the full
  // pin-and-replay), tier 3 recounts every invariant: both allocate scratch by design.
  WARN("skipped: debug tier " << KVMM_DEBUG_CHECKS << " checks fast paths against generic ones with scratch vectors");
  return;
#endif
  const KVLayout layout = KVLayout::plan(
      {LayerGroup::full_attention("full", 2, 2, 16, 2, 16), LayerGroup::sliding_window("sw", 2, 2, 16, 2, 16, 64)});
  const bool kv_events = GENERATE(false, true);
  INFO("record_kv_events " << kv_events);
  // Tight enough that the second wave evicts the first wave's cached pages.
  // (Up to 38 pages a request: 25 full-attention, 5 in the window, up to 8 held for the
  // prompt's tail until the answer outgrows it.)
  KVCacheManager kv(layout, {.num_large_pages = 64 * 40, .max_requests = 64, .record_kv_events = kv_events});
  KvEventBatch batch;
  std::uint64_t stored_pages = 0, removed_pages = 0;
  auto take = [&] {
    if (!kv_events) return;
    kv.take_events(batch);
    for (const KvEvent& e : batch.events)
      (e.kind == KvEventKind::kStored ? stored_pages : removed_pages) += e.num_pages;
  };
  std::vector<RequestId> ids(64);
  std::vector<std::uint32_t> prompt(200);
  auto wave = [&](std::uint32_t salt, std::uint64_t& decode_allocs) {
    for (std::size_t i = 0; i < ids.size(); ++i) {
      for (std::size_t t = 0; t < prompt.size(); ++t)
        prompt[t] = static_cast<std::uint32_t>(salt * 100000 + i * 1000 + t);
      ids[i] = kv.add_request(prompt, {.max_tokens = 400});
      kv.lookup_prefix(ids[i]);
      REQUIRE(kv.allocate(ids[i], 200));
      kv.commit(ids[i], 200);
      if (i % 4 == 0) {  // preempted by recompute and admitted again: reset, lookup, refill
        kv.reset(ids[i]);
        REQUIRE(kv.lookup_prefix(ids[i]) == 192);
        REQUIRE(kv.allocate(ids[i], 8));
        kv.commit(ids[i], 200);
      }
      take();
    }
    for (std::uint32_t step = 0; step < 180; ++step) {
      const std::uint64_t before = kvmm::test::heap_allocations();
      kv.begin_step();
      for (RequestId r : ids) {
        kv.append_token(r, step);
        REQUIRE(kv.allocate(r, 1));
        kv.commit(r, kv.num_computed(r) + 1);
      }
      take();
      decode_allocs += kvmm::test::heap_allocations() - before;
    }
    for (RequestId r : ids) kv.free(r);
    take();
  };
  std::uint64_t first = 0, second = 0;
  wave(1, first);
  if (kv_events) wave(3, first);
  const std::uint64_t before = kvmm::test::heap_allocations();
  wave(2, second);
  const std::uint64_t whole_wave = kvmm::test::heap_allocations() - before;
  CHECK(second == 0);
  CHECK(whole_wave == 0);
  CHECK(kv.stats().groups[0].evicted_pages > 0);  // the second wave did evict
  if (kv_events) {                                // the batches were not empty
    CHECK(stored_pages > 3 * 64 * 12);
    CHECK(removed_pages > 0);
  }
  // The counter works: the first wave had to size the slots.
  CHECK(kvmm::test::heap_allocations() > 0);
}
