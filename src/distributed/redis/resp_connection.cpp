// One Redis connection and its I/O thread (resp_connection.hpp): a loop of take new jobs,
// send while the pipeline has room, poll() the socket and the wake-up fd up to the next
// deadline, resolve replies in order; the circuit breaker's probe runs here too.
#include "resp_connection.hpp"

#include "kvmm/distributed/tier_value.hpp"
#include "kvmm/error.hpp"

#include <hiredis/hiredis.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <ctime>

namespace kvmm::redis {

namespace {

constexpr std::size_t kReadBytes = std::size_t{256} << 10;  // one recv
constexpr int kReadsPerWake = 64;                           // then writes get a turn
constexpr std::size_t kInternalSlots = 64;                  // in-flight room for DEL/PING
constexpr auto kIdleWait = std::chrono::milliseconds(100);
constexpr auto kProbeSpacing = std::chrono::milliseconds(5);  // breaker open: how often to look again

// ppoll's timeout until `until` (a doze is shorter than poll's millisecond), at most kIdleWait.
timespec poll_ts(Clock::time_point until, Clock::time_point now) {
  const auto ns = until <= now ? std::int64_t{0}
                               : std::min<std::int64_t>(std::chrono::nanoseconds(until - now).count(),
                                                        std::chrono::nanoseconds(kIdleWait).count());
  return timespec{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
}

// A non-blocking socket connected to `e` within `deadline`, or -1.
int open_socket(const Endpoint& e, Clock::time_point deadline) {
  sockaddr_storage addr{};
  socklen_t len = 0;
  int family = AF_UNIX;
  if (e.unix_socket) {
    auto* un = reinterpret_cast<sockaddr_un*>(&addr);
    un->sun_family = AF_UNIX;
    std::memcpy(un->sun_path, e.path.c_str(), e.path.size() + 1);
    len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + e.path.size() + 1);
  } else {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    if (getaddrinfo(e.host.c_str(), std::to_string(e.port).c_str(), &hints, &res) != 0 || res == nullptr) return -1;
    std::memcpy(&addr, res->ai_addr, res->ai_addrlen);
    len = res->ai_addrlen;
    family = res->ai_family;
    freeaddrinfo(res);
  }
  const int fd = ::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (!e.unix_socket) {
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), len) == 0) return fd;
  if (errno == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    int err = 0;
    socklen_t err_len = sizeof err;
    const auto now = Clock::now();
    const int ms =
        deadline > now ? static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(deadline - now).count()) : 0;
    if (::poll(&p, 1, ms) == 1 && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &err_len) == 0 && err == 0) return fd;
  }
  ::close(fd);
  return -1;
}

// hiredis's reader builds no reply objects here: these hooks record each reply in view_
// (one reply at a time; arrays are not expected and fail the connection), and a GET's value
// is verified, and copied into its page, while it is still in the reader's buffer.
const redisReplyObjectFunctions kReplyHooks = {
    [](const redisReadTask* task, char* str, std::size_t len) -> void* {
      return static_cast<Connection*>(task->privdata)->hook_string(task->type, task->parent != nullptr, str, len);
    },
    [](const redisReadTask* task, int) -> void* {
      auto* c = static_cast<Connection*>(task->privdata);
      return c->hook_value(REDIS_REPLY_ARRAY, true, 0);
    },
    [](const redisReadTask* task, long long value) -> void* {
      return static_cast<Connection*>(task->privdata)->hook_value(REDIS_REPLY_INTEGER, task->parent != nullptr, value);
    },
    [](const redisReadTask* task) -> void* {
      return static_cast<Connection*>(task->privdata)->hook_value(REDIS_REPLY_NIL, task->parent != nullptr, 0);
    },
    [](void*) {},
};

}  // namespace

Endpoint parse_endpoint(const std::string& endpoint) {
  Endpoint e;
  if (endpoint.rfind("unix:", 0) == 0) {
    e.path = endpoint.substr(5);
    if (e.path.empty() || e.path.size() >= sizeof(sockaddr_un{}.sun_path))
      fail("RedisTierOptions::endpoint = '{}': a unix socket path of 1..{} bytes", endpoint,
           sizeof(sockaddr_un{}.sun_path) - 1);
    return e;
  }
  const std::size_t colon = endpoint.rfind(':');
  if (endpoint.rfind("tcp:", 0) == 0 && colon > 4) {
    e.unix_socket = false;
    e.host = endpoint.substr(4, colon - 4);
    const std::string port = endpoint.substr(colon + 1);
    const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), e.port);
    if (ec == std::errc() && end == port.data() + port.size() && e.port != 0 && !e.host.empty()) return e;
  }
  fail("RedisTierOptions::endpoint = '{}': expected 'unix:<path>' or 'tcp:<host>:<port>'", endpoint);
}

Connection::Connection(TierCore& core, const Endpoint& endpoint) : core_(core), endpoint_(endpoint) {
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) fail("RedisTier: eventfd failed (errno {})", errno);
  inflight_.resize(core_.options().pipeline_depth + kInternalSlots);
  rbuf_.resize(kReadBytes);
  thread_ = std::thread([this] { run(); });
}

Connection::~Connection() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  const std::uint64_t one = 1;
  [[maybe_unused]] const ssize_t n = ::write(wake_fd_, &one, sizeof one);
  thread_.join();
  ::close(wake_fd_);
}

void Connection::submit(Job* job) {
  job->next = nullptr;
  {
    std::lock_guard lock(mu_);
    (in_tail_ ? in_tail_->next : in_head_) = job;
    in_tail_ = job;
  }
  // The job is queued under mu_ before asleep_ is read; idle_wait sets asleep_ before it
  // looks at the queue under mu_: one of the two sees the other (no lost wake-up).
  // doze_window 0 (the plain path): always woken.
  if (core_.options().doze_window.count() > 0 && !asleep_.load()) return;  // dozing or busy: it looks itself
  const std::uint64_t one = 1;
  [[maybe_unused]] const ssize_t n = ::write(wake_fd_, &one, sizeof one);
}

void Connection::idle_wait(Clock::time_point now) {
  const RedisTierOptions& o = core_.options();
  if (o.doze_window.count() > 0 && now - last_work_ < o.doze_window) {
    wait_wake(now + o.doze_interval);
    return;
  }
  asleep_.store(true);
  {
    std::lock_guard lock(mu_);
    if (in_head_ || stop_) {  // queued before the flag was seen
      asleep_.store(false);
      return;
    }
  }
  wait_wake(now + kIdleWait);
  asleep_.store(false);
}

void Connection::take_incoming() {
  std::lock_guard lock(mu_);
  if (!in_head_) return;
  if (!pend_head_) send_index_ = in_head_->begin;
  (pend_tail_ ? pend_tail_->next : pend_head_) = in_head_;
  pend_tail_ = in_tail_;
  in_head_ = in_tail_ = nullptr;
}

void Connection::run() {
  for (;;) {
    take_incoming();
    bool stopping = false;
    {
      std::lock_guard lock(mu_);
      stopping = stop_;
    }
    Clock::time_point now = Clock::now();
    if (stopping) {
      fail_inflight(TierStatus::kUnavailable);
      fail_pending(TierStatus::kUnavailable);
      close();
      return;
    }
    Breaker& breaker = core_.breaker();
    if (breaker.open()) {  // no I/O but the probe; everything completes kUnavailable at once
      fail_inflight(TierStatus::kUnavailable);
      close();
      fail_pending(TierStatus::kUnavailable);
      if (breaker.begin_probe(now)) {
        const bool ok = probe(now);
        breaker.end_probe(ok, Clock::now());
        if (ok) continue;
      }
      // Another connection may be probing (probe_due() in the past): do not spin.
      wait_wake(std::max(std::min(breaker.probe_due(), now + kIdleWait), now + kProbeSpacing));
      continue;
    }
    if (pend_head_ && fd_ < 0 && !connect(now)) {
      fail_pending(TierStatus::kUnavailable);
      breaker.failure(now);
      continue;
    }
    if (pend_head_ || if_count_ != 0) last_work_ = now;
    if (fd_ >= 0) fill(now);
    if (fd_ >= 0 && (if_count_ != 0 || has_output()))
      pump(now);
    else if (pend_head_)
      wait_wake(next_deadline());
    else
      idle_wait(now);
  }
}

bool Connection::connect(Clock::time_point now) {
  fd_ = open_socket(endpoint_, now + core_.options().connect_timeout);
  if (fd_ < 0) {
    core_.counters().connect_failures.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  reader_ = redisReaderCreateWithFunctions(const_cast<redisReplyObjectFunctions*>(&kReplyHooks));
  reader_->maxbuf = 0;  // keep the reader's buffer between replies
  reader_->privdata = this;
  core_.counters().connects.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void Connection::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (reader_) redisReaderFree(reader_);
  reader_ = nullptr;
  segs_.clear();
  small_.clear();
  seg_head_ = 0;
  seg_done_ = 0;
}

// Sends the pending keys while the pipeline has room; a key whose deadline has passed
// completes kTimeout without being sent.
void Connection::fill(Clock::time_point now) {
  const RedisTierOptions& o = core_.options();
  while (pend_head_ && if_count_ < o.pipeline_depth && inflight_bytes_ < o.max_inflight_bytes) {
    Job* job = pend_head_;
    const std::uint32_t index = send_index_++;
    const bool last = send_index_ == job->end;
    if (last) {
      pend_head_ = job->next;
      if (!pend_head_)
        pend_tail_ = nullptr;
      else
        send_index_ = pend_head_->begin;
    }
    if (now >= job->ticket->deadline)
      set(*job, index, TierStatus::kTimeout);  // may finish the job
    else
      append(*job, index);
  }
}

void Connection::append(Job& job, std::uint32_t index) {
  const Ticket& t = *job.ticket;
  const TierPage& page = t.pages[index];
  const RedisTierOptions& o = core_.options();
  format_tier_key(o.key_prefix, core_.scope(), page.key, key_);
  Cmd cmd{&job, index, CmdKind::kKey, key_.size(), t.deadline};
  switch (t.op) {
    case TierOp::kContains:
      resp_array(2), resp_bulk("EXISTS"), resp_bulk(key_);
      break;
    case TierOp::kRemove:
      resp_array(2), resp_bulk("DEL"), resp_bulk(key_);
      break;
    case TierOp::kGet:
      resp_array(2), resp_bulk("GET"), resp_bulk(key_);
      cmd.bytes += kTierHeaderBytes + core_.page_bytes(page.key.group);
      break;
    case TierOp::kPut: {
      const std::uint64_t bytes = core_.page_bytes(page.key.group);
      const TierValueIdentity id{core_.scope(), page.key, core_.tokens_per_page(page.key.group), bytes};
      std::array<std::byte, kTierHeaderBytes> header{};
      encode_tier_header(id, std::span<const std::byte>(page.data, bytes), header);
      resp_array(o.ttl_ms ? 6 : 4), resp_bulk("SET"), resp_bulk(key_);
      resp_bulk_header(kTierHeaderBytes + bytes);
      small(std::string_view(reinterpret_cast<const char*>(header.data()), header.size()));
      ref(page.data, bytes);  // the page goes to the kernel from the caller's buffer
      small("\r\n");
      resp_bulk("NX");
      if (o.ttl_ms) resp_bulk("PX"), resp_bulk(std::to_string(o.ttl_ms));
      cmd.bytes += bytes;
      break;
    }
  }
  inflight_[(if_head_ + if_count_++) % inflight_.size()] = cmd;
  inflight_bytes_ += cmd.bytes;
}

void Connection::append_del(const TierKey& key, Clock::time_point now) {
  if (if_count_ == inflight_.size()) return;  // best effort: the next get finds it corrupt again
  format_tier_key(core_.options().key_prefix, core_.scope(), key, key_);
  resp_array(2), resp_bulk("DEL"), resp_bulk(key_);
  inflight_[(if_head_ + if_count_++) % inflight_.size()] =
      Cmd{nullptr, 0, CmdKind::kDel, 0, now + core_.options().command_timeout};
}

Clock::time_point Connection::next_deadline() const {
  Clock::time_point d = Clock::now() + kIdleWait;
  if (if_count_ != 0) d = std::min(d, inflight_[if_head_].deadline);
  if (pend_head_) d = std::min(d, pend_head_->ticket->deadline);
  return d;
}

// One poll over the socket and the wake-up fd, then whatever it allows: write, read,
// replies; on an I/O error or the oldest command's deadline, the connection is dropped.
void Connection::pump(Clock::time_point now) {
  std::array<pollfd, 2> p{pollfd{fd_, static_cast<short>(POLLIN | (has_output() ? POLLOUT : 0)), 0},
                          pollfd{wake_fd_, POLLIN, 0}};
  // Submissions do not wake a busy thread (asleep_ is false): it looks for them at least
  // every doze_interval.
  Clock::time_point until = next_deadline();
  if (core_.options().doze_window.count() > 0) until = std::min(until, now + core_.options().doze_interval);
  const timespec ts = poll_ts(until, now);
  ::ppoll(p.data(), p.size(), &ts, nullptr);
  if (p[1].revents & POLLIN) {
    std::uint64_t v = 0;
    [[maybe_unused]] const ssize_t n = ::read(wake_fd_, &v, sizeof v);
  }
  bool ok = true;
  if (p[0].revents & POLLOUT) ok = write_out();
  if (ok && (p[0].revents & (POLLIN | POLLHUP | POLLERR))) ok = read_in();
  now = Clock::now();
  if (!ok)
    drop(now, TierStatus::kUnavailable);
  else if (if_count_ != 0 && inflight_[if_head_].deadline <= now)
    drop(now, TierStatus::kTimeout);
}

void Connection::drop(Clock::time_point now, TierStatus status) {
  fail_inflight(status);
  close();
  core_.counters().io_failures.fetch_add(1, std::memory_order_relaxed);
  core_.breaker().failure(now);
}

bool Connection::write_out() {
  while (has_output()) {
    std::array<iovec, 64> iov{};
    std::size_t n = 0;
    for (std::size_t s = seg_head_; s < segs_.size() && n < iov.size(); ++s, ++n) {
      const Seg& seg = segs_[s];
      const std::byte* base = seg.ptr ? seg.ptr : reinterpret_cast<const std::byte*>(small_.data()) + seg.off;
      const std::uint64_t skip = s == seg_head_ ? seg_done_ : 0;
      iov[n] = iovec{const_cast<std::byte*>(base + skip), seg.len - skip};
    }
    msghdr msg{};
    msg.msg_iov = iov.data();
    msg.msg_iovlen = n;
    const ssize_t w = ::sendmsg(fd_, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
    std::uint64_t left = static_cast<std::uint64_t>(w);
    while (left != 0) {
      const std::uint64_t in_seg = segs_[seg_head_].len - seg_done_;
      const std::uint64_t take = std::min(left, in_seg);
      seg_done_ += take;
      left -= take;
      if (seg_done_ == segs_[seg_head_].len) ++seg_head_, seg_done_ = 0;
    }
  }
  segs_.clear();
  small_.clear();
  seg_head_ = 0;
  return true;
}

bool Connection::read_in() {
  for (int i = 0; i < kReadsPerWake; ++i) {
    const ssize_t n = ::recv(fd_, rbuf_.data(), rbuf_.size(), MSG_DONTWAIT);
    if (n == 0) return false;  // the server closed the connection
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
    if (redisReaderFeed(reader_, rbuf_.data(), static_cast<std::size_t>(n)) != REDIS_OK) return false;
    for (;;) {
      void* reply = nullptr;
      if (redisReaderGetReply(reader_, &reply) != REDIS_OK) return false;  // protocol error
      if (!reply) break;
      const bool ok = on_reply();
      view_ = ReplyView{};
      if (!ok) return false;
    }
    if (static_cast<std::size_t>(n) < rbuf_.size()) return true;
  }
  return true;
}

void* Connection::hook_value(int type, bool nested, long long value) {
  view_.type = type;
  view_.nested = view_.nested || nested;
  view_.integer = value;
  return &view_;
}

void* Connection::hook_string(int type, bool nested, const char* str, std::size_t len) {
  hook_value(type, nested, 0);
  if (type == REDIS_REPLY_STRING && !nested && if_count_ != 0) {
    const Cmd& cmd = inflight_[if_head_];
    if (cmd.kind == CmdKind::kKey && cmd.job->ticket->op == TierOp::kGet)
      view_.get = verify_get(str, len, cmd.job->ticket->pages[cmd.index]);
  }
  return &view_;
}

// A get's value: the page's bytes are written only when the whole value verifies.
TierStatus Connection::verify_get(const char* str, std::size_t len, const TierPage& page) {
  const std::uint64_t bytes = core_.page_bytes(page.key.group);
  const TierValueIdentity id{core_.scope(), page.key, core_.tokens_per_page(page.key.group), bytes};
  if (check_tier_value(std::span<const std::byte>(reinterpret_cast<const std::byte*>(str), len), id) !=
      TierValueError::kNone)
    return TierStatus::kCorrupt;
  std::memcpy(page.data, str + kTierHeaderBytes, bytes);
  core_.counters().bytes_got.fetch_add(bytes, std::memory_order_relaxed);
  return TierStatus::kOk;
}

// Resolves the oldest in-flight command with view_; false for a reply nobody asked for.
bool Connection::on_reply() {
  if (if_count_ == 0 || view_.nested) return false;
  const Cmd cmd = inflight_[if_head_];
  if_head_ = (if_head_ + 1) % inflight_.size();
  --if_count_;
  inflight_bytes_ -= cmd.bytes;
  core_.breaker().success();
  if (cmd.kind != CmdKind::kKey) return true;
  Job& job = *cmd.job;
  const Ticket& t = *job.ticket;
  const int type = view_.type;
  TierStatus s = TierStatus::kUnavailable;  // an error reply (OOM, LOADING, ...)
  if (type != REDIS_REPLY_ERROR) {
    switch (t.op) {
      case TierOp::kContains:
      case TierOp::kRemove:
        s = type == REDIS_REPLY_INTEGER && view_.integer > 0 ? TierStatus::kOk : TierStatus::kMiss;
        break;
      case TierOp::kPut:
        s = TierStatus::kOk;
        if (type == REDIS_REPLY_NIL)
          core_.counters().put_existing.fetch_add(1, std::memory_order_relaxed);
        else
          core_.counters().bytes_put.fetch_add(core_.page_bytes(t.pages[cmd.index].key.group),
                                               std::memory_order_relaxed);
        break;
      case TierOp::kGet:
        s = type == REDIS_REPLY_NIL ? TierStatus::kMiss : type == REDIS_REPLY_STRING ? view_.get : TierStatus::kCorrupt;
        if (s == TierStatus::kCorrupt) append_del(t.pages[cmd.index].key, Clock::now());  // never served again
        break;
    }
  }
  set(job, cmd.index, s);
  return true;
}

bool Connection::probe(Clock::time_point now) {
  if (fd_ < 0 && !connect(now)) return false;
  resp_array(1), resp_bulk("PING");
  inflight_[(if_head_ + if_count_++) % inflight_.size()] =
      Cmd{nullptr, 0, CmdKind::kPing, 0, now + core_.options().command_timeout};
  while (fd_ >= 0 && if_count_ != 0) pump(Clock::now());
  return fd_ >= 0;
}

void Connection::set(Job& job, std::uint32_t index, TierStatus status) {
  job.ticket->status[index] = status;
  core_.counters().count(status);
  if (--job.remaining == 0) core_.job_done(job);  // job may be reused from here on
}

void Connection::fail_inflight(TierStatus status) {
  while (if_count_ != 0) {
    const Cmd cmd = inflight_[if_head_];
    if_head_ = (if_head_ + 1) % inflight_.size();
    --if_count_;
    if (cmd.kind == CmdKind::kKey) set(*cmd.job, cmd.index, status);
  }
  inflight_bytes_ = 0;
}

void Connection::fail_pending(TierStatus status) {
  while (pend_head_) {
    Job* job = pend_head_;
    pend_head_ = job->next;
    const std::uint32_t end = job->end;
    for (std::uint32_t i = send_index_; i < end; ++i) set(*job, i, status);  // the last may finish it
    if (pend_head_) send_index_ = pend_head_->begin;
  }
  pend_tail_ = nullptr;
}

// Sleeps until woken or `until`; an idle connection's socket is watched too, so that a
// server that went away (killed, restarted) is noticed before the next command is sent.
void Connection::wait_wake(Clock::time_point until) {
  const bool idle_socket = fd_ >= 0 && if_count_ == 0 && !has_output();
  std::array<pollfd, 2> p{pollfd{wake_fd_, POLLIN, 0}, pollfd{fd_, POLLIN, 0}};
  const timespec ts = poll_ts(until, Clock::now());
  ::ppoll(p.data(), idle_socket ? 2 : 1, &ts, nullptr);
  if (p[0].revents & POLLIN) {
    std::uint64_t v = 0;
    [[maybe_unused]] const ssize_t n = ::read(wake_fd_, &v, sizeof v);
  }
  if (idle_socket && p[1].revents != 0 && !read_in()) close();  // EOF or a reply nobody asked for
}

void Connection::resp_array(std::size_t n) {
  small("*");
  small(std::to_string(n));
  small("\r\n");
}

void Connection::resp_bulk_header(std::uint64_t len) {
  small("$");
  small(std::to_string(len));
  small("\r\n");
}

void Connection::resp_bulk(std::string_view s) {
  resp_bulk_header(s.size());
  small(s);
  small("\r\n");
}

void Connection::small(std::string_view s) {
  const std::uint64_t off = small_.size();
  small_.append(s);
  if (!segs_.empty() && !segs_.back().ptr && segs_.back().off + segs_.back().len == off)
    segs_.back().len += s.size();
  else
    segs_.push_back(Seg{nullptr, off, s.size()});
}

void Connection::ref(const std::byte* p, std::uint64_t len) {
  if (len != 0) segs_.push_back(Seg{p, 0, len});
}

}  // namespace kvmm::redis
