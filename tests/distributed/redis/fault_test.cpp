// The Redis tier's fault matrix with a real redis-server: SIGKILL mid-put and mid-get,
// SIGSTOP past the timeout (the circuit breaker opens, then a probe closes it), a
// connection cut at chosen byte offsets by a relay, values corrupted in place (SETRANGE and
// friends), keys evicted by maxmemory, a durable (append-only) server killed mid-put. In
// every case: each submission and each poll() returns at once, each ticket completes
// within the timeout bound, a get's page holds exactly the stored bytes or is untouched,
// and the tier works again once the server is back.
#include "kvmm/distributed/tier_value.hpp"
#include "tier_fixture.hpp"

#include <thread>

using namespace kvmm;
using namespace kvmm::test;
using namespace std::chrono_literals;

namespace {

constexpr auto kSubmitBound = 100ms;  // submit and poll never wait on I/O; the margin is for preemption

std::vector<TierKey> keys_of_group(GroupId g, std::size_t n, std::uint64_t base = 0) {
  std::vector<TierKey> k;
  for (std::size_t i = 0; i < n; ++i) k.push_back(tier_key(g, base + i));
  return k;
}

// Submits with `submit`, requires that it returned within kSubmitBound and that the ticket
// completed within kBound; returns the statuses.
template <class Submit>
std::vector<TierStatus> bounded(KVTier& tier, Submit submit) {
  const auto t0 = std::chrono::steady_clock::now();
  const TierTicket t = submit();
  REQUIRE(std::chrono::steady_clock::now() - t0 < kSubmitBound);
  std::chrono::milliseconds waited{};
  auto st = wait_ticket(tier, t, 10s, &waited);
  INFO("completed after " << waited.count() << " ms");
  REQUIRE_FALSE(st.empty());
  REQUIRE(waited <= kBound);
  REQUIRE(longest_poll() < kSubmitBound);  // poll() never waited either
  return st;
}

// Waits (<= 5 s) until a contains answers from the server again, then requires a put/get
// round trip of fresh pages to succeed in full.
void require_recovers(KVTier& tier, const KVLayout& layout, std::uint64_t base) {
  const TierKey probe = tier_key(1, base + 999);
  const auto until = std::chrono::steady_clock::now() + 5s;
  bool back = false;
  while (!back && std::chrono::steady_clock::now() < until) {
    const auto st = bounded(tier, [&] { return tier.contains(std::span(&probe, 1)); });
    back = st[0] == TierStatus::kMiss || st[0] == TierStatus::kOk;
    if (!back) std::this_thread::sleep_for(20ms);
  }
  REQUIRE(back);
  HostPages hp(layout, keys_of_group(1, 8, base));
  hp.fill(7);
  REQUIRE(count(bounded(tier, [&] { return tier.put(hp.pages); }), TierStatus::kOk) == 8);
  hp.sentinel();
  REQUIRE(require_sound_get(hp, bounded(tier, [&] { return tier.get(hp.pages); }), 7) == 8);
}

template <class Pred>
bool wait_until(Pred pred, std::chrono::milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

bool only(const std::vector<TierStatus>& st, std::initializer_list<TierStatus> allowed) {
  for (const TierStatus s : st)
    if (std::find(allowed.begin(), allowed.end(), s) == allowed.end()) return false;
  return true;
}

}  // namespace

TEST_CASE("redis tier faults: SIGKILL mid-put and mid-get, then restart") {
  KVMM_REQUIRE_REDIS();
  RedisServer server;
  const KVLayout layout = tier_layout(16);  // group 0: 1 MiB pages
  REQUIRE(layout.small_page_bytes(0) == std::uint64_t{1} << 20);
  auto tier = make_redis_tier(layout, tier_scope(), fault_options(server.endpoint()));
  HostPages hp(layout, keys_of_group(0, 160));
  hp.fill(1);

  SECTION("mid-put") {
    const auto t0 = std::chrono::steady_clock::now();
    const TierTicket t = tier->put(hp.pages);
    REQUIRE(std::chrono::steady_clock::now() - t0 < kSubmitBound);
    REQUIRE(wait_until([&] { return server.dbsize() > 0; }, 5s));
    server.kill9();
    std::chrono::milliseconds waited{};
    const auto st = wait_ticket(*tier, t, 10s, &waited);
    REQUIRE_FALSE(st.empty());
    REQUIRE(waited <= kBound);
    REQUIRE(only(st, {TierStatus::kOk, TierStatus::kUnavailable, TierStatus::kTimeout}));
    REQUIRE(count(st, TierStatus::kOk) < st.size());  // it was cut mid-way
    server.start();                                   // empty: no persistence
    require_recovers(*tier, layout, 5000);
    hp.sentinel();
    REQUIRE(require_sound_get(hp, bounded(*tier, [&] { return tier->get(hp.pages); }), 1) == 0);
  }
  SECTION("mid-get") {
    {  // the setup, not under test: 160 MiB may take longer than the timeout under sanitizers
      RedisTierOptions slow = fault_options(server.endpoint());
      slow.command_timeout = 60s;
      auto loader = make_redis_tier(layout, tier_scope(), slow);
      REQUIRE(count(wait_ticket(*loader, loader->put(hp.pages), 60s), TierStatus::kOk) == 160);
    }
    hp.sentinel();
    const std::uint64_t got_before = tier->health().bytes_got;
    const TierTicket t = tier->get(hp.pages);
    REQUIRE(wait_until([&] { return tier->health().bytes_got > got_before; }, 5s));
    server.kill9();
    std::chrono::milliseconds waited{};
    const auto st = wait_ticket(*tier, t, 10s, &waited);
    REQUIRE_FALSE(st.empty());
    REQUIRE(waited <= kBound);
    REQUIRE(only(st, {TierStatus::kOk, TierStatus::kUnavailable, TierStatus::kTimeout}));
    const std::size_t ok = require_sound_get(hp, st, 1);
    REQUIRE(ok > 0);
    REQUIRE(ok < 160);
    server.start();
    require_recovers(*tier, layout, 6000);
  }
  REQUIRE(tier->health().corrupt == 0);
}

TEST_CASE("redis tier faults: SIGSTOP past the timeout opens the breaker; SIGCONT closes it") {
  KVMM_REQUIRE_REDIS();
  RedisServer server;
  const KVLayout layout = tier_layout();
  auto tier = make_redis_tier(layout, tier_scope(), fault_options(server.endpoint()));
  HostPages hp(layout, keys_of_group(1, 20));
  hp.fill(3);
  REQUIRE(count(bounded(*tier, [&] { return tier->put(hp.pages); }), TierStatus::kOk) == 20);

  server.stop();
  hp.sentinel();
  auto st = bounded(*tier, [&] { return tier->get(hp.pages); });
  REQUIRE(count(st, TierStatus::kTimeout) == 20);
  REQUIRE(require_sound_get(hp, st, 3) == 0);
  // Each timed-out connection is one failure; the breaker opens at the third.
  const auto until = std::chrono::steady_clock::now() + 5s;
  while (!tier->health().breaker_open && std::chrono::steady_clock::now() < until) {
    st = bounded(*tier, [&] { return tier->get(hp.pages); });
    REQUIRE(require_sound_get(hp, st, 3) == 0);
  }
  REQUIRE(tier->health().breaker_open);
  REQUIRE(tier->health().breaker_opens == 1);
  // Open: no I/O, every key completes kUnavailable at once.
  const auto t0 = std::chrono::steady_clock::now();
  st = bounded(*tier, [&] { return tier->contains(hp.keys); });
  REQUIRE(std::chrono::steady_clock::now() - t0 < kSubmitBound);
  REQUIRE(count(st, TierStatus::kUnavailable) == 20);

  server.resume();
  REQUIRE(wait_until([&] { return !tier->health().breaker_open; }, 5s));  // a probe succeeded
  hp.sentinel();
  REQUIRE(require_sound_get(hp, bounded(*tier, [&] { return tier->get(hp.pages); }), 3) == 20);
  require_recovers(*tier, layout, 100);
}

TEST_CASE("redis tier faults: a dead server and a refused connection open the breaker, a restart closes it") {
  KVMM_REQUIRE_REDIS();
  RedisServer server;
  const KVLayout layout = tier_layout();
  auto tier = make_redis_tier(layout, tier_scope(), fault_options(server.endpoint()));
  server.kill9();
  HostPages hp(layout, keys_of_group(1, 4));
  hp.fill(1);
  for (int i = 0; i < 5; ++i)
    REQUIRE(count(bounded(*tier, [&] { return tier->put(hp.pages); }), TierStatus::kUnavailable) == 4);
  REQUIRE(tier->health().breaker_open);
  REQUIRE(tier->health().connect_failures >= 3);
  server.start();
  require_recovers(*tier, layout, 200);
  REQUIRE_FALSE(tier->health().breaker_open);
}

TEST_CASE("redis tier faults: a connection cut at chosen byte offsets (relay)") {
  KVMM_REQUIRE_REDIS();
  RedisServer server;
  Relay relay(server.dir() + "/relay.sock", server.socket_path());
  const KVLayout layout = tier_layout();
  RedisTierOptions o = fault_options(relay.endpoint());
  o.connections = 1;           // every byte of the tier is on the one cut connection
  o.breaker_failures = 10000;  // the breaker has its own tests; here every command goes out
  auto tier = make_redis_tier(layout, tier_scope(), o);
  HostPages hp(layout, keys_of_group(1, 8));
  hp.fill(4);
  REQUIRE(count(bounded(*tier, [&] { return tier->put(hp.pages); }), TierStatus::kOk) == 8);

  const std::uint64_t value = kTierHeaderBytes + layout.small_page_bytes(1);
  const std::uint64_t head = 1 + std::to_string(value).size() + 2;  // "$<len>\r\n"
  const std::uint64_t reply = head + value + 2;                     // one GET reply
  int cuts = 0;
  // Server to client: inside a reply header, inside the value header, inside the payload,
  // exactly between replies, and inside a later reply.
  for (const std::uint64_t at : {std::uint64_t{1}, head - 1, head + 20, head + 100, reply, reply + 3,
                                 3 * reply + head + kTierHeaderBytes, 7 * reply + 1}) {
    INFO("reply stream cut after " << at << " bytes");
    relay.cut_next(Relay::Direction::kToClient, at);
    hp.sentinel();
    const auto st = bounded(*tier, [&] { return tier->get(hp.pages); });
    REQUIRE(relay.cuts() == ++cuts);
    REQUIRE(only(st, {TierStatus::kOk, TierStatus::kUnavailable}));
    REQUIRE(require_sound_get(hp, st, 4) == at / reply);  // exactly the replies fully received
    hp.sentinel();
    REQUIRE(require_sound_get(hp, bounded(*tier, [&] { return tier->get(hp.pages); }), 4) == 8);
  }
  // Client to server, mid-put: the server stores at most the commands it fully received (it
  // may drop the connection, on the failed write of an earlier reply, before executing the
  // last ones), each stored one exact.
  std::string key;
  format_tier_key("kvmm", tier->scope(), tier_key(1, 100), key);
  const std::uint64_t command = 4 + 9 + (1 + std::to_string(key.size()).size() + 2) + key.size() + 2 + head + value +
                                2 + 8;  // *4 $3 SET $<n> key $<len> value $2 NX
  std::uint64_t base = 100;
  for (const std::uint64_t at : {std::uint64_t{10}, command - 1, command, command + 5000, 3 * command + 70}) {
    INFO("command stream cut after " << at << " bytes");
    HostPages fresh(layout, keys_of_group(1, 6, base));
    base += 100;
    fresh.fill(5);
    relay.cut_next(Relay::Direction::kToServer, at);
    const auto st = bounded(*tier, [&] { return tier->put(fresh.pages); });
    REQUIRE(relay.cuts() == ++cuts);
    REQUIRE(only(st, {TierStatus::kOk, TierStatus::kUnavailable}));
    fresh.sentinel();
    REQUIRE(require_sound_get(fresh, bounded(*tier, [&] { return tier->get(fresh.pages); }), 5) <= at / command);
  }
  REQUIRE(tier->health().corrupt == 0);
  REQUIRE(tier->health().io_failures >= static_cast<std::uint64_t>(cuts));
}

TEST_CASE("redis tier faults: values corrupted in place are never loaded, counted and deleted") {
  KVMM_REQUIRE_REDIS();
  RedisServer server;
  const KVLayout layout = tier_layout();
  RedisTierOptions o = fault_options(server.endpoint());
  o.connections = 1;  // the DEL of a corrupt value goes before the next command
  auto tier = make_redis_tier(layout, tier_scope(), o);
  HostPages hp(layout, keys_of_group(0, 12));
  hp.fill(6);
  REQUIRE(count(bounded(*tier, [&] { return tier->put(hp.pages); }), TierStatus::kOk) == 12);
  auto name = [&](std::size_t i) { return tier_key_string(*tier, hp.keys[i]); };
  auto flip_at = [&](std::size_t i, std::uint64_t offset) {
    const std::string v = server.get(name(i));
    REQUIRE(offset < v.size());
    const std::string b(1, static_cast<char>(~v[offset]));
    REQUIRE(server.command({"SETRANGE", name(i), std::to_string(offset), b}));
  };
  const std::uint64_t value = kTierHeaderBytes + layout.small_page_bytes(0);
  flip_at(0, kTierHeaderBytes + 1000);  // payload
  flip_at(1, 3);                        // magic
  flip_at(2, value - 1);                // last payload byte
  flip_at(3, 20);                       // block hash
  const std::string v4 = server.get(name(4));
  REQUIRE(server.command({"SET", name(4), v4.substr(0, v4.size() - 1)}));  // truncated
  REQUIRE(server.command({"SET", name(5), server.get(name(6))}));          // another page's valid value
  REQUIRE(server.command({"APPEND", name(7), "x"}));                       // extended
  const std::vector<std::size_t> bad = {0, 1, 2, 3, 4, 5, 7};

  hp.sentinel();
  const auto st = bounded(*tier, [&] { return tier->get(hp.pages); });
  REQUIRE(require_sound_get(hp, st, 6) == 12 - bad.size());
  for (const std::size_t i : bad) REQUIRE(st[i] == TierStatus::kCorrupt);
  REQUIRE(tier->health().corrupt == bad.size());
  const auto present = bounded(*tier, [&] { return tier->contains(hp.keys); });
  for (std::size_t i = 0; i < 12; ++i) {
    const bool is_bad = std::find(bad.begin(), bad.end(), i) != bad.end();
    REQUIRE(present[i] == (is_bad ? TierStatus::kMiss : TierStatus::kOk));  // deleted
  }
  // A fresh put stores them again (SET NX: the key is free) and they load.
  hp.fill(6);
  REQUIRE(count(bounded(*tier, [&] { return tier->put(hp.pages); }), TierStatus::kOk) == 12);
  REQUIRE(tier->health().put_existing == 12 - bad.size());
  hp.sentinel();
  REQUIRE(require_sound_get(hp, bounded(*tier, [&] { return tier->get(hp.pages); }), 6) == 12);
}

TEST_CASE("redis tier faults: keys evicted by maxmemory read as misses, never as wrong bytes") {
  KVMM_REQUIRE_REDIS();
  RedisServer server({"--maxmemory", "4mb", "--maxmemory-policy", "allkeys-lru"});
  const KVLayout layout = tier_layout();
  auto tier = make_redis_tier(layout, tier_scope(), fault_options(server.endpoint()));
  HostPages hp(layout, keys_of_group(1, 128));  // 8 MiB of values into 4 MiB
  hp.fill(8);
  const auto put = bounded(*tier, [&] { return tier->put(hp.pages); });
  REQUIRE(only(put, {TierStatus::kOk, TierStatus::kUnavailable}));  // unavailable: an OOM error reply
  const auto present = bounded(*tier, [&] { return tier->contains(hp.keys); });
  REQUIRE(count(present, TierStatus::kMiss) > 0);
  REQUIRE(count(present, TierStatus::kOk) > 0);
  hp.sentinel();
  const auto st = bounded(*tier, [&] { return tier->get(hp.pages); });
  REQUIRE(only(st, {TierStatus::kOk, TierStatus::kMiss}));
  const std::size_t ok = require_sound_get(hp, st, 8);
  REQUIRE(ok > 0);
  REQUIRE(ok < 128);
  REQUIRE(tier->health().corrupt == 0);
}

TEST_CASE("redis tier faults: a durable server killed mid-put keeps every acknowledged page, exact") {
  KVMM_REQUIRE_REDIS();
  RedisServer server({"--appendonly", "yes", "--appendfsync", "always"});
  const KVLayout layout = tier_layout();
  auto tier = make_redis_tier(layout, tier_scope(), fault_options(server.endpoint()));
  HostPages hp(layout, keys_of_group(1, 300));
  hp.fill(11);
  const TierTicket t = tier->put(hp.pages);
  REQUIRE(wait_until([&] { return server.dbsize() >= 20; }, 5s));
  server.kill9();
  std::chrono::milliseconds waited{};
  const auto put = wait_ticket(*tier, t, 10s, &waited);
  REQUIRE_FALSE(put.empty());
  REQUIRE(waited <= kBound);
  REQUIRE(only(put, {TierStatus::kOk, TierStatus::kUnavailable, TierStatus::kTimeout}));
  REQUIRE(count(put, TierStatus::kOk) < put.size());
  server.start();  // reloads the append-only file
  require_recovers(*tier, layout, 7000);
  hp.sentinel();
  const auto got = bounded(*tier, [&] { return tier->get(hp.pages); });
  require_sound_get(hp, got, 11);
  for (std::size_t i = 0; i < put.size(); ++i) {
    INFO("page " << i << ": put " << to_string(put[i]) << ", get " << to_string(got[i]));
    if (put[i] == TierStatus::kOk) REQUIRE(got[i] == TierStatus::kOk);    // acknowledged: kept
    REQUIRE((got[i] == TierStatus::kOk || got[i] == TierStatus::kMiss));  // never corrupt
  }
  REQUIRE(count(put, TierStatus::kOk) > 0);  // replies already sent are read before the EOF
  REQUIRE(count(got, TierStatus::kOk) >= count(put, TierStatus::kOk));
}
