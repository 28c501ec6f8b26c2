// The manager's own KV events through the wire (issue 20's target): seeded random serving
// traffic on a KVCacheManager with record_kv_events (tests/support/kv_traffic.hpp: hybrid
// layout, evictions, swaps, forks, preemption, reset_prefix_cache), each step's batch
// published by KvEventPublisher to independent Python consumers (vLLM's schema) that lose
// batches and replay, join late, and are killed and restarted; at every checkpoint each
// consumer's set of (group, hash) blocks equals the manager's cached set (after every step
// for one seed per encoding, every 10th for the other), for both encodings, 10^5
// operations per encoding over two seeds.
#include "event_harness.hpp"
#include "kvmm/distributed/event_publisher.hpp"
#include "support/kv_traffic.hpp"

#include <catch2/catch.hpp>

using namespace kvmm;
using namespace kvmm::test;

namespace {

class ManagerSource : public BatchSource {
 public:
  ManagerSource(std::uint64_t seed, std::uint64_t ops) : traffic_(seed), ops_(ops) {}
  bool next(KvEventBatch& batch) override {
    if (traffic_.ops() >= ops_) return false;
    traffic_.step();
    traffic_.manager().take_events(batch);
    return true;
  }
  SetDigest expected() const override {
    SetDigest d;
    for (const CachedBlock& b : traffic_.cached_set()) {
      ++d.blocks;
      d.digest += block_mix(b.first, b.second.first);  // kU64: the low 64 bits go on the wire
    }
    return d;
  }
  std::uint64_t resets() const { return traffic_.resets_of_cache(); }

 private:
  KvTraffic traffic_;
  std::uint64_t ops_;
};

// Checks after every `every` non-empty batch (a flush and a round trip to each consumer).
void run_manager(EventEncoding encoding, std::uint64_t seed, std::uint64_t every) {
  INFO("seed " << seed);
  ManagerSource source(seed, 50000);
  run_stream(traffic_layout(), source, encoding, 50000 / 4, every);  // ~4 operations a non-empty batch
  CHECK(source.resets() > 0);
}

}  // namespace

TEST_CASE("manager events: Python consumers rebuild the manager's cached set, map encoding", "[python]") {
  KVMM_REQUIRE_PYTHON();
  ::signal(SIGPIPE, SIG_IGN);
  run_manager(EventEncoding::kMap, 21, 1);  // after every step
  run_manager(EventEncoding::kMap, 22, 10);
}

TEST_CASE("manager events: Python consumers rebuild the manager's cached set, array encoding", "[python]") {
  KVMM_REQUIRE_PYTHON();
  ::signal(SIGPIPE, SIG_IGN);
  run_manager(EventEncoding::kArray, 23, 1);
  run_manager(EventEncoding::kArray, 24, 10);
}
