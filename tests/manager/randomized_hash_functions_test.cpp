// The randomized manager test (reference_model.hpp) under every block hash function: the
// model hashes with the same BlockHasher, so hits, evictions and tables must match.
#include "reference_model.hpp"

#include <catch2/catch.hpp>

using namespace kvmm;
using namespace kvmm::test;

TEST_CASE("the randomized test against its reference model under every block hash function",
          "[manager][random][hasher]") {
  // Seeds 1 (layout 0) and 4 (layout 1, prompt tails), 6,000 operations each, per mode;
  // the model hashes with the same BlockHasher, so hits, evictions and tables must match.
  for (const auto& [f, salted_only] :
       {std::pair{BlockHashFunction::kSha256, false}, std::pair{BlockHashFunction::kBlake2bKeyed, false},
        std::pair{BlockHashFunction::kBlake2bKeyed, true}}) {
    BlockHashOptions o;
    o.function = f;
    o.salted_only = salted_only;
    if (f == BlockHashFunction::kBlake2bKeyed) o.key = "a per-deployment secret, 32 bytes";
    for (std::uint64_t seed : {1u, 4u}) {
      INFO(to_string(f) << " salted_only " << salted_only << " seed " << seed);
      Model m(seed, seed == 4 ? 24 : 12, seed == 4 ? 1 : 0, 0, seed == 4 ? 12 : 0, o);
      m.run(6000);
      CHECK(m.hits > 30);
      CHECK(m.evictions > 30);
    }
  }
}
