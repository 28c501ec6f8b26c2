// lookup_prefix's fast paths: add_request hashes the prompt's full pages as it copies them
// (the values of the hash_page chain, as commit registers them), and the full-attention
// probe that tries the page after the previous hit before the index gives the index's own
// answer whether the cached pages are consecutive ids or not.
#include "kvmm/manager/kv_cache_manager.hpp"
#include "kvmm/testing/manager_inspector.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <vector>

using namespace kvmm;

namespace {

std::vector<BlockHash> chain(const std::vector<std::uint32_t>& tokens, std::uint32_t P, std::uint32_t lora,
                             std::string_view salt = {}) {
  std::vector<BlockHash> out;
  for (std::size_t i = 0; (i + 1) * P <= tokens.size(); ++i) {
    PageExtraKeys ex;
    ex.lora_id = lora;
    if (i == 0) ex.salt = salt;
    out.push_back(hash_page(i ? out.back() : BlockHash{}, std::span(tokens).subspan(i * P, P), ex));
  }
  return out;
}

std::vector<std::uint32_t> random_tokens(std::mt19937& rng, std::size_t n) {
  std::vector<std::uint32_t> t(n);
  for (auto& x : t) x = static_cast<std::uint32_t>(rng());
  return t;
}

}  // namespace

TEST_CASE("add_request hashes full pages as the hash_page chain, for every hash class", "[manager][lookup]") {
  // Two page sizes, so two hash classes: 16 (the fused copy + hash pass) and 8.
  const KVLayout layout =
      KVLayout::plan({LayerGroup::full_attention("a", 1, 1, 8, 2, 16), LayerGroup::full_attention("b", 1, 1, 8, 2, 8)});
  std::mt19937 rng(3);
  for (const std::uint32_t lora : {0u, 4u}) {
    for (const std::string_view salt : {std::string_view{}, std::string_view{"tenant"}}) {
      KVCacheManager kv(layout, {.num_large_pages = 64, .max_requests = 2});
      const auto tokens = random_tokens(rng, 16 * 10 + 5);
      const RequestId r = kv.add_request(tokens, {.lora_id = lora, .cache_salt = salt});
      CHECK(kv.num_tokens(r) == tokens.size());
      CHECK(kv.lookup_prefix(r) == 0);
      REQUIRE(kv.allocate(r, static_cast<std::uint32_t>(tokens.size())));
      kv.commit(r, tokens.size());
      for (GroupId g = 0; g < 2; ++g) {
        const std::uint32_t P = g == 0 ? 16 : 8;
        const auto expect = chain(tokens, P, lora, salt);
        const auto pages = kv.page_table(r, g);
        REQUIRE(pages.size() >= expect.size());
        INFO("group " << g << " lora " << lora << " salt " << salt);
        for (std::size_t i = 0; i < expect.size(); ++i)
          CHECK(kvmm::testing::ManagerInspector(kv).page_hash(g, pages[i]) == expect[i]);
      }
      kv.free(r);
      // The same prompt hits all it can (prompt - 1 tokens, page-aligned in both classes);
      // a different LoRA id or salt hits nothing.
      const RequestId same = kv.add_request(tokens, {.lora_id = lora, .cache_salt = salt});
      CHECK(kv.lookup_prefix(same) == 160);
      kv.free(same);
      const RequestId other = kv.add_request(tokens, {.lora_id = lora + 1, .cache_salt = salt});
      CHECK(kv.lookup_prefix(other) == 0);
      kv.free(other);
      kv.check_invariants();
    }
  }
}

TEST_CASE("lookup_prefix hashes ids appended after add_request", "[manager][lookup]") {
  KVCacheManager kv(KVLayout::plan({LayerGroup::full_attention("a", 1, 1, 8, 2, 16)}),
                    {.num_large_pages = 32, .max_requests = 2});
  std::mt19937 rng(5);
  const auto tokens = random_tokens(rng, 16 * 8 + 1);
  const RequestId w = kv.add_request(tokens);
  kv.lookup_prefix(w);
  REQUIRE(kv.allocate(w, static_cast<std::uint32_t>(tokens.size())));
  kv.commit(w, tokens.size());
  kv.free(w);
  const RequestId r = kv.add_request(std::span(tokens).first(40));
  kv.append_tokens(r, std::span(tokens).subspan(40));
  CHECK(kv.lookup_prefix(r) == 128);
  kv.check_invariants();
}

TEST_CASE("lookup_prefix finds prefixes in scattered pages and stops at the first miss", "[manager][lookup]") {
  // One group, one small page per large page: two requests allocating in turn get
  // alternating page ids, so the page after a hit is the other prompt's (hashed, another
  // hash) and every probe falls back to the index.
  KVCacheManager kv(KVLayout::plan({LayerGroup::full_attention("a", 1, 1, 8, 2, 16)}),
                    {.num_large_pages = 64, .max_requests = 4});
  std::mt19937 rng(9);
  const auto ta = random_tokens(rng, 16 * 12 + 3), tb = random_tokens(rng, 16 * 12 + 3);
  const RequestId a = kv.add_request(ta), b = kv.add_request(tb);
  kv.lookup_prefix(a);
  kv.lookup_prefix(b);
  for (std::uint64_t i = 0; i < 13; ++i) {
    const std::uint64_t upto = std::min<std::uint64_t>(16 * (i + 1), ta.size());
    REQUIRE(kv.allocate(a, 16));
    kv.commit(a, upto);
    REQUIRE(kv.allocate(b, 16));
    kv.commit(b, upto);
  }
  const std::vector<PageId> pa(kv.page_table(a, 0).begin(), kv.page_table(a, 0).end());
  const std::vector<PageId> pb(kv.page_table(b, 0).begin(), kv.page_table(b, 0).end());
  REQUIRE(pa[1] != pa[0] + 1);  // scattered indeed
  kv.free(a);
  kv.free(b);
  for (const auto* t : {&ta, &tb}) {
    const RequestId r = kv.add_request(*t);
    CHECK(kv.lookup_prefix(r) == 192);
    CHECK(kv.page_table(r, 0).empty());  // pure: allocate pins the hit
    REQUIRE(kv.allocate(r, 0));
    const auto& expect = t == &ta ? pa : pb;
    const auto got = kv.page_table(r, 0);
    REQUIRE(got.size() >= 12);
    for (std::size_t i = 0; i < 12; ++i) {
      CHECK(got[i] == expect[i]);
      CHECK(kvmm::testing::ManagerInspector(kv).ref_count(0, got[i]) == 1);
    }
    kv.check_invariants();
    kv.free(r);
  }
  // A prompt equal to ta but for one id in page 5 hits pages 0..4 exactly, then b's
  // prompt with a changed page 0 hits nothing.
  auto tc = ta;
  tc[5 * 16 + 7] ^= 1;
  const RequestId c = kv.add_request(tc);
  CHECK(kv.lookup_prefix(c) == 80);
  REQUIRE(kv.allocate(c, 0));
  CHECK(kv.page_table(c, 0).size() == 5);
  kv.check_invariants();
  auto td = tb;
  td[3] ^= 1;
  const RequestId d = kv.add_request(td);
  CHECK(kv.lookup_prefix(d) == 0);
  kv.check_invariants();
}

TEST_CASE("lookup_prefix over consecutive pages stops where the next page holds another prefix", "[manager][lookup]") {
  // Prompt a cached in consecutive pages, then prompt b sharing a's first 4 pages cached
  // after it: b's pages 4.. follow a's last page in id order, so the probe of b meets a
  // consecutive candidate whose hash differs at page 4 and must take the index's answer.
  KVCacheManager kv(KVLayout::plan({LayerGroup::full_attention("a", 1, 1, 8, 2, 16)}),
                    {.num_large_pages = 64, .max_requests = 4});
  std::mt19937 rng(13);
  const auto ta = random_tokens(rng, 16 * 8 + 1);
  auto tb = ta;
  for (std::size_t i = 16 * 4; i < tb.size(); ++i) tb[i] = static_cast<std::uint32_t>(rng());
  const std::vector<std::uint32_t>* prompts[] = {&ta, &tb};
  for (const auto* t : prompts) {
    const RequestId r = kv.add_request(*t);
    kv.lookup_prefix(r);
    REQUIRE(kv.allocate(r, static_cast<std::uint32_t>(t->size() - kv.num_computed(r))));
    kv.commit(r, t->size());
    kv.free(r);
  }
  for (const auto* t : prompts) {
    const RequestId r = kv.add_request(*t);
    CHECK(kv.lookup_prefix(r) == 128);
    kv.check_invariants();
    kv.free(r);
  }
}

// A capped lookup is the lookup of the prompt cut to cap + 1 tokens (whose own limit is
// cap): the longest prefix of at most cap tokens valid in every group, a sliding window's
// rule included (a hit ending earlier needs other window pages), and allocate pins it.
TEST_CASE("lookup_prefix with a limit equals the lookup of the prompt cut at limit + 1", "[manager][lookup]") {
  const KVLayout layout = KVLayout::plan(
      {LayerGroup::full_attention("full", 1, 1, 8, 2, 16), LayerGroup::sliding_window("swa", 1, 1, 8, 2, 16, 40)});
  std::mt19937 rng(11);
  const auto prompt = random_tokens(rng, 16 * 12 + 3);
  for (int trial = 0; trial < 60; ++trial) {
    KVCacheManager kv(layout, {.num_large_pages = 256, .max_requests = 4});
    // Cache the prompt, then evict nothing: every cap's answer comes from the same pages.
    const RequestId w = kv.add_request(prompt);
    kv.lookup_prefix(w);
    REQUIRE(kv.allocate(w, static_cast<std::uint32_t>(prompt.size())));
    kv.commit(w, prompt.size());
    kv.free(w);
    const std::uint64_t cap = rng() % (prompt.size() + 8);
    const RequestId capped = kv.add_request(prompt);
    const std::uint64_t hit = kv.lookup_prefix(capped, cap);
    const std::vector<std::uint32_t> cut(
        prompt.begin(), prompt.begin() + static_cast<long>(std::min<std::uint64_t>(cap + 1, prompt.size())));
    const RequestId ref = kv.add_request(cut);
    INFO("cap " << cap);
    CHECK(hit <= cap);
    CHECK(hit == kv.lookup_prefix(ref));
    REQUIRE(kv.allocate(capped, static_cast<std::uint32_t>(prompt.size() - hit)));
    CHECK(kv.num_computed(capped) == hit);
    kv.check_invariants();
  }
  KVCacheManager kv(layout, {.num_large_pages = 16, .max_requests = 2});
  const RequestId r = kv.add_request(prompt);
  CHECK(kv.lookup_prefix(r, 0) == 0);  // a zero cap: no hit, and the lookup is spent
  CHECK_THROWS_WITH(kv.lookup_prefix(r, 5), Catch::Contains("lookup_prefix must come once"));
}
