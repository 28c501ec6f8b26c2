// KVCacheManager defects found by an adversarial run (issue 14), one exact test each:
// every bad call raises kvmm::Error naming the field, leaves the manager as it was, and
// the manager still serves requests afterwards.
#include "kvmm/manager/kv_cache_manager.hpp"

#include <catch2/catch.hpp>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

using namespace kvmm;

namespace {

KVLayout text_layout(std::uint32_t tokens_per_page = 4, std::uint32_t window = 8) {
  return KVLayout::plan({LayerGroup::full_attention("full", 1, 1, 8, 2, tokens_per_page),
                         LayerGroup::sliding_window("sw", 1, 1, 8, 2, tokens_per_page, window)});
}

// Serves one request end to end: the manager still works after whatever came before.
void serve_one(KVCacheManager& kv, std::uint32_t first_id = 500) {
  kv.begin_step();
  std::vector<std::uint32_t> ids(9);
  for (std::uint32_t i = 0; i < ids.size(); ++i) ids[i] = first_id + i;
  const RequestId r = kv.add_request(ids);
  const std::uint64_t hit = kv.lookup_prefix(r);
  REQUIRE(kv.allocate(r, static_cast<std::uint32_t>(ids.size() - hit)));
  kv.commit(r, ids.size());
  kv.free(r);
  kv.check_invariants();
}

}  // namespace

TEST_CASE("add_request with a huge max_tokens raises and takes no request slot", "[manager][defect]") {
  KVCacheManager kv(text_layout(), {.num_large_pages = 16, .max_requests = 2});
  const std::vector<std::uint32_t> ids{1, 2, 3, 4, 5};
  for (const std::uint64_t huge : {std::uint64_t{1} << 40, std::uint64_t{1} << 63, ~std::uint64_t{0}}) {
    CHECK_THROWS_WITH(kv.add_request(ids, {.max_tokens = huge}),
                      Catch::Contains("extras.max_tokens = " + std::to_string(huge)));
    CHECK(kv.num_active() == 0);
    kv.check_invariants();
  }
  // Both slots are still free; a free of a slot never handed out is refused.
  CHECK_THROWS_WITH(kv.free(0), Catch::Contains("not an active request"));
  CHECK(kv.num_active() == 0);
  const RequestId a = kv.add_request(ids);
  const RequestId b = kv.add_request(ids);
  CHECK(a != b);
  CHECK(kv.num_active() == 2);
  kv.free(a);
  kv.free(b);
  serve_one(kv);
}

TEST_CASE("image placeholders must lie inside the prompt and not wrap", "[manager][defect]") {
  const KVLayout layout = KVLayout::plan(
      {LayerGroup::full_attention("text", 1, 1, 8, 2, 4), LayerGroup::cross_attention("cross", 1, 1, 8, 2, 4)});
  KVCacheManager kv(layout, {.num_large_pages = 32, .max_requests = 2});
  const std::vector<std::uint32_t> ids(10, 3);
  const MultimodalItem past{hash_bytes(std::as_bytes(std::span("a", 1))), 8, 4};  // [8, 12) > 10
  CHECK_THROWS_WITH(kv.add_request(ids, {.items = std::span(&past, 1)}),
                    Catch::Contains("extras.items[0]") && Catch::Contains("10"));
  const MultimodalItem wrap[2] = {{hash_bytes(std::as_bytes(std::span("b", 1))), 1, 2},
                                  {hash_bytes(std::as_bytes(std::span("c", 1))), ~std::uint64_t{0} - 1, 4}};
  CHECK_THROWS_WITH(kv.add_request(ids, {.items = std::span(wrap, 2)}), Catch::Contains("extras.items[1]"));
  // A prompt whose ids arrive in chunks declares its length; fewer than the ids is refused.
  CHECK_THROWS_WITH(kv.add_request(ids, {.items = std::span(&past, 1), .prompt_tokens = 11}),
                    Catch::Contains("extras.items[0]") && Catch::Contains("11"));
  CHECK_THROWS_WITH(kv.add_request(ids, {.prompt_tokens = 9}), Catch::Contains("extras.prompt_tokens = 9"));
  CHECK(kv.num_active() == 0);
  const RequestId r = kv.add_request(std::span(ids).first(4), {.items = std::span(&past, 1), .prompt_tokens = 12});
  kv.append_tokens(r, std::span(ids).subspan(4));
  kv.free(r);
  kv.check_invariants();
  serve_one(kv);
}

TEST_CASE("lookup_prefix after an allocate that took image pages is refused", "[manager][defect]") {
  const KVLayout layout = KVLayout::plan(
      {LayerGroup::full_attention("text", 1, 1, 8, 2, 4), LayerGroup::cross_attention("cross", 1, 1, 8, 2, 4)});
  KVCacheManager kv(layout, {.num_large_pages = 32, .max_requests = 2});
  const MultimodalItem img{hash_bytes(std::as_bytes(std::span("pixels", 6))), 2, 8};
  const std::vector<std::uint32_t> ids{1, 2, 0, 0, 0, 0, 0, 0, 0, 0, 3, 4, 5};
  kv.begin_step();
  const RequestId r = kv.add_request(ids, {.items = std::span(&img, 1)});
  REQUIRE(kv.allocate(r, 0));  // takes the image's pages only
  const std::uint32_t free_before = kv.large_pages().num_free();
  CHECK_THROWS_WITH(kv.lookup_prefix(r), Catch::Contains("request = " + std::to_string(r)));
  CHECK(kv.large_pages().num_free() == free_before);
  kv.check_invariants();
  kv.free(r);
  kv.reset_prefix_cache();
  CHECK(kv.large_pages().num_free() == kv.large_pages().capacity());  // nothing leaked
  kv.check_invariants();
}

TEST_CASE("commit into a page shared since fork without an allocate is refused", "[manager][defect][fork]") {
  // A parent with slots allocated past its computed tokens, forked: its next commit would
  // write the shared partial page. Also a Mamba state page shared the same way.
  const KVLayout layouts[2] = {text_layout(4, 64), KVLayout::plan({LayerGroup::full_attention("full", 1, 1, 8, 2, 4),
                                                                   LayerGroup::mamba_state("m", 1, 64, 4)})};
  for (const KVLayout& layout : layouts) {
    KVCacheManager kv(layout, {.num_large_pages = 32, .max_requests = 4});
    kv.begin_step();
    const RequestId p = kv.add_request(std::vector<std::uint32_t>{1, 2, 3, 4, 5, 6, 7, 8});
    kv.lookup_prefix(p);
    REQUIRE(kv.allocate(p, 6, 2));  // pages for 8 tokens, 6 computed
    kv.commit(p, 6);
    const RequestId c = kv.fork(p);
    const PageId shared = kv.page_table(p, 1)[1];
    REQUIRE(kv.page_table(c, 1)[1] == shared);
    CHECK_THROWS_WITH(kv.commit(p, 8),
                      Catch::Contains("request = " + std::to_string(p)) && Catch::Contains("allocate"));
    CHECK(kv.num_computed(p) == 6);
    kv.check_invariants();
    // The documented path: allocate plans the copy, then the commit is accepted.
    kv.begin_step();
    REQUIRE(kv.allocate(p, 2));
    CHECK(kv.copies().size() == 2);
    CHECK(kv.page_table(p, 1)[1] != shared);
    kv.commit(p, 8);
    CHECK(kv.page_table(c, 1)[1] == shared);
    kv.free(p);
    kv.free(c);
    kv.check_invariants();
  }
}

TEST_CASE("reset_prefix_cache forgets the hashes of swapped-out pages (vLLM test_reset_prefix_cache)",
          "[manager][defect][swap]") {
  KVCacheManager kv(text_layout(16, 64), {.num_large_pages = 16, .num_host_large_pages = 16, .max_requests = 4});
  std::vector<std::uint32_t> ids(50);
  for (std::uint32_t i = 0; i < ids.size(); ++i) ids[i] = i;
  kv.begin_step();
  const RequestId r = kv.add_request(ids);
  CHECK(kv.lookup_prefix(r) == 0);
  REQUIRE(kv.allocate(r, 49));
  kv.commit(r, 49);
  REQUIRE(kv.swap_out(r).has_value());
  kv.reset_prefix_cache();
  kv.begin_step();
  REQUIRE(kv.swap_in(r).has_value());
  kv.free(r);
  kv.check_invariants();
  const RequestId again = kv.add_request(ids);
  CHECK(kv.lookup_prefix(again) == 0);
  kv.free(again);
  kv.check_invariants();
}

TEST_CASE("manager options are validated before anything is allocated", "[manager][defect]") {
  const KVLayout layout = text_layout();
  const std::uint32_t max32 = std::numeric_limits<std::uint32_t>::max();
  CHECK_THROWS_WITH(KVCacheManager(layout, {.num_large_pages = max32}),
                    Catch::Contains("num_large_pages = " + std::to_string(max32)));
  CHECK_THROWS_WITH(KVCacheManager(layout, {.num_large_pages = 8, .num_host_large_pages = max32}),
                    Catch::Contains("num_host_large_pages = " + std::to_string(max32)));
  // Past 2^31 small pages the message names the option, not the prefix index.
  CHECK_THROWS_WITH(KVCacheManager(layout, {.num_large_pages = (1u << 30) + 1}),
                    Catch::Contains("num_large_pages = ") && !Catch::Contains("max_entries"));
  CHECK_THROWS_WITH(KVCacheManager(layout, {.num_large_pages = 8, .max_requests = max32}),
                    Catch::Contains("max_requests = " + std::to_string(max32)));
}

// Found by the Python differential test (issue 22): pinning a request's hit when another
// request was looked up last rewrote the lookup memo, which the other request's allocate
// then trusted, pinning the first request's pages (another LoRA adapter's KV) unchecked.
TEST_CASE("interleaved lookups pin each request's own pages", "[manager][defect]") {
  KVCacheManager kv(text_layout(), {.num_large_pages = 32, .max_requests = 4});
  const std::vector<std::uint32_t> ids{1, 2, 3, 4, 5, 6, 7, 8, 9};
  for (std::uint32_t lora : {0u, 1u}) {  // the same ids cached under two adapters
    const RequestId r = kv.add_request(ids, {.lora_id = lora});
    kv.lookup_prefix(r);
    REQUIRE(kv.allocate(r, 9));
    kv.commit(r, 9);
    kv.free(r);
  }
  const RequestId a = kv.add_request(ids, {.lora_id = 0}), b = kv.add_request(ids, {.lora_id = 1});
  REQUIRE(kv.lookup_prefix(a) == 8);
  REQUIRE(kv.lookup_prefix(b) == 8);
  REQUIRE(kv.allocate(a, 1));
  REQUIRE(kv.allocate(b, 1));
  kv.check_invariants();
  for (GroupId g = 0; g < 2; ++g) {
    const auto pa = kv.page_table(a, g), pb = kv.page_table(b, g);
    for (std::size_t i = 0; i < 2; ++i)
      if (pa[i] != kNullPage) CHECK(pa[i] != pb[i]);
  }
}
