#include "kvmm/memory/elastic_memory.hpp"

#include "kvmm/error.hpp"

#include <limits>
#include <utility>

namespace kvmm {

ElasticMemory::ElasticMemory(ChunkPool& pool, ActivationAllocator& activations, ChunkOwner kv_owner, KVReclaimer kv)
    : pool_(pool), act_(activations), kv_owner_(kv_owner), kv_(std::move(kv)) {
  if (kv_owner != ChunkOwner::kKVArena && kv_owner != ChunkOwner::kVirtualTensor)
    fail("kv_owner = {}: must be a KV owner", to_string(kv_owner));
}

bool ElasticMemory::inflate(std::uint32_t n) {
  const auto act = ChunkOwner::kActivation;
  const std::uint32_t slack = pool_.quota(act) - pool_.owned(act);
  if (slack < n) {
    // Lightweight GC: only idle (mapped, unused) activation chunks can be given up.
    if (std::uint64_t{slack} + act_.idle_chunks() < n) return false;
    act_.gc(n - slack);
  }
  return pool_.move_quota(act, kv_owner_, n);
}

bool ElasticMemory::deflate(std::uint32_t n) {
  const std::uint32_t slack = pool_.quota(kv_owner_) - pool_.owned(kv_owner_);
  if (slack < n) {
    const std::uint32_t need = n - slack;
    if (!kv_.reclaimable || !kv_.reclaim || kv_.reclaimable() < need) return false;
    if (kv_.reclaim(need) < need) return false;
  }
  return pool_.move_quota(kv_owner_, ChunkOwner::kActivation, n);
}

bool ElasticMemory::balloon(std::int64_t amount) {
  // |amount| in 64 bits (INT64_MIN has no int64 negation), then it must fit 32.
  const std::uint64_t magnitude =
      amount < 0 ? std::uint64_t{0} - static_cast<std::uint64_t>(amount) : static_cast<std::uint64_t>(amount);
  if (magnitude > std::numeric_limits<std::uint32_t>::max())
    fail("amount = {}: more chunks than a pool can hold (|amount| must be below 2^32)", amount);
  if (amount > 0) return inflate(static_cast<std::uint32_t>(magnitude));
  if (amount < 0) return deflate(static_cast<std::uint32_t>(magnitude));
  return true;
}

void ElasticMemory::check_invariants() const {
  pool_.check_invariants();
  act_.check_invariants();
}

ElasticBatch plan_elastic_batch(const ElasticBatchInput& in, std::span<const ElasticRequest> queue) {
  ElasticBatch b;
  std::uint64_t host = in.host_buffer;
  auto fits = [&](std::uint64_t extra) {
    const std::uint64_t used = std::uint64_t{b.kv} + b.act + extra;
    return used <= in.total && in.total - used >= in.threshold;
  };
  for (const ElasticRequest& r : queue) {
    if (fits(std::uint64_t{r.kv} + r.act)) {
      b.kv += r.kv;
      b.act += r.act;
      b.offloaded.push_back(0);
    } else if (in.phase == ElasticPhase::kPrefill && fits(r.act) && r.kv <= host) {
      b.act += r.act;  // prefill computes here, its KV goes to the CPU buffer
      host -= r.kv;
      b.offloaded.push_back(1);
    } else {
      break;
    }
    ++b.admitted;
  }
  if (in.free_kv < b.kv && in.free_act > b.act)
    b.inflation = static_cast<std::int64_t>(b.kv) - in.free_kv;  // inflation
  else if (in.free_act < b.act && in.free_kv > b.kv)
    b.inflation = static_cast<std::int64_t>(in.free_act) - b.act;  // deflation
  return b;
}

}  // namespace kvmm
