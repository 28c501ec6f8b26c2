// The self-verifying value of one page in a KVTier: a 64-byte header, then the page's
// bytes exactly as kvmm lays them out. Header (little-endian): magic "KVMP", format
// version, header size, scope fingerprint, the 128-bit block hash again, group,
// tokens_per_page, payload bytes, XXH3-64 of the payload, XXH3-64 of the header's first 56
// bytes. check_tier_value() verifies all of it, so a value that is truncated, altered,
// stored under another key or scope is never taken for the page. Cost: one XXH3 pass over
// the payload (~0.1 ms per 2 MiB) for encode and for check.
#pragma once

#include "kvmm/distributed/kv_tier.hpp"

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace kvmm {

inline constexpr std::size_t kTierHeaderBytes = 64;
inline constexpr std::uint16_t kTierFormatVersion = 1;

// What a value must say about itself to be the expected page.
struct TierValueIdentity {
  std::uint64_t scope = 0;
  TierKey key;
  std::uint32_t tokens_per_page = 0;
  std::uint64_t payload_bytes = 0;
};

// Writes the header of `payload` (whose size must equal id.payload_bytes; kvmm::Error
// otherwise) into `header`.
void encode_tier_header(const TierValueIdentity& id, std::span<const std::byte> payload,
                        std::span<std::byte, kTierHeaderBytes> header);

enum class TierValueError : std::uint8_t {
  kNone,
  kLength,  // shorter than a header, or header + payload bytes != value length
  kMagic,
  kVersion,
  kHeaderBytes,
  kHeaderChecksum,
  kScope,
  kHash,
  kGroup,
  kTokensPerPage,
  kPayloadBytes,
  kPayloadChecksum,
};
std::string_view to_string(TierValueError error);

// kNone when `value` (header + payload) is exactly the page `expect` names.
TierValueError check_tier_value(std::span<const std::byte> value, const TierValueIdentity& expect);

}  // namespace kvmm
