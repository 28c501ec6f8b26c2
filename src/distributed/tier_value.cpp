#include "kvmm/distributed/tier_value.hpp"

#include "fingerprint.hpp"
#include "kvmm/error.hpp"

#include <cstring>

namespace kvmm {

namespace {

constexpr std::byte kMagic[4] = {std::byte{'K'}, std::byte{'V'}, std::byte{'M'}, std::byte{'P'}};
constexpr std::size_t kChecked = 56;  // the header checksum covers bytes [0, 56)

void put(std::byte* p, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
std::uint64_t get(const std::byte* p, int bytes) {
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= std::uint64_t{std::to_integer<std::uint8_t>(p[i])} << (8 * i);
  return v;
}

}  // namespace

void encode_tier_header(const TierValueIdentity& id, std::span<const std::byte> payload,
                        std::span<std::byte, kTierHeaderBytes> header) {
  if (payload.size() != id.payload_bytes)
    fail("tier value payload = {} bytes: the identity says payload_bytes = {}", payload.size(), id.payload_bytes);
  std::byte* h = header.data();
  std::memcpy(h, kMagic, 4);
  put(h + 4, kTierFormatVersion, 2);
  put(h + 6, kTierHeaderBytes, 2);
  put(h + 8, id.scope, 8);
  put(h + 16, id.key.hash.lo, 8);
  put(h + 24, id.key.hash.hi, 8);
  put(h + 32, id.key.group, 4);
  put(h + 36, id.tokens_per_page, 4);
  put(h + 40, id.payload_bytes, 8);
  put(h + 48, detail::xxh3_64(payload.data(), payload.size()), 8);
  put(h + 56, detail::xxh3_64(h, kChecked), 8);
}

TierValueError check_tier_value(std::span<const std::byte> value, const TierValueIdentity& expect) {
  if (value.size() < kTierHeaderBytes) return TierValueError::kLength;
  const std::byte* h = value.data();
  if (std::memcmp(h, kMagic, 4) != 0) return TierValueError::kMagic;
  if (get(h + 4, 2) != kTierFormatVersion) return TierValueError::kVersion;
  if (get(h + 6, 2) != kTierHeaderBytes) return TierValueError::kHeaderBytes;
  if (get(h + 56, 8) != detail::xxh3_64(h, kChecked)) return TierValueError::kHeaderChecksum;
  const std::uint64_t payload = get(h + 40, 8);
  if (payload != expect.payload_bytes) return TierValueError::kPayloadBytes;
  if (value.size() - kTierHeaderBytes != payload) return TierValueError::kLength;
  if (get(h + 8, 8) != expect.scope) return TierValueError::kScope;
  if (get(h + 16, 8) != expect.key.hash.lo || get(h + 24, 8) != expect.key.hash.hi) return TierValueError::kHash;
  if (get(h + 32, 4) != expect.key.group) return TierValueError::kGroup;
  if (get(h + 36, 4) != expect.tokens_per_page) return TierValueError::kTokensPerPage;
  if (get(h + 48, 8) != detail::xxh3_64(h + kTierHeaderBytes, payload)) return TierValueError::kPayloadChecksum;
  return TierValueError::kNone;
}

std::string_view to_string(TierValueError error) {
  switch (error) {
    case TierValueError::kNone:
      return "none";
    case TierValueError::kLength:
      return "length";
    case TierValueError::kMagic:
      return "magic";
    case TierValueError::kVersion:
      return "version";
    case TierValueError::kHeaderBytes:
      return "header_bytes";
    case TierValueError::kHeaderChecksum:
      return "header_checksum";
    case TierValueError::kScope:
      return "scope";
    case TierValueError::kHash:
      return "hash";
    case TierValueError::kGroup:
      return "group";
    case TierValueError::kTokensPerPage:
      return "tokens_per_page";
    case TierValueError::kPayloadBytes:
      return "payload_bytes";
    case TierValueError::kPayloadChecksum:
      return "payload_checksum";
  }
  return "unknown";
}

}  // namespace kvmm
