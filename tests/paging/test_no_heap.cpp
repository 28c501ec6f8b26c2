// The hot paths must not touch the heap after construction: this binary links the
// counting operator new (tests/support) and checks the count over a measured window.
#include <kvmm/paging/kv_allocator.hpp>
#include <kvmm/spec/presets.hpp>
#include "support/count_new.hpp"

#include <catch2/catch.hpp>

#include <new>
#include <vector>

using namespace kvmm;

TEST_CASE("the allocation counter sees heap allocations") {
  // Direct calls of the replaceable functions: a new-expression may be elided.
  const std::uint64_t before = kvmm::test::heap_allocations();
  void* a = ::operator new(16);
  void* b = ::operator new(16, std::nothrow);
  ::operator delete(a);
  ::operator delete(b);
  CHECK(kvmm::test::heap_allocations() == before + 2);
}

TEST_CASE("no heap allocation on the large- and small-page paths") {
  LargePagePool pool(256);
  SmallPageAllocator alloc(0, 16, pool, 64);
  std::vector<PageId> held;
  held.reserve(4096);
  const std::uint64_t before = kvmm::test::heap_allocations();
  for (int round = 0; round < 20; ++round) {
    for (int i = 0; i < 4096; ++i) held.push_back(*alloc.allocate(Row{static_cast<std::uint32_t>(i % 64)}));
    for (PageId p : held) alloc.free(p);
    held.clear();
    for (std::uint32_t r = 0; r < 64; ++r) alloc.release_request(Row{r});
    for (int i = 0; i < 200; ++i) pool.free(*pool.allocate(1));
  }
  CHECK(kvmm::test::heap_allocations() == before);
  CHECK(pool.num_free() == 256);
}

TEST_CASE("no heap allocation per decode step once page tables have grown") {
  // Gemma-3 whole (two groups, 32.5 MiB large pages: 4096 hold every request) and as the
  // default plans it (LayoutOptions::slice_layers: seven groups, 1.25 MiB large pages, 26
  // times as many for the same memory).
  for (const auto slice : {SliceLayers::kOff, SliceLayers::kSmallestWhenDense}) {
    const KVLayout layout = presets::gemma3_27b({.tokens_per_page = 16, .layout = {.slice_layers = slice}});
    CAPTURE(layout.num_groups());
    const std::uint32_t large = slice == SliceLayers::kOff ? 4096 : 4096 * 26;
    PagedKVAllocator kv(layout, {.num_large_pages = large, .max_requests = 64});
    std::vector<RequestId> reqs;
    for (int i = 0; i < 64; ++i) reqs.push_back(kv.add_request());
    // Warm-up: every slot grows to its longest page table once.
    for (RequestId r : reqs) REQUIRE(kv.append_tokens(r, 2048));
    for (RequestId r : reqs) kv.free_request(r);
    reqs.clear();
    for (int i = 0; i < 64; ++i) reqs.push_back(kv.add_request());
    const std::uint64_t before = kvmm::test::heap_allocations();
    for (int step = 0; step < 2000; ++step)
      for (RequestId r : reqs) REQUIRE(kv.append_tokens(r, 1));
    for (RequestId r : reqs) kv.free_request(r);
    CHECK(kvmm::test::heap_allocations() == before);
    kv.check_invariants();
  }
}
