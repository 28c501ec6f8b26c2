// RedisTier (target kvmm::redis, built when libhiredis-dev is found): a KVTier on a Redis
// or Valkey server. One key per page ("<prefix>:<scope>:<group>:<hash>", tier_value.hpp's
// self-verifying value), pipelined commands (EXISTS, GET, SET NX: first writer wins, DEL)
// on a few connections, each with its own I/O thread; a get verifies every value and
// deletes one that fails. Every key completes within command_timeout of its submission
// (plus connect_timeout when its connection must connect first); after breaker_failures
// consecutive I/O failures a circuit breaker completes submissions at once as kUnavailable
// until a probe (connect + PING, every breaker_cooldown) succeeds. The scheduler thread's
// cost is a copy of the keys on submit and of the statuses on poll; no hiredis type here.
#pragma once

#include "kvmm/distributed/kv_tier.hpp"
#include "kvmm/spec/kv_layout.hpp"

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace kvmm {

struct RedisTierOptions {
  std::string endpoint;                                        // "unix:/path/redis.sock" or "tcp:127.0.0.1:6379"
  std::uint32_t connections = 2;                               // I/O threads, one socket each (1..16)
  std::uint32_t pipeline_depth = 256;                          // commands in flight per connection (1..65536)
  std::uint64_t max_inflight_bytes = std::uint64_t{32} << 20;  // value bytes in flight per connection (> 0)
  std::chrono::milliseconds connect_timeout{200};
  std::chrono::milliseconds command_timeout{1000};
  std::uint32_t ttl_ms = 0;  // 0: keys live until the server's maxmemory policy evicts them
  std::uint32_t breaker_failures = 3;
  std::chrono::milliseconds breaker_cooldown{1000};
  std::string key_prefix = "kvmm";
  // Wake-ups: a submission wakes a sleeping I/O thread with an eventfd write, ~2 us of the
  // caller's (scheduler's) time on a VM. For doze_window after its last work an I/O thread
  // dozes instead: it sleeps doze_interval at a time and finds new commands itself, so a
  // submission then costs no system call and waits at most doze_interval longer; the cost
  // is a timed wake-up per doze_interval (5000/s per connection at 200 us) while traffic
  // continues. doze_window 0: always woken (the plain path).
  std::chrono::microseconds doze_interval{200};  // 1 us .. 100 ms
  std::chrono::milliseconds doze_window{50};
  // Completions: false, event_fd() is readable exactly while completions wait (one eventfd
  // write by an I/O thread and one read in poll() per batch: ~1 us of the scheduler's time
  // on a VM); true, it becomes readable only for a completion after arm(), and poll() reads
  // it only then: an engine that polls every step and arms before it sleeps makes no
  // system call for its completions.
  bool notify_when_armed = false;
};

// Validates the options (kvmm::Error naming the field and value) and starts the I/O
// threads; connections are opened when the first command needs them.
std::unique_ptr<KVTier> make_redis_tier(const KVLayout& layout, const TierScope& scope,
                                        const RedisTierOptions& options);

}  // namespace kvmm
