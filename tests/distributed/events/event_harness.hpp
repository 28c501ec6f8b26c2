// The event-stream harness of the publisher tests: a Python consumer process
// (tests/distributed/kv_consumer.py) driven over pipes, the digest of a set of cached (group,
// hash) blocks both sides compute, BatchSource, the interface of whatever produces the
// batches (a model of a prefix cache, or the manager itself), and run_stream, which drives
// a source through a real publisher to consumers that lose batches, join late and restart.
#pragma once

#include "dist_test_util.hpp"
#include "kvmm/distributed/event_publisher.hpp"
#include "kvmm/manager/kv_events.hpp"

#include <catch2/catch.hpp>

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace kvmm::test {

// splitmix64 of hash ^ group * golden ratio; a set's digest is the sum mod 2^64.
inline std::uint64_t block_mix(GroupId group, std::uint64_t hash) {
  std::uint64_t z = hash ^ (std::uint64_t{group} * 0x9E3779B97F4A7C15ULL);
  z += 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

struct SetDigest {
  std::uint64_t blocks = 0;
  std::uint64_t digest = 0;
  friend bool operator==(const SetDigest&, const SetDigest&) = default;
};

// Produces batches and knows the cached set they should leave a consumer with: the
// (group, low 64 bits of the hash) of every cached page of every decoder group.
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // Fills `batch` (cleared first) with the next step's events; false when done.
  virtual bool next(KvEventBatch& batch) = 0;
  virtual SetDigest expected() const = 0;
};

struct ConsumerState {
  SetDigest set;
  std::int64_t last_seq = -1;
  std::uint64_t replays = 0, lost = 0, errors = 0;
};

// /usr/bin/python3 kv_consumer.py as a child process.
class ConsumerProcess {
 public:
  ConsumerProcess(const std::string& endpoint, const std::string& replay, const std::string& topic, int drop_every) {
    int in[2], out[2];
    if (::pipe(in) != 0 || ::pipe(out) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(in[0], 0);
      ::dup2(out[1], 1);
      ::close(in[1]);
      ::close(out[0]);
      const std::string script = dist_script("kv_consumer.py");
      const std::string drop = std::to_string(drop_every);
      ::execl(kPython, kPython, script.c_str(), "--endpoint", endpoint.c_str(), "--replay", replay.c_str(), "--topic",
              topic.c_str(), "--drop-every", drop.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    to_ = in[1];
    from_ = out[0];
    ready_ = read_line(std::chrono::seconds(60)) == "ready";
  }
  ~ConsumerProcess() { kill(); }
  ConsumerProcess(const ConsumerProcess&) = delete;
  ConsumerProcess& operator=(const ConsumerProcess&) = delete;

  bool ready() const { return ready_; }

  // Waits (up to `timeout`) until the consumer has applied every batch up to `seq`.
  std::optional<ConsumerState> sync(std::uint64_t seq, std::chrono::seconds timeout = std::chrono::seconds(60)) {
    const std::string cmd = "sync " + std::to_string(seq) + "\n";
    if (::write(to_, cmd.data(), cmd.size()) != static_cast<ssize_t>(cmd.size())) return std::nullopt;
    std::istringstream in(read_line(timeout));
    std::string word;
    ConsumerState s;
    if (!(in >> word >> s.set.blocks >> s.set.digest >> s.last_seq >> s.replays >> s.lost >> s.errors) ||
        word != "state")
      return std::nullopt;
    return s;
  }

  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    ::close(to_);
    ::close(from_);
    pid_ = -1;
  }

 private:
  std::string read_line(std::chrono::seconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      const std::size_t nl = buf_.find('\n');
      if (nl != std::string::npos) {
        std::string line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return line;
      }
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return {};
      pollfd p{from_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char chunk[512];
      const ssize_t n = ::read(from_, chunk, sizeof chunk);
      if (n <= 0) return {};
      buf_.append(chunk, static_cast<std::size_t>(n));
    }
  }

  pid_t pid_ = -1;
  int to_ = -1, from_ = -1;
  bool ready_ = false;
  std::string buf_;
};

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    char tmpl[] = "/tmp/kvmm_events_XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

inline bool have_python() { return python_has("zmq msgpack"); }

#define KVMM_REQUIRE_PYTHON()                                                                             \
  if (!have_python()) {                                                                                   \
    WARN("SKIPPED: /usr/bin/python3 lacks zmq or msgpack (apt-get install python3-zmq python3-msgpack)"); \
    return;                                                                                               \
  }

// Drives `source` (about `approx_batches` non-empty batches) through a publisher; consumer 0 runs
// from the start with simulated gaps, is killed at 60% and restarted; consumer 1 joins at
// 40%. Checks every consumer against source.expected() every `every` batches and at the end.
inline void run_stream(const KVLayout& layout, BatchSource& source, EventEncoding encoding,
                       std::uint64_t approx_batches, std::uint64_t every = 50) {
  TempDir dir;
  EventPublisherOptions opt;
  opt.endpoint = "ipc://" + (dir.path / "pub").string();
  opt.replay_endpoint = "ipc://" + (dir.path / "replay").string();
  opt.topic = "kv@pod0@model";
  opt.buffer_steps = 100000;
  opt.encoding = encoding;
  KvEventPublisher pub(layout, opt);
  std::vector<std::unique_ptr<ConsumerProcess>> consumers(2);
  auto start = [&](std::size_t i, int drop_every) {
    consumers[i] = std::make_unique<ConsumerProcess>(pub.endpoint(), pub.replay_endpoint(), opt.topic, drop_every);
    REQUIRE(consumers[i]->ready());
  };
  start(0, 97);
  KvEventBatch batch;
  std::uint64_t batches = 0, checkpoints = 0;
  bool joined = false, restarted = false;
  auto checkpoint = [&] {
    REQUIRE(pub.flush(std::chrono::seconds(60)));
    if (pub.next_sequence() == 0) return;
    for (auto& c : consumers) {
      if (!c) continue;
      const auto s = c->sync(pub.next_sequence() - 1);
      REQUIRE(s.has_value());
      REQUIRE(s->errors == 0);
      REQUIRE(s->lost == 0);
      REQUIRE(s->set == source.expected());
    }
    ++checkpoints;
  };
  while (source.next(batch)) {
    if (batch.empty()) continue;  // not published: takes no sequence number
    REQUIRE(pub.publish(batch, static_cast<double>(batches)));
    ++batches;
    if (!joined && batches >= approx_batches * 2 / 5) {
      start(1, 0);
      joined = true;
    }
    if (!restarted && batches >= approx_batches * 3 / 5) {
      consumers[0]->kill();
      start(0, 0);
      restarted = true;
    }
    if (batches % every == 0) checkpoint();
  }
  checkpoint();
  CHECK(joined);
  CHECK(restarted);
  CHECK(checkpoints > 20);
  const PublisherStats st = pub.stats();
  CHECK(st.dropped == 0);
  CHECK(st.sent == batches);
  CHECK(st.published == batches);
  CHECK(st.replay_requests >= 3);  // the gaps, the late joiner, the restart
  CHECK(st.bad_requests == 0);
}

}  // namespace kvmm::test
