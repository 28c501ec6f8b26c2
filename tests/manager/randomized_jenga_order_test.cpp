// The randomized manager test (reference_model.hpp) with Jenga's step order (packing off):
// the main case runs the default packing order.
#include "reference_model.hpp"

#include <catch2/catch.hpp>

using namespace kvmm;
using namespace kvmm::test;

TEST_CASE("the randomized test against its reference model with Jenga's step order (packing off)",
          "[manager][random][packing]") {
  // The main case runs the default packing order; this one keeps Jenga's order covered:
  // seeds 1 (layout 0), 4 (one-page sliding and Mamba groups) and 7 (the lineup's storage
  // with an indexer), 15,000 operations each.
  for (std::uint64_t seed : {1u, 4u, 7u}) {
    INFO("seed " << seed);
    const int layout = seed == 7 ? 3 : seed == 4 ? 1 : 0;
    Model m(seed, layout == 1 ? 24 : 12, layout, 0, seed == 1 ? 0 : 12, {}, false);
    m.run(15000);
    CHECK(m.hits > 50);
    CHECK(m.evictions > 50);
    CHECK(m.failures > 10);
  }
}
