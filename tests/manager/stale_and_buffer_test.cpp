// Two defects of issue 29 at the manager, each exact: is_swapped of a stale handle raises as
// every other query does (it answered false), and export_dense_incremental into another
// buffer than the previous export's writes every row (it wrote only the changes, leaving the
// new buffer's zeros: page 0 for a kernel).
#include "kvmm/manager/kernel_exports.hpp"
#include "kvmm/manager/kv_cache_manager.hpp"

#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

using namespace kvmm;

namespace {

KVLayout two_groups() {
  return KVLayout::plan(
      {LayerGroup::full_attention("full", 1, 1, 8, 2, 4), LayerGroup::sliding_window("sw", 1, 1, 8, 2, 4, 8)});
}

RequestId admitted(KVCacheManager& kv, std::uint32_t n, std::uint32_t first) {
  std::vector<std::uint32_t> ids(n);
  for (std::uint32_t i = 0; i < n; ++i) ids[i] = first + i;
  const RequestId r = kv.add_request(ids);
  const std::uint64_t hit = kv.lookup_prefix(r);
  REQUIRE(kv.allocate(r, static_cast<std::uint32_t>(n - hit)));
  kv.commit(r, n);
  return r;
}

}  // namespace

TEST_CASE("is_swapped of a stale or unknown handle raises, naming it", "[manager][defect]") {
  KVCacheManager kv(two_groups(), {.num_large_pages = 16, .num_host_large_pages = 8, .max_requests = 4});
  kv.begin_step();
  const RequestId a = admitted(kv, 9, 1);
  const RequestId b = admitted(kv, 9, 100);
  CHECK_FALSE(kv.is_swapped(a));
  REQUIRE(kv.swap_out(b));
  CHECK(kv.is_swapped(b));
  kv.free(a);
  CHECK_THROWS_WITH(kv.is_swapped(a), Catch::Contains("request = " + std::to_string(a)));
  CHECK_THROWS_WITH(kv.num_computed(a), Catch::Contains("request = " + std::to_string(a)));  // as every query
  CHECK_THROWS_WITH(kv.is_swapped(12345), Catch::Contains("request = 12345"));
  CHECK_FALSE(kv.is_active(a));  // the one query that answers for any handle
  // A new request in a's row: the old handle stays stale, the new one answers.
  const RequestId c = admitted(kv, 9, 200);
  CHECK_THROWS_WITH(kv.is_swapped(a), Catch::Contains("request = " + std::to_string(a)));
  CHECK_FALSE(kv.is_swapped(c));
  CHECK(kv.is_swapped(b));
  kv.check_invariants();
}

TEST_CASE("export_dense_incremental into another buffer writes every row", "[manager][defect][export]") {
  KVCacheManager kv(two_groups(), {.num_large_pages = 32, .max_requests = 4});
  kv.begin_step();
  const RequestId a = admitted(kv, 21, 1), b = admitted(kv, 13, 100);
  const std::vector<RequestId> batch{a, b};
  constexpr std::uint32_t kMaxPages = 8;
  const KernelExportOptions o{.null_page = 3};
  // Every buffer lives to the end: one freed could give its address to a later one, which
  // the manager cannot tell from it (the header says so).
  std::vector<std::int32_t> bufs[2][2];
  for (GroupId g = 0; g < 2; ++g) {
    INFO("group " << g);
    std::vector<std::int32_t> full(batch.size() * kMaxPages, -1);
    KernelExports(kv).export_dense(g, batch, full, kMaxPages, o);
    std::vector<std::int32_t>&first = bufs[g][0], &second = bufs[g][1];
    first.assign(batch.size() * kMaxPages, 0);
    second.assign(batch.size() * kMaxPages, 0);
    CHECK(KernelExports(kv).export_dense_incremental(g, batch, first, kMaxPages, o) == full.size());
    CHECK(first == full);
    // Nothing changed since: the same buffer gets nothing, another one everything.
    CHECK(KernelExports(kv).export_dense_incremental(g, batch, first, kMaxPages, o) == 0);
    CHECK(KernelExports(kv).export_dense_incremental(g, batch, second, kMaxPages, o) == full.size());
    CHECK(second == full);
    // Back to the first: it is another buffer than the previous export's again.
    std::fill(first.begin(), first.end(), 0);
    CHECK(KernelExports(kv).export_dense_incremental(g, batch, first, kMaxPages, o) == full.size());
    CHECK(first == full);
    // A prefix of the same buffer (the batch's first row) keeps its rows.
    CHECK(KernelExports(kv).export_dense_incremental(g, std::span(batch).first(1), std::span(first).first(kMaxPages),
                                                     kMaxPages, o) == 0);
  }
  // The several-group export and decode_step decide per table.
  std::vector<std::int32_t> t0(batch.size() * kMaxPages, 0), t1(batch.size() * kMaxPages, 0);
  const BlockTableOut tables[] = {{.group = 0, .table = t0}, {.group = 1, .table = t1}};
  CHECK(KernelExports(kv).export_dense_incremental(batch, tables, kMaxPages, o) == 2 * batch.size() * kMaxPages);
  kv.begin_step();
  const std::vector<std::uint32_t> tokens{7, 8};
  std::vector<std::int32_t> u0(t0.size(), 0), u1(t1.size(), 0);
  const BlockTableOut fresh[] = {{.group = 0, .table = u0}, {.group = 1, .table = u1}};
  REQUIRE(KernelExports(kv).decode_step(batch, tokens, fresh, kMaxPages, o) == batch.size());
  for (GroupId g = 0; g < 2; ++g) {
    std::vector<std::int32_t> full(batch.size() * kMaxPages, -1);
    KernelExports(kv).export_dense(g, batch, full, kMaxPages, o);
    CHECK((g == 0 ? u0 : u1) == full);
  }
  kv.check_invariants();
}
