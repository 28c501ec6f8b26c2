// Block hash values: the bulk hash_pages (with its fixed-length 16-token path) equals the
// page-by-page hash_page chain for every page size and LoRA id, and hash_page is XXH3-128
// over (parent, XXH3-128 of the page's ids), computed here with xxHash itself.
#include "kvmm/caching/block_hash.hpp"
#include "kvmm/error.hpp"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

using namespace kvmm;

TEST_CASE("hash_pages equals the hash_page chain for every page size and LoRA id", "[caching][hash]") {
  std::mt19937_64 rng(7);
  for (const std::uint32_t P : {1u, 3u, 4u, 5u, 8u, 16u, 17u, 32u, 33u, 64u, 512u}) {
    for (const std::uint32_t lora : {0u, 9u}) {
      for (const bool zero_parent : {true, false}) {
        const std::size_t pages = 7;
        std::vector<std::uint32_t> tokens(pages * P + 3);  // a partial page after them
        for (auto& t : tokens) t = static_cast<std::uint32_t>(rng());
        const BlockHash parent = zero_parent ? BlockHash{} : BlockHash{rng(), rng()};
        std::vector<BlockHash> expect;
        PageExtraKeys ex;
        ex.lora_id = lora;
        for (std::size_t i = 0; i < pages; ++i)
          expect.push_back(
              hash_page(i ? expect.back() : parent, std::span<const std::uint32_t>(tokens).subspan(i * P, P), ex));
        std::vector<BlockHash> out(pages);
        hash_pages(parent, tokens, P, lora, out);
        INFO("tokens_per_page " << P << " lora " << lora << " zero parent " << zero_parent);
        CHECK(out == expect);
        // Any prefix of the pages gives the prefix of the chain.
        std::vector<BlockHash> three(3);
        hash_pages(parent, tokens, P, lora, three);
        CHECK(std::equal(three.begin(), three.end(), expect.begin()));
      }
    }
  }
}

TEST_CASE("hash_pages rejects too few ids, naming them, and writes nothing", "[caching][hash]") {
  std::vector<std::uint32_t> tokens(16 * 3 - 1, 5);
  std::vector<BlockHash> out(3, BlockHash{1, 2});
  try {
    hash_pages({}, tokens, 16, 0, out);
    FAIL("expected kvmm::Error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("tokens") != std::string::npos);
    CHECK(std::string(e.what()).find("47") != std::string::npos);
  }
  CHECK(out == std::vector<BlockHash>(3, BlockHash{1, 2}));
  CHECK_THROWS_AS(hash_pages({}, tokens, 0, 0, out), Error);
}

TEST_CASE("hash_page is XXH3-128 over (parent, XXH3-128 of the page's ids)", "[caching][hash]") {
  std::mt19937_64 rng(11);
  for (const std::uint32_t P : {2u, 5u, 16u, 40u, 512u}) {
    std::vector<std::uint32_t> ids(P);
    for (auto& t : ids) t = static_cast<std::uint32_t>(rng());
    const BlockHash parent{rng(), rng()};
    const XXH128_hash_t content = XXH3_128bits(ids.data(), ids.size() * 4);
    const std::uint64_t link[4] = {parent.lo, parent.hi, content.low64, content.high64};
    const XXH128_hash_t h = XXH3_128bits(link, sizeof link);
    INFO("tokens_per_page " << P);
    CHECK(hash_page(parent, ids, {}) == BlockHash{h.low64, h.high64});
    std::vector<BlockHash> out(1);
    hash_pages(parent, ids, P, 0, out);
    CHECK(out[0] == BlockHash{h.low64, h.high64});
  }
}
