// Internal to kvmm::events (distributed/detail/: the publisher's queue, not public API).
// BatchRing: a single-producer single-consumer queue of KvEventBatch copies in one byte
// ring allocated at construction, so the producer (the scheduler thread) never allocates
// and never waits: push() copies the batch's flat arrays in (a few memcpy, ~1 ns per
// stored page) or reports the ring full. pop() copies the oldest batch out into a reused
// batch on the consumer's thread. Memory order: acquire/release on the two positions.
#pragma once

#include "kvmm/manager/kv_events.hpp"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

namespace kvmm {

class BatchRing {
 public:
  // `capacity_bytes` (rounded up to 8, at least 64) of records, at most `max_batches` at once.
  BatchRing(std::uint64_t capacity_bytes, std::uint32_t max_batches);
  BatchRing(const BatchRing&) = delete;
  BatchRing& operator=(const BatchRing&) = delete;

  // Bytes a batch takes in the ring (header and 8-byte padding included).
  static std::uint64_t record_bytes(const KvEventBatch& batch);

  // Producer: copies `batch` with its sequence number and timestamp in. false (nothing
  // changed) when the ring lacks room or holds max_batches batches. A batch of up to half
  // the capacity always fits in an empty ring (a wrap wastes less than one record); a
  // larger one may not.
  bool push(const KvEventBatch& batch, std::uint64_t seq, double ts);
  // Consumer: moves the oldest batch into `out` (its capacities reused). false if empty.
  bool pop(KvEventBatch& out, std::uint64_t& seq, double& ts);

  bool empty() const { return pushed_.load(std::memory_order_acquire) == popped_.load(std::memory_order_acquire); }
  std::uint64_t size() const {
    return pushed_.load(std::memory_order_acquire) - popped_.load(std::memory_order_acquire);
  }
  std::uint64_t capacity_bytes() const { return capacity_; }
  std::uint32_t max_batches() const { return max_batches_; }

 private:
  std::uint64_t capacity_ = 0;
  std::uint32_t max_batches_ = 0;
  std::unique_ptr<std::byte[]> data_;
  // Monotonic byte positions: the producer owns tail_, the consumer head_.
  alignas(64) std::atomic<std::uint64_t> tail_{0};
  std::atomic<std::uint64_t> pushed_{0};
  alignas(64) std::atomic<std::uint64_t> head_{0};
  std::atomic<std::uint64_t> popped_{0};
};

}  // namespace kvmm
