// Internal (src/distributed/redis): one connection to the server and the I/O thread that owns it.
// Commands are written as RESP by hand with sendmsg(): a put's page goes to the kernel
// straight from the caller's buffer (no copy on our side); replies are parsed by hiredis's
// reader with hooks that build no objects: a GET's value is verified in the reader's buffer
// and copied once, into its page. At most pipeline_depth commands and max_inflight_bytes
// value bytes are in flight. Every deadline is enforced with poll() timeouts, so nothing
// waits past it.
#pragma once

#include "tier_state.hpp"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

struct redisReader;

namespace kvmm::redis {

struct Endpoint {
  bool unix_socket = true;
  std::string path;  // unix
  std::string host;  // tcp
  std::uint16_t port = 0;
};
// "unix:<path>" or "tcp:<host>:<port>"; kvmm::Error naming the endpoint otherwise.
Endpoint parse_endpoint(const std::string& endpoint);

class Connection {
 public:
  Connection(TierCore& core, const Endpoint& endpoint);
  ~Connection();  // fails what it still holds as kUnavailable, joins the thread
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  void submit(Job* job);  // any thread

  // For the reader's hooks only (resp_connection.cpp): record the reply being parsed.
  void* hook_value(int type, bool nested, long long value);
  void* hook_string(int type, bool nested, const char* str, std::size_t len);

 private:
  // The reply hiredis's reader is parsing, as its hooks record it.
  struct ReplyView {
    int type = 0;  // REDIS_REPLY_*
    bool nested = false;
    long long integer = 0;
    TierStatus get = TierStatus::kCorrupt;  // a GET's verified outcome
  };

  enum class CmdKind : std::uint8_t { kKey, kDel, kPing };
  struct Cmd {
    Job* job = nullptr;
    std::uint32_t index = 0;
    CmdKind kind = CmdKind::kKey;
    std::uint64_t bytes = 0;
    Clock::time_point deadline;
  };
  struct Seg {  // output: `len` bytes at ptr, or at small_[off] when ptr is null
    const std::byte* ptr = nullptr;
    std::uint64_t off = 0;
    std::uint64_t len = 0;
  };

  void run();
  void take_incoming();
  bool connect(Clock::time_point now);
  void close();
  void fill(Clock::time_point now);
  void append(Job& job, std::uint32_t index);
  void append_del(const TierKey& key, Clock::time_point now);
  void pump(Clock::time_point now);
  bool write_out();
  bool read_in();
  bool on_reply();
  TierStatus verify_get(const char* str, std::size_t len, const TierPage& page);
  bool probe(Clock::time_point now);
  void drop(Clock::time_point now, TierStatus status);  // fails what is in flight, closes, counts a failure
  void fail_inflight(TierStatus status);
  void fail_pending(TierStatus status);
  void set(Job& job, std::uint32_t index, TierStatus status);
  void wait_wake(Clock::time_point until);
  void idle_wait(Clock::time_point now);  // nothing to send or read: doze, else sleep until woken
  Clock::time_point next_deadline() const;

  // RESP formatting into small_.
  void resp_array(std::size_t n);
  void resp_bulk(std::string_view s);
  void resp_bulk_header(std::uint64_t len);
  void small(std::string_view s);
  void ref(const std::byte* p, std::uint64_t len);
  bool has_output() const { return seg_head_ < segs_.size(); }

  TierCore& core_;
  Endpoint endpoint_;
  int wake_fd_ = -1;
  std::thread thread_;

  std::mutex mu_;  // guards incoming_ and stop_
  Job* in_head_ = nullptr;
  Job* in_tail_ = nullptr;
  bool stop_ = false;
  // Set by the I/O thread (under mu_'s ordering, see idle_wait) before it sleeps until
  // woken; a submission writes wake_fd_ only then.
  std::atomic<bool> asleep_{false};

  // I/O thread only.
  Clock::time_point last_work_{};  // the last time it had commands to send or await
  int fd_ = -1;
  redisReader* reader_ = nullptr;
  Job* pend_head_ = nullptr;  // jobs with keys not yet sent; the head's next key is send_index_
  Job* pend_tail_ = nullptr;
  std::uint32_t send_index_ = 0;
  std::vector<Cmd> inflight_;  // ring
  std::size_t if_head_ = 0, if_count_ = 0;
  std::uint64_t inflight_bytes_ = 0;
  std::vector<Seg> segs_;
  std::size_t seg_head_ = 0;
  std::uint64_t seg_done_ = 0;  // bytes of segs_[seg_head_] already written
  std::string small_;
  std::string key_;
  std::vector<char> rbuf_;
  ReplyView view_;
};

}  // namespace kvmm::redis
