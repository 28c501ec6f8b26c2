// Bad input against PageTableSet and PagedKVAllocator, in the style of the random
// operation tests: every hostile call raises the documented kvmm::Error (or returns
// false for lack of memory), check_invariants() holds and the observable state is
// unchanged afterwards, and the object still serves a request end to end.
#include <kvmm/error.hpp>
#include <kvmm/paging/kv_allocator.hpp>
#include <kvmm/spec/presets.hpp>

#include <catch2/catch.hpp>

#include <functional>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>
#include "support/error_of.hpp"

using namespace kvmm;

namespace {

constexpr std::uint32_t kMax32 = std::numeric_limits<std::uint32_t>::max();

using kvmm::test::error_of;

struct TableState {
  std::vector<std::vector<PageId>> rows;
  std::vector<std::uint64_t> tokens;
  bool operator==(const TableState&) const = default;
};

TableState state_of(const PageTableSet& t) {
  TableState s;
  for (RequestId r = 0; r < t.max_requests(); ++r) {
    s.rows.emplace_back(t.pages(Row{r}).begin(), t.pages(Row{r}).end());
    s.tokens.push_back(t.num_tokens(Row{r}));
  }
  return s;
}

struct KVState {
  std::vector<TableState> tables;
  std::vector<std::uint32_t> used, held;
  std::vector<std::uint64_t> tokens;
  std::uint32_t pool_free = 0, active = 0;
  bool operator==(const KVState&) const = default;
};

KVState state_of(const PagedKVAllocator& kv, std::uint32_t max_requests) {
  KVState s;
  for (GroupId g = 0; g < kv.layout().num_groups(); ++g) {
    s.tables.push_back(state_of(kv.page_tables(g)));
    s.used.push_back(kv.small_pages(g).num_used_small());
    s.held.push_back(kv.small_pages(g).num_large_pages());
  }
  for (RequestId r = 0; r < max_requests; ++r)
    s.tokens.push_back(kv.is_active(r) ? kv.num_tokens(r) * 1000003 + kv.num_encoder_tokens(r) : ~0ull);
  s.pool_free = kv.large_pages().num_free();
  s.active = kv.num_active();
  return s;
}

// A request end to end: tokens in every group, one sliding page freed, then gone.
void serves(PagedKVAllocator& kv) {
  const std::uint32_t free_before = kv.large_pages().num_free();
  const RequestId r = kv.add_request();
  REQUIRE(kv.append_tokens(r, 5));
  REQUIRE(kv.append_tokens(r, 1));
  REQUIRE(kv.append_encoder_tokens(r, 3));
  kv.check_invariants();
  kv.free_request(r);
  kv.check_invariants();
  CHECK(kv.large_pages().num_free() == free_before);
}

}  // namespace

TEST_CASE("PageTableSet: constructors validate before they allocate", "[paging][bad-input]") {
  // 2^32-1 rows allocated 128 GiB before the check (bad_alloc).
  CHECK_THAT(error_of([] { PageTableSet t(kMax32, 16); }), Catch::Contains("max_requests = 4294967295"));
  CHECK_THAT(error_of([] { PageTableSet t(0, 16); }), Catch::Contains("max_requests = 0"));
  CHECK_THAT(error_of([] { PageTableSet t(4, 0); }), Catch::Contains("tokens_per_page = 0"));
}

TEST_CASE("PageTableSet: hostile calls raise and change nothing", "[paging][bad-input]") {
  PageTableSet t(4, 16);
  t.append(Row{0}, std::vector<PageId>{3, 4, 5});
  t.set_num_tokens(Row{0}, 40);
  t.append(Row{2}, 9);
  t.set_num_tokens(Row{2}, 1);
  const std::vector<Row> batch{Row{0}, Row{2}};
  std::vector<std::uint32_t> indptr(3), last(2);
  std::vector<PageId> indices(4), dense(8);
  const std::vector<std::pair<std::function<void()>, std::string>> calls{
      {[&] { t.append(Row{4}, 1); }, "request = 4"},
      {[&] { t.append(Row{kNoRequest}, std::vector<PageId>{1}); }, "request = 4294967295"},
      {[&] { t.append(Row{1}, std::uint64_t{1} << 31, 7); }, "count = 2147483648"},
      {[&] { t.append(Row{0}, std::uint64_t{kMax32}, 7); }, "count = 4294967295"},
      {[&] { t.append(Row{0}, ~std::uint64_t{0}, 7); }, "count = 18446744073709551615"},
      {[&] { t.set(Row{0}, 3, 1); }, "index = 3"},
      {[&] { t.set(Row{5}, 0, 1); }, "request = 5"},
      {[&] { (void)t.pop_back(Row{1}); }, "pop_back on an empty"},
      {[&] { t.set_num_tokens(Row{4}, 1); }, "request = 4"},
      {[&] { t.clear(Row{9}); }, "request = 9"},
      {[&] { (void)t.last_page_len(Row{4}); }, "request = 4"},
      {[&] { (void)t.pages(Row{4}); }, "request = 4"},
      {[&] {
         t.export_csr(std::vector<Row>{Row{0}, Row{7}}, indptr, indices, last);
       },
       "request = 7"},
      {[&] { t.export_dense(batch, dense, 2); }, "max_pages = 2"},
      {[&] {
         t.export_dense_incremental(std::vector<Row>{Row{0}, Row{8}}, dense, 4);
       },
       "request = 8"},
      {[&] {
         t.export_dense_incremental(std::vector<Row>{Row{0}, Row{1}, Row{2}, Row{3}, Row{0}}, dense, 1);
       },
       "batch: size 5"},
  };
  const TableState before = state_of(t);
  for (const auto& [call, message] : calls) {
    INFO(message);
    CHECK_THAT(error_of(call), Catch::Contains(message));
    CHECK(state_of(t) == before);
  }
  // Still serves.
  CHECK(t.export_csr(batch, indptr, indices, last) == 4);
  CHECK(indices == std::vector<PageId>{3, 4, 5, 9});
  CHECK(last == std::vector<std::uint32_t>{8, 1});
}

TEST_CASE("PageTableSet: a request twice in an incremental batch gets both rows right", "[paging][bad-input]") {
  // The first occurrence cleared the row's dirty mark, so the second row kept stale
  // entries.
  PageTableSet t(4, 16);
  constexpr std::uint32_t kMax = 6;
  const std::vector<Row> batch{Row{1}, Row{1}, Row{2}};
  std::vector<PageId> inc(batch.size() * kMax, 0), full(inc.size(), 0);
  t.append(Row{1}, 10);
  t.append(Row{2}, 20);
  t.export_dense_incremental(batch, inc, kMax);
  t.append(Row{1}, 11);
  t.set(Row{1}, 0, 12);
  t.export_dense_incremental(batch, inc, kMax);
  t.export_dense(batch, full, kMax);
  CHECK(inc == full);
  // And under random edits with duplicates in every batch.
  std::mt19937 rng(15);
  std::vector<Row> b;
  for (int step = 0; step < 2000; ++step) {
    if (step % 40 == 0) {
      b.clear();
      for (int i = 0; i < 4; ++i) b.push_back(Row{static_cast<std::uint32_t>(rng() % 4)});  // at most max_requests rows
    }
    for (int k = 0; k < 3; ++k) {
      const RequestId r = rng() % 4;
      if (t.num_pages(Row{r}) < kMax && rng() % 3)
        t.append(Row{r}, rng() % 100);
      else if (t.num_pages(Row{r}) > 0 && rng() % 2)
        t.set(Row{r}, rng() % t.num_pages(Row{r}), kNullPage);
      else if (t.num_pages(Row{r}) > 0)
        t.pop_back(Row{r});
    }
    inc.resize(b.size() * kMax);
    full.resize(b.size() * kMax);
    t.export_dense_incremental(b, inc, kMax);
    t.export_dense(b, full, kMax);
    REQUIRE(inc == full);
  }
}

TEST_CASE("PagedKVAllocator: constructors validate before they allocate, naming the option", "[paging][bad-input]") {
  const KVLayout l = presets::gemma2_27b({.tokens_per_page = 4});
  // 2^32-1 large pages allocated the pool's records before any check (bad_alloc).
  CHECK_THAT(error_of([&] { PagedKVAllocator kv(l, {.num_large_pages = kMax32}); }),
             Catch::Contains("num_large_pages = 4294967295"));
  CHECK_THAT(error_of([&] { PagedKVAllocator kv(l, {.num_large_pages = 0}); }), Catch::Contains("num_large_pages = 0"));
  CHECK_THAT(error_of([&] { PagedKVAllocator kv(l, {.num_large_pages = 4, .max_requests = 0}); }),
             Catch::Contains("max_requests = 0"));
  CHECK_THAT(error_of([&] { PagedKVAllocator kv(l, {.num_large_pages = 4, .max_requests = kNoRequest}); }),
             Catch::Contains("max_requests = 4294967295"));
  // Small page ids of a group would not fit 32 bits: named as num_large_pages, per group.
  const KVLayout fig6 = KVLayout::plan(
      {LayerGroup::cross_attention("image", 2, 1, 32, 2, 1), LayerGroup::full_attention("text", 3, 1, 32, 2, 1)});
  CHECK_THAT(error_of([&] { PagedKVAllocator kv(fig6, {.num_large_pages = 1u << 31}); }),
             Catch::Contains("num_large_pages = 2147483648") && Catch::Contains("'image'"));
  PagedKVAllocator ok(l, {.num_large_pages = 16, .max_requests = 2});
  serves(ok);
}

TEST_CASE("PagedKVAllocator: 2^32-1 tokens in one call never wrap the page count", "[paging][bad-input]") {
  // append_tokens(r, 2^32-1) returned true with 0 pages (a 32-bit wrap of the count).
  PagedKVAllocator kv(presets::gemma2_27b({.tokens_per_page = 16}), {.num_large_pages = 8, .max_requests = 2});
  const RequestId r = kv.add_request();
  REQUIRE(kv.append_tokens(r, 20));
  const KVState before = state_of(kv, 2);
  CHECK_FALSE(kv.append_tokens(r, kMax32));
  CHECK_FALSE(kv.append_tokens(r, kMax32 - 5));
  kv.check_invariants();
  CHECK(state_of(kv, 2) == before);
  serves(kv);
  // The same for encoder tokens of a cross-attention group.
  PagedKVAllocator v(presets::llama3_2_11b_vision({.tokens_per_page = 16}), {.num_large_pages = 8, .max_requests = 2});
  const RequestId e = v.add_request();
  REQUIRE(v.append_encoder_tokens(e, 20));
  const KVState before_v = state_of(v, 2);
  CHECK_FALSE(v.append_encoder_tokens(e, kMax32));
  CHECK_FALSE(v.append_tokens(e, kMax32));
  v.check_invariants();
  CHECK(state_of(v, 2) == before_v);
  serves(v);
  // A Mamba-only layout keeps one state page however long the request grows (it took a
  // second page after 2^33 tokens).
  PagedKVAllocator m(KVLayout::plan({LayerGroup::mamba_state("m", 2, 4096, 64)}),
                     {.num_large_pages = 4, .max_requests = 2});
  const RequestId s = m.add_request();
  for (int i = 0; i < 6; ++i) REQUIRE(m.append_tokens(s, kMax32));
  CHECK(m.num_tokens(s) == 6ull * kMax32);
  CHECK(m.page_tables(0).num_pages(Row{s}) == 1);
  CHECK(m.large_pages().num_used() == 1);
  m.check_invariants();
}

TEST_CASE("PagedKVAllocator: hostile calls raise and change nothing", "[paging][bad-input]") {
  PagedKVAllocator kv(presets::llama3_2_11b_vision({.tokens_per_page = 4, .vision_embedding = true}),
                      {.num_large_pages = 24, .max_requests = 3});
  const RequestId r = kv.add_request();
  REQUIRE(kv.append_tokens(r, 9));
  REQUIRE(kv.append_encoder_tokens(r, 5));
  const std::vector<std::pair<std::function<void()>, std::string>> calls{
      {[&] { (void)kv.append_tokens(1, 1); }, "request = 1: not an active request"},
      {[&] { (void)kv.append_tokens(kNoRequest, 1); }, "request = 4294967295"},
      {[&] { (void)kv.append_encoder_tokens(3, 1); }, "request = 3"},
      {[&] { kv.free_request(2); }, "request = 2"},
      {[&] { kv.free_page(r, 0, 3); }, "index = 3"},
      {[&] { kv.free_page(r, 3, 0); }, "group = 3"},
      {[&] { kv.free_page(2, 0, 0); }, "request = 2"},
      {[&] { (void)kv.num_tokens(7); }, "request = 7"},
      {[&] { (void)kv.num_encoder_tokens(1); }, "request = 1"},
      {[&] { (void)kv.page_tables(kNoGroup); }, "group = 4294967295"},
      {[&] { (void)kv.small_pages(3); }, "group = 3"},
  };
  const KVState before = state_of(kv, 3);
  for (const auto& [call, message] : calls) {
    INFO(message);
    CHECK_THAT(error_of(call), Catch::Contains(message));
    kv.check_invariants();
    CHECK(state_of(kv, 3) == before);
  }
  kv.free_page(r, 0, 0);
  CHECK_THAT(error_of([&] { kv.free_page(r, 0, 0); }), Catch::Contains("already the null page"));
  serves(kv);
}

TEST_CASE("PagedKVAllocator: random operations with hostile ones mixed in", "[paging][bad-input]") {
  constexpr std::uint32_t kReq = 6;
  presets::PresetOptions o{.tokens_per_page = 4, .mamba_checkpoint_interval = 32};
  for (const KVLayout& layout :
       {presets::jamba1_5_mini(o), presets::gemma3_27b(o), presets::llama3_2_11b_vision({.tokens_per_page = 4})}) {
    std::mt19937 rng(1415);
    PagedKVAllocator kv(layout, {.num_large_pages = 40, .max_requests = kReq});
    std::map<RequestId, std::pair<std::uint64_t, std::uint64_t>> model;
    std::uint64_t hostile = 0;
    for (int op = 0; op < 8000; ++op) {
      const int kind = static_cast<int>(rng() % 20);
      auto pick = [&] { return std::next(model.begin(), static_cast<long>(rng() % model.size())); };
      if (kind < 2 && model.size() < kReq) {
        model[kv.add_request()] = {0, 0};
      } else if (kind < 4 && !model.empty()) {
        const auto it = pick();
        kv.free_request(it->first);
        model.erase(it);
      } else if (kind < 10 && !model.empty()) {
        const auto it = pick();
        const bool enc = kind == 9;
        const auto n = static_cast<std::uint32_t>(1 + rng() % 9);
        if (enc ? kv.append_encoder_tokens(it->first, n) : kv.append_tokens(it->first, n))
          (enc ? it->second.second : it->second.first) += n;
      } else {
        ++hostile;
        const KVState before = state_of(kv, kReq);
        RequestId bad = rng() % (kReq + 2);
        while (kv.is_active(bad)) ++bad;
        const RequestId live = model.empty() ? bad : pick()->first;
        switch (kind) {
          case 10:
            CHECK_THROWS_AS(kv.append_tokens(bad, 1), Error);
            break;
          case 11:
            CHECK_THROWS_AS(kv.free_request(bad), Error);
            break;
          case 12:
            CHECK_THROWS_AS(kv.free_page(live, 0, kMax32), Error);
            break;
          case 13:
            CHECK_THROWS_AS(kv.free_page(live, static_cast<GroupId>(layout.num_groups()), 0), Error);
            break;
          case 14:
            CHECK_THROWS_AS(kv.append_encoder_tokens(bad, 1), Error);
            break;
          default:  // too many tokens at once: false, nothing changed
            if (!model.empty()) CHECK_FALSE(kv.append_tokens(live, kMax32 - static_cast<std::uint32_t>(rng() % 64)));
        }
        REQUIRE(state_of(kv, kReq) == before);
      }
      kv.check_invariants();
      for (const auto& [id, t] : model) {
        REQUIRE(kv.num_tokens(id) == t.first);
        REQUIRE(kv.num_encoder_tokens(id) == t.second);
      }
    }
    CHECK(hostile > 2000);
    for (const auto& [id, t] : model) kv.free_request(id);
    CHECK(kv.large_pages().num_free() == 40);
  }
}
