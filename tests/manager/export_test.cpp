// The manager's kernel-facing exports (issue 15): rows hold the pages of the tokens the
// step will have computed, so FlashInfer's last_page_len is exact inside the last page,
// lookahead pages stay out, an image row counts its image tokens, and a reserved null page
// replaces kNullPage. Exact cases from the issue, by hand.
#include "kvmm/manager/kernel_exports.hpp"
#include "kvmm/manager/kv_cache_manager.hpp"
#include "manager_fixture.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <vector>

using namespace kvmm;

namespace {

std::vector<std::uint32_t> ids(std::uint32_t n, std::uint32_t salt) { return test::salted_ids(n, salt); }

struct Csr {
  std::vector<std::int32_t> indptr, indices, last, first;
  explicit Csr(std::size_t batch) : indptr(batch + 1), indices(4096), last(batch), first(batch) {}
  std::int32_t pages(std::size_t b) const { return indptr[b + 1] - indptr[b]; }
};

}  // namespace

TEST_CASE("decode inside the last page: last_page_len follows the step, lookahead stays out", "[manager][export]") {
  const KVLayout layout = KVLayout::plan({LayerGroup::full_attention("full", 1, 1, 8, 2, 16)});
  KVCacheManager kv(layout, {.num_large_pages = 16, .max_requests = 2});
  kv.begin_step();
  const RequestId r = kv.add_request(ids(20, 1));
  kv.lookup_prefix(r);
  REQUIRE(kv.allocate(r, 20));
  const std::vector<RequestId> batch{r};
  Csr c(1);
  KernelExports(kv).export_csr(0, batch, c.indptr, c.indices, c.last);
  CHECK(c.pages(0) == 2);
  CHECK(c.last[0] == 4);
  kv.commit(r, 20);
  // kv_len 21, 22, 23 need last_page_len 5, 6, 7 (the table's own count said 4, 4, 4).
  for (std::uint32_t step = 0; step < 3; ++step) {
    kv.begin_step();
    kv.append_token(r, 7);
    REQUIRE(kv.allocate(r, 1, step == 2 ? 16 : 0));  // the last step with 16 lookahead tokens
    CHECK(KernelExports(kv).kv_len(r, 0) == 21 + step);
    KernelExports(kv).export_csr(0, batch, c.indptr, c.indices, c.last);
    CHECK(c.pages(0) == 2);  // the lookahead page is not exported
    CHECK(c.last[0] == static_cast<std::int32_t>(5 + step));
    CHECK(c.indices[1] == static_cast<std::int32_t>(kv.page_table(r, 0)[1]));
    kv.commit(r, 21 + step);
  }
  CHECK(kv.page_table(r, 0).size() == 3);  // the lookahead page is held
  // After the commit and before the next allocate the row still exports what is computed.
  CHECK(KernelExports(kv).kv_len(r, 0) == 23);
  std::vector<std::int32_t> dense(4, -7);
  KernelExports(kv).export_dense(0, batch, dense, 4, {.null_page = 15});
  CHECK(dense[0] == static_cast<std::int32_t>(kv.page_table(r, 0)[0]));
  CHECK(dense[2] == 15);  // padding: the reserved page, never kNullPage
  CHECK(dense[3] == 15);
}

TEST_CASE("a cross-attention row exports its image tokens: 4,803 tokens end 3 into the last page",
          "[manager][export]") {
  const KVLayout layout = KVLayout::plan(
      {LayerGroup::full_attention("text", 1, 1, 8, 2, 16), LayerGroup::cross_attention("cross", 1, 1, 8, 2, 16)});
  KVCacheManager kv(layout, {.num_large_pages = 1024, .max_requests = 2});
  const MultimodalItem img{hash_bytes(std::as_bytes(std::span("pixels", 6))), 2, 4803};
  std::vector<std::uint32_t> prompt = ids(4810, 2);
  kv.begin_step();
  const RequestId r = kv.add_request(prompt, {.items = std::span(&img, 1)});
  kv.lookup_prefix(r);
  REQUIRE(kv.allocate(r, 64));
  const std::vector<RequestId> batch{r};
  Csr c(1);
  KernelExports(kv).export_csr(1, batch, c.indptr, c.indices, c.last);
  CHECK(KernelExports(kv).kv_len(r, 1) == 4803);
  CHECK(c.pages(0) == 301);
  CHECK(c.last[0] == 3);
  KernelExports(kv).export_csr(0, batch, c.indptr, c.indices, c.last);
  CHECK(c.pages(0) == 4);  // text: the 64 tokens scheduled
  CHECK(c.last[0] == 16);
}

TEST_CASE("sliding-window rows: the reserved null page replaces freed pages, or rows are trimmed",
          "[manager][export]") {
  const KVLayout layout = KVLayout::plan(
      {LayerGroup::full_attention("full", 1, 1, 8, 2, 4), LayerGroup::sliding_window("sw", 1, 1, 8, 2, 4, 8)});
  KVCacheManager kv(layout, {.num_large_pages = 64, .max_requests = 2});
  kv.begin_step();
  const RequestId r = kv.add_request(ids(30, 3));
  kv.lookup_prefix(r);
  REQUIRE(kv.allocate(r, 30));
  kv.commit(r, 30);
  kv.begin_step();
  kv.append_token(r, 1);
  REQUIRE(kv.allocate(r, 1));
  const std::span<const PageId> row = kv.page_table(r, 1);
  REQUIRE(row.size() == 8);
  std::size_t nulls = 0;
  while (row[nulls] == kNullPage) ++nulls;
  REQUIRE(nulls >= 4);  // the window of 8 tokens keeps the last pages only
  const std::vector<RequestId> batch{r};
  Csr c(1);
  const PageId reserved = 63 * layout.small_pages_per_large_page(1);
  KernelExports(kv).export_csr(1, batch, c.indptr, c.indices, c.last, {.null_page = reserved});
  CHECK(c.pages(0) == 8);
  for (std::size_t i = 0; i < 8; ++i) CHECK(c.indices[i] == static_cast<std::int32_t>(i < nulls ? reserved : row[i]));
  CHECK(c.last[0] == 3);  // 31 tokens, 4 per page
  KernelExports(kv).export_csr(1, batch, c.indptr, c.indices, c.last, {.trim = true}, c.first);
  CHECK(c.first[0] == static_cast<std::int32_t>(nulls));
  CHECK(c.pages(0) == static_cast<std::int32_t>(8 - nulls));
  CHECK(c.indices[0] == static_cast<std::int32_t>(row[nulls]));
  // A request with nothing scheduled or computed has no row to export.
  const RequestId idle = kv.add_request(ids(5, 4));
  const std::vector<RequestId> bad{idle};
  CHECK_THROWS_WITH(KernelExports(kv).export_csr(1, bad, c.indptr, c.indices, c.last),
                    Catch::Contains("kv_lens[0] = 0"));
  kv.free(idle);
  kv.free(r);
  CHECK_THROWS_WITH(KernelExports(kv).export_csr(1, batch, c.indptr, c.indices, c.last),
                    Catch::Contains("not an active request"));
}

TEST_CASE("the incremental dense export equals the full one after every step of a random run",
          "[manager][export][random]") {
  const KVLayout layout = KVLayout::plan(
      {LayerGroup::full_attention("full", 1, 1, 8, 2, 4), LayerGroup::sliding_window("sw", 1, 1, 8, 2, 4, 12)});
  KVCacheManager kv(layout, {.num_large_pages = 64, .max_requests = 12});
  std::mt19937_64 rng(7);
  constexpr std::uint32_t kMaxPages = 48;
  std::vector<RequestId> running;
  std::vector<std::int32_t> inc[2], full;
  std::vector<RequestId> prev;
  std::uint64_t same_steps = 0, same_rows = 0, same_written = 0;
  for (std::uint32_t step = 0; step < 3000; ++step) {
    kv.begin_step();
    std::vector<RequestId> batch;
    if (running.size() < 10 && rng() % 3 == 0) {  // a prompt sharing one of 4 prefixes
      std::vector<std::uint32_t> t = ids(8 + rng() % 24, static_cast<std::uint32_t>(rng() % 4));
      t.push_back(static_cast<std::uint32_t>(rng()));
      const RequestId r = kv.add_request(t);
      const std::uint64_t hit = kv.lookup_prefix(r);
      if (kv.allocate(r, static_cast<std::uint32_t>(t.size() - hit)))
        batch.push_back(r);
      else
        kv.free(r);
    }
    std::size_t old = running.size();
    running.insert(running.end(), batch.begin(), batch.end());
    for (std::size_t k = 0; k < old;) {
      const RequestId r = running[k];
      const std::uint64_t c = kv.num_computed(r), n = kv.num_tokens(r);
      if (c >= 120 || rng() % 40 == 0) {  // finished or dropped
        kv.free(r);
        running.erase(running.begin() + static_cast<std::ptrdiff_t>(k));
        --old;
        continue;
      }
      if (c >= n) kv.append_token(r, static_cast<std::uint32_t>(rng()));
      const auto todo = static_cast<std::uint32_t>(std::min<std::uint64_t>(kv.num_tokens(r) - c, 1 + rng() % 9));
      if (kv.allocate(r, todo, rng() % 4 == 0 ? 2 : 0)) batch.push_back(r);
      ++k;
    }
    if (step % 50 == 0) std::shuffle(batch.begin(), batch.end(), rng);  // rows move in the buffer
    for (GroupId g = 0; g < 2; ++g) {
      const KernelExportOptions o{.null_page = 0};
      full.assign(batch.size() * kMaxPages, -7);
      inc[g].resize(batch.size() * kMaxPages, -9);
      KernelExports(kv).export_dense(g, batch, full, kMaxPages, o);
      const std::size_t w = KernelExports(kv).export_dense_incremental(g, batch, inc[g], kMaxPages, o);
      if (batch == prev) {
        same_rows += batch.size();
        same_written += w;
      }
      INFO("step " << step << " group " << g);
      REQUIRE(inc[g] == full);
    }
    same_steps += batch == prev;
    prev = batch;
    for (RequestId r : batch) kv.commit(r, KernelExports(kv).kv_len(r, 0));
  }
  // With the batch unchanged, a row gets only its new pages and the window's newly freed
  // ones (a step adds at most 9 tokens: 3 pages each way with 4-token pages), not 48.
  REQUIRE(same_steps > 100);
  CHECK(same_written <= 6 * same_rows);
}
