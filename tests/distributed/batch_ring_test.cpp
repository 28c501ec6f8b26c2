// BatchRing: a randomized single-threaded sequence of pushes and pops of random batches
// against a deque model (wrap-around, full ring, max_batches), then a producer and a
// consumer thread (run under TSan in scripts/test.sh) checking every popped batch.
#include "kvmm/distributed/detail/batch_ring.hpp"

#include <catch2/catch.hpp>

#include <deque>
#include <random>
#include <thread>

using namespace kvmm;

namespace {

KvEventBatch random_batch(std::mt19937_64& rng, std::uint64_t tag) {
  KvEventBatch b;
  const std::size_t events = 1 + rng() % 4;
  for (std::size_t i = 0; i < events; ++i) {
    KvEvent e;
    e.kind = static_cast<KvEventKind>(rng() % 3);
    e.group = static_cast<GroupId>(tag);
    e.num_pages = static_cast<std::uint32_t>(rng() % 9);
    b.events.push_back(e);
  }
  for (std::size_t i = rng() % 20; i > 0; --i) b.hashes.push_back(BlockHash{rng(), tag});
  for (std::size_t i = rng() % 70; i > 0; --i) b.tokens.push_back(static_cast<std::uint32_t>(rng()));
  for (std::size_t i = rng() % 11; i > 0; --i) b.text.push_back(static_cast<char>('a' + rng() % 26));
  for (std::size_t i = rng() % 3; i > 0; --i) b.items.push_back(KvEventItemKey{1, BlockHash{rng(), 1}, -3});
  return b;
}

bool same(const KvEventBatch& a, const KvEventBatch& b) {
  if (a.events.size() != b.events.size()) return false;
  for (std::size_t i = 0; i < a.events.size(); ++i)
    if (a.events[i].kind != b.events[i].kind || a.events[i].group != b.events[i].group ||
        a.events[i].num_pages != b.events[i].num_pages)
      return false;
  if (a.items.size() != b.items.size()) return false;
  for (std::size_t i = 0; i < a.items.size(); ++i)
    if (!(a.items[i].item_hash == b.items[i].item_hash) || a.items[i].offset != b.items[i].offset) return false;
  return a.hashes == b.hashes && a.tokens == b.tokens && a.text == b.text;
}

}  // namespace

TEST_CASE("BatchRing: randomized push/pop against a model") {
  for (const std::uint64_t seed : {1, 2, 3}) {
    std::mt19937_64 rng(seed);
    BatchRing ring(2048, 7);
    struct Entry {
      KvEventBatch batch;
      std::uint64_t seq;
      double ts;
    };
    std::deque<Entry> model;
    std::uint64_t seq = 0, full = 0;
    KvEventBatch out;
    for (int op = 0; op < 20000; ++op) {
      if (rng() % 2 == 0) {
        KvEventBatch b = random_batch(rng, seq);
        const bool ok = ring.push(b, seq, seq * 0.5);
        if (model.size() == 7) REQUIRE_FALSE(ok);
        if (BatchRing::record_bytes(b) > 2048) REQUIRE_FALSE(ok);
        // An empty ring takes any batch of up to half its capacity (a wrap wastes < one record).
        if (model.empty() && 2 * BatchRing::record_bytes(b) <= 2048) REQUIRE(ok);
        if (ok) {
          model.push_back(Entry{std::move(b), seq, seq * 0.5});
        } else {
          ++full;
        }
        ++seq;
      } else {
        std::uint64_t s = 0;
        double ts = 0;
        const bool ok = ring.pop(out, s, ts);
        REQUIRE(ok == !model.empty());
        if (!ok) continue;
        REQUIRE(s == model.front().seq);
        REQUIRE(ts == model.front().ts);
        REQUIRE(same(out, model.front().batch));
        model.pop_front();
      }
      REQUIRE(ring.size() == model.size());
    }
    CHECK(full > 0);  // the sequence did exercise a full ring
  }
}

TEST_CASE("BatchRing: a producer and a consumer thread") {
  BatchRing ring(4096, 16);
  constexpr std::uint64_t kBatches = 20000;
  std::thread producer([&ring] {
    std::mt19937_64 rng(9);
    for (std::uint64_t seq = 0; seq < kBatches;) {
      std::mt19937_64 copy = rng;
      const KvEventBatch b = random_batch(copy, seq);
      if (ring.push(b, seq, 0)) {
        rng = copy;
        ++seq;
      } else {
        std::this_thread::yield();
      }
    }
  });
  std::mt19937_64 rng(9);
  KvEventBatch out;
  std::uint64_t bad = 0;
  for (std::uint64_t want = 0; want < kBatches;) {
    std::uint64_t s = 0;
    double ts = 0;
    if (!ring.pop(out, s, ts)) {
      std::this_thread::yield();
      continue;
    }
    const KvEventBatch b = random_batch(rng, want);
    bad += s != want || !same(out, b);
    ++want;
  }
  producer.join();
  CHECK(bad == 0);
  CHECK(ring.empty());
}
