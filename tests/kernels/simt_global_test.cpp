// Cross-CTA hand-offs in the host emulation (kernels/simt_global.hpp, simt_host.hpp):
// the seeded block order (every CTA once, a different last CTA under different seeds),
// the last-CTA reduction pattern (store, fence, barrier, atomic; atomic, fence, barrier,
// load) with no violation under several orders and lane schedules, and each missing step
// (the writer's fence, the barrier before the arrival, the reader's fence, the barrier
// after it) reported and read as NaN.
#if defined(__SANITIZE_ADDRESS__)
// Fiber stacks switched with longjmp confuse AddressSanitizer: release CI job only.
#else
#define KVMM_SIMT_HOST 1
#include "../../kernels/memory.cuh"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

using namespace kvmm;
namespace dev = kvmm::kernels::device;

namespace {

enum class Skip { kNone, kWriterFence, kArrivalBarrier, kReaderFence, kReaderBarrier };

// 6 CTAs of 64 threads: each stores its 64 values, the last to arrive sums all 384 (each
// thread a column of the 6 CTAs) and resets the counter. Returns the sums (NaN where a
// load was not visible) and which CTA merged.
struct Result {
  std::vector<float> sums;
  unsigned merger = ~0u;
  long long violations = 0;
};
Result last_cta_sum(Skip skip) {
  constexpr unsigned kCtas = 6, kThreads = 64;
  std::vector<float> parts(kCtas * kThreads, 0.0f), sums(kThreads, 0.0f);
  unsigned counter = 0, merger = ~0u;
  simt::GlobalOrder::get().reset_violations();
  const bool ok = simt::launch(dim3(kCtas), kThreads, [&] {
    static unsigned last;
    const unsigned t = threadIdx.x, cta = blockIdx.x;
    dev::stg(&parts[cta * kThreads + t], static_cast<float>(cta * 1000 + t));
    if (skip != Skip::kWriterFence) __threadfence();
    if (skip != Skip::kArrivalBarrier) __syncthreads();
    if (t == 0) {
      last = atomicAdd(&counter, 1u) == kCtas - 1 ? 1u : 0u;
      if (last != 0) atomicExch(&counter, 0u);
      if (skip != Skip::kReaderFence) __threadfence();
    }
    if (skip != Skip::kReaderBarrier) __syncthreads();
    if (last == 0) return;
    if (t == 0) merger = cta;
    float sum = 0.0f;
    for (unsigned c = 0; c < kCtas; ++c) sum += dev::ldcg(&parts[c * kThreads + t]);
    sums[t] = sum;
  });
  REQUIRE(ok);
  REQUIRE(counter == 0);
  return Result{sums, merger, simt::GlobalOrder::get().violations()};
}

}  // namespace

TEST_CASE("seeded block order: every CTA once, a different order per seed", "[kernels][simt][global]") {
  std::set<std::vector<unsigned> > orders;
  for (std::uint64_t seed : {0ull, 1ull, 2ull, 3ull}) {
    simt::Emulator::get().set_block_order_seed(seed);
    std::vector<unsigned> ran;
    REQUIRE(simt::launch(dim3(4, 3, 2), 32, [&] {
      if (threadIdx.x == 0) ran.push_back((blockIdx.z * 3 + blockIdx.y) * 4 + blockIdx.x);
    }));
    std::vector<unsigned> sorted = ran;
    std::sort(sorted.begin(), sorted.end());
    std::vector<unsigned> all(24);
    std::iota(all.begin(), all.end(), 0u);
    CHECK(sorted == all);
    if (seed == 0) CHECK(ran == all);  // x, y, z order
    orders.insert(ran);
  }
  CHECK(orders.size() == 4);
  simt::Emulator::get().set_block_order_seed(0);
}

TEST_CASE("the last CTA's reduction: visible under every order, each missing fence or barrier caught",
          "[kernels][simt][global]") {
  std::set<unsigned> mergers;
  for (auto [blocks, lanes] : {std::pair{0ull, 0ull}, {5ull, 0ull}, {6ull, 9ull}, {7ull, 4ull}}) {
    simt::Emulator::get().set_block_order_seed(blocks);
    simt::Emulator::get().set_schedule_seed(lanes);
    const Result r = last_cta_sum(Skip::kNone);
    CHECK(r.violations == 0);
    for (unsigned t = 0; t < 64; ++t) CHECK(r.sums[t] == static_cast<float>(15000 + 6 * t));
    mergers.insert(r.merger);
  }
  CHECK(mergers.size() > 1);
  for (Skip skip : {Skip::kWriterFence, Skip::kArrivalBarrier, Skip::kReaderFence, Skip::kReaderBarrier}) {
    INFO("skipped step " << static_cast<int>(skip));
    simt::Emulator::get().set_block_order_seed(5);
    simt::Emulator::get().set_schedule_seed(0);  // thread 0 first: it arrives before the others fence
    const Result r = last_cta_sum(skip);
    CHECK(r.violations > 0);
    CHECK(std::any_of(r.sums.begin(), r.sums.end(), [](float x) { return std::isnan(x); }));
  }
  simt::Emulator::get().set_block_order_seed(0);
  simt::Emulator::get().set_schedule_seed(0);
}

#endif
