// PageTableSet's kernel-facing exports (ExportOptions): int32 buffers, a reserved null
// page id, rows trimmed to their first page with a per-row offset, and kv lengths passed
// per row. Exact on small hand-made tables; then randomized tables, batches and options
// against a plain reference, for CSR, dense and incremental dense.
#include <kvmm/error.hpp>
#include <kvmm/paging/page_table.hpp>

#include <catch2/catch.hpp>

#include <cstdint>
#include <optional>
#include <random>
#include <vector>

using namespace kvmm;

namespace {

constexpr PageId N = kNullPage;
using I32 = std::vector<std::int32_t>;
using U32 = std::vector<std::uint32_t>;

// P = 4. Row 0: three pages, 10 tokens. Row 1: a sliding window that freed its first two
// pages, 15 tokens. Row 2: a lookahead page past its 5 tokens (3 pages, table says 12).
PageTableSet hand_made() {
  PageTableSet t(4, 4);
  t.append(Row{0}, std::vector<PageId>{10, 11, 12});
  t.set_num_tokens(Row{0}, 10);
  t.append(Row{1}, std::vector<PageId>{N, N, 7, 8});
  t.set_num_tokens(Row{1}, 15);
  t.append(Row{2}, std::vector<PageId>{20, 21, 22});
  t.set_num_tokens(Row{2}, 12);
  return t;
}

// The plain reference of one exported row, ids as int64 (kNullPage kept as such).
struct RefRow {
  std::vector<std::int64_t> ids;
  std::uint32_t first = 0, last = 0, n = 0;
};

RefRow reference(const PageTableSet& t, Row r, std::optional<std::uint64_t> kv, PageId null_page, bool trim) {
  const auto pages = t.pages(Row{r});
  const std::uint64_t P = t.tokens_per_page();
  RefRow row;
  if (kv) {
    row.n = static_cast<std::uint32_t>((*kv + P - 1) / P);
    row.last = static_cast<std::uint32_t>(*kv - (row.n - 1) * P);
  } else {
    row.n = static_cast<std::uint32_t>(pages.size());
    row.last = t.num_tokens(Row{r}) == 0 ? 0 : static_cast<std::uint32_t>((t.num_tokens(Row{r}) - 1) % P + 1);
  }
  if (trim)
    while (row.first < row.n && pages[row.first] == kNullPage) ++row.first;
  for (std::uint32_t k = row.first; k < row.n; ++k) row.ids.push_back(pages[k] == kNullPage ? null_page : pages[k]);
  return row;
}

std::int64_t as_int32(std::int64_t id) { return id == kNullPage ? -1 : id; }

}  // namespace

TEST_CASE("export options: int32 CSR and the reserved null page, exactly", "[paging][export]") {
  const PageTableSet t = hand_made();
  const std::vector<Row> batch{Row{0}, Row{1}};
  I32 indptr(3), indices(7), last(2);
  CHECK(t.export_csr(batch, indptr, indices, last) == 7);
  CHECK(indptr == I32{0, 3, 7});
  CHECK(indices == I32{10, 11, 12, -1, -1, 7, 8});  // kNullPage left as is: -1
  CHECK(last == I32{2, 3});
  CHECK(t.export_csr(batch, indptr, indices, last, {.null_page = 99}) == 7);
  CHECK(indices == I32{10, 11, 12, 99, 99, 7, 8});
  // The uint32 overload with options.
  U32 uptr(3), uidx(7), ulast(2);
  CHECK(t.export_csr(batch, uptr, uidx, ulast, ExportOptions{.null_page = 5}) == 7);
  CHECK(uidx == U32{10, 11, 12, 5, 5, 7, 8});
  CHECK(ulast == U32{2, 3});
}

TEST_CASE("export options: a trimmed CSR starts each row at its first page", "[paging][export]") {
  const PageTableSet t = hand_made();
  const std::vector<Row> batch{Row{1}, Row{0}, Row{1}};
  I32 indptr(4), indices(10, -7), last(3), first(3);
  CHECK(t.export_csr(batch, indptr, indices, last, {.trim = true}, first) == 7);
  CHECK(indptr == I32{0, 2, 5, 7});
  CHECK(std::vector<std::int32_t>(indices.begin(), indices.begin() + 7) == I32{7, 8, 10, 11, 12, 7, 8});
  CHECK(first == I32{2, 0, 2});  // a kernel adds first * 4 to positions
  CHECK(last == I32{3, 2, 3});
  // first_page is required with trim.
  CHECK_THROWS_WITH(t.export_csr(batch, indptr, indices, last, {.trim = true}),
                    Catch::Contains("first_page: size 0 < batch size 3"));
  // A row with no page left to trim to raises, naming it.
  PageTableSet gone(2, 4);
  gone.append(Row{1}, 2, N);
  gone.set_num_tokens(Row{1}, 8);
  CHECK_THROWS_WITH(gone.export_csr(std::vector<Row>{Row{1}}, indptr, indices, last, {.trim = true}, first),
                    Catch::Contains("request 1 (row 0) has only null pages"));
}

TEST_CASE("export options: kv lengths of the step, not the table's tokens", "[paging][export]") {
  // The decode: a 20-token prompt in 16-token pages, decoding tokens 21..23 inside
  // the last page (the table still says 32, lookahead slots counted): 5, 6, 7.
  PageTableSet d(2, 16);
  d.append(Row{0}, std::vector<PageId>{4, 9});
  d.set_num_tokens(Row{0}, 32);
  const std::vector<Row> one{Row{0}};
  I32 indptr(2), indices(2), last(1);
  for (const std::uint64_t kv : {21, 22, 23}) {
    const std::vector<std::uint64_t> kv_lens{kv};
    CHECK(d.export_csr(one, indptr, indices, last, {.kv_lens = kv_lens}) == 2);
    CHECK(last[0] == static_cast<std::int32_t>(kv - 16));
  }
  // A lookahead page past the kv length stays out: row 2 holds 3 pages, kv 5 needs 2.
  const PageTableSet t = hand_made();
  const std::vector<Row> batch{Row{2}, Row{0}, Row{1}};
  const std::vector<std::uint64_t> kv{5, 12, 13};
  I32 ip(4), ix(10), lp(3), fp(3);
  CHECK(t.export_csr(batch, ip, ix, lp, {.kv_lens = kv}) == 9);
  CHECK(ip == I32{0, 2, 5, 9});
  CHECK(lp == I32{1, 4, 1});
  CHECK(t.export_csr(batch, ip, ix, lp, {.kv_lens = kv, .null_page = 0, .trim = true}, fp) == 7);
  CHECK(std::vector<std::int32_t>(ix.begin(), ix.begin() + 7) == I32{20, 21, 10, 11, 12, 7, 8});
  CHECK(fp == I32{0, 0, 2});
  // Dense: exported pages then the null page.
  I32 dense(12, -5);
  t.export_dense(batch, dense, 4, {.kv_lens = kv, .null_page = 3});
  CHECK(dense == I32{20, 21, 3, 3, 10, 11, 12, 3, 3, 3, 7, 8});
  // Bad kv lengths name the row and the value; the table is unchanged.
  const std::vector<std::uint64_t> zero{5, 0, 13}, past{5, 12, 17}, short_kv{5, 12};
  CHECK_THROWS_WITH(t.export_csr(batch, ip, ix, lp, {.kv_lens = zero}),
                    Catch::Contains("kv_lens[1] = 0") && Catch::Contains("request 0 (row 1)"));
  CHECK_THROWS_WITH(t.export_csr(batch, ip, ix, lp, {.kv_lens = past}),
                    Catch::Contains("kv_lens[2] = 17") && Catch::Contains("must be in [1, 16]"));
  CHECK_THROWS_WITH(t.export_dense(batch, dense, 4, {.kv_lens = past}), Catch::Contains("kv_lens[2] = 17"));
  CHECK_THROWS_WITH(t.export_csr(batch, ip, ix, lp, {.kv_lens = short_kv}), Catch::Contains("kv_lens: size 2"));
  CHECK(t.num_pages(Row{2}) == 3);
  CHECK(t.num_tokens(Row{2}) == 12);
}

TEST_CASE("export options: int32 dense tables and ids past int32", "[paging][export]") {
  PageTableSet t = hand_made();
  const std::vector<Row> batch{Row{1}, Row{2}};
  I32 dense(8);
  t.export_dense(batch, dense, 4);
  CHECK(dense == I32{-1, -1, 7, 8, 20, 21, 22, -1});
  t.export_dense(batch, dense, 4, {.null_page = 1});
  CHECK(dense == I32{1, 1, 7, 8, 20, 21, 22, 1});
  CHECK_THROWS_WITH(t.export_dense(batch, dense, 4, {.trim = true}), Catch::Contains("trim: only export_csr"));
  CHECK_THROWS_WITH(t.export_dense(batch, dense, 4, {.null_page = 1u << 31}),
                    Catch::Contains("null_page = 2147483648"));
  t.set(Row{2}, 1, 1u << 31);
  I32 indptr(3), indices(7), last(2);
  CHECK_THROWS_WITH(t.export_dense(batch, dense, 4), Catch::Contains("page id = 2147483648 (request 2)"));
  CHECK_THROWS_WITH(t.export_csr(batch, indptr, indices, last), Catch::Contains("page id = 2147483648"));
  U32 udense(8);  // the uint32 table still takes it
  t.export_dense(batch, udense, 4, ExportOptions{});
  CHECK(udense[5] == 1u << 31);
}

TEST_CASE("export options: random tables and options against the plain reference", "[paging][export]") {
  constexpr std::uint32_t kReq = 6, kP = 4, kMax = 12;
  std::mt19937 rng(1515);
  PageTableSet t(kReq, kP);
  std::vector<std::int32_t> inc;  // the incremental int32 buffer across steps
  std::uint64_t rows_checked = 0;
  for (int step = 0; step < 3000; ++step) {
    // Edit: grow rows, free a leading page (sliding window), set tokens within the pages.
    for (int k = 0; k < 3; ++k) {
      const RequestId r = rng() % kReq;
      const std::uint32_t n = t.num_pages(Row{r});
      const int op = static_cast<int>(rng() % 8);
      if (op == 0 && n > 0) {
        t.clear(Row{r});
      } else if (op < 5 && n < kMax) {
        t.append(Row{r}, 1 + rng() % 5000);
      } else if (op < 7 && n > 1) {
        std::uint32_t lead = 0;
        while (lead + 1 < n && t.pages(Row{r})[lead] == kNullPage) ++lead;
        if (lead + 1 < n) t.set(Row{r}, lead, kNullPage);
      } else if (n > 0) {
        t.set(Row{r}, rng() % n, 1 + rng() % 5000);
      }
      const std::uint32_t m = t.num_pages(Row{r});
      if (m > 0) t.set_num_tokens(Row{r}, std::uint64_t{m - 1} * kP + 1 + rng() % kP);
    }
    // A batch of rows that hold pages (duplicates allowed), and random options.
    std::vector<Row> batch;
    for (std::uint32_t i = 0, want = 1 + rng() % kReq; i < want; ++i) {
      const RequestId r = rng() % kReq;
      if (t.num_pages(Row{r}) > 0) batch.push_back(Row{r});
    }
    const bool use_kv = rng() % 2, trim = rng() % 2;
    const PageId null_page = rng() % 2 ? kNullPage : 7777;
    std::vector<std::uint64_t> kv;
    for (Row r : batch) {
      std::uint32_t lead = 0;
      while (t.pages(r)[lead] == kNullPage) ++lead;  // the last page is never null here
      const std::uint64_t lo = std::uint64_t{lead} * kP + 1, hi = std::uint64_t{t.num_pages(r)} * kP;
      kv.push_back(lo + rng() % (hi - lo + 1));
    }
    const ExportOptions o{.kv_lens = use_kv ? std::span<const std::uint64_t>(kv) : std::span<const std::uint64_t>(),
                          .null_page = null_page,
                          .trim = trim};
    I32 ip(batch.size() + 1), ix(batch.size() * kMax), lp(batch.size()), fp(batch.size());
    U32 uip(batch.size() + 1), uix(batch.size() * kMax), ulp(batch.size()), ufp(batch.size());
    const std::size_t nnz = t.export_csr(batch, ip, ix, lp, o, fp);
    REQUIRE(t.export_csr(batch, uip, uix, ulp, o, ufp) == nnz);
    std::vector<std::int32_t> dense(batch.size() * kMax);
    U32 udense(batch.size() * kMax);
    ExportOptions od = o;
    od.trim = false;
    t.export_dense(batch, dense, kMax, od);
    t.export_dense(batch, udense, kMax, od);
    inc.resize(batch.size() * kMax, -9);  // holds the previous incremental export
    t.export_dense_incremental(batch, inc, kMax, od);
    REQUIRE(inc == dense);
    REQUIRE(ip[0] == 0);
    for (std::size_t i = 0; i < batch.size(); ++i) {
      const RefRow ref = reference(t, batch[i], use_kv ? std::optional(kv[i]) : std::nullopt, null_page, trim);
      const RefRow full = reference(t, batch[i], use_kv ? std::optional(kv[i]) : std::nullopt, null_page, false);
      REQUIRE(static_cast<std::size_t>(ip[i + 1] - ip[i]) == ref.ids.size());
      REQUIRE(uip[i + 1] == static_cast<std::uint32_t>(ip[i + 1]));
      for (std::size_t k = 0; k < ref.ids.size(); ++k) {
        REQUIRE(ix[ip[i] + k] == as_int32(ref.ids[k]));
        REQUIRE(uix[uip[i] + k] == static_cast<std::uint32_t>(ref.ids[k]));
      }
      REQUIRE(lp[i] == static_cast<std::int32_t>(ref.last));
      REQUIRE(ulp[i] == ref.last);
      if (trim) REQUIRE(fp[i] == static_cast<std::int32_t>(ref.first));
      if (trim) REQUIRE(ufp[i] == ref.first);
      for (std::uint32_t k = 0; k < kMax; ++k) {
        const std::int64_t want = k < full.ids.size() ? full.ids[k] : null_page;
        REQUIRE(dense[i * kMax + k] == as_int32(want));
        REQUIRE(udense[i * kMax + k] == static_cast<std::uint32_t>(want));
      }
      ++rows_checked;
    }
  }
  CHECK(rows_checked > 5000);
}
