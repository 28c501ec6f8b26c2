// What the Redis tier tests share: a two-group layout of a chosen page size, page bytes
// that are a pure function of (key, version), host pages pre-filled with a sentinel so a
// test sees whether a get wrote anything, and the check that a get's outcome is sound
// (kOk: exactly the expected bytes; anything else: the page untouched).
#pragma once

#include "kvmm/distributed/kv_tier.hpp"
#include "kvmm/distributed/redis_tier.hpp"
#include "redis_harness.hpp"

#include <catch2/catch.hpp>

#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace kvmm::test {

inline constexpr std::byte kSentinel{0xA5};

// The fault tests' timeouts (short, so that each case takes a fraction of a second), and
// what a completion or a step may take past them on a loaded 2-core machine under
// sanitizers.
inline constexpr std::chrono::milliseconds kCommandTimeout{300};
inline constexpr std::chrono::milliseconds kConnectTimeout{100};
inline constexpr std::chrono::milliseconds kSlack{700};
inline constexpr auto kBound = kCommandTimeout + kConnectTimeout + kSlack;

// A tier on `endpoint` with the fault tests' timeouts and a quick circuit breaker (3
// failures, 200 ms cooldown).
inline RedisTierOptions fault_options(const std::string& endpoint) {
  RedisTierOptions o;
  o.endpoint = endpoint;
  o.command_timeout = kCommandTimeout;
  o.connect_timeout = kConnectTimeout;
  o.breaker_failures = 3;
  o.breaker_cooldown = std::chrono::milliseconds(200);
  return o;
}

// Group 0: full attention of `layers` layers (8 heads x 128 x 2 bytes, 16 tokens: 64 KiB a
// layer); group 1: a one-layer sliding window (64 KiB pages).
// Planned unsliced (LayoutOptions::slice_layers = kOff): the fault tests want group 0's
// pages as large as `layers` makes them (16 layers: 1 MiB), which the planner's default
// would cut into one-layer groups (16 pages per large page is above its threshold of 8).
inline KVLayout tier_layout(std::uint32_t layers = 2) {
  LayoutOptions unsliced;
  unsliced.slice_layers = SliceLayers::kOff;
  return KVLayout::plan({LayerGroup::full_attention("full", layers, 8, 128, 2, 16),
                         LayerGroup::sliding_window("swa", 1, 8, 128, 2, 16, 64)},
                        unsliced);
}

inline TierScope tier_scope(std::uint32_t tp_rank = 0) {
  return TierScope{"test-model@1", "bfloat16", tp_rank, 2, false};
}

inline TierKey tier_key(GroupId g, std::uint64_t i) {
  return TierKey{g, BlockHash{0x9e3779b97f4a7c15ULL * (i + 1), i}};
}

// Word i of version `version` of page `key`: a pure function of the three (splitmix64).
inline std::uint64_t page_word(const TierKey& key, std::uint64_t version, std::uint64_t i) {
  std::uint64_t z =
      key.hash.lo * 31 + key.hash.hi * 7 + key.group * 131 + version * 1000003 + i * 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// The bytes of version `version` of page `key`.
inline void fill_page(std::byte* p, std::uint64_t bytes, const TierKey& key, std::uint64_t version) {
  for (std::uint64_t i = 0; i < bytes; i += 8) {
    const std::uint64_t v = page_word(key, version, i);
    std::memcpy(p + i, &v, std::min<std::uint64_t>(8, bytes - i));
  }
}

// Host pages for a set of keys.
struct HostPages {
  const KVLayout* layout = nullptr;
  std::vector<std::vector<std::byte>> bytes;
  std::vector<TierPage> pages;
  std::vector<TierKey> keys;

  HostPages(const KVLayout& l, std::vector<TierKey> k) : layout(&l), keys(std::move(k)) {
    for (const TierKey& key : keys) bytes.emplace_back(l.small_page_bytes(key.group));
    for (std::size_t i = 0; i < keys.size(); ++i) pages.push_back(TierPage{keys[i], bytes[i].data()});
  }
  void fill(std::uint64_t version) {
    for (std::size_t i = 0; i < keys.size(); ++i) fill_page(bytes[i].data(), bytes[i].size(), keys[i], version);
  }
  void sentinel() {
    for (auto& b : bytes) std::fill(b.begin(), b.end(), kSentinel);
  }
  bool equals(std::size_t i, std::uint64_t version) const {
    const std::vector<std::byte>& b = bytes[i];
    for (std::uint64_t at = 0; at < b.size(); at += 8) {
      const std::uint64_t v = page_word(keys[i], version, at);
      if (std::memcmp(b.data() + at, &v, std::min<std::uint64_t>(8, b.size() - at)) != 0) return false;
    }
    return true;
  }
  bool untouched(std::size_t i) const {
    std::byte row[256];
    std::fill(std::begin(row), std::end(row), kSentinel);
    const std::vector<std::byte>& b = bytes[i];
    for (std::size_t at = 0; at < b.size(); at += sizeof row)
      if (std::memcmp(b.data() + at, row, std::min(sizeof row, b.size() - at)) != 0) return false;
    return true;
  }
};

// Every key of a get: kOk with exactly `version`'s bytes, or any other status with the page
// untouched. Returns how many were kOk.
inline std::size_t require_sound_get(const HostPages& hp, const std::vector<TierStatus>& st, std::uint64_t version) {
  REQUIRE(st.size() == hp.keys.size());
  std::size_t ok = 0;
  for (std::size_t i = 0; i < st.size(); ++i) {
    INFO("key " << i << " status " << to_string(st[i]));
    if (st[i] == TierStatus::kOk) {
      REQUIRE(hp.equals(i, version));
      ++ok;
    } else {
      REQUIRE(hp.untouched(i));
    }
  }
  return ok;
}

inline std::size_t count(const std::vector<TierStatus>& st, TierStatus s) {
  return static_cast<std::size_t>(std::count(st.begin(), st.end(), s));
}

inline std::string tier_key_string(const KVTier& tier, const TierKey& key) {
  std::string s;
  format_tier_key("kvmm", tier.scope(), key, s);
  return s;
}

#define KVMM_REQUIRE_REDIS()                                                         \
  do {                                                                               \
    if (!::kvmm::test::redis_server_available()) {                                   \
      WARN("SKIPPED: redis-server not found on PATH (scripts/deps.sh installs it)"); \
      return;                                                                        \
    }                                                                                \
  } while (0)

}  // namespace kvmm::test
