// KvEventPublisher (target kvmm::events, built when libzmq and cppzmq are found): publishes
// the manager's KvEventBatches as vLLM's KV event stream, which KV-aware routers (Dynamo,
// llm-d, AIBrix, ...) consume: ZeroMQ PUB frames [topic][sequence u64 big-endian][msgpack
// batch], and a ROUTER socket that answers "replay from sequence N" with the buffered
// batches and an end marker. publish() runs on the scheduler thread: it copies the batch
// into a preallocated ring (~1 ns per page plus a fixed ~100 ns) and returns; it never
// blocks and never allocates; a full ring drops the batch and counts it. Encoding and
// sending happen on the publisher's own thread.
#pragma once

#include "kvmm/distributed/kv_event_encoding.hpp"
#include "kvmm/manager/kv_events.hpp"
#include "kvmm/spec/kv_layout.hpp"

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace kvmm {

// vLLM's KVEventsConfig plus kvmm's encoding and queue choices.
struct EventPublisherOptions {
  // Bound when it contains '*' or "::" or is ipc:// or inproc://, else connected (vLLM's
  // rule). A TCP port is offset by data_parallel_rank; an ipc/inproc name gets "_dp<rank>".
  std::string endpoint = "tcp://*:5557";
  std::string replay_endpoint;                          // ROUTER for replays, bound; empty: none (vLLM: None)
  std::string topic;                                    // frame 0 of every message; llm-d uses "kv@<pod>@<model>"
  std::uint32_t buffer_steps = 10000;                   // batches kept for replay
  int hwm = 100000;                                     // PUB send high-water mark (messages)
  std::uint32_t max_queue = 100000;                     // batches waiting for the publisher thread
  std::uint64_t queue_bytes = std::uint64_t{64} << 20;  // their memory, allocated up front
  std::uint32_t data_parallel_rank = 0;                 // batch field and port offset
  EventEncoding encoding = EventEncoding::kMap;
  EventHashFormat hash_format = EventHashFormat::kU64;
  // While batches keep coming the publisher thread looks for more every poll_interval and
  // publish() makes no system call; after 100 ms without one it sleeps until publish()
  // wakes it (one eventfd write). 0: publish() always wakes it (the plain path).
  std::chrono::microseconds poll_interval{1000};
  std::chrono::milliseconds linger{200};  // how long close waits for unsent frames
};

struct PublisherStats {
  std::uint64_t published = 0;   // batches queued by publish()
  std::uint64_t dropped = 0;     // batches publish() dropped (queue full); their sequence numbers stay unused
  std::uint64_t sent = 0;        // batches sent on the PUB socket
  std::uint64_t sent_bytes = 0;  // msgpack payload bytes sent
  std::uint64_t send_errors = 0;
  std::uint64_t replay_requests = 0;  // well-formed replay requests answered
  std::uint64_t replayed = 0;         // batches sent in answers
  std::uint64_t bad_requests = 0;     // replay requests that were not [id, "", seq u64 BE]
  std::uint64_t wakeups = 0;          // eventfd writes by publish()
};

class KvEventPublisher {
 public:
  // Binds/connects the sockets and starts the thread; kvmm::Error naming the option and
  // ZeroMQ's message when an option is invalid or an endpoint cannot be used.
  KvEventPublisher(const KVLayout& layout, EventPublisherOptions options);
  // Sends what is queued, then closes the sockets (waiting up to `linger`).
  ~KvEventPublisher();
  KvEventPublisher(const KvEventPublisher&) = delete;
  KvEventPublisher& operator=(const KvEventPublisher&) = delete;

  // Queues `batch` under the next sequence number. true: queued; false: dropped (queue
  // full, counted; the number is skipped so subscribers see the gap). An empty batch is
  // not published and takes no number. Raises kvmm::Error for a malformed batch
  // (validate_kv_event_batch). Scheduler thread only (single producer).
  bool publish(const KvEventBatch& batch, double ts);
  bool publish(const KvEventBatch& batch);  // ts = now (seconds since the epoch)

  // Waits until everything queued has been sent, up to `timeout`; true if it was. For
  // tests and shutdown, not for the scheduler's step.
  bool flush(std::chrono::milliseconds timeout);
  PublisherStats stats() const;
  std::uint64_t next_sequence() const;
  // The endpoints as bound (a tcp "*" port resolved), for subscribers.
  std::string endpoint() const;
  std::string replay_endpoint() const;

  // Endpoint rule of vLLM for data-parallel ranks (see EventPublisherOptions::endpoint).
  static std::string offset_endpoint(const std::string& endpoint, std::uint32_t data_parallel_rank);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvmm
