// Seeded model-based test of the manager (>= 100k random operations on three-group
// layouts; also in the 2026 lineup's storage: an MLA latent, fp8/nvfp4 pages with scales,
// a recurrent state's tensors, and a fourth group, a DSA indexer tied to the latent),
// checked after every operation against a plain reference model (reference_model.hpp).
// Siblings: randomized_hash_functions_test.cpp, randomized_jenga_order_test.cpp.
#include "reference_model.hpp"

#include <catch2/catch.hpp>

using namespace kvmm;
using namespace kvmm::test;

TEST_CASE("model-based randomized test against a reference model", "[manager][random]") {
  std::uint64_t total_ops = 0;
  for (std::uint64_t seed : {1u, 2u, 3u, 4u, 5u, 6u, 7u}) {
    INFO("seed " << seed);
    // Seeds 4 and 5: one-page sliding and Mamba groups; 6 and 7: the 2026 lineup's storage
    // (MLA latent, fp8/nvfp4 window, recurrent-state tensors; 7 with a DSA indexer).
    const int layout = seed >= 6 ? static_cast<int>(seed) - 4 : seed >= 4 ? 1 : 0;
    // Seeds 2, 5 and 6 learn boundaries too (a small table: entries overwrite each other);
    // seeds 2, 4, 6 and 7 hold prompt tails (6 and 12 tokens: shorter and longer than the window).
    Model m(seed,
            seed == 3     ? 40
            : layout == 1 ? 24
                          : 12,
            layout, seed == 2 || seed == 5 || seed == 6 ? 16 : 0,
            seed == 2 || seed == 6   ? 6
            : seed == 4 || seed == 7 ? 12
                                     : 0,
            {}, true,
            seed == 2 || seed == 4 ? 0.05 : 0.25,  // a retention bound that binds (1 window page)
            // Which held pages a refused running allocate releases: seed 1 none, 3 and 5
            // any request's, the others (the default) the request's own.
            seed == 1                ? RetentionRelease::kOff
            : seed == 3 || seed == 5 ? RetentionRelease::kAll
                                     : RetentionRelease::kOwn);
    m.run(35000);
    total_ops += 35000;
    // The run exercised what it claims to.
    CHECK(m.hits > 100);
    CHECK(m.evictions > 100);
    CHECK(m.cows > 10);
    CHECK(m.swaps > 10);
    CHECK(m.resets > 10);
    CHECK(m.refusals > 50);
    CHECK(m.holds > 100);
    CHECK(m.handovers > 10);
    if (seed == 1)
      CHECK(m.pressure_releases == 0);
    else
      CHECK(m.pressure_releases > 10);
    if (seed == 2 || seed == 4) CHECK(m.over_bound > 10);
    // The reasons the random traffic must reach (the counters agree with the reports).
    for (MissReason why : {MissReason::kNone, MissReason::kPageFloor, MissReason::kNotCached, MissReason::kEvicted}) {
      CHECK(m.reports[static_cast<std::size_t>(why)] > 0);
      CHECK(m.kv().counters().misses.lookups[static_cast<std::size_t>(why)] ==
            m.reports[static_cast<std::size_t>(why)]);
    }
    if (seed != 3) CHECK(m.failures > 10);
    if (layout >= 2) {  // the lineup's storage, at layout 0's page counts (6, 3, 2; the indexer 6)
      CHECK(m.kv().layout().group(kFull).storage == KvStorage::kLatent);
      CHECK(m.kv().layout().group(kSw).v_element().bits() == 4);
      CHECK(m.kv().layout().group(kMamba).state_tensors.size() == 2);
      CHECK(m.kv().layout().num_groups() == (layout == 3 ? 4u : 3u));
      if (layout == 3) CHECK(m.kv().layout().group(kIndexer).storage == KvStorage::kKeyOnly);
    }
    if (layout == 1) {
      CHECK(m.kv().layout().small_pages_per_large_page(kSw) == 1);
      CHECK(m.kv().layout().small_pages_per_large_page(kMamba) == 1);
      CHECK(m.kv().layout().small_pages_per_large_page(kFull) > 1);
    }
    WARN("seed " << seed << ": lookups " << m.lookups << " hits " << m.hits << " evictions " << m.evictions
                 << " failed allocations " << m.failures << " copies " << m.cows << " swaps " << m.swaps << " resets "
                 << m.resets << " refused admissions " << m.refusals << " commits holding pages " << m.holds
                 << " hand-overs " << m.handovers << " retention released under pressure " << m.pressure_releases
                 << " pages over the retention bound " << m.over_bound);
  }
  CHECK(total_ops >= 200000);
}
