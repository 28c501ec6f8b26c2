// A seeded random sequence of thousands of tier operations against a model of the store:
// contains/get/put/remove tickets of 1..8 keys (sometimes two tickets with disjoint keys in
// flight at once), values corrupted in place and keys deleted behind the tier's back. Every
// status must be the model's, every loaded page byte-exact, every other page untouched; every
// 100 steps the server's whole content is checked against the model (key count, and each
// value verified by check_tier_value with the model's bytes).
#include "kvmm/distributed/tier_value.hpp"
#include "tier_fixture.hpp"

#include <map>
#include <set>
#include <thread>

using namespace kvmm;
using namespace kvmm::test;
using namespace std::chrono_literals;

namespace {

constexpr std::size_t kKeys = 48;

struct Model {
  std::map<std::size_t, std::uint64_t> version;  // present keys and the version stored
  std::set<std::size_t> corrupt;                 // present, but altered behind the tier's back
  bool has(std::size_t k) const { return version.count(k) != 0; }
};

class RandomRun {
 public:
  RandomRun(RedisServer& server, std::uint32_t connections, std::uint64_t seed)
      : server_(server),
        layout_(KVLayout::plan({LayerGroup::full_attention("full", 1, 1, 16, 2, 4),
                                LayerGroup::sliding_window("swa", 1, 2, 16, 2, 4, 16)})),
        rng_(seed) {
    RedisTierOptions o;
    o.endpoint = server.endpoint();
    o.connections = connections;
    o.pipeline_depth = 4;  // tickets of up to 8 keys wait for pipeline room
    o.command_timeout = 5000ms;
    o.doze_window = connections == 1 ? 0ms : 50ms;  // one run on the plain wake-up path, one dozing
    tier_ = make_redis_tier(layout_, tier_scope(), o);
    for (std::size_t i = 0; i < kKeys; ++i) {
      keys_.push_back(tier_key(static_cast<GroupId>(i % 2), i));
      names_.push_back(tier_key_string(*tier_, keys_.back()));
    }
  }

  void run(int steps) {
    for (int step = 1; step <= steps; ++step) {
      INFO("step " << step);
      const auto op = rng_() % 100;
      if (op < 5)
        corrupt_one();
      else if (op < 10)
        delete_one();
      else if (op < 20)
        two_at_once(step);
      else
        one_ticket(static_cast<TierOp>(rng_() % 4), pick(), step);
      if (step % 100 == 0) check_server();
    }
    check_server();
    const TierHealth h = tier_->health();
    REQUIRE(h.corrupt == corrupt_found_);
    REQUIRE(h.timeouts == 0);
    REQUIRE(h.unavailable == 0);
    REQUIRE(h.put_existing == put_existing_);
    REQUIRE(corrupt_found_ > 10);  // the sequence did exercise the paths it checks
    REQUIRE(put_existing_ > 100);
  }

 private:
  std::vector<std::size_t> pick() {
    std::vector<std::size_t> all(kKeys);
    for (std::size_t i = 0; i < kKeys; ++i) all[i] = i;
    std::shuffle(all.begin(), all.end(), rng_);
    all.resize(1 + rng_() % 8);
    return all;
  }

  TierTicket submit(TierOp op, HostPages& hp) {
    switch (op) {
      case TierOp::kContains:
        return tier_->contains(hp.keys);
      case TierOp::kRemove:
        return tier_->remove(hp.keys);
      case TierOp::kGet:
        hp.sentinel();
        return tier_->get(hp.pages);
      case TierOp::kPut:
        return tier_->put(hp.pages);
    }
    return 0;
  }

  std::unique_ptr<HostPages> pages(const std::vector<std::size_t>& ks, std::uint64_t version) {
    std::vector<TierKey> k;
    for (const std::size_t i : ks) k.push_back(keys_[i]);
    auto hp = std::make_unique<HostPages>(layout_, k);
    hp->fill(version);
    return hp;
  }

  void one_ticket(TierOp op, const std::vector<std::size_t>& ks, std::uint64_t version) {
    auto hp = pages(ks, version);
    const auto st = wait_ticket(*tier_, submit(op, *hp), 10s);
    check(op, ks, *hp, st, version);
  }

  void two_at_once(std::uint64_t version) {
    const auto ks = pick();
    const std::size_t half = ks.size() / 2;
    const std::vector<std::size_t> a(ks.begin(), ks.begin() + static_cast<std::ptrdiff_t>(half));
    const std::vector<std::size_t> b(ks.begin() + static_cast<std::ptrdiff_t>(half), ks.end());
    const auto op_a = static_cast<TierOp>(rng_() % 4), op_b = static_cast<TierOp>(rng_() % 4);
    auto pa = pages(a, version), pb = pages(b, version);
    const TierTicket ta = submit(op_a, *pa), tb = submit(op_b, *pb);
    std::vector<std::vector<TierStatus>> st;
    REQUIRE(wait_tickets(*tier_, {ta, tb}, 10s, st));
    check(op_a, a, *pa, st[0], version);
    check(op_b, b, *pb, st[1], version);
  }

  // The statuses `st` of op on keys `ks` against the model, which it then updates.
  void check(TierOp op, const std::vector<std::size_t>& ks, const HostPages& hp, const std::vector<TierStatus>& st,
             std::uint64_t version) {
    REQUIRE(st.size() == ks.size());
    for (std::size_t j = 0; j < ks.size(); ++j) {
      const std::size_t k = ks[j];
      INFO(to_string(op) << " key " << k << " status " << to_string(st[j]));
      const bool has = model_.has(k), bad = model_.corrupt.count(k) != 0;
      switch (op) {
        case TierOp::kContains:
          REQUIRE(st[j] == (has ? TierStatus::kOk : TierStatus::kMiss));
          break;
        case TierOp::kRemove:
          REQUIRE(st[j] == (has ? TierStatus::kOk : TierStatus::kMiss));
          model_.version.erase(k);
          model_.corrupt.erase(k);
          break;
        case TierOp::kPut:
          REQUIRE(st[j] == TierStatus::kOk);
          if (has)
            ++put_existing_;
          else
            model_.version[k] = version;
          break;
        case TierOp::kGet:
          if (!has) {
            REQUIRE(st[j] == TierStatus::kMiss);
            REQUIRE(hp.untouched(j));
          } else if (bad) {
            REQUIRE(st[j] == TierStatus::kCorrupt);
            REQUIRE(hp.untouched(j));
            ++corrupt_found_;
            model_.version.erase(k);
            model_.corrupt.erase(k);
            // The tier deletes it asynchronously; later tickets may use another connection.
            const auto until = std::chrono::steady_clock::now() + 5s;
            while (server_.exists(names_[k]) && std::chrono::steady_clock::now() < until)
              std::this_thread::sleep_for(1ms);
            REQUIRE_FALSE(server_.exists(names_[k]));
          } else {
            REQUIRE(st[j] == TierStatus::kOk);
            REQUIRE(hp.equals(j, model_.version.at(k)));
          }
          break;
      }
    }
  }

  void corrupt_one() {
    if (model_.version.empty()) return;
    auto it = model_.version.begin();
    std::advance(it, static_cast<std::ptrdiff_t>(rng_() % model_.version.size()));
    const std::size_t k = it->first;
    const std::string v = server_.get(names_[k]);
    REQUIRE_FALSE(v.empty());
    const std::uint64_t at = rng_() % v.size();
    REQUIRE(server_.command({"SETRANGE", names_[k], std::to_string(at), std::string(1, static_cast<char>(~v[at]))}));
    model_.corrupt.insert(k);
  }

  void delete_one() {  // an eviction, as far as the tier can tell
    const std::size_t k = rng_() % kKeys;
    REQUIRE(server_.command({"DEL", names_[k]}));
    model_.version.erase(k);
    model_.corrupt.erase(k);
  }

  void check_server() {
    REQUIRE(server_.dbsize() == static_cast<long long>(model_.version.size()));
    for (const auto& [k, version] : model_.version) {
      const std::string v = server_.get(names_[k]);
      const std::uint64_t bytes = layout_.small_page_bytes(keys_[k].group);
      const TierValueIdentity id{tier_->scope(), keys_[k], 4, bytes};
      const bool valid = check_tier_value(std::as_bytes(std::span(v)), id) == TierValueError::kNone;
      REQUIRE(valid == (model_.corrupt.count(k) == 0));
      if (!valid) continue;
      std::vector<std::byte> want(bytes);
      fill_page(want.data(), bytes, keys_[k], version);
      REQUIRE(std::memcmp(v.data() + kTierHeaderBytes, want.data(), bytes) == 0);
    }
  }

  RedisServer& server_;
  KVLayout layout_;
  std::mt19937_64 rng_;
  std::unique_ptr<KVTier> tier_;
  std::vector<TierKey> keys_;
  std::vector<std::string> names_;
  Model model_;
  std::uint64_t corrupt_found_ = 0, put_existing_ = 0;
};

}  // namespace

TEST_CASE("redis tier: a seeded random operation sequence matches a model of the store") {
  KVMM_REQUIRE_REDIS();
  RedisServer server;
  for (const std::uint32_t connections : {1u, 3u}) {
    INFO("connections " << connections);
    REQUIRE(server.command({"FLUSHALL"}));
    RandomRun(server, connections, 20261124 + connections).run(2500);
  }
}
