// Test harness of the Redis tier: a real redis-server started by the test (unix socket in a
// temporary directory, no TCP, no persistence) that can be killed, stopped, restarted and
// inspected with a synchronous hiredis client; a relay on a unix socket that cuts one
// connection after a chosen number of bytes; helpers that wait for a ticket with a bound.
#pragma once

#include "kvmm/distributed/kv_tier.hpp"

#include <hiredis/hiredis.h>

#include <sys/types.h>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace kvmm::test {

// True when redis-server is on PATH; tests SKIP with a message otherwise.
bool redis_server_available();

struct RedisReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, RedisReplyDeleter>;

class RedisServer {
 public:
  // `extra`: more redis-server arguments ("--maxmemory", "4mb", ...).
  explicit RedisServer(std::vector<std::string> extra = {});
  ~RedisServer();
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  void start();   // spawns and waits (<= 5 s) until PING answers; throws otherwise
  void kill9();   // SIGKILL and reap
  void stop();    // SIGSTOP
  void resume();  // SIGCONT
  std::string dir() const { return dir_; }
  std::string socket_path() const { return dir_ + "/redis.sock"; }
  std::string endpoint() const { return "unix:" + socket_path(); }

  // Synchronous client commands (binary-safe arguments); a fresh connection when needed.
  Reply command(const std::vector<std::string>& args);
  long long dbsize();
  bool exists(const std::string& key);
  std::string get(const std::string& key);  // empty when missing

 private:
  std::vector<std::string> extra_;
  std::string dir_;
  pid_t pid_ = -1;
  redisContext* client_ = nullptr;
};

// Forwards connections accepted on listen_path to target_path. cut_next() arms a cut: from
// then on, exactly `bytes` more bytes pass in the chosen direction (whichever connection
// carries them), then that connection's two sockets are closed; the cut is then disarmed.
class Relay {
 public:
  enum class Direction { kToServer, kToClient };
  Relay(std::string listen_path, std::string target_path);
  ~Relay();
  Relay(const Relay&) = delete;
  Relay& operator=(const Relay&) = delete;
  void cut_next(Direction direction, std::uint64_t bytes);
  std::string endpoint() const { return "unix:" + listen_path_; }
  int cuts() const { return cuts_.load(); }
  int accepted() const { return accepted_.load(); }

 private:
  struct Pair {
    int client = -1, server = -1;
  };
  void run();
  bool forward(Pair& p, bool to_server);  // false: the pair is finished
  std::string listen_path_, target_path_;
  int listen_fd_ = -1;
  int stop_fd_ = -1;
  std::mutex mu_;
  bool armed_ = false;
  Direction direction_ = Direction::kToClient;
  std::uint64_t bytes_ = 0;
  std::atomic<int> cuts_{0}, accepted_{0};
  std::vector<Pair> pairs_;  // relay thread only
  std::thread thread_;
};

// Waits for `ticket` with poll() on the tier's event fd, at most `limit`; the statuses, or
// an empty vector when it did not complete. `waited` gets the time it took. Completions of
// other tickets polled meanwhile are dropped.
std::vector<TierStatus> wait_ticket(KVTier& tier, TierTicket ticket, std::chrono::milliseconds limit,
                                    std::chrono::milliseconds* waited = nullptr);
// The same for several tickets: their statuses in the order of `tickets`; false when one
// did not complete within `limit` or completed twice.
bool wait_tickets(KVTier& tier, const std::vector<TierTicket>& tickets, std::chrono::milliseconds limit,
                  std::vector<std::vector<TierStatus>>& out);

// The longest single tier.poll() call the wait helpers have seen (poll must never block).
std::chrono::microseconds longest_poll();

}  // namespace kvmm::test
