#include "kvmm/distributed/kv_tier.hpp"

#include "fingerprint.hpp"
#include "kvmm/distributed/page_descriptors.hpp"
#include "kvmm/error.hpp"

namespace kvmm {

std::string_view to_string(TierStatus status) {
  switch (status) {
    case TierStatus::kOk:
      return "ok";
    case TierStatus::kMiss:
      return "miss";
    case TierStatus::kCorrupt:
      return "corrupt";
    case TierStatus::kTimeout:
      return "timeout";
    case TierStatus::kUnavailable:
      return "unavailable";
  }
  return "unknown";
}

std::string_view to_string(TierOp op) {
  switch (op) {
    case TierOp::kContains:
      return "contains";
    case TierOp::kGet:
      return "get";
    case TierOp::kPut:
      return "put";
    case TierOp::kRemove:
      return "remove";
  }
  return "unknown";
}

std::uint64_t scope_fingerprint(const KVLayout& layout, const TierScope& scope) {
  if (scope.tp_size == 0 || scope.tp_rank >= scope.tp_size)
    fail("TierScope tp_rank = {}, tp_size = {}: need tp_rank < tp_size", scope.tp_rank, scope.tp_size);
  detail::Fingerprint f;
  f.str("kvmm.scope").u64(layout_fingerprint(layout)).str(scope.model_id).str(scope.dtype);
  if (scope.rank_shared)
    f.u64(0).u64(0);
  else
    f.u64(scope.tp_rank + std::uint64_t{1}).u64(scope.tp_size);
  return f.digest();
}

void format_tier_key(std::string_view prefix, std::uint64_t scope, const TierKey& key, std::string& out) {
  static constexpr char kHex[] = "0123456789abcdef";
  auto hex = [&out](std::uint64_t v) {
    for (int i = 60; i >= 0; i -= 4) out.push_back(kHex[(v >> i) & 0xf]);
  };
  out.clear();
  out.append(prefix);
  out.push_back(':');
  hex(scope);
  out.push_back(':');
  char digits[10];
  int n = 0;
  std::uint32_t g = key.group;
  do digits[n++] = static_cast<char>('0' + g % 10);
  while ((g /= 10) != 0);
  while (n > 0) out.push_back(digits[--n]);
  out.push_back(':');
  hex(key.hash.hi);
  hex(key.hash.lo);
}

}  // namespace kvmm
