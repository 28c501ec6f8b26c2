// RedisTier: the submission and completion side of kvmm::redis. A submission validates its
// keys, takes a recycled ticket, splits the keys into one contiguous job per connection
// and hands the jobs to the connections' I/O threads (O(keys) copies, one mutex and one
// eventfd write per job). The last job to finish queues the ticket for poll(), which
// copies its statuses out and recycles it. No heap allocation in steady state.
#include "kvmm/distributed/redis_tier.hpp"

#include "kvmm/error.hpp"
#include "resp_connection.hpp"
#include "tier_state.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <mutex>

namespace kvmm {

namespace {

constexpr std::uint32_t kMaxConnections = 16;
constexpr std::uint32_t kMaxPipelineDepth = 65536;
// A ticket is split over connections only in jobs of at least this much wire work (a key
// counts kKeyWork bytes, a get or put its page bytes too): each more job costs the caller
// one more wake-up of an I/O thread (~1 us), worth it for bulk transfers only.
constexpr std::uint64_t kMinJobWork = std::uint64_t{256} << 10;
constexpr std::uint64_t kKeyWork = 128;

void validate(const RedisTierOptions& o) {
  if (o.connections < 1 || o.connections > kMaxConnections)
    fail("RedisTierOptions::connections = {}: need 1..{}", o.connections, kMaxConnections);
  if (o.pipeline_depth < 1 || o.pipeline_depth > kMaxPipelineDepth)
    fail("RedisTierOptions::pipeline_depth = {}: need 1..{}", o.pipeline_depth, kMaxPipelineDepth);
  if (o.max_inflight_bytes == 0) fail("RedisTierOptions::max_inflight_bytes = 0: need > 0");
  if (o.connect_timeout.count() <= 0)
    fail("RedisTierOptions::connect_timeout = {} ms: need > 0", o.connect_timeout.count());
  if (o.command_timeout.count() <= 0)
    fail("RedisTierOptions::command_timeout = {} ms: need > 0", o.command_timeout.count());
  if (o.breaker_failures < 1) fail("RedisTierOptions::breaker_failures = 0: need >= 1");
  if (o.breaker_cooldown.count() <= 0)
    fail("RedisTierOptions::breaker_cooldown = {} ms: need > 0", o.breaker_cooldown.count());
  if (o.doze_window.count() < 0) fail("RedisTierOptions::doze_window = {} ms: need >= 0", o.doze_window.count());
  if (o.doze_window.count() > 0 && (o.doze_interval.count() < 1 || o.doze_interval.count() > 100000))
    fail("RedisTierOptions::doze_interval = {} us: need 1..100000", o.doze_interval.count());
  if (o.key_prefix.empty() || o.key_prefix.find_first_of(" \r\n") != std::string::npos)
    fail("RedisTierOptions::key_prefix = '{}': need a non-empty prefix without spaces or newlines", o.key_prefix);
}

class RedisTier final : public KVTier, public redis::TierCore {
 public:
  RedisTier(const KVLayout& layout, const TierScope& scope, const RedisTierOptions& options)
      : options_(options),
        scope_(scope_fingerprint(layout, scope)),
        breaker_(options.breaker_failures, options.breaker_cooldown) {
    validate(options_);
    const redis::Endpoint endpoint = redis::parse_endpoint(options_.endpoint);
    for (GroupId g = 0; g < layout.num_groups(); ++g) {
      page_bytes_.push_back(layout.small_page_bytes(g));
      tokens_per_page_.push_back(layout.group(g).tokens_per_page);
    }
    event_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (event_fd_ < 0) fail("RedisTier: eventfd failed (errno {})", errno);
    for (std::uint32_t i = 0; i < options_.connections; ++i)
      connections_.push_back(std::make_unique<redis::Connection>(*this, endpoint));
  }

  ~RedisTier() override {
    connections_.clear();  // joins the I/O threads; they complete what they hold first
    ::close(event_fd_);
  }

  TierTicket contains(std::span<const TierKey> keys) override { return submit(TierOp::kContains, keys); }
  TierTicket remove(std::span<const TierKey> keys) override { return submit(TierOp::kRemove, keys); }
  TierTicket get(std::span<const TierPage> pages) override { return submit(TierOp::kGet, pages); }
  TierTicket put(std::span<const TierPage> pages) override { return submit(TierOp::kPut, pages); }

  std::size_t poll(TierResults& out) override {
    {
      std::lock_guard lock(done_mu_);
      if (done_.empty()) return 0;
      polled_.swap(done_);
      if (signaled_) {  // readable (signaled_) only while done_ is not empty
        std::uint64_t v = 0;
        [[maybe_unused]] const ssize_t n = ::read(event_fd_, &v, sizeof v);
        signaled_ = false;
      }
    }
    for (redis::Ticket* t : polled_) {
      const auto begin = static_cast<std::uint32_t>(out.statuses.size());
      out.statuses.insert(out.statuses.end(), t->status.begin(), t->status.end());
      out.completions.push_back(TierCompletion{t->id, t->op, begin, static_cast<std::uint32_t>(t->status.size())});
    }
    const std::size_t n = polled_.size();
    {
      std::lock_guard lock(free_mu_);
      free_.insert(free_.end(), polled_.begin(), polled_.end());
    }
    polled_.clear();
    return n;
  }

  int event_fd() const override { return event_fd_; }

  bool arm() override {
    std::lock_guard lock(done_mu_);
    if (!done_.empty()) return false;
    armed_ = true;
    return true;
  }

  TierHealth health() const override {
    const auto r = std::memory_order_relaxed;
    TierHealth h;
    h.breaker_open = breaker_.open();
    h.ok = counters_.ok.load(r);
    h.misses = counters_.misses.load(r);
    h.corrupt = counters_.corrupt.load(r);
    h.timeouts = counters_.timeouts.load(r);
    h.unavailable = counters_.unavailable.load(r);
    h.put_existing = counters_.put_existing.load(r);
    h.bytes_put = counters_.bytes_put.load(r);
    h.bytes_got = counters_.bytes_got.load(r);
    h.connects = counters_.connects.load(r);
    h.connect_failures = counters_.connect_failures.load(r);
    h.io_failures = counters_.io_failures.load(r);
    h.breaker_opens = breaker_.opens();
    return h;
  }

  std::uint64_t scope() const override { return scope_; }

  // TierCore, for the connections.
  const RedisTierOptions& options() const override { return options_; }
  std::uint64_t page_bytes(GroupId g) const override { return page_bytes_[g]; }
  std::uint32_t tokens_per_page(GroupId g) const override { return tokens_per_page_[g]; }
  redis::Breaker& breaker() override { return breaker_; }
  redis::Counters& counters() override { return counters_; }
  void job_done(redis::Job& job) override {
    if (job.ticket->jobs_left.fetch_sub(1, std::memory_order_acq_rel) == 1) complete(job.ticket);
  }

 private:
  static const TierKey& key_of(const TierKey& k) { return k; }
  static const TierKey& key_of(const TierPage& p) { return p.key; }
  static std::byte* data_of(const TierKey&) { return nullptr; }
  static std::byte* data_of(const TierPage& p) { return p.data; }

  // kvmm::Error naming the first bad key; nothing is submitted then.
  template <class T>
  void check(TierOp op, std::span<const T> items) const {
    if (items.size() > UINT32_MAX) fail("KVTier::{}: {} keys, at most {}", to_string(op), items.size(), UINT32_MAX);
    const bool needs_data = op == TierOp::kGet || op == TierOp::kPut;
    for (std::size_t i = 0; i < items.size(); ++i) {
      const TierKey& k = key_of(items[i]);
      if (k.group >= page_bytes_.size())
        fail("KVTier::{}: key {} has group = {}, the layout has {} groups", to_string(op), i, k.group,
             page_bytes_.size());
      if (needs_data && data_of(items[i]) == nullptr) fail("KVTier::{}: page {} has data = null", to_string(op), i);
    }
  }

  template <class T>
  TierTicket submit(TierOp op, std::span<const T> items) {
    check(op, items);
    redis::Ticket* t = acquire();
    t->id = next_id_.fetch_add(1, std::memory_order_relaxed);
    t->op = op;
    t->deadline = redis::Clock::now() + options_.command_timeout;
    const auto n = static_cast<std::uint32_t>(items.size());
    t->pages.resize(n);
    TierPage* pages = t->pages.data();
    for (std::uint32_t i = 0; i < n; ++i) pages[i] = TierPage{key_of(items[i]), data_of(items[i])};
    const TierTicket id = t->id;
    t->status.assign(n, TierStatus::kUnavailable);
    if (n == 0 || breaker_.open()) {  // no I/O: every key completes now
      counters_.count(TierStatus::kUnavailable, n);
      complete(t);
      return id;
    }
    const std::uint32_t conns = static_cast<std::uint32_t>(connections_.size());
    std::uint64_t work = std::uint64_t{n} * kKeyWork;
    if (op == TierOp::kGet || op == TierOp::kPut)
      for (std::uint32_t i = 0; i < n; ++i) work += page_bytes_[pages[i].key.group];
    const auto jobs = static_cast<std::uint32_t>(std::clamp<std::uint64_t>(work / kMinJobWork, 1, conns));
    t->jobs.resize(jobs);
    t->jobs_left.store(jobs, std::memory_order_relaxed);
    const std::uint32_t first = next_conn_.fetch_add(1, std::memory_order_relaxed);
    for (std::uint32_t j = 0; j < jobs; ++j) {  // contiguous ranges: the order of keys on the wire
      redis::Job& job = t->jobs[j];
      job.ticket = t;
      job.begin = static_cast<std::uint32_t>(std::uint64_t{n} * j / jobs);
      job.end = static_cast<std::uint32_t>(std::uint64_t{n} * (j + 1) / jobs);
      job.remaining = job.end - job.begin;
    }
    // The ticket may complete (and be recycled by poll) once its last job is submitted: no
    // access to `t` after the loop.
    for (std::uint32_t j = 0; j < jobs; ++j) connections_[(first + j) % conns]->submit(&t->jobs[j]);
    return id;
  }

  redis::Ticket* acquire() {
    std::lock_guard lock(free_mu_);
    if (free_.empty()) {
      tickets_.push_back(std::make_unique<redis::Ticket>());
      return tickets_.back().get();
    }
    redis::Ticket* t = free_.back();
    free_.pop_back();
    return t;
  }

  // One eventfd write per batch of completions, and with notify_when_armed only when armed.
  void complete(redis::Ticket* t) {
    std::lock_guard lock(done_mu_);
    done_.push_back(t);
    if (signaled_ || (options_.notify_when_armed && !armed_)) return;
    armed_ = false;
    signaled_ = true;
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(event_fd_, &one, sizeof one);
  }

  const RedisTierOptions options_;
  const std::uint64_t scope_;
  std::vector<std::uint64_t> page_bytes_;
  std::vector<std::uint32_t> tokens_per_page_;
  redis::Breaker breaker_;
  redis::Counters counters_;
  int event_fd_ = -1;
  std::atomic<TierTicket> next_id_{1};
  std::atomic<std::uint32_t> next_conn_{0};

  std::mutex free_mu_;  // guards tickets_ and free_
  std::vector<std::unique_ptr<redis::Ticket>> tickets_;
  std::vector<redis::Ticket*> free_;

  std::mutex done_mu_;  // guards done_, armed_, signaled_ and the eventfd's count
  std::vector<redis::Ticket*> done_;
  bool armed_ = false;                  // notify_when_armed: arm() asked for the next completion's signal
  bool signaled_ = false;               // the eventfd is readable (written since poll() last read it)
  std::vector<redis::Ticket*> polled_;  // poll()'s thread only

  // Last: destroyed first, so the I/O threads stop before anything they use goes away.
  std::vector<std::unique_ptr<redis::Connection>> connections_;
};

}  // namespace

std::unique_ptr<KVTier> make_redis_tier(const KVLayout& layout, const TierScope& scope,
                                        const RedisTierOptions& options) {
  return std::make_unique<RedisTier>(layout, scope, options);
}

}  // namespace kvmm
