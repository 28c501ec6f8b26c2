// KvEventPublisher on ZeroMQ (cppzmq): the scheduler thread pushes batch copies into a
// BatchRing; the publisher thread pops, encodes (kv_event_encoding), sends on PUB, keeps
// the last buffer_steps payloads for replays and answers the ROUTER. Only the publisher
// thread touches the sockets.
#include "kvmm/distributed/event_publisher.hpp"

#include "kvmm/distributed/detail/batch_ring.hpp"
#include "kvmm/error.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <array>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <thread>
#include <vector>

namespace kvmm {

namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kDeepSleepAfter = std::chrono::milliseconds(100);
constexpr long kDeepSleepPollMs = 100;

std::array<std::uint8_t, 8> big_endian(std::uint64_t v) {
  std::array<std::uint8_t, 8> b{};
  for (int i = 0; i < 8; ++i) b[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(v >> (56 - 8 * i));
  return b;
}

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

bool binds(const std::string& endpoint) {
  return endpoint.find('*') != std::string::npos || endpoint.find("::") != std::string::npos ||
         starts_with(endpoint, "ipc://") || starts_with(endpoint, "inproc://");
}

}  // namespace

std::string KvEventPublisher::offset_endpoint(const std::string& endpoint, std::uint32_t rank) {
  if (endpoint.empty() || rank == 0) return endpoint;
  if (starts_with(endpoint, "inproc://") || starts_with(endpoint, "ipc://"))
    return endpoint + "_dp" + std::to_string(rank);
  if (!starts_with(endpoint, "tcp://"))
    fail("endpoint = '{}': data_parallel_rank = {} needs a tcp://, ipc:// or inproc:// endpoint", endpoint, rank);
  const std::size_t colon = endpoint.rfind(':');
  const std::string port = endpoint.substr(colon + 1);
  if (port == "*") return endpoint;  // an ephemeral port per rank already
  std::uint32_t p = 0;
  const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
  if (ec != std::errc() || end != port.data() + port.size() || colon < 6 || p + std::uint64_t{rank} > 65535)
    fail("endpoint = '{}': cannot offset its port by data_parallel_rank = {}", endpoint, rank);
  return endpoint.substr(0, colon + 1) + std::to_string(p + rank);
}

struct KvEventPublisher::Impl {
  Impl(const KVLayout& l, EventPublisherOptions o);
  ~Impl();
  void run();
  void send_popped(std::uint64_t seq, double ts);
  void serve_replays();
  void answer(const zmq::message_t& id, std::uint64_t start);
  void sleep(Clock::time_point last_activity);

  KVLayout layout;
  EventPublisherOptions opt;
  EventEncodeOptions enc;
  BatchRing ring;
  zmq::context_t ctx{1};
  zmq::socket_t pub{ctx, zmq::socket_type::pub};
  zmq::socket_t replay;
  std::string bound, bound_replay;
  int wake_fd = -1;
  std::thread thread;
  std::atomic<bool> stop{false};
  std::atomic<bool> sleeping{false};
  std::uint64_t next_seq = 0;  // scheduler thread
  std::atomic<std::uint64_t> published{0}, dropped{0}, sent{0}, sent_bytes{0}, send_errors{0}, handled{0};
  std::atomic<std::uint64_t> replay_requests{0}, replayed{0}, bad_requests{0}, wakeups{0};

  // Publisher thread only.
  struct Entry {
    std::uint64_t seq = 0;
    std::vector<std::uint8_t> payload;
  };
  std::vector<Entry> buffer;  // ring of the last buffer_steps payloads
  std::size_t buffer_first = 0, buffer_count = 0;
  std::vector<std::uint8_t> scratch_payload;
  KvEventBatch scratch;
  std::vector<zmq::message_t> frames;
};

KvEventPublisher::Impl::Impl(const KVLayout& l, EventPublisherOptions o)
    : layout(l), opt(std::move(o)), ring(opt.queue_bytes, opt.max_queue) {
  if (opt.endpoint.empty()) fail("EventPublisherOptions::endpoint is empty");
  if (opt.hwm < 0) fail("EventPublisherOptions::hwm = {}: must be >= 0", opt.hwm);
  if (opt.poll_interval.count() < 0)
    fail("EventPublisherOptions::poll_interval = {} us: must be >= 0", opt.poll_interval.count());
  enc = EventEncodeOptions{opt.encoding, opt.hash_format, opt.data_parallel_rank};
  validate_event_encode_options(enc);  // here: the publisher thread's encoding must not raise
  const std::string endpoint = offset_endpoint(opt.endpoint, opt.data_parallel_rank);
  const std::string replay_endpoint = offset_endpoint(opt.replay_endpoint, opt.data_parallel_rank);
  try {
    pub.set(zmq::sockopt::sndhwm, opt.hwm);
    pub.set(zmq::sockopt::linger, static_cast<int>(opt.linger.count()));
    if (binds(endpoint)) {
      pub.bind(endpoint);
      bound = pub.get(zmq::sockopt::last_endpoint);
    } else {
      pub.connect(endpoint);
      bound = endpoint;
    }
    if (!replay_endpoint.empty()) {
      replay = zmq::socket_t(ctx, zmq::socket_type::router);
      replay.set(zmq::sockopt::linger, static_cast<int>(opt.linger.count()));
      // An answer is up to buffer_steps batches: at the default HWM (1000) a ROUTER would
      // silently drop the rest of a long answer, so its queue is unbounded (the buffer
      // bounds it).
      replay.set(zmq::sockopt::sndhwm, 0);
      replay.bind(replay_endpoint);
      bound_replay = replay.get(zmq::sockopt::last_endpoint);
    }
  } catch (const zmq::error_t& e) {
    fail("KvEventPublisher endpoint = '{}', replay_endpoint = '{}': {}", endpoint, replay_endpoint, e.what());
  }
  wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd < 0) fail("KvEventPublisher: eventfd failed (errno {})", errno);
  buffer.resize(opt.buffer_steps);
  thread = std::thread([this] { run(); });
}

KvEventPublisher::Impl::~Impl() {
  stop.store(true);
  const std::uint64_t one = 1;
  [[maybe_unused]] const ssize_t n = ::write(wake_fd, &one, sizeof one);
  thread.join();
  ::close(wake_fd);
}

void KvEventPublisher::Impl::run() {
  Clock::time_point last_activity = Clock::now();
  std::uint64_t seq = 0;
  double ts = 0;
  for (;;) {
    std::uint32_t n = 0;
    while (ring.pop(scratch, seq, ts)) {
      send_popped(seq, ts);
      if (++n % 64 == 0 && replay) serve_replays();  // replays are not starved by a busy stream
    }
    if (n != 0) last_activity = Clock::now();
    if (replay) serve_replays();
    if (stop.load() && ring.empty()) return;
    sleep(last_activity);
  }
}

// Waits for a batch, a replay request or a wake-up: briefly (poll_interval) while batches
// keep coming, without asking publish() to wake it; after kDeepSleepAfter idle (or always
// when poll_interval is 0) it raises `sleeping`, and publish() writes the eventfd.
void KvEventPublisher::Impl::sleep(Clock::time_point last_activity) {
  const bool light = opt.poll_interval.count() > 0 && Clock::now() - last_activity < kDeepSleepAfter;
  long timeout_ms = kDeepSleepPollMs;
  if (light) {
    timeout_ms = std::max<long>(1, static_cast<long>(opt.poll_interval.count() / 1000));
  } else {
    // Dekker with publish(): both store then load, all seq_cst (no fences: TSan cannot
    // model them), so either this sees the new count or publish() sees `sleeping`.
    sleeping.store(true, std::memory_order_seq_cst);
    if (published.load(std::memory_order_seq_cst) != handled.load(std::memory_order_relaxed) || stop.load()) {
      sleeping.store(false, std::memory_order_relaxed);
      return;
    }
  }
  std::array<zmq_pollitem_t, 2> items{};
  items[0] = zmq_pollitem_t{nullptr, wake_fd, ZMQ_POLLIN, 0};
  std::size_t count = 1;
  if (replay) items[count++] = zmq_pollitem_t{replay.handle(), 0, ZMQ_POLLIN, 0};
  zmq::poll(items.data(), count, std::chrono::milliseconds(timeout_ms));
  sleeping.store(false, std::memory_order_relaxed);
  if (items[0].revents & ZMQ_POLLIN) {
    std::uint64_t v = 0;
    [[maybe_unused]] const ssize_t r = ::read(wake_fd, &v, sizeof v);
  }
}

void KvEventPublisher::Impl::send_popped(std::uint64_t seq, double ts) {
  std::vector<std::uint8_t>* payload = &scratch_payload;
  if (!buffer.empty()) {
    if (buffer_count == buffer.size()) {  // overwrite the oldest
      buffer_first = (buffer_first + 1) % buffer.size();
      --buffer_count;
    }
    Entry& e = buffer[(buffer_first + buffer_count) % buffer.size()];
    ++buffer_count;
    e.seq = seq;
    payload = &e.payload;
  }
  payload->clear();
  encode_kv_event_batch(scratch, layout, ts, enc, *payload);
  const auto seq_be = big_endian(seq);
  try {
    const bool ok = pub.send(zmq::buffer(opt.topic), zmq::send_flags::sndmore | zmq::send_flags::dontwait) &&
                    pub.send(zmq::buffer(seq_be), zmq::send_flags::sndmore | zmq::send_flags::dontwait) &&
                    pub.send(zmq::buffer(*payload), zmq::send_flags::dontwait);
    if (ok) {
      sent.fetch_add(1, std::memory_order_relaxed);
      sent_bytes.fetch_add(payload->size(), std::memory_order_relaxed);
    } else {
      send_errors.fetch_add(1, std::memory_order_relaxed);
    }
  } catch (const zmq::error_t&) {
    send_errors.fetch_add(1, std::memory_order_relaxed);
  }
  handled.fetch_add(1, std::memory_order_release);
}

// Answers every waiting request [identity, "", start seq u64 BE] (what a REQ socket, or a
// DEALER that sends an empty delimiter, puts on the wire).
void KvEventPublisher::Impl::serve_replays() {
  for (;;) {
    frames.clear();
    std::optional<std::size_t> n;
    try {
      n = zmq::recv_multipart(replay, std::back_inserter(frames), zmq::recv_flags::dontwait);
    } catch (const zmq::error_t&) {
      bad_requests.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    if (!n) return;
    if (frames.size() != 3 || frames[1].size() != 0 || frames[2].size() != 8) {
      bad_requests.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    std::uint64_t start = 0;
    const auto* b = static_cast<const std::uint8_t*>(frames[2].data());
    for (int i = 0; i < 8; ++i) start = (start << 8) | b[i];
    answer(frames[0], start);
    replay_requests.fetch_add(1, std::memory_order_relaxed);
  }
}

void KvEventPublisher::Impl::answer(const zmq::message_t& id, std::uint64_t start) {
  const auto flags = zmq::send_flags::sndmore | zmq::send_flags::dontwait;
  const std::array<std::uint8_t, 0> empty{};
  try {
    for (std::size_t i = 0; i < buffer_count; ++i) {
      const Entry& e = buffer[(buffer_first + i) % buffer.size()];
      if (e.seq < start) continue;
      const auto seq_be = big_endian(e.seq);
      replay.send(zmq::buffer(id.data(), id.size()), flags);
      replay.send(zmq::buffer(empty), flags);
      replay.send(zmq::buffer(seq_be), flags);
      replay.send(zmq::buffer(e.payload), zmq::send_flags::dontwait);
      replayed.fetch_add(1, std::memory_order_relaxed);
    }
    const auto end = big_endian(~std::uint64_t{0});  // -1 as a signed 64-bit big-endian
    replay.send(zmq::buffer(id.data(), id.size()), flags);
    replay.send(zmq::buffer(empty), flags);
    replay.send(zmq::buffer(end), flags);
    replay.send(zmq::buffer(empty), zmq::send_flags::dontwait);
  } catch (const zmq::error_t&) {
    send_errors.fetch_add(1, std::memory_order_relaxed);
  }
}

KvEventPublisher::KvEventPublisher(const KVLayout& layout, EventPublisherOptions options)
    : impl_(std::make_unique<Impl>(layout, std::move(options))) {}

KvEventPublisher::~KvEventPublisher() = default;

bool KvEventPublisher::publish(const KvEventBatch& batch, double ts) {
  if (batch.empty()) return true;
  validate_kv_event_batch(batch, impl_->layout);
  Impl& m = *impl_;
  const std::uint64_t seq = m.next_seq++;
  if (!m.ring.push(batch, seq, ts)) {
    m.dropped.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  m.published.fetch_add(1, std::memory_order_seq_cst);  // pairs with Impl::sleep
  if (m.sleeping.load(std::memory_order_seq_cst) && m.sleeping.exchange(false)) {
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(m.wake_fd, &one, sizeof one);
    m.wakeups.fetch_add(1, std::memory_order_relaxed);
  }
  return true;
}

bool KvEventPublisher::publish(const KvEventBatch& batch) {
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  return publish(batch, std::chrono::duration<double>(now).count());
}

bool KvEventPublisher::flush(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (impl_->handled.load(std::memory_order_acquire) != impl_->published.load(std::memory_order_relaxed)) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

PublisherStats KvEventPublisher::stats() const {
  const Impl& m = *impl_;
  const auto r = std::memory_order_relaxed;
  return PublisherStats{m.published.load(r),  m.dropped.load(r),      m.sent.load(r),
                        m.sent_bytes.load(r), m.send_errors.load(r),  m.replay_requests.load(r),
                        m.replayed.load(r),   m.bad_requests.load(r), m.wakeups.load(r)};
}

std::uint64_t KvEventPublisher::next_sequence() const { return impl_->next_seq; }
std::string KvEventPublisher::endpoint() const { return impl_->bound; }
std::string KvEventPublisher::replay_endpoint() const { return impl_->bound_replay; }

}  // namespace kvmm
