#include <kvmm/paging/page_table.hpp>

#include <catch2/catch.hpp>

#include <random>
#include <vector>

using namespace kvmm;

TEST_CASE("PageTableSet: CSR and dense export") {
  PageTableSet t(4, 16);
  for (PageId p : {5u, 9u, 2u}) t.append(Row{0}, p);
  t.set_num_tokens(Row{0}, 35);
  t.append(Row{2}, 7);
  t.set_num_tokens(Row{2}, 16);
  t.set(Row{0}, 0, kNullPage);  // an out-of-window page freed
  const std::vector<Row> batch{Row{2}, Row{0}, Row{3}};
  std::vector<std::uint32_t> indptr(4), last(3);
  std::vector<PageId> indices(4);
  CHECK(t.export_csr(batch, indptr, indices, last) == 4);
  CHECK(indptr == std::vector<std::uint32_t>{0, 1, 4, 4});
  CHECK(indices == std::vector<PageId>{7, kNullPage, 9, 2});
  CHECK(last == std::vector<std::uint32_t>{16, 3, 0});
  CHECK(t.last_page_len(Row{0}) == 3);
  CHECK(t.num_tokens(Row{2}) == 16);
  std::vector<PageId> dense(3 * 4, 123);
  t.export_dense(batch, dense, 4, kNullPage);
  const PageId N = kNullPage;
  CHECK(dense == std::vector<PageId>{7, N, N, N, N, 9, 2, N, N, N, N, N});

  std::vector<PageId> small(3);
  CHECK_THROWS_WITH(t.export_csr(batch, indptr, small, last), Catch::Contains("indices: size 3"));
  CHECK_THROWS_WITH(t.export_csr(batch, small, indices, last), Catch::Contains("indptr: size 3"));
  std::vector<std::uint32_t> short_last(2);
  CHECK_THROWS_WITH(t.export_csr(batch, indptr, indices, short_last), Catch::Contains("last_page_len: size 2"));
  CHECK_THROWS_WITH(t.export_dense(batch, dense, 2), Catch::Contains("max_pages = 2"));
  CHECK_THROWS_WITH(t.export_dense(batch, small, 4), Catch::Contains("table: size 3"));
  CHECK_THROWS_WITH(t.append(Row{4}, 1), Catch::Contains("request = 4"));
  CHECK_THROWS_WITH(t.set(Row{2}, 1, 1), Catch::Contains("index = 1"));
}

TEST_CASE("PageTableSet: incremental export equals a full export after random edits") {
  std::mt19937 rng(99);
  constexpr std::uint32_t kRows = 32, kMax = 40;
  PageTableSet t(kRows, 16);
  std::vector<PageId> inc(std::size_t{kRows} * kMax), full(inc.size());
  std::vector<Row> batch;
  for (int step = 0; step < 3000; ++step) {
    if (step % 50 == 0) {  // a new batch composition now and then
      batch.clear();
      for (std::uint32_t r = 0; r < kRows; ++r)
        if (rng() % 3) batch.push_back(Row{r});
      std::shuffle(batch.begin(), batch.end(), rng);
    }
    std::size_t edits = 0;
    for (int k = 0; k < 8; ++k) {
      const Row r{static_cast<std::uint32_t>(rng() % kRows)};
      const int what = static_cast<int>(rng() % 10);
      if (what < 6 && t.num_pages(r) < kMax) {
        t.append(r, rng() % 1000);
      } else if (what < 7 && t.num_pages(r) > 0) {
        t.pop_back(r);
      } else if (what < 9 && t.num_pages(r) > 0) {
        t.set(r, rng() % t.num_pages(r), kNullPage);
      } else {
        t.clear(r);
      }
      ++edits;
    }
    const std::size_t written = t.export_dense_incremental(batch, inc, kMax);
    t.export_dense(batch, full, kMax);
    REQUIRE(std::equal(full.begin(), full.begin() + static_cast<long>(batch.size() * kMax), inc.begin()));
    if (step % 50 != 0) REQUIRE(written <= edits * kMax);
  }
  // With a stable batch and one append per row, each row costs exactly one entry.
  batch.assign({Row{0}, Row{1}, Row{2}, Row{3}});
  for (Row r : batch) t.clear(r);
  t.export_dense_incremental(batch, inc, kMax);
  for (Row r : batch) t.append(r, 5);
  CHECK(t.export_dense_incremental(batch, inc, kMax) == 4);
}
