// The Redis tier test harness (redis_harness.hpp): redis-server by posix_spawn (no fork of
// a threaded process), a poll()-driven relay thread, a bounded wait for tickets.
#include "redis_harness.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <utility>

extern char** environ;

namespace kvmm::test {

namespace {

int unix_socket(const std::string& path, bool listen) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  if (listen) {
    ::unlink(path.c_str());
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd, 16) != 0)
      throw std::runtime_error("relay: cannot listen on " + path);
    return fd;
  }
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

bool write_all(int fd, const char* p, std::size_t n) {
  while (n != 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w <= 0) return false;
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

}  // namespace

bool redis_server_available() { return std::system("command -v redis-server >/dev/null 2>&1") == 0; }

RedisServer::RedisServer(std::vector<std::string> extra) : extra_(std::move(extra)) {
  char tmpl[] = "/tmp/kvmm-redis-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
  dir_ = tmpl;
  start();
}

RedisServer::~RedisServer() {
  if (pid_ > 0) ::kill(pid_, SIGCONT);
  kill9();
  if (client_) redisFree(client_);
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

void RedisServer::start() {
  std::vector<std::string> args = {
      "redis-server", "--port",      "0",  "--unixsocket", socket_path(), "--unixsocketperm",
      "700",          "--save",      "",   "--appendonly", "no",          "--dir",
      dir_,           "--daemonize", "no", "--loglevel",   "warning"};
  args.insert(args.end(), extra_.begin(), extra_.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  const std::string log = dir_ + "/redis.log";
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  const int rc = posix_spawnp(&pid_, "redis-server", &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) throw std::runtime_error("cannot spawn redis-server");
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < until) {
    Reply r = command({"PING"});
    if (r && r->type == REDIS_REPLY_STATUS) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  throw std::runtime_error("redis-server did not answer PING within 5 s (log: " + log + ")");
}

void RedisServer::kill9() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
  if (client_) redisFree(client_);
  client_ = nullptr;
}

void RedisServer::stop() { ::kill(pid_, SIGSTOP); }
void RedisServer::resume() { ::kill(pid_, SIGCONT); }

Reply RedisServer::command(const std::vector<std::string>& args) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (!client_) {
      const timeval tv{2, 0};
      client_ = redisConnectUnixWithTimeout(socket_path().c_str(), tv);
      if (!client_ || client_->err) {
        if (client_) redisFree(client_);
        client_ = nullptr;
        return nullptr;
      }
      redisSetTimeout(client_, tv);
    }
    std::vector<const char*> argv;
    std::vector<std::size_t> lens;
    for (const std::string& a : args) argv.push_back(a.data()), lens.push_back(a.size());
    auto* r =
        static_cast<redisReply*>(redisCommandArgv(client_, static_cast<int>(args.size()), argv.data(), lens.data()));
    if (r) return Reply(r);
    redisFree(client_);  // a dead connection (the server restarted): reconnect once
    client_ = nullptr;
  }
  return nullptr;
}

long long RedisServer::dbsize() {
  Reply r = command({"DBSIZE"});
  return r && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
}

bool RedisServer::exists(const std::string& key) {
  Reply r = command({"EXISTS", key});
  return r && r->type == REDIS_REPLY_INTEGER && r->integer == 1;
}

std::string RedisServer::get(const std::string& key) {
  Reply r = command({"GET", key});
  return r && r->type == REDIS_REPLY_STRING ? std::string(r->str, r->len) : std::string();
}

Relay::Relay(std::string listen_path, std::string target_path)
    : listen_path_(std::move(listen_path)), target_path_(std::move(target_path)) {
  listen_fd_ = unix_socket(listen_path_, true);
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
  stop_fd_ = p[1];
  pairs_.push_back(Pair{p[0], -1});  // slot 0: the stop pipe's read end
  thread_ = std::thread([this] { run(); });
}

Relay::~Relay() {
  ::close(stop_fd_);  // the relay thread sees EOF and ends
  thread_.join();
  ::close(listen_fd_);
  ::unlink(listen_path_.c_str());
}

void Relay::cut_next(Direction direction, std::uint64_t bytes) {
  std::lock_guard lock(mu_);
  armed_ = true;
  direction_ = direction;
  bytes_ = bytes;
}

bool Relay::forward(Pair& p, bool to_server) {
  char buf[65536];
  const int from = to_server ? p.client : p.server, to = to_server ? p.server : p.client;
  const ssize_t n = ::recv(from, buf, sizeof buf, 0);
  if (n <= 0) return false;
  std::size_t pass = static_cast<std::size_t>(n);
  bool cut = false;
  {
    std::lock_guard lock(mu_);
    if (armed_ && (direction_ == Direction::kToServer) == to_server) {
      pass = static_cast<std::size_t>(std::min<std::uint64_t>(pass, bytes_));
      bytes_ -= pass;
      cut = bytes_ == 0;
      if (cut) armed_ = false;
    }
  }
  if (pass != 0 && !write_all(to, buf, pass)) return false;
  if (cut) cuts_.fetch_add(1);
  return !cut;
}

void Relay::run() {
  for (;;) {
    std::vector<pollfd> fds{pollfd{pairs_[0].client, POLLIN, 0}, pollfd{listen_fd_, POLLIN, 0}};
    for (std::size_t i = 1; i < pairs_.size(); ++i) {
      fds.push_back(pollfd{pairs_[i].client, POLLIN, 0});
      fds.push_back(pollfd{pairs_[i].server, POLLIN, 0});
    }
    if (::poll(fds.data(), fds.size(), 1000) < 0) continue;
    if (fds[0].revents != 0) break;  // stop
    for (std::size_t i = pairs_.size() - 1; i >= 1; --i) {
      Pair& p = pairs_[i];
      const short c = fds[2 * i].revents, s = fds[2 * i + 1].revents;
      bool alive = true;
      if (alive && c != 0) alive = forward(p, true);
      if (alive && s != 0) alive = forward(p, false);
      if (!alive) {
        ::close(p.client);
        ::close(p.server);
        pairs_.erase(pairs_.begin() + static_cast<std::ptrdiff_t>(i));
      }
    }
    if (fds[1].revents & POLLIN) {
      const int c = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      const int s = unix_socket(target_path_, false);
      if (s < 0) {
        ::close(c);
        continue;
      }
      accepted_.fetch_add(1);
      pairs_.push_back(Pair{c, s});
    }
  }
  for (std::size_t i = 1; i < pairs_.size(); ++i) ::close(pairs_[i].client), ::close(pairs_[i].server);
  ::close(pairs_[0].client);
}

namespace {
std::atomic<std::int64_t> g_longest_poll_us{0};
}

std::chrono::microseconds longest_poll() { return std::chrono::microseconds(g_longest_poll_us.load()); }

bool wait_tickets(KVTier& tier, const std::vector<TierTicket>& tickets, std::chrono::milliseconds limit,
                  std::vector<std::vector<TierStatus>>& out) {
  const auto until = std::chrono::steady_clock::now() + limit;
  out.assign(tickets.size(), {});
  std::vector<bool> seen(tickets.size(), false);
  std::size_t left = tickets.size();
  TierResults results;
  for (;;) {
    results.clear();
    const auto p0 = std::chrono::steady_clock::now();
    tier.poll(results);
    const auto took = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - p0);
    if (took.count() > g_longest_poll_us.load()) g_longest_poll_us.store(took.count());
    for (const TierCompletion& c : results.completions) {
      const auto i = static_cast<std::size_t>(std::find(tickets.begin(), tickets.end(), c.ticket) - tickets.begin());
      if (i == tickets.size()) continue;
      if (seen[i]) return false;
      seen[i] = true;
      --left;
      const auto s = results.status_of(c);
      out[i].assign(s.begin(), s.end());
    }
    const auto now = std::chrono::steady_clock::now();
    if (left == 0) return true;
    if (now >= until) return false;
    pollfd p{tier.event_fd(), POLLIN, 0};
    ::poll(&p, 1, static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(until - now).count()));
  }
}

std::vector<TierStatus> wait_ticket(KVTier& tier, TierTicket ticket, std::chrono::milliseconds limit,
                                    std::chrono::milliseconds* waited) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::vector<TierStatus>> out;
  const bool done = wait_tickets(tier, {ticket}, limit, out);
  if (waited) *waited = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
  return done ? out[0] : std::vector<TierStatus>();
}

}  // namespace kvmm::test
