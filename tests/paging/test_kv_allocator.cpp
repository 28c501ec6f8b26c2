#include <kvmm/paging/kv_allocator.hpp>
#include <kvmm/spec/presets.hpp>

#include <catch2/catch.hpp>

#include <map>
#include <random>
#include <vector>

using namespace kvmm;

namespace {

// A snapshot of everything observable, to prove that failed or rejected calls change
// nothing.
struct Snapshot {
  std::vector<std::vector<PageId>> tables;
  std::vector<std::uint32_t> used, held;
  std::uint32_t pool_free = 0, active = 0;
  bool operator==(const Snapshot&) const = default;
};

Snapshot snapshot(const PagedKVAllocator& kv, std::uint32_t max_requests) {
  Snapshot s;
  for (GroupId g = 0; g < kv.layout().num_groups(); ++g) {
    for (RequestId r = 0; r < max_requests; ++r) {
      auto p = kv.page_tables(g).pages(Row{r});
      s.tables.emplace_back(p.begin(), p.end());
    }
    s.used.push_back(kv.small_pages(g).num_used_small());
    s.held.push_back(kv.small_pages(g).num_large_pages());
  }
  s.pool_free = kv.large_pages().num_free();
  s.active = kv.num_active();
  return s;
}

}  // namespace

TEST_CASE("Jenga Fig. 6: the <IMG>x4 Hello World request") {
  // Image tokens in 256-byte small pages (3 per 768-byte large page), text tokens in
  // 384-byte small pages (2 per large page). As in the figure, large pages 0 and 2 hold
  // the image tokens and large page 1 the text: small pages P2 and P3 of the text group.
  KVLayout layout = KVLayout::plan(
      {LayerGroup::cross_attention("image", 2, 1, 32, 2, 1), LayerGroup::full_attention("text", 3, 1, 32, 2, 1)});
  PagedKVAllocator kv(std::move(layout), {.num_large_pages = 4, .max_requests = 2});
  const RequestId r = kv.add_request();
  REQUIRE(kv.append_encoder_tokens(r, 3));  // <IMG><IMG><IMG>: fills large page 0
  REQUIRE(kv.append_tokens(r, 2));          // Hello World: large page 1
  REQUIRE(kv.append_encoder_tokens(r, 1));  // the 4th <IMG>: large page 2
  const auto image = kv.page_tables(0).pages(Row{r});
  const auto text = kv.page_tables(1).pages(Row{r});
  CHECK(std::vector<PageId>(image.begin(), image.end()) == std::vector<PageId>{0, 1, 2, 6});
  CHECK(std::vector<PageId>(text.begin(), text.end()) == std::vector<PageId>{2, 3});
  // Byte addresses in the arena: id * small_page_bytes.
  CHECK(image[3] * kv.layout().small_page_bytes(0) == 2 * 768);
  CHECK(text[0] * kv.layout().small_page_bytes(1) == 1 * 768);
  CHECK(kv.large_pages().owner(LargePageId{0}) == 0);
  CHECK(kv.large_pages().owner(LargePageId{1}) == 1);
  CHECK(kv.large_pages().owner(LargePageId{2}) == 0);
  CHECK(kv.large_pages().num_free() == 1);
  kv.check_invariants();
  kv.free_request(r);
  CHECK(kv.large_pages().num_free() == 4);
  kv.check_invariants();
}

TEST_CASE("PagedKVAllocator: all groups or none under memory pressure") {
  // Two groups whose pages differ: a multi-group growth must not let the first group
  // take the last large page the second needs.
  KVLayout layout = KVLayout::plan(
      {LayerGroup::full_attention("a", 1, 1, 64, 2, 4), LayerGroup::full_attention("b", 3, 1, 64, 2, 4)});
  REQUIRE(layout.small_pages_per_large_page(0) == 3);
  REQUIRE(layout.small_pages_per_large_page(1) == 1);
  PagedKVAllocator kv(std::move(layout), {.num_large_pages = 3, .max_requests = 4});
  const RequestId r0 = kv.add_request();
  REQUIRE(kv.append_tokens(r0, 4));  // a: 1 page (large 0, 2 free slots), b: large 1
  const RequestId r1 = kv.add_request();
  // r1 needs 1 page of each: a can use r0's large page (step 3), b needs the last large
  // page. Without the reserve, a would take the last large page for itself (step 2).
  REQUIRE(kv.append_tokens(r1, 4));
  kv.check_invariants();
  CHECK(kv.large_pages().num_free() == 0);
  const Snapshot before = snapshot(kv, 4);
  CHECK_FALSE(kv.append_tokens(r1, 1));  // b needs another large page: none left
  CHECK(snapshot(kv, 4) == before);
  CHECK(kv.num_tokens(r1) == 4);
  kv.free_request(r0);
  CHECK(kv.append_tokens(r1, 1));
  kv.check_invariants();
}

TEST_CASE("PagedKVAllocator: misuse raises kvmm::Error and leaves state unchanged") {
  PagedKVAllocator kv(presets::gemma2_27b({.tokens_per_page = 4}), {.num_large_pages = 8, .max_requests = 2});
  const RequestId r = kv.add_request();
  REQUIRE(kv.append_tokens(r, 10));
  const Snapshot before = snapshot(kv, 2);
  CHECK_THROWS_WITH(kv.append_tokens(1, 1), Catch::Contains("request = 1") && Catch::Contains("not an active"));
  CHECK_THROWS_WITH(kv.append_tokens(77, 1), Catch::Contains("request = 77"));
  CHECK_THROWS_WITH(kv.free_request(1), Catch::Contains("request = 1"));
  CHECK_THROWS_WITH(kv.page_tables(2), Catch::Contains("group = 2"));
  (void)kv.add_request();
  CHECK_THROWS_WITH(kv.add_request(), Catch::Contains("max_requests = 2"));
  kv.free_request(1);
  CHECK(snapshot(kv, 2) == before);
  kv.free_request(r);
  CHECK_THROWS_WITH(kv.free_request(r), Catch::Contains("request = ") && Catch::Contains("not an active"));
  CHECK_THROWS_WITH(PagedKVAllocator(presets::llama3_1_8b(), {.num_large_pages = 0}),
                    Catch::Contains("num_large_pages = 0"));
  kv.check_invariants();
}

TEST_CASE("PagedKVAllocator: 100k random operations against a model, several layouts") {
  struct Case {
    const char* name;
    KVLayout layout;
    std::uint32_t large_pages;
  };
  presets::PresetOptions small{.tokens_per_page = 4, .mamba_checkpoint_interval = 64};
  presets::PresetOptions padded = small;
  padded.layout.max_large_page_bytes = 12ull << 20;
  std::vector<Case> cases;
  cases.push_back({"jamba", presets::jamba1_5_mini(small), 40});
  cases.push_back({"jamba-padded", presets::jamba1_5_mini(padded), 40});
  cases.push_back({"gemma-3", presets::gemma3_27b(small), 48});
  cases.push_back({"vision", presets::llama3_2_11b_vision({.tokens_per_page = 4, .vision_embedding = true}), 48});
  cases.push_back({"spec", presets::speculative_70b_1b({.tokens_per_page = 3}), 48});
  cases.push_back({"fig6",
                   KVLayout::plan({LayerGroup::cross_attention("image", 2, 1, 32, 2, 1),
                                   LayerGroup::full_attention("text", 3, 1, 32, 2, 1)}),
                   24});
  constexpr std::uint32_t kMaxRequests = 12;
  std::uint64_t failures = 0, total_ops = 0;
  for (Case& c : cases) {
    INFO("layout " << c.name);
    std::mt19937 rng(42);
    PagedKVAllocator kv(c.layout, {.num_large_pages = c.large_pages, .max_requests = kMaxRequests});
    std::map<RequestId, std::pair<std::uint64_t, std::uint64_t>> model;  // tokens, encoder tokens
    for (int op = 0; op < 17000; ++op, ++total_ops) {
      const int kind = static_cast<int>(rng() % 100);
      if (kind < 12 && model.size() < kMaxRequests) {
        const RequestId r = kv.add_request();
        REQUIRE(model.count(r) == 0);
        model[r] = {0, 0};
      } else if (kind < 22 && !model.empty()) {
        auto it = std::next(model.begin(), static_cast<long>(rng() % model.size()));
        kv.free_request(it->first);
        model.erase(it);
      } else if (!model.empty()) {
        auto it = std::next(model.begin(), static_cast<long>(rng() % model.size()));
        const bool encoder = kind >= 90;
        const auto n = static_cast<std::uint32_t>(kind < 70 ? 1 : 1 + rng() % 40);
        const Snapshot before = snapshot(kv, kMaxRequests);
        const bool ok = encoder ? kv.append_encoder_tokens(it->first, n) : kv.append_tokens(it->first, n);
        if (ok) {
          (encoder ? it->second.second : it->second.first) += n;
        } else {
          ++failures;
          REQUIRE(snapshot(kv, kMaxRequests) == before);
        }
      }
      // Invariants after every operation: large pages free xor owned by one group,
      // small pages free xor in exactly one page table, counts add up.
      kv.check_invariants();
      for (const auto& [r, t] : model) {
        REQUIRE(kv.num_tokens(r) == t.first);
        REQUIRE(kv.num_encoder_tokens(r) == t.second);
        for (GroupId g = 0; g < kv.layout().num_groups(); ++g) {
          const LayerGroup& grp = kv.layout().group(g);
          REQUIRE(kv.page_tables(g).num_pages(Row{r}) == grp.pages_for_tokens(grp.is_decoder() ? t.first : t.second));
        }
      }
    }
    for (const auto& [r, t] : model) kv.free_request(r);
    kv.check_invariants();
    CHECK(kv.large_pages().num_free() == c.large_pages);  // nothing leaked
  }
  CHECK(total_ops >= 100000);
  CHECK(failures > 100);  // the sizes above do run out of memory regularly
}

TEST_CASE("PagedKVAllocator: page tables carry each group's token count") {
  PagedKVAllocator kv(presets::llama3_2_11b_vision({.tokens_per_page = 16}),
                      {.num_large_pages = 64, .max_requests = 4});
  const RequestId a = kv.add_request(), b = kv.add_request();
  REQUIRE(kv.append_tokens(a, 35));
  REQUIRE(kv.append_encoder_tokens(a, 20));
  REQUIRE(kv.append_tokens(b, 16));
  REQUIRE(kv.append_tokens(b, 1));  // fast path: no new page, count still updated
  const std::vector<Row> batch{kv.row(b), kv.row(a)};
  std::vector<std::uint32_t> indptr(3), last(2);
  std::vector<PageId> indices(8);
  CHECK(kv.page_tables(0).export_csr(batch, indptr, indices, last) == 5);
  CHECK(indptr == std::vector<std::uint32_t>{0, 2, 5});
  CHECK(last == std::vector<std::uint32_t>{1, 3});
  CHECK(indices[2] == kv.page_tables(0).pages(kv.row(a))[0]);
  CHECK(kv.page_tables(1).export_csr(batch, indptr, indices, last) == 2);  // cross: encoder tokens
  CHECK(indptr == std::vector<std::uint32_t>{0, 0, 2});
  CHECK(last == std::vector<std::uint32_t>{0, 4});
}
