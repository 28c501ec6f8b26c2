// KVCacheManagerOptions::block_hash through the manager: the same seeded traffic (LoRA ids,
// salts, images, forks, swaps, evictions, cache resets) gives the same page tables, hits and
// evictions under every hash function and scope, step by step (differential against
// XXH3-128; learned boundaries off, whose direct-mapped table keeps hints by hash value,
// so which ones a collision of slots drops differs); block_hashes and the tier keys are the chosen function's chain;
// bad key material fails the constructor with a kvmm::Error naming the option.
#include "kvmm/caching/block_hasher.hpp"
#include "kvmm/manager/kv_cache_manager.hpp"
#include "kvmm/manager/tier_admission.hpp"
#include "support/error_of.hpp"
#include "support/kv_traffic.hpp"

#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

using namespace kvmm;
using namespace kvmm::test;

namespace {

const std::string kKey = "0123456789abcdef0123456789ABCDEF";

BlockHashOptions mode(BlockHashFunction f, bool salted_only) {
  BlockHashOptions o;
  o.function = f;
  o.salted_only = salted_only;
  if (f == BlockHashFunction::kBlake2bKeyed) o.key = kKey;
  return o;
}

}  // namespace

TEST_CASE("the same traffic gives the same tables, hits and evictions under every block hash",
          "[manager][hasher][random]") {
  const std::vector<BlockHashOptions> modes = {
      mode(BlockHashFunction::kSha256, false), mode(BlockHashFunction::kSha256, true),
      mode(BlockHashFunction::kBlake2bKeyed, false), mode(BlockHashFunction::kBlake2bKeyed, true)};
  for (std::uint64_t seed = 1; seed <= 3; ++seed) {
    INFO("seed " << seed);
    // Learned boundaries off: their direct-mapped table loses hints by hash value.
    KvTraffic reference(seed, 40, {}, false);  // XXH3-128
    std::vector<std::unique_ptr<KvTraffic>> others;
    for (const BlockHashOptions& o : modes) others.push_back(std::make_unique<KvTraffic>(seed, 40, o, false));
    std::uint64_t steps = 0;
    while (reference.ops() < 5000) {
      reference.step();
      const auto expect = reference.observe();
      const auto cached = reference.cached_set().size();
      for (std::size_t m = 0; m < others.size(); ++m) {
        INFO("mode " << to_string(modes[m].function) << " salted_only " << modes[m].salted_only << " step " << steps);
        others[m]->step();
        REQUIRE(others[m]->observe() == expect);
        REQUIRE(others[m]->cached_set().size() == cached);
      }
      ++steps;
    }
    const ManagerCounters c = reference.manager().counters();
    CHECK(c.hit_tokens > 200);
    CHECK(c.evicted_pages > 100);
    for (const auto& t : others) t->manager().check_invariants();
  }
}

TEST_CASE("block_hashes and tier keys are the chosen function's chain", "[manager][hasher]") {
  const KVLayout layout = traffic_layout();  // full P=4, window P=4, Mamba P=8, cross P=4
  std::vector<std::uint32_t> tokens(41);
  for (std::uint32_t i = 0; i < tokens.size(); ++i) tokens[i] = 7 * i + 1;
  for (const bool salted : {false, true}) {
    for (const BlockHashOptions& o :
         {mode(BlockHashFunction::kSha256, false), mode(BlockHashFunction::kBlake2bKeyed, false),
          mode(BlockHashFunction::kBlake2bKeyed, true)}) {
      INFO(to_string(o.function) << " salted_only " << o.salted_only << " salted " << salted);
      const BlockHasher hasher(o);
      KVCacheManager kv(layout, {.num_large_pages = 40, .block_hash = o});
      TierAdmission adm(kv);
      RequestExtras ex;
      ex.lora_id = 5;
      if (salted) ex.cache_salt = "tenant-a";
      const RequestId r = kv.add_request(tokens, ex);
      kv.lookup_prefix(r);
      std::vector<TierKey> keys;
      adm.tier_candidates(r, keys);
      std::size_t k = 0;
      for (GroupId g = 0; g < 3; ++g) {  // the decoder groups
        const std::uint32_t P = layout.group(g).tokens_per_page;
        std::vector<BlockHash> expect;
        for (std::size_t i = 0; (i + 1) * P <= tokens.size(); ++i) {
          PageExtraKeys pk;
          pk.lora_id = 5;
          if (i == 0) pk.salt = ex.cache_salt;
          expect.push_back(hasher.hash_page(salted, i ? expect.back() : BlockHash{},
                                            std::span<const std::uint32_t>(tokens).subspan(i * P, P), pk));
        }
        const auto got = adm.block_hashes(r, g);
        CHECK(std::vector<BlockHash>(got.begin(), got.end()) == expect);
        const bool xxh3 = o.salted_only && !salted;
        std::vector<BlockHash> plain(expect.size());
        hash_pages({}, tokens, P, 5, plain);
        if (!salted) CHECK((plain[0] == expect[0]) == (xxh3 && (plain[0].hi >> 63) == 0));
        // Tier candidates: every full page below the lookup's limit (40 tokens), in order.
        for (std::size_t i = 0; i < 40 / P; ++i, ++k) {
          REQUIRE(k < keys.size());
          CHECK(keys[k].group == g);
          CHECK(keys[k].hash == expect[i]);
        }
      }
      CHECK(k == keys.size());
    }
  }
}

TEST_CASE("bad block_hash key material fails the manager's constructor, naming the option", "[manager][hasher]") {
  const KVLayout layout = traffic_layout();
  KVCacheManagerOptions o{.num_large_pages = 8};
  o.block_hash.function = BlockHashFunction::kBlake2bKeyed;
  CHECK(error_of([&] {
          KVCacheManager kv(layout, o);
        }).starts_with("KVCacheManagerOptions::block_hash.key: 0 bytes; function = blake2b-keyed needs"));
  o.block_hash.key = "short";
  CHECK(error_of([&] {
          KVCacheManager kv(layout, o);
        }).starts_with("KVCacheManagerOptions::block_hash.key: 5 bytes; function = blake2b-keyed needs"));
  o.block_hash.key = kKey;
  KVCacheManager kv(layout, o);  // a good key is taken
  CHECK(kv.counters().free_large_pages == 8);
}
