// Bad-input driver for the memory classes: a seeded random sequence of valid operations
// with bad calls mixed in. Each bad call must (a) raise kvmm::Error naming what the case
// expects, or report failure by value, (b) leave the invariants and a snapshot of the
// object's observable state unchanged; every case runs at least once. O(ops * check).
#pragma once

#include "kvmm/error.hpp"

#include <catch2/catch.hpp>

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace kvmm::test {

struct BadCase {
  std::string name;
  // Substring of the kvmm::Error message the call must raise; empty: the call reports
  // failure by value and returns whether it did.
  std::string error;
  std::function<bool()> call;
};

// Runs `ops` steps: two in three a valid operation (`valid(rng)`), one in three a random
// bad case; then every case once more. `check` runs the invariant checks; `snapshot`
// returns the observable state (a type with ==).
template <class Snapshot>
void run_bad_inputs(std::uint32_t seed, int ops, const std::vector<BadCase>& cases,
                    const std::function<Snapshot()>& snapshot, const std::function<void()>& check,
                    const std::function<void(std::mt19937&)>& valid) {
  std::mt19937 rng(seed);
  auto bad = [&](const BadCase& c) {
    CAPTURE(c.name);
    const Snapshot before = snapshot();
    if (!c.error.empty()) {
      CHECK_THROWS_WITH(c.call(), Catch::Contains(c.error));
    } else {
      CHECK(c.call());
    }
    check();
    CHECK((snapshot() == before));
  };
  int bad_calls = 0;
  for (int op = 0; op < ops; ++op) {
    if (rng() % 3 != 0) {
      valid(rng);
      check();
    } else {
      bad(cases[rng() % cases.size()]);
      ++bad_calls;
    }
  }
  for (const BadCase& c : cases) bad(c);
  CHECK(bad_calls > ops / 4);
}

}  // namespace kvmm::test
