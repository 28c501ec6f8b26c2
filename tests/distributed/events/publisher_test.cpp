// KvEventPublisher end to end over real ZeroMQ sockets with an independent Python consumer
// (kv_consumer.py: vLLM's schema, gap detection, replay): a randomized prefix-cache model
// produces >= 1e5 operations per run; at checkpoints every consumer's rebuilt set equals the
// model's, for both encodings, with simulated gaps, a late joiner, and a consumer killed and
// restarted ([python]: these fork a consumer, which ThreadSanitizer does not support in a
// threaded process, so the TSan stage runs the rest). Also: no heap allocation per publish on the scheduler thread, a
// dropped batch is counted and leaves a gap, and vLLM's data-parallel endpoint rule.
#include "event_harness.hpp"
#include "kvmm/distributed/detail/batch_ring.hpp"
#include "kvmm/distributed/event_publisher.hpp"
#include "kvmm/error.hpp"
#include "support/count_new.hpp"

#include <catch2/catch.hpp>

#include <filesystem>
#include <memory>
#include <random>
#include <unordered_map>

using namespace kvmm;
using namespace kvmm::test;

namespace {

constexpr std::uint32_t kTpp = 4;

KVLayout model_layout() {
  return KVLayout::plan({LayerGroup::full_attention("full", 2, 2, 64, 2, kTpp),
                         LayerGroup::sliding_window("swa", 2, 2, 64, 2, kTpp, 16),
                         LayerGroup::cross_attention("cross", 1, 2, 64, 2, kTpp)});
}

// A prefix cache as a set of cached pages per group: stored runs extend a random cached
// page (or start a request at page 0), removed runs drop random cached pages, clears drop
// all. Group 2 is cross attention: its events are generated and must not reach the wire.
class PrefixCacheModel : public BatchSource {
 public:
  PrefixCacheModel(const KVLayout& layout, std::uint64_t seed, std::uint64_t ops)
      : layout_(layout), rng_(seed), ops_left_(ops), groups_(layout.num_groups()) {}

  bool next(KvEventBatch& b) override {
    b.clear();
    if (ops_left_ == 0) return false;
    const std::uint64_t n = std::min<std::uint64_t>(ops_left_, 1 + rng_() % 64);
    for (std::uint64_t i = 0; i < n; ++i) {
      const std::uint64_t r = rng_() % 1000;
      const GroupId g = static_cast<GroupId>(rng_() % layout_.num_groups());
      if (r < 1)
        clear(b);
      else if (r < 600 || groups_[g].pages.empty())
        store(b, g);
      else
        remove(b, g);
    }
    ops_left_ -= n;
    return true;
  }
  SetDigest expected() const override { return expected_; }

 private:
  struct Page {
    BlockHash hash;
    std::uint64_t index;  // page index in its request
  };
  struct Group {
    std::vector<Page> pages;
    std::unordered_map<std::uint64_t, std::size_t> at;  // hash.lo -> position in pages
  };

  bool counted(GroupId g) const { return layout_.group(g).is_decoder(); }

  void store(KvEventBatch& b, GroupId g) {
    Group& grp = groups_[g];
    KvEvent e;
    e.kind = KvEventKind::kStored;
    e.medium = rng_() % 4 == 0 ? Medium::kHost : Medium::kDevice;
    e.group = g;
    if (!grp.pages.empty() && rng_() % 2 == 0) {
      const Page& parent = grp.pages[rng_() % grp.pages.size()];
      e.has_parent = true;
      e.parent = parent.hash;
      e.first_page = parent.index + 1;
    }
    e.num_pages = 1 + static_cast<std::uint32_t>(rng_() % 8);
    e.tokens_per_page = kTpp;
    e.hash_begin = static_cast<std::uint32_t>(b.hashes.size());
    e.token_begin = b.tokens.size();
    e.lora_id = rng_() % 3 == 0 ? 5 : 0;
    if (e.first_page == 0 && rng_() % 4 == 0) {
      e.salt_begin = static_cast<std::uint32_t>(b.text.size());
      e.salt_size = 4;
      b.text += "salt";
    }
    if (rng_() % 5 == 0) {
      e.item_begin = static_cast<std::uint32_t>(b.items.size());
      e.num_items = 1;
      b.items.push_back(KvEventItemKey{static_cast<std::uint32_t>(rng_() % e.num_pages), BlockHash{rng_(), rng_()},
                                       static_cast<std::int64_t>(rng_() % 5) - 1});
    }
    for (std::uint32_t p = 0; p < e.num_pages; ++p) {
      BlockHash h{rng_(), rng_()};
      while (grp.at.count(h.lo) != 0) h.lo = rng_();
      b.hashes.push_back(h);
      grp.at[h.lo] = grp.pages.size();
      grp.pages.push_back(Page{h, e.first_page + p});
      if (counted(g)) {
        ++expected_.blocks;
        expected_.digest += block_mix(g, h.lo);
      }
      for (std::uint32_t t = 0; t < kTpp; ++t) b.tokens.push_back(static_cast<std::uint32_t>(rng_() % 200000));
    }
    b.events.push_back(e);
  }

  void remove(KvEventBatch& b, GroupId g) {
    Group& grp = groups_[g];
    KvEvent e;
    e.kind = KvEventKind::kRemoved;
    e.group = g;
    e.hash_begin = static_cast<std::uint32_t>(b.hashes.size());
    e.num_pages = static_cast<std::uint32_t>(std::min<std::size_t>(grp.pages.size(), 1 + rng_() % 4));
    for (std::uint32_t i = 0; i < e.num_pages; ++i) {
      const std::size_t at = rng_() % grp.pages.size();
      const BlockHash h = grp.pages[at].hash;
      b.hashes.push_back(h);
      grp.at[grp.pages.back().hash.lo] = at;
      grp.pages[at] = grp.pages.back();
      grp.pages.pop_back();
      grp.at.erase(h.lo);
      if (counted(g)) {
        --expected_.blocks;
        expected_.digest -= block_mix(g, h.lo);
      }
    }
    b.events.push_back(e);
  }

  void clear(KvEventBatch& b) {
    KvEvent e;
    e.kind = KvEventKind::kCleared;
    b.events.push_back(e);
    for (Group& grp : groups_) {
      grp.pages.clear();
      grp.at.clear();
    }
    expected_ = SetDigest{};
  }

  KVLayout layout_;
  std::mt19937_64 rng_;
  std::uint64_t ops_left_;
  std::vector<Group> groups_;
  SetDigest expected_;
};

}  // namespace

TEST_CASE("publisher: a Python consumer rebuilds the cached set through the wire, map encoding", "[python]") {
  KVMM_REQUIRE_PYTHON();
  ::signal(SIGPIPE, SIG_IGN);
  const KVLayout layout = model_layout();
  for (const std::uint64_t seed : {1, 2}) {
    INFO("seed " << seed);
    PrefixCacheModel model(layout, seed, 100000);
    run_stream(layout, model, EventEncoding::kMap, 100000 / 32);  // ~32 operations a batch
  }
}

TEST_CASE("publisher: a Python consumer rebuilds the cached set through the wire, array encoding", "[python]") {
  KVMM_REQUIRE_PYTHON();
  ::signal(SIGPIPE, SIG_IGN);
  const KVLayout layout = model_layout();
  for (const std::uint64_t seed : {3, 4}) {
    INFO("seed " << seed);
    PrefixCacheModel model(layout, seed, 100000);
    run_stream(layout, model, EventEncoding::kArray, 100000 / 32);
  }
}

TEST_CASE("publisher: publish() makes no heap allocation on the scheduler thread in steady state") {
  TempDir dir;
  const KVLayout layout = model_layout();
  EventPublisherOptions opt;
  opt.endpoint = "ipc://" + (dir.path / "pub").string();
  opt.buffer_steps = 64;
  KvEventPublisher pub(layout, opt);
  PrefixCacheModel model(layout, 7, ~0ULL);
  std::vector<KvEventBatch> batches(256);
  for (auto& b : batches) {
    model.next(b);
  }
  for (const auto& b : batches) pub.publish(b);
  REQUIRE(pub.flush(std::chrono::seconds(30)));
  const std::uint64_t before = thread_heap_allocations();
  for (int round = 0; round < 4; ++round) {
    for (const auto& b : batches) pub.publish(b);
    REQUIRE(pub.flush(std::chrono::seconds(30)));  // flush itself only sleeps
  }
  CHECK(thread_heap_allocations() - before == 0);
  CHECK(pub.stats().published == 5 * batches.size());
  CHECK(pub.stats().dropped == 0);
}

TEST_CASE("publisher: a batch that does not fit is dropped, counted, and leaves a gap", "[python]") {
  KVMM_REQUIRE_PYTHON();
  ::signal(SIGPIPE, SIG_IGN);
  TempDir dir;
  const KVLayout layout = model_layout();
  EventPublisherOptions opt;
  opt.endpoint = "ipc://" + (dir.path / "pub").string();
  opt.replay_endpoint = "ipc://" + (dir.path / "replay").string();
  opt.queue_bytes = 4096;
  KvEventPublisher pub(layout, opt);
  ConsumerProcess consumer(pub.endpoint(), pub.replay_endpoint(), "", 0);
  REQUIRE(consumer.ready());
  KvEventBatch small, big;
  PrefixCacheModel model(layout, 11, ~0ULL);
  do model.next(small);
  while (BatchRing::record_bytes(small) > 1024);
  do model.next(big);
  while (BatchRing::record_bytes(big) <= 4096);
  CHECK(pub.publish(small, 1.0));
  CHECK_FALSE(pub.publish(big, 2.0));
  CHECK(pub.publish(small, 3.0));
  REQUIRE(pub.flush(std::chrono::seconds(30)));
  CHECK(pub.stats().dropped == 1);
  CHECK(pub.stats().sent == 2);
  CHECK(pub.next_sequence() == 3);
  const auto s = consumer.sync(2);
  REQUIRE(s.has_value());
  CHECK(s->lost == 1);  // sequence 1 never existed: the consumer knows it missed a batch
  CHECK(s->last_seq == 2);
}

TEST_CASE("publisher: options and vLLM's data-parallel endpoint rule") {
  CHECK(KvEventPublisher::offset_endpoint("tcp://*:5557", 0) == "tcp://*:5557");
  CHECK(KvEventPublisher::offset_endpoint("tcp://*:5557", 2) == "tcp://*:5559");
  CHECK(KvEventPublisher::offset_endpoint("tcp://10.0.0.1:6000", 1) == "tcp://10.0.0.1:6001");
  CHECK(KvEventPublisher::offset_endpoint("ipc:///tmp/kv", 3) == "ipc:///tmp/kv_dp3");
  CHECK_THROWS_WITH(KvEventPublisher::offset_endpoint("tcp://*:65535", 1), Catch::Contains("data_parallel_rank = 1"));
  const KVLayout layout = model_layout();
  EventPublisherOptions opt;
  opt.endpoint = "bogus://x";
  CHECK_THROWS_WITH(KvEventPublisher(layout, opt), Catch::Contains("endpoint = 'bogus://x'"));
  opt.endpoint = "";
  CHECK_THROWS_WITH(KvEventPublisher(layout, opt), Catch::Contains("endpoint is empty"));
  // Encodings outside their enums are refused here, not on the publisher thread.
  TempDir enum_dir;
  opt.endpoint = "ipc://" + (enum_dir.path / "pub").string();
  opt.encoding = static_cast<EventEncoding>(5);
  CHECK_THROWS_WITH(KvEventPublisher(layout, opt), Catch::Contains("EventEncodeOptions.encoding = 5"));
  opt.encoding = EventEncoding::kMap;
  opt.hash_format = static_cast<EventHashFormat>(2);
  CHECK_THROWS_WITH(KvEventPublisher(layout, opt), Catch::Contains("EventEncodeOptions.hash_format = 2"));
  opt.hash_format = EventHashFormat::kU64;
  // A malformed batch is refused before it takes a sequence number.
  TempDir dir;
  opt.endpoint = "ipc://" + (dir.path / "pub").string();
  KvEventPublisher pub(layout, opt);
  KvEventBatch b;
  KvEvent e;
  e.group = 9;
  e.num_pages = 1;
  b.events.push_back(e);
  CHECK_THROWS_WITH(pub.publish(b, 0.0), Catch::Contains("events[0].group = 9"));
  CHECK(pub.next_sequence() == 0);
}
