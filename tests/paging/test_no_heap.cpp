// The hot paths must not touch the heap after construction: this binary replaces the
// global operator new to count allocations inside a measured window.
#include <kvmm/paging/kv_allocator.hpp>
#include <kvmm/spec/presets.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <cstdlib>
#include <new>
#include <vector>

namespace {
std::atomic<long> g_news{0};
}

// GCC sees the replaced new/delete pair as malloc/free and flags the pairing it cannot
// know is ours.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

// Every unaligned form is replaced, so that whatever new'd memory is deleted by ours.
void* operator new(std::size_t n) {
  g_news.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  g_news.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n ? n : 1);
}
void* operator new[](std::size_t n, const std::nothrow_t& t) noexcept { return operator new(n, t); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

using namespace kvmm;

TEST_CASE("the allocation counter sees heap allocations") {
  const long before = g_news.load();
  auto* v = new std::vector<int>(10);
  delete v;
  CHECK(g_news.load() >= before + 2);
}

TEST_CASE("no heap allocation on the large- and small-page paths") {
  LargePagePool pool(256);
  SmallPageAllocator alloc(0, 16, pool, 64);
  std::vector<PageId> held;
  held.reserve(4096);
  const long before = g_news.load();
  for (int round = 0; round < 20; ++round) {
    for (int i = 0; i < 4096; ++i) held.push_back(*alloc.allocate(static_cast<RequestId>(i % 64)));
    for (PageId p : held) alloc.free(p);
    held.clear();
    for (RequestId r = 0; r < 64; ++r) alloc.release_request(r);
    for (int i = 0; i < 200; ++i) pool.free(*pool.allocate(1));
  }
  CHECK(g_news.load() == before);
  CHECK(pool.num_free() == 256);
}

TEST_CASE("no heap allocation per decode step once page tables have grown") {
  PagedKVAllocator kv(presets::gemma3_27b({.tokens_per_page = 16}), {.num_large_pages = 4096, .max_requests = 64});
  std::vector<RequestId> reqs;
  for (int i = 0; i < 64; ++i) reqs.push_back(kv.add_request());
  // Warm-up: every slot grows to its longest page table once.
  for (RequestId r : reqs) REQUIRE(kv.append_tokens(r, 2048));
  for (RequestId r : reqs) kv.free_request(r);
  reqs.clear();
  for (int i = 0; i < 64; ++i) reqs.push_back(kv.add_request());
  const long before = g_news.load();
  for (int step = 0; step < 2000; ++step)
    for (RequestId r : reqs) REQUIRE(kv.append_tokens(r, 1));
  for (RequestId r : reqs) kv.free_request(r);
  CHECK(g_news.load() == before);
  kv.check_invariants();
}
