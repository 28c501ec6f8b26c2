// RedisTier against a real redis-server, no faults: options are validated; put/get/contains/
// remove round-trip byte-exact; a put is SET NX (first writer wins); the stored key and value
// are the documented ones; another scope sees nothing; the event fd is readable exactly
// while completions wait; submissions are spread over the connections and pipelined.
#include "kvmm/distributed/tier_value.hpp"
#include "kvmm/error.hpp"
#include "tier_fixture.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

using namespace kvmm;
using namespace kvmm::test;
using namespace std::chrono_literals;

namespace {

RedisTierOptions options_for(const std::string& endpoint) {
  RedisTierOptions o;
  o.endpoint = endpoint;
  o.command_timeout = 2000ms;
  return o;
}

std::vector<TierKey> keys(std::size_t n, std::uint64_t base = 0) {
  std::vector<TierKey> k;
  for (std::size_t i = 0; i < n; ++i) k.push_back(tier_key(static_cast<GroupId>(i % 2), base + i));
  return k;
}

bool readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1;
}

}  // namespace

TEST_CASE("redis tier: bad options and bad keys are rejected naming the field") {
  const KVLayout layout = tier_layout();
  auto expect = [&](RedisTierOptions o, const char* what) {
    try {
      make_redis_tier(layout, tier_scope(), o);
      FAIL("no error for " << what);
    } catch (const Error& e) {
      REQUIRE_THAT(e.what(), Catch::Contains(what));
    }
  };
  RedisTierOptions o;
  o.endpoint = "redis://localhost";
  expect(o, "endpoint = 'redis://localhost'");
  o.endpoint = "tcp:localhost:0";
  expect(o, "endpoint = 'tcp:localhost:0'");
  o.endpoint = "unix:/tmp/x.sock";
  o.connections = 0;
  expect(o, "connections = 0");
  o.connections = 2;
  o.pipeline_depth = 0;
  expect(o, "pipeline_depth = 0");
  o.pipeline_depth = 8;
  o.command_timeout = 0ms;
  expect(o, "command_timeout = 0");
  o.command_timeout = 10ms;
  o.doze_interval = 0us;
  expect(o, "doze_interval = 0 us");
  o.doze_interval = 200us;
  o.key_prefix = "";
  expect(o, "key_prefix");

  o.key_prefix = "kvmm";
  auto tier = make_redis_tier(layout, tier_scope(), o);  // no server: nothing connects yet
  const TierKey bad{7, BlockHash{1, 2}};
  REQUIRE_THROWS_WITH(tier->contains(std::span(&bad, 1)), Catch::Contains("group = 7"));
  const TierPage null_page{TierKey{0, BlockHash{1, 2}}, nullptr};
  REQUIRE_THROWS_WITH(tier->put(std::span(&null_page, 1)), Catch::Contains("data = null"));
  TierResults r;
  REQUIRE(tier->poll(r) == 0);  // nothing was submitted
}

TEST_CASE("redis tier: round trip, SET NX, key and value format, scope isolation, event fd") {
  KVMM_REQUIRE_REDIS();
  RedisServer server;
  const KVLayout layout = tier_layout();
  auto tier = make_redis_tier(layout, tier_scope(), options_for(server.endpoint()));
  HostPages hp(layout, keys(40));
  hp.fill(1);

  REQUIRE(count(wait_ticket(*tier, tier->contains(hp.keys), 5s), TierStatus::kMiss) == 40);
  const TierTicket put = tier->put(hp.pages);
  REQUIRE(put != 0);
  REQUIRE(count(wait_ticket(*tier, put, 5s), TierStatus::kOk) == 40);
  REQUIRE(server.dbsize() == 40);
  REQUIRE(tier->health().bytes_put == 20 * layout.small_page_bytes(0) + 20 * layout.small_page_bytes(1));

  // The stored value is the documented one: header + page, verifiable by check_tier_value.
  const std::string v = server.get(tier_key_string(*tier, hp.keys[3]));
  REQUIRE(v.size() == kTierHeaderBytes + layout.small_page_bytes(1));
  const TierValueIdentity id{tier->scope(), hp.keys[3], 16, layout.small_page_bytes(1)};
  REQUIRE(check_tier_value(std::as_bytes(std::span(v)), id) == TierValueError::kNone);
  REQUIRE(std::memcmp(v.data() + kTierHeaderBytes, hp.bytes[3].data(), hp.bytes[3].size()) == 0);

  // First writer wins: version 2 of the same keys is answered ok but not stored.
  hp.fill(2);
  REQUIRE(count(wait_ticket(*tier, tier->put(hp.pages), 5s), TierStatus::kOk) == 40);
  REQUIRE(tier->health().put_existing == 40);
  hp.sentinel();
  REQUIRE(require_sound_get(hp, wait_ticket(*tier, tier->get(hp.pages), 5s), 1) == 40);

  // Another TP rank is another scope: nothing is visible to it.
  auto other = make_redis_tier(layout, tier_scope(1), options_for(server.endpoint()));
  REQUIRE(other->scope() != tier->scope());
  hp.sentinel();
  REQUIRE(require_sound_get(hp, wait_ticket(*other, other->get(hp.pages), 5s), 1) == 0);
  REQUIRE(other->health().misses == 40);

  // Remove half; contains and get then miss exactly those.
  const std::vector<TierKey> half(hp.keys.begin(), hp.keys.begin() + 20);
  REQUIRE(count(wait_ticket(*tier, tier->remove(half), 5s), TierStatus::kOk) == 20);
  REQUIRE(count(wait_ticket(*tier, tier->remove(half), 5s), TierStatus::kMiss) == 20);
  const auto present = wait_ticket(*tier, tier->contains(hp.keys), 5s);
  for (std::size_t i = 0; i < 40; ++i) REQUIRE(present[i] == (i < 20 ? TierStatus::kMiss : TierStatus::kOk));
  REQUIRE(server.dbsize() == 20);

  // The event fd: readable while a completion waits, not after poll took it.
  const TierTicket t = tier->contains(hp.keys);
  pollfd p{tier->event_fd(), POLLIN, 0};
  REQUIRE(::poll(&p, 1, 5000) == 1);
  TierResults r;
  std::size_t got = 0;
  while (got == 0) got = tier->poll(r);
  REQUIRE(r.completions.size() == 1);
  REQUIRE(r.completions[0].ticket == t);
  REQUIRE(r.completions[0].op == TierOp::kContains);
  REQUIRE(r.status_of(r.completions[0]).size() == 40);
  REQUIRE_FALSE(readable(tier->event_fd()));
  // An empty submission completes at once.
  const TierTicket e = tier->get(std::span<const TierPage>());
  std::vector<std::vector<TierStatus>> done;
  REQUIRE(wait_tickets(*tier, {e}, 1s, done));
  REQUIRE(done[0].empty());
  const TierHealth h = tier->health();
  REQUIRE(h.corrupt == 0);
  REQUIRE(h.timeouts == 0);
  REQUIRE(h.unavailable == 0);
  REQUIRE_FALSE(h.breaker_open);
}

TEST_CASE("redis tier: notify_when_armed: the event fd is readable only for a completion after arm()") {
  KVMM_REQUIRE_REDIS();
  RedisServer server;
  const KVLayout layout = tier_layout();
  RedisTierOptions o = options_for(server.endpoint());
  o.notify_when_armed = true;
  auto tier = make_redis_tier(layout, tier_scope(), o);
  HostPages hp(layout, keys(8));
  hp.fill(1);
  TierResults r;
  for (int round = 0; round < 20; ++round) {
    // Not armed: the completion arrives through poll() alone; the fd stays unreadable.
    const TierTicket t = tier->put(hp.pages);
    const auto until = std::chrono::steady_clock::now() + 5s;
    r.clear();
    while (tier->poll(r) == 0 && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(100us);
    REQUIRE(r.completions.size() == 1);
    REQUIRE(r.completions[0].ticket == t);
    REQUIRE_FALSE(readable(tier->event_fd()));
    // Armed with nothing pending: the next completion makes it readable, poll() clears it.
    REQUIRE(tier->arm());
    const TierTicket c = tier->contains(hp.keys);
    pollfd p{tier->event_fd(), POLLIN, 0};
    REQUIRE(::poll(&p, 1, 5000) == 1);
    REQUIRE_FALSE(tier->arm());  // a completion waits: poll it instead of sleeping
    r.clear();
    REQUIRE(tier->poll(r) == 1);
    REQUIRE(r.completions[0].ticket == c);
    REQUIRE(count(std::vector<TierStatus>(r.statuses.begin(), r.statuses.end()), TierStatus::kOk) == 8);
    REQUIRE_FALSE(readable(tier->event_fd()));
  }
}

TEST_CASE("redis tier: many tickets in flight complete once each, in any order, all correct") {
  KVMM_REQUIRE_REDIS();
  RedisServer server;
  const KVLayout layout = tier_layout();
  RedisTierOptions o = options_for(server.endpoint());
  o.connections = 3;
  o.pipeline_depth = 8;  // smaller than a ticket: keys wait for room in the pipeline
  // The plain path (every submission wakes its I/O thread) and the dozing one.
  o.doze_window = GENERATE(0ms, 50ms);
  auto tier = make_redis_tier(layout, tier_scope(), o);
  std::vector<std::unique_ptr<HostPages>> sets;
  std::vector<TierTicket> tickets;
  for (int s = 0; s < 30; ++s) {
    sets.push_back(std::make_unique<HostPages>(layout, keys(1 + static_cast<std::size_t>(s) * 3 % 50, s * 1000)));
    sets.back()->fill(5);
    tickets.push_back(tier->put(sets.back()->pages));
  }
  TierResults r;
  std::vector<int> seen(tickets.size(), 0);
  const auto until = std::chrono::steady_clock::now() + 10s;
  std::size_t done = 0;
  while (done < tickets.size() && std::chrono::steady_clock::now() < until) {
    r.clear();
    tier->poll(r);
    for (const TierCompletion& c : r.completions) {
      const auto i = static_cast<std::size_t>(std::find(tickets.begin(), tickets.end(), c.ticket) - tickets.begin());
      REQUIRE(i < tickets.size());
      ++seen[i];
      ++done;
      REQUIRE(c.num_keys == sets[i]->keys.size());
      for (const TierStatus st : r.status_of(c)) REQUIRE(st == TierStatus::kOk);
    }
    pollfd p{tier->event_fd(), POLLIN, 0};
    ::poll(&p, 1, 100);
  }
  REQUIRE(done == tickets.size());
  for (const int n : seen) REQUIRE(n == 1);
  for (auto& s : sets) {
    s->sentinel();
    REQUIRE(require_sound_get(*s, wait_ticket(*tier, tier->get(s->pages), 5s), 5) == s->keys.size());
  }
}

TEST_CASE("redis tier: a TCP endpoint round-trips too") {
  KVMM_REQUIRE_REDIS();
  // A free loopback port: bind port 0, read it back, release it for the server.
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  REQUIRE(::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  const std::string port = std::to_string(ntohs(a.sin_port));
  ::close(s);
  RedisServer server({"--port", port, "--bind", "127.0.0.1"});
  const KVLayout layout = tier_layout();
  auto tier = make_redis_tier(layout, tier_scope(), options_for("tcp:127.0.0.1:" + port));
  HostPages hp(layout, keys(6));
  hp.fill(9);
  REQUIRE(count(wait_ticket(*tier, tier->put(hp.pages), 5s), TierStatus::kOk) == 6);
  hp.sentinel();
  REQUIRE(require_sound_get(hp, wait_ticket(*tier, tier->get(hp.pages), 5s), 9) == 6);
  REQUIRE(server.dbsize() == 6);
}

TEST_CASE("redis tier: ttl_ms gives every stored page an expiry") {
  KVMM_REQUIRE_REDIS();
  RedisServer server;
  const KVLayout layout = tier_layout();
  RedisTierOptions o = options_for(server.endpoint());
  o.ttl_ms = 60000;
  auto tier = make_redis_tier(layout, tier_scope(), o);
  HostPages hp(layout, keys(4));
  hp.fill(1);
  REQUIRE(count(wait_ticket(*tier, tier->put(hp.pages), 5s), TierStatus::kOk) == 4);
  for (const TierKey& k : hp.keys) {
    const Reply r = server.command({"PTTL", tier_key_string(*tier, k)});
    REQUIRE(r);
    REQUIRE(r->type == REDIS_REPLY_INTEGER);
    REQUIRE(r->integer > 50000);
    REQUIRE(r->integer <= 60000);
  }
  // Without ttl_ms a key has none (PTTL -1).
  auto plain = make_redis_tier(layout, tier_scope(1), options_for(server.endpoint()));
  REQUIRE(count(wait_ticket(*plain, plain->put(hp.pages), 5s), TierStatus::kOk) == 4);
  const Reply r = server.command({"PTTL", tier_key_string(*plain, hp.keys[0])});
  REQUIRE(r->integer == -1);
}

TEST_CASE("redis tier: two engines writing the same pages at once: one value per key, whole and valid") {
  KVMM_REQUIRE_REDIS();
  RedisServer server;
  const KVLayout layout = tier_layout();
  auto a = make_redis_tier(layout, tier_scope(), options_for(server.endpoint()));
  auto b = make_redis_tier(layout, tier_scope(), options_for(server.endpoint()));
  REQUIRE(a->scope() == b->scope());
  HostPages pa(layout, keys(64)), pb(layout, keys(64));
  pa.fill(1);
  pb.fill(2);
  const TierTicket ta = a->put(pa.pages), tb = b->put(pb.pages);
  REQUIRE(count(wait_ticket(*a, ta, 5s), TierStatus::kOk) == 64);
  REQUIRE(count(wait_ticket(*b, tb, 5s), TierStatus::kOk) == 64);
  REQUIRE(a->health().put_existing + b->health().put_existing == 64);  // SET NX: one writer per key
  pa.sentinel();
  REQUIRE(count(wait_ticket(*a, a->get(pa.pages), 5s), TierStatus::kOk) == 64);
  for (std::size_t i = 0; i < 64; ++i) REQUIRE((pa.equals(i, 1) || pa.equals(i, 2)));  // never a mix
}
