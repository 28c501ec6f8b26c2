// Internal (src/distributed/redis): what RedisTier's submission side and its connections share:
// tickets split into per-connection jobs, the circuit breaker, per-key counters. A job is
// finished by exactly one connection; the ticket completes when its last job does.
#pragma once

#include "kvmm/distributed/kv_tier.hpp"
#include "kvmm/distributed/redis_tier.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <vector>

namespace kvmm::redis {

using Clock = std::chrono::steady_clock;

struct Ticket;

// The keys [begin, end) of a ticket that one connection serves.
struct Job {
  Ticket* ticket = nullptr;
  std::uint32_t begin = 0, end = 0;
  std::uint32_t remaining = 0;  // keys without a status yet (the serving connection's thread)
  Job* next = nullptr;          // intrusive FIFO of a connection
};

struct Ticket {
  TierTicket id = 0;
  TierOp op = TierOp::kContains;
  Clock::time_point deadline;
  std::vector<TierPage> pages;  // data is null for contains and remove
  std::vector<TierStatus> status;
  std::vector<Job> jobs;
  std::atomic<std::uint32_t> jobs_left{0};
};

// Closed, then open after `threshold` consecutive failures; open until a probe succeeds,
// at most one probe at a time and only after `cooldown`.
class Breaker {
 public:
  Breaker(std::uint32_t threshold, std::chrono::milliseconds cooldown) : threshold_(threshold), cooldown_(cooldown) {}
  bool open() const { return open_until_.load(std::memory_order_acquire) != 0; }
  // true: the caller is the one probe now due.
  bool begin_probe(Clock::time_point now) {
    const std::int64_t until = open_until_.load(std::memory_order_acquire);
    return until != 0 && ticks(now) >= until && !probing_.exchange(true);
  }
  void end_probe(bool ok, Clock::time_point now) {
    if (ok) {
      failures_.store(0);
      open_until_.store(0, std::memory_order_release);
    } else {
      open_until_.store(ticks(now + cooldown_), std::memory_order_release);
    }
    probing_.store(false);
  }
  void failure(Clock::time_point now) {
    if (failures_.fetch_add(1) + 1 < threshold_) return;
    std::int64_t closed = 0;
    if (open_until_.compare_exchange_strong(closed, ticks(now + cooldown_))) opens_.fetch_add(1);
  }
  void success() { failures_.store(0, std::memory_order_relaxed); }
  // When the next probe is due (a time in the past when it is due now).
  Clock::time_point probe_due() const { return Clock::time_point(Clock::duration(open_until_.load())); }
  std::uint64_t opens() const { return opens_.load(); }

 private:
  static std::int64_t ticks(Clock::time_point t) { return std::max<std::int64_t>(1, t.time_since_epoch().count()); }
  const std::uint32_t threshold_;
  const std::chrono::milliseconds cooldown_;
  std::atomic<std::uint32_t> failures_{0};
  std::atomic<std::int64_t> open_until_{0};  // steady clock ticks; 0: closed
  std::atomic<bool> probing_{false};
  std::atomic<std::uint64_t> opens_{0};
};

struct Counters {
  std::atomic<std::uint64_t> ok{0}, misses{0}, corrupt{0}, timeouts{0}, unavailable{0};
  std::atomic<std::uint64_t> put_existing{0}, bytes_put{0}, bytes_got{0};
  std::atomic<std::uint64_t> connects{0}, connect_failures{0}, io_failures{0};
  void count(TierStatus s, std::uint64_t n = 1) {
    const auto r = std::memory_order_relaxed;
    switch (s) {
      case TierStatus::kOk:
        ok.fetch_add(n, r);
        break;
      case TierStatus::kMiss:
        misses.fetch_add(n, r);
        break;
      case TierStatus::kCorrupt:
        corrupt.fetch_add(n, r);
        break;
      case TierStatus::kTimeout:
        timeouts.fetch_add(n, r);
        break;
      case TierStatus::kUnavailable:
        unavailable.fetch_add(n, r);
        break;
    }
  }
};

// The tier as its connections see it.
class TierCore {
 public:
  virtual ~TierCore() = default;
  virtual const RedisTierOptions& options() const = 0;
  virtual std::uint64_t scope() const = 0;
  virtual std::uint64_t page_bytes(GroupId g) const = 0;
  virtual std::uint32_t tokens_per_page(GroupId g) const = 0;
  virtual Breaker& breaker() = 0;
  virtual Counters& counters() = 0;
  // A connection has set the status of every key of `job`.
  virtual void job_done(Job& job) = 0;
};

}  // namespace kvmm::redis
