// The KV event validator and encoder against malformed batches (issue 29 item 11): every
// field out of range (kinds and media outside their enums, groups, page counts, hash /
// token / salt / item ranges, item order, the options' enums) is refused by both
// validate_kv_event_batch and encode_kv_event_batch with kvmm::Error naming the field,
// and the encoder leaves its output exactly as it was. Random batches, valid or with one
// field broken, check the same and that every encoded batch is one complete msgpack value.
#include "event_fixture.hpp"
#include "fuzz/msgpack_walk.hpp"
#include "kvmm/distributed/kv_event_encoding.hpp"
#include "kvmm/error.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

using namespace kvmm;
using kvmm::test::test_batch;
using kvmm::test::test_layout;

namespace {

const std::vector<std::uint8_t> kPrefix{0xde, 0xad, 0xbe, 0xef};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

// The encoder's error for `b`, checking it wrote nothing after what `out` held.
std::string encode_error(const KvEventBatch& b, const KVLayout& layout, const EventEncodeOptions& o = {}) {
  std::vector<std::uint8_t> out = kPrefix;
  const std::string e = error_of([&] { encode_kv_event_batch(b, layout, 1.0, o, out); });
  CHECK(out == kPrefix);
  return e;
}

template <typename T>
T as_enum(unsigned v) {
  return static_cast<T>(v);
}

}  // namespace

TEST_CASE("events validation: every field out of range is refused naming it, nothing written",
          "[dist][events][errors]") {
  const KVLayout layout = test_layout();
  constexpr std::uint32_t kMax32 = std::numeric_limits<std::uint32_t>::max();
  struct Case {
    const char* expect;
    std::function<void(KvEventBatch&)> mutate;
  };
  const std::vector<Case> cases{
      {"events[0].kind = 3: not a KvEventKind", [](KvEventBatch& b) { b.events[0].kind = as_enum<KvEventKind>(3); }},
      {"events[3].kind = 255: not a KvEventKind",
       [](KvEventBatch& b) { b.events[3].kind = as_enum<KvEventKind>(255); }},
      {"events[4].kind = 7: not a KvEventKind", [](KvEventBatch& b) { b.events[4].kind = as_enum<KvEventKind>(7); }},
      {"events[0].medium = 3: not a Medium", [](KvEventBatch& b) { b.events[0].medium = as_enum<Medium>(3); }},
      {"events[3].medium = 200: not a Medium", [](KvEventBatch& b) { b.events[3].medium = as_enum<Medium>(200); }},
      {"events[2].medium = 9: not a Medium", [](KvEventBatch& b) { b.events[2].medium = as_enum<Medium>(9); }},
      {"events[0].group = 3: the layout has 3 groups", [](KvEventBatch& b) { b.events[0].group = 3; }},
      {"events[3].group = 65535", [](KvEventBatch& b) { b.events[3].group = 65535; }},
      {"events[1].num_pages = 0", [](KvEventBatch& b) { b.events[1].num_pages = 0; }},
      {"events[3].num_pages = 0", [](KvEventBatch& b) { b.events[3].num_pages = 0; }},
      {"events[3].hash_begin = 5, num_pages = 2: outside the batch's 6 hashes",
       [](KvEventBatch& b) { b.events[3].hash_begin = 5; }},
      {"events[3].hash_begin = 4, num_pages = 5", [](KvEventBatch& b) { b.events[3].num_pages = 5; }},
      {"events[0].hash_begin = 4294967295, num_pages = 2", [](KvEventBatch& b) { b.events[0].hash_begin = kMax32; }},
      {"events[0].hash_begin = 0, num_pages = 4294967295", [](KvEventBatch& b) { b.events[0].num_pages = kMax32; }},
      {"events[0].tokens_per_page = 8: group 0 has 4", [](KvEventBatch& b) { b.events[0].tokens_per_page = 8; }},
      {"events[1].tokens_per_page = 0: group 1 has 4", [](KvEventBatch& b) { b.events[1].tokens_per_page = 0; }},
      {"events[1].token_begin = 13, num_pages x tokens_per_page = 4: outside the batch's 16 tokens",
       [](KvEventBatch& b) { b.events[1].token_begin = 13; }},
      {"events[0].token_begin = 18446744073709551615",
       [](KvEventBatch& b) { b.events[0].token_begin = std::numeric_limits<std::uint64_t>::max(); }},
      {"events[1].token_begin = 8, num_pages x tokens_per_page = 4: outside the batch's 10 tokens",
       [](KvEventBatch& b) { b.tokens.resize(10); }},
      {"events[0].salt_begin = 1, salt_size = 2: outside the batch's 2 text bytes",
       [](KvEventBatch& b) { b.events[0].salt_begin = 1; }},
      {"events[0].salt_begin = 0, salt_size = 3", [](KvEventBatch& b) { b.events[0].salt_size = 3; }},
      {"events[1].salt_begin = 4294967295, salt_size = 2", [](KvEventBatch& b) { b.events[1].salt_begin = kMax32; }},
      {"events[0].item_begin = 1, num_items = 1: outside the batch's 1 items",
       [](KvEventBatch& b) { b.events[0].item_begin = 1; }},
      {"events[0].item_begin = 0, num_items = 4294967295", [](KvEventBatch& b) { b.events[0].num_items = kMax32; }},
      {"events[0]: items[0].page_in_run = 2 must be < num_pages = 2",
       [](KvEventBatch& b) { b.items[0].page_in_run = 2; }},
      {"events[0]: items[1].page_in_run = 0 must be < num_pages = 2 and not below the previous item's 1",
       [](KvEventBatch& b) {
         b.items.push_back(KvEventItemKey{0, BlockHash{1, 2}, 0});
         b.events[0].num_items = 2;
       }},
  };
  for (const Case& c : cases) {
    INFO(c.expect);
    KvEventBatch b = test_batch();
    c.mutate(b);
    CHECK_THAT(error_of([&] { validate_kv_event_batch(b, layout); }), Catch::Contains(c.expect));
    CHECK_THAT(encode_error(b, layout), Catch::Contains(c.expect));
  }
  // The options' enums: the encoder refuses them before writing anything.
  CHECK_THAT(encode_error(test_batch(), layout, EventEncodeOptions{as_enum<EventEncoding>(2)}),
             Catch::Contains("EventEncodeOptions.encoding = 2: not an EventEncoding"));
  CHECK_THAT(encode_error(test_batch(), layout, EventEncodeOptions{{}, as_enum<EventHashFormat>(9)}),
             Catch::Contains("EventEncodeOptions.hash_format = 9: not an EventHashFormat"));
  CHECK_THAT(error_of([] { medium_name(as_enum<Medium>(3)); }), Catch::Contains("medium = 3: not a Medium"));
  // What a kind does not use is not checked: a clear has no group or medium, a removed
  // run no tokens, salt or items.
  KvEventBatch b = test_batch();
  b.events[4].group = 999;
  b.events[4].medium = as_enum<Medium>(9);
  b.events[3].tokens_per_page = 77;
  b.events[3].token_begin = 1u << 30;
  b.events[3].salt_begin = kMax32;
  b.events[3].item_begin = kMax32;
  CHECK_NOTHROW(validate_kv_event_batch(b, layout));
  std::vector<std::uint8_t> out = kPrefix;
  encode_kv_event_batch(b, layout, 1.0, {}, out);
  const auto body = std::span<const std::uint8_t>(out).subspan(kPrefix.size());
  CHECK(kvmm::test::msgpack_value_size(body) == body.size());
}

namespace {

// A random valid batch over test_layout(): runs of 1-3 pages in any group, any kind and
// medium, with items in page order.
KvEventBatch random_batch(std::mt19937_64& rng) {
  KvEventBatch b;
  const int n = static_cast<int>(rng() % 8);
  for (int i = 0; i < n; ++i) {
    KvEvent e;
    e.kind = static_cast<KvEventKind>(rng() % 3);
    e.medium = static_cast<Medium>(rng() % 3);
    e.group = static_cast<GroupId>(rng() % 3);
    e.num_pages = 1 + static_cast<std::uint32_t>(rng() % 3);
    e.hash_begin = static_cast<std::uint32_t>(b.hashes.size());
    for (std::uint32_t p = 0; p < e.num_pages; ++p) b.hashes.push_back(BlockHash{rng(), rng()});
    e.tokens_per_page = 4;
    e.token_begin = b.tokens.size();
    for (std::uint32_t t = 0; t < e.num_pages * 4; ++t) b.tokens.push_back(static_cast<std::uint32_t>(rng()));
    e.first_page = rng() % 3;
    e.has_parent = e.first_page != 0;
    e.lora_id = static_cast<std::uint32_t>(rng() % 3);
    e.salt_begin = static_cast<std::uint32_t>(b.text.size());
    e.salt_size = static_cast<std::uint32_t>(rng() % 40);
    b.text.append(e.salt_size, 's');
    e.item_begin = static_cast<std::uint32_t>(b.items.size());
    e.num_items = static_cast<std::uint32_t>(rng() % 3);
    std::uint32_t page = 0;
    for (std::uint32_t k = 0; k < e.num_items; ++k) {
      page += static_cast<std::uint32_t>(rng() % 2);
      b.items.push_back(KvEventItemKey{std::min(page, e.num_pages - 1), BlockHash{rng(), rng()},
                                       static_cast<std::int64_t>(rng() % 64) - 32});
    }
    b.events.push_back(e);
  }
  return b;
}

}  // namespace

TEST_CASE("events validation: random batches, one field broken or none", "[dist][events][errors][random]") {
  const KVLayout layout = test_layout();
  std::mt19937_64 rng(20261127);
  int refused = 0, encoded = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    KvEventBatch b = random_batch(rng);
    INFO("iteration " << iter);
    const bool bad = !b.events.empty() && rng() % 2 == 0;
    if (bad) {
      KvEvent& e = b.events[rng() % b.events.size()];
      switch (rng() % 6) {
        case 0:
          e.kind = as_enum<KvEventKind>(3 + rng() % 253);
          break;
        case 1:
          e.kind = KvEventKind::kStored;
          e.medium = as_enum<Medium>(3 + rng() % 253);
          break;
        case 2:
          e.kind = KvEventKind::kRemoved;
          e.group = static_cast<GroupId>(3 + rng() % 100);
          break;
        case 3:
          e.kind = KvEventKind::kStored;
          e.hash_begin = static_cast<std::uint32_t>(b.hashes.size());
          break;
        case 4:
          e.kind = KvEventKind::kStored;
          e.token_begin = b.tokens.size() - rng() % 4;
          break;
        default:
          e.kind = KvEventKind::kStored;
          e.salt_size = static_cast<std::uint32_t>(b.text.size() + 1);
          break;
      }
    }
    const std::string v = error_of([&] { validate_kv_event_batch(b, layout); });
    const auto options =
        EventEncodeOptions{static_cast<EventEncoding>(rng() % 2), static_cast<EventHashFormat>(rng() % 2), 0};
    if (bad) {
      REQUIRE_THAT(v, Catch::StartsWith("events["));
      REQUIRE(encode_error(b, layout, options) == v);
      ++refused;
      continue;
    }
    REQUIRE(v == "no error");
    std::vector<std::uint8_t> out = kPrefix;
    encode_kv_event_batch(b, layout, 2.0, options, out);
    const auto body = std::span<const std::uint8_t>(out).subspan(kPrefix.size());
    REQUIRE(std::equal(kPrefix.begin(), kPrefix.end(), out.begin()));
    REQUIRE(kvmm::test::msgpack_value_size(body) == body.size());
    ++encoded;
  }
  CHECK(refused > 1000);
  CHECK(encoded > 1000);
}
