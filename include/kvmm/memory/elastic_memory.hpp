// ElasticMemory: eLLM's intra-GPU elasticity (§4.3.1, §4.4.1) over one ChunkPool:
// inflate(n) lends activation quota to KV (unmapping idle activation chunks first),
// deflate(n) gives it back (reclaiming cached KV chunks first); all or nothing, never
// waiting (no hold-and-wait). Cost: counter updates plus the GC's unmaps.
// plan_elastic_batch() is eLLM Algorithm 1 on chunk counts.
#pragma once

#include "kvmm/memory/activation_allocator.hpp"
#include "kvmm/memory/chunk_pool.hpp"

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace kvmm {

// How the KV side gives cached memory back (e.g. VirtualKVCache::reclaimable_chunks /
// reclaim, or nothing for an elastic KVArena, whose free chunks are already unmapped).
struct KVReclaimer {
  std::function<std::uint32_t()> reclaimable;
  std::function<std::uint32_t(std::uint32_t chunks)> reclaim;  // returns chunks unmapped
};

class ElasticMemory {
 public:
  ElasticMemory(ChunkPool& pool, ActivationAllocator& activations, ChunkOwner kv_owner, KVReclaimer kv = {});

  // Moves n chunks of quota activation -> KV. false, nothing changed, if the
  // activation side cannot free that many (live activations are never touched). Should
  // the backend raise during the GC, the idle chunks unmapped so far stay unmapped, the
  // quotas are unchanged and the exception propagates.
  bool inflate(std::uint32_t n);
  // Moves n chunks of quota KV -> activation. false, nothing changed, if the KV side
  // cannot free that many. Should the backend raise while the KV side reclaims, what
  // was reclaimed stays reclaimed, the quotas are unchanged and it propagates.
  bool deflate(std::uint32_t n);
  // Signed form used by the scheduler: I > 0 inflates, I < 0 deflates. Raises
  // kvmm::Error, nothing changed, for |I| >= 2^32 (no pool holds that many chunks).
  bool balloon(std::int64_t amount);

  std::uint32_t kv_quota() const { return pool_.quota(kv_owner_); }
  std::uint32_t activation_quota() const { return pool_.quota(ChunkOwner::kActivation); }
  // Chunks each side could map right now without borrowing.
  std::uint32_t kv_free() const { return pool_.available(kv_owner_); }
  std::uint32_t activation_free() const { return pool_.available(ChunkOwner::kActivation); }
  // The pool's and the activation allocator's invariant checks (both sides' holdings
  // within their quotas). Raises kvmm::Error naming the first broken one.
  void check_invariants() const;

 private:
  ChunkPool& pool_;
  ActivationAllocator& act_;
  ChunkOwner kv_owner_;
  KVReclaimer kv_;
};

// eLLM Algorithm 1 input, in chunks. kv/act per pending request in queue order.
struct ElasticRequest {
  std::uint32_t kv = 0;
  std::uint32_t act = 0;
};
enum class ElasticPhase : std::uint8_t { kPrefill, kDecode };
struct ElasticBatchInput {
  ElasticPhase phase = ElasticPhase::kDecode;
  std::uint32_t free_kv = 0;      // P_kv
  std::uint32_t free_act = 0;     // P_act
  std::uint32_t total = 0;        // P_T: chunks in the pool
  std::uint32_t threshold = 0;    // theta: chunks kept in reserve
  std::uint32_t host_buffer = 0;  // P_B: free chunks of the (logical) CPU buffer
};
struct ElasticBatch {
  std::uint32_t admitted = 0;           // the first `admitted` requests form the batch
  std::vector<std::uint8_t> offloaded;  // per admitted request: KV goes to the CPU buffer
  std::uint32_t kv = 0, act = 0;        // M_kv, M_act
  std::int64_t inflation = 0;           // I: > 0 act -> kv, < 0 kv -> act
};
// Admits requests in order while P_T - (M_kv + M_act + KV_r + ACT_r) >= theta (prefill
// may offload KV_r to the CPU buffer instead), then computes the balloon amount I.
ElasticBatch plan_elastic_batch(const ElasticBatchInput& in, std::span<const ElasticRequest> queue);

}  // namespace kvmm
