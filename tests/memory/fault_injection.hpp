// Fault-injection driver for the memory classes: an operation is rerun from a fresh
// setup with the Nth backend call failing, for N = 1, 2, ... until a run makes no call
// that the fault reaches, so every call position is tried. Three kinds: the Nth acquiring
// call returns false, the Nth acquiring call raises, the Nth releasing call raises.
// Cost: O(positions * (setup + operation)).
#pragma once

#include "kvmm/error.hpp"
#include "kvmm/memory/chunk_pool.hpp"
#include "kvmm/memory/host_memory.hpp"
#include "kvmm/testing/faulty_memory.hpp"

#include <catch2/catch.hpp>

#include <cstdint>
#include <string>

namespace kvmm::test {

enum class Fault { kFalse, kThrow, kRelease };
inline constexpr Fault kFaults[] = {Fault::kFalse, Fault::kThrow, Fault::kRelease};
inline const char* fault_name(Fault f) {
  return f == Fault::kFalse   ? "acquiring call returns false"
         : f == Fault::kThrow ? "acquiring call raises"
                              : "releasing call raises";
}

// Arms the `n`th call of kind `f` (and disarms the other kind).
inline void arm(FaultyMemory& m, Fault f, std::uint64_t n) {
  if (f == Fault::kRelease) {
    m.fail_at(0);
    m.throw_release_at(n);
  } else {
    m.throw_release_at(0);
    m.fail_at(n, f == Fault::kThrow ? FaultMode::kThrow : FaultMode::kReturnFalse);
  }
}
// Disarms both kinds; returns whether the armed fault fired (re-arming clears that).
inline bool disarm(FaultyMemory& m) {
  const bool fired = m.fired();
  m.fail_at(0);
  m.throw_release_at(0);
  return fired;
}

// What an armed operation did: its result, and whether it raised (only the injected
// kvmm::Error is caught; any other exception fails the test).
struct Outcome {
  bool ok = false;
  bool raised = false;
  std::string what;
};
template <class Op>
Outcome run_op(Op&& op) {
  Outcome o;
  try {
    o.ok = op();
  } catch (const Error& e) {
    o.raised = true;
    o.what = e.what();
  }
  return o;
}

// Calls `trial(n)` for n = 1, 2, ... while it returns true (the fault fired); returns
// the number of positions that fired.
template <class Trial>
std::uint64_t every_position(Trial&& trial) {
  std::uint64_t n = 1;
  while (trial(n)) {
    ++n;
    REQUIRE(n < 10000);
  }
  return n - 1;
}

// Leak accounting: every chunk alive in the backend is one the pool created, every
// mapping one the pool holds; both sides' invariants hold.
inline void accounted(const HostMemory& host, const ChunkPool& pool) {
  host.check_invariants();
  pool.check_invariants();
  const ChunkPoolStats s = pool.stats();
  REQUIRE(host.live_chunks() == s.created);
  REQUIRE(host.live_mappings() == s.mapped);
}

}  // namespace kvmm::test
