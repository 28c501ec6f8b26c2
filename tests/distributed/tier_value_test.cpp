// The KVTier value codec (tier_value.hpp) and scope/key helpers (kv_tier.hpp): a value
// round-trips; every header bit flipped, every payload bit flip tried at random, and
// truncation or extension are all rejected; a self-consistent header for another page
// (other scope, hash, group, tokens per page, size) is rejected naming the field; the
// scope fingerprint covers model, dtype, layout and TP rank (not the rank when shared).
#include "kvmm/distributed/tier_value.hpp"
#include "kvmm/distributed/kv_tier.hpp"
#include "kvmm/error.hpp"

#include <catch2/catch.hpp>

#include <random>
#include <vector>

using namespace kvmm;

namespace {

TierValueIdentity identity() {
  return TierValueIdentity{0x1234567890abcdefULL, TierKey{2, BlockHash{0x1111, 0x2222}}, 16, 1000};
}

std::vector<std::byte> make_value(const TierValueIdentity& id, std::uint64_t seed) {
  std::vector<std::byte> v(kTierHeaderBytes + id.payload_bytes);
  std::mt19937_64 rng(seed);
  for (std::size_t i = kTierHeaderBytes; i < v.size(); ++i) v[i] = static_cast<std::byte>(rng());
  encode_tier_header(id, std::span<const std::byte>(v).subspan(kTierHeaderBytes),
                     std::span<std::byte, kTierHeaderBytes>(v.data(), kTierHeaderBytes));
  return v;
}

KVLayout layout(std::uint32_t tpp = 16) { return KVLayout::plan({LayerGroup::full_attention("f", 2, 2, 64, 2, tpp)}); }

}  // namespace

TEST_CASE("tier value: a value round-trips and any altered header bit is rejected") {
  const TierValueIdentity id = identity();
  const auto v = make_value(id, 1);
  REQUIRE(check_tier_value(v, id) == TierValueError::kNone);
  for (std::size_t byte = 0; byte < kTierHeaderBytes; ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      auto bad = v;
      bad[byte] ^= static_cast<std::byte>(1 << bit);
      INFO("header byte " << byte << " bit " << bit);
      REQUIRE(check_tier_value(bad, id) != TierValueError::kNone);
    }
  }
}

TEST_CASE("tier value: payload bit flips, truncation and extension are rejected") {
  const TierValueIdentity id = identity();
  const auto v = make_value(id, 2);
  std::mt19937_64 rng(3);
  for (int i = 0; i < 5000; ++i) {
    auto bad = v;
    const std::size_t at = kTierHeaderBytes + rng() % id.payload_bytes;
    bad[at] ^= static_cast<std::byte>(1u << (rng() % 8));
    if (rng() % 2 == 0) bad[kTierHeaderBytes + rng() % id.payload_bytes] ^= std::byte{0x80};
    if (bad == v) continue;  // the second flip undid the first
    REQUIRE(check_tier_value(bad, id) == TierValueError::kPayloadChecksum);
  }
  for (const std::size_t len : {std::size_t{0}, std::size_t{10}, kTierHeaderBytes, v.size() - 1}) {
    INFO("length " << len);
    CHECK(check_tier_value(std::span<const std::byte>(v).first(len), id) == TierValueError::kLength);
  }
  auto longer = v;
  longer.push_back(std::byte{0});
  CHECK(check_tier_value(longer, id) == TierValueError::kLength);
}

TEST_CASE("tier value: a consistent header of another page is rejected naming the field") {
  const TierValueIdentity id = identity();
  auto other = id;
  other.scope ^= 1;
  CHECK(check_tier_value(make_value(other, 4), id) == TierValueError::kScope);
  other = id;
  other.key.hash.lo ^= 1;
  CHECK(check_tier_value(make_value(other, 4), id) == TierValueError::kHash);
  other = id;
  other.key.hash.hi ^= 1;
  CHECK(check_tier_value(make_value(other, 4), id) == TierValueError::kHash);
  other = id;
  other.key.group = 3;
  CHECK(check_tier_value(make_value(other, 4), id) == TierValueError::kGroup);
  other = id;
  other.tokens_per_page = 32;
  CHECK(check_tier_value(make_value(other, 4), id) == TierValueError::kTokensPerPage);
  other = id;
  other.payload_bytes = 999;
  CHECK(check_tier_value(make_value(other, 4), id) == TierValueError::kPayloadBytes);
  // The header is fine but the bytes are another page's: the payload checksum differs.
  auto swapped = make_value(id, 5);
  const auto donor = make_value(id, 6);
  std::copy(donor.begin() + kTierHeaderBytes, donor.end(), swapped.begin() + kTierHeaderBytes);
  CHECK(check_tier_value(swapped, id) == TierValueError::kPayloadChecksum);
  // encode_tier_header refuses a payload of the wrong size.
  std::vector<std::byte> header(kTierHeaderBytes), payload(10);
  CHECK_THROWS_WITH(
      encode_tier_header(id, payload, std::span<std::byte, kTierHeaderBytes>(header.data(), kTierHeaderBytes)),
      Catch::Contains("payload = 10 bytes"));
  CHECK(to_string(TierValueError::kPayloadChecksum) == "payload_checksum");
}

TEST_CASE("tier scope: the fingerprint covers layout, model, dtype and TP rank; keys") {
  const TierScope s{"llama-3-8b@main", "bfloat16", 1, 4, false};
  const std::uint64_t base = scope_fingerprint(layout(), s);
  CHECK(scope_fingerprint(layout(), s) == base);
  CHECK(scope_fingerprint(layout(32), s) != base);
  auto t = s;
  t.model_id = "llama-3-8b@other";
  CHECK(scope_fingerprint(layout(), t) != base);
  t = s;
  t.dtype = "float16";
  CHECK(scope_fingerprint(layout(), t) != base);
  t = s;
  t.tp_rank = 2;
  CHECK(scope_fingerprint(layout(), t) != base);
  t = s;
  t.tp_size = 8;
  CHECK(scope_fingerprint(layout(), t) != base);
  // Rank-shared bytes (MLA-like): every rank has the same scope.
  auto shared = s;
  shared.rank_shared = true;
  auto shared2 = shared;
  shared2.tp_rank = 3;
  CHECK(scope_fingerprint(layout(), shared) == scope_fingerprint(layout(), shared2));
  CHECK(scope_fingerprint(layout(), shared) != base);
  t = s;
  t.tp_rank = 4;
  CHECK_THROWS_WITH(scope_fingerprint(layout(), t), Catch::Contains("tp_rank = 4, tp_size = 4"));

  std::string key;
  format_tier_key("kvmm", 0x00ab, TierKey{12, BlockHash{0x2, 0xf1}}, key);
  CHECK(key == "kvmm:00000000000000ab:12:00000000000000f10000000000000002");
  format_tier_key("p", ~0ULL, TierKey{0, BlockHash{}}, key);
  CHECK(key == "p:ffffffffffffffff:0:00000000000000000000000000000000");
  CHECK(to_string(TierStatus::kCorrupt) == "corrupt");
  CHECK(to_string(TierOp::kPut) == "put");
}
