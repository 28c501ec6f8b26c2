// A finished request's partial last page under hit_unit (issue 34 item 3): cached at free
// under its filled tokens, a follower (a chat's next turn) hits into it at unit
// granularity and copies it into its own fresh page; the page stays evictable, is never
// written in place, is not cached while a fork shares it, keys its multimodal items, is
// forgotten by reset_prefix_cache and makes no router (KV) event.
#include "kvmm/manager/kv_cache_manager.hpp"
#include "kvmm/testing/manager_inspector.hpp"

#include <catch2/catch.hpp>

#include <vector>

using namespace kvmm;

namespace {

KVLayout full64() { return KVLayout::plan({LayerGroup::full_attention("f", 1, 1, 8, 2, 64)}); }

std::vector<std::uint32_t> ids(std::uint32_t n, std::uint32_t base) {
  std::vector<std::uint32_t> t(n);
  for (std::uint32_t i = 0; i < n; ++i) t[i] = base + i;
  return t;
}

std::vector<std::uint32_t> concat(std::vector<std::uint32_t> a, const std::vector<std::uint32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Runs t through one request (lookup, one allocate, commit), returns it running.
RequestId run(KVCacheManager& kv, const std::vector<std::uint32_t>& t, const RequestExtras& extras = {}) {
  const RequestId r = kv.add_request(t, extras);
  const std::uint64_t h = kv.lookup_prefix(r);
  REQUIRE(kv.allocate(r, static_cast<std::uint32_t>(t.size() - h)));
  kv.begin_step();
  kv.commit(r, t.size());
  return r;
}

}  // namespace

TEST_CASE("a follower of a finished 70-token request hits into its partial last page", "[manager][partial]") {
  for (const std::uint32_t unit : {0u, 1u, 4u, 8u}) {
    INFO("hit_unit " << unit);
    KVCacheManager kv(full64(), {.num_large_pages = 16, .max_requests = 4, .hit_unit = unit});
    const auto a = ids(70, 100);
    const RequestId ra = run(kv, a);
    const PageId src = kv.page_table(ra, 0)[1];
    kv.free(ra);
    const bool cached = unit > 0 && unit <= 6;  // hit_unit on and a whole unit filled
    const kvmm::testing::ManagerInspector in(kv);
    CHECK(in.page_hash(0, src).has_value() == cached);
    CHECK(kv.stats().groups[0].evictable_pages == (cached ? 2 : 1));
    kv.check_invariants();
    const auto b = concat(a, ids(30, 9000));  // the next turn: all of a, then more
    const RequestId rb = kv.add_request(b);
    const std::uint64_t expect = unit == 1 ? 70 : unit == 4 ? 68 : 64;  // 8: 6 tokens fill no unit
    CHECK(kv.lookup_prefix(rb) == expect);
    REQUIRE(kv.allocate(rb, static_cast<std::uint32_t>(b.size() - expect)));
    const auto row = kv.page_table(rb, 0);
    if (expect % 64 != 0) {
      REQUIRE(kv.copies().size() == 1);
      CHECK(kv.copies()[0] == PageCopy{0, src, row[1]});  // copied, never shared
      CHECK(row[1] != src);
      CHECK(in.ref_count(0, src) == 1);  // held until the copy has run
    } else {
      CHECK(kv.copies().empty());
    }
    kv.check_invariants();
    kv.begin_step();
    if (cached) {
      CHECK(in.ref_count(0, src) == 0);  // evictable again, its key unchanged
      CHECK(in.page_hash(0, src).has_value());
    }
    kv.commit(rb, b.size());
    kv.check_invariants();
    kv.free(rb);
    kv.check_invariants();
    // a's partial page still serves a second follower that continues differently.
    if (unit == 4) {
      const RequestId rc = kv.add_request(concat(a, ids(5, 70000)));
      CHECK(kv.lookup_prefix(rc) == 68);
      kv.free(rc);
    }
  }
}

TEST_CASE("a partial last page of fewer than a unit's tokens, or on page 0, gives no partial hit",
          "[manager][partial]") {
  KVCacheManager kv(full64(), {.num_large_pages = 16, .max_requests = 4, .hit_unit = 4});
  const auto a = ids(64 + 3, 100);  // 3 tokens past the page: less than a unit
  kv.free(run(kv, a));
  const RequestId rb = kv.add_request(concat(a, ids(10, 5000)));
  CHECK(kv.lookup_prefix(rb) == 64);
  kv.free(rb);
  const auto c = ids(40, 30000);  // one partial page, no parent page to chain on
  kv.free(run(kv, c));
  const RequestId rd = kv.add_request(concat(c, ids(10, 5000)));
  CHECK(kv.lookup_prefix(rd) == 0);
  kv.free(rd);
  kv.check_invariants();
}

TEST_CASE("a partial last page a fork shares is not cached: its other holder writes it", "[manager][partial]") {
  KVCacheManager kv(full64(), {.num_large_pages = 16, .max_requests = 4, .hit_unit = 4});
  const auto a = ids(70, 100);
  const RequestId ra = run(kv, a);
  const RequestId child = kv.fork(ra);
  const PageId shared = kv.page_table(ra, 0)[1];
  kv.free(ra);  // the page is the child's alone now, and the child will write into it
  const kvmm::testing::ManagerInspector in(kv);
  CHECK_FALSE(in.page_hash(0, shared).has_value());
  const RequestId rb = kv.add_request(concat(a, ids(10, 5000)));
  CHECK(kv.lookup_prefix(rb) == 64);
  kv.free(rb);
  // The child writes 4 more tokens in place (no copy: it is the page's only holder).
  kv.append_tokens(child, ids(4, 777));
  REQUIRE(kv.allocate(child, 4));
  CHECK(kv.copies().empty());
  CHECK(kv.page_table(child, 0)[1] == shared);
  kv.begin_step();
  kv.commit(child, 74);
  kv.free(child);  // now cached with the child's 74 tokens
  CHECK(in.page_hash(0, shared).has_value());
  const RequestId rc = kv.add_request(concat(concat(a, ids(4, 777)), ids(3, 1)));
  CHECK(kv.lookup_prefix(rc) == 72);
  kv.free(rc);
  kv.check_invariants();
}

TEST_CASE("a cached partial page is evicted like any cached page, with no router event", "[manager][partial]") {
  KVCacheManager kv(
      full64(),
      {.num_large_pages = 4, .max_requests = 4, .record_events = true, .record_kv_events = true, .hit_unit = 4});
  const auto a = ids(70, 100);
  kv.free(run(kv, a));
  KvEventBatch batch;
  kv.take_events(batch);
  REQUIRE(batch.events.size() == 1);  // page 0's stored run only
  CHECK(batch.events[0].kind == KvEventKind::kStored);
  CHECK(batch.events[0].num_pages == 1);
  std::vector<CacheEvent> pages;
  kv.take_events(pages);
  CHECK(pages.size() == 2);  // page events: both pages stored
  // Another request takes every page: a's two cached pages are evicted.
  const RequestId big = run(kv, ids(4 * 64, 50000));
  kv.take_events(batch);
  std::size_t removed = 0;
  for (const KvEvent& e : batch.events)
    if (e.kind == KvEventKind::kRemoved) removed += e.num_pages;
  CHECK(removed == 1);  // page 0's hash only: the partial key was never announced
  kv.take_events(pages);
  std::size_t page_removed = 0;
  for (const CacheEvent& e : pages) page_removed += e.kind == CacheEventKind::kRemoved;
  CHECK(page_removed == 2);
  kv.free(big);
  const RequestId rb = kv.add_request(concat(a, ids(10, 5000)));
  CHECK(kv.lookup_prefix(rb) == 0);
  kv.free(rb);
  kv.check_invariants();
}

TEST_CASE("a partial page's key covers its multimodal items; reset_prefix_cache forgets it", "[manager][partial]") {
  KVCacheManager kv(full64(), {.num_large_pages = 16, .max_requests = 4, .hit_unit = 4});
  const auto a = ids(70, 100);
  const MultimodalItem cat{BlockHash{1, 2}, 65, 3}, dog{BlockHash{3, 4}, 65, 3};
  const std::vector<MultimodalItem> with_cat{cat}, with_dog{dog};
  kv.free(run(kv, a, {.items = with_cat, .prompt_tokens = 0}));
  const auto b = concat(a, ids(10, 5000));
  const RequestId rd = kv.add_request(b, {.items = with_dog});
  CHECK(kv.lookup_prefix(rd) == 64);  // same ids, another image inside the partial page
  kv.free(rd);
  const RequestId rc = kv.add_request(b, {.items = with_cat});
  CHECK(kv.lookup_prefix(rc) == 68);
  kv.free(rc);
  kv.reset_prefix_cache();
  const RequestId re = kv.add_request(b, {.items = with_cat});
  CHECK(kv.lookup_prefix(re) == 0);
  kv.free(re);
  kv.check_invariants();
}

TEST_CASE("sliding-window and full-attention groups both serve a finished request's partial page",
          "[manager][partial]") {
  const KVLayout gemma = KVLayout::plan(
      {LayerGroup::full_attention("global", 1, 1, 8, 2, 16), LayerGroup::sliding_window("local", 2, 1, 8, 2, 16, 40)});
  KVCacheManager kv(gemma, {.num_large_pages = 64, .max_requests = 4, .hit_unit = 2});
  const auto a = ids(16 * 6 + 7, 7);
  kv.free(run(kv, a));
  const RequestId r = kv.add_request(concat(a, ids(9, 4000)));
  CHECK(kv.lookup_prefix(r) == 16 * 6 + 6);
  REQUIRE(kv.allocate(r, 10));
  REQUIRE(kv.copies().size() == 2);
  for (const PageCopy& c : kv.copies()) CHECK(kv.page_table(r, c.group)[6] == c.dst);
  kv.check_invariants();
  kv.begin_step();
  kv.check_invariants();
}
