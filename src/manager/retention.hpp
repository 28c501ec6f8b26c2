// Boundary-aware retention (private to src/manager/; issue 17): a request's cache
// boundaries, the pages a hit at each needs that it holds instead of releasing when they
// leave its window, and the branch points learned from lookups. Why: Jenga §5's rule
// releases a running request's out-of-window pages with their older access time, so they
// are the first victims, and they are exactly the window a later hit at a shared prefix
// (a document, a system prompt, the previous turns) needs. Costs: held() is O(boundaries)
// per page leaving a window and nothing for a request without boundaries; BranchPoints is
// a direct-mapped table (16 bytes an entry), O(1) per insert and probe.
#pragma once

#include "kvmm/caching/block_hash.hpp"
#include "kvmm/caching/layer_policy.hpp"
#include "kvmm/manager/kv_cache_manager.hpp"
#include "kvmm/types.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace kvmm::detail {

// A request's boundaries (tokens), ascending, unique: the hinted ones, then learned ones
// merged in. Fixed capacity: no heap.
class CacheBoundaries {
 public:
  static constexpr std::size_t kCapacity = 2 * kMaxCacheBoundaries;  // hinted + learned

  void clear() {
    n_ = 0;
    tail_lo_ = tail_hi_ = tail_end_ = 0;
  }
  bool empty() const { return n_ == 0 && tail_hi_ == 0; }
  // Every length in [lo, hi] is a boundary (the prompt's tail) until the request has
  // computed more than `end` tokens: held(.., true) then also answers for the union of
  // their needs, which for every policy is one page range (the required pages of a hit at
  // L never start later for a shorter L), so it costs O(1) per page.
  void set_tail(std::uint64_t lo, std::uint64_t hi, std::uint64_t end) {
    tail_lo_ = lo;
    tail_hi_ = hi;
    tail_end_ = end;
  }
  std::uint64_t tail_lo() const { return tail_lo_; }
  std::uint64_t tail_hi() const { return tail_hi_; }
  std::uint64_t tail_end() const { return tail_end_; }
  std::span<const std::uint64_t> values() const { return {at_.data(), n_}; }
  // Inserts L in order; false when present or full (a learned one beyond the capacity is
  // dropped: the hold is a retention hint, never needed for correctness).
  bool add(std::uint64_t L) {
    const auto end = at_.begin() + n_;
    const auto it = std::lower_bound(at_.begin(), end, L);
    if ((it != end && *it == L) || n_ == kCapacity || L == 0) return false;
    std::copy_backward(it, end, end + 1);
    *it = L;
    ++n_;
    return true;
  }
  // Whether page i of a group with policy `policy` is one a hit at some boundary needs:
  // i in [first_required_page(L'), L' / P), L' = L rounded down to the group's pages.
  bool held(const LayerPolicy& policy, std::uint64_t i, bool with_tail) const {
    const std::uint64_t P = policy.tokens_per_page();
    if (with_tail && i < tail_hi_ / P && i >= policy.first_required_page(tail_lo_ / P * P)) return true;
    for (std::size_t k = 0; k < n_; ++k) {
      const std::uint64_t pages = at_[k] / P;
      if (i < pages && i >= policy.first_required_page(pages * P)) return true;
    }
    return false;
  }

 private:
  std::array<std::uint64_t, kCapacity> at_{};
  std::size_t n_ = 0;
  std::uint64_t tail_lo_ = 0, tail_hi_ = 0, tail_end_ = 0;  // [lo, hi]; hi = 0: none
};

// Learned suffix lengths (issue 34: the prompt tail that adapts): how far followers' prompts
// ran past the prefix they shared with an earlier request (prompt - whole-prefix hit, at
// first admissions whose full-attention hit ended inside their prompt), the last kCapacity
// of them in a ring. range() answers their 5th and 95th percentiles once kMin are known:
// where in its prompt a request's followers are likely to part from it. O(1) per add;
// range() O(kCapacity) after an add, else O(1). 2 KiB.
// Entries of the table of sequence ends beside SuffixLengths (a follower that parts where
// an earlier request ended continues it, as a chat turn does: no suffix to learn).
inline constexpr std::uint32_t kLearnedEnds = 4096;
// Slots of the evicted-key table the adaptive tail reads (a follower whose next page was
// evicted lost the rest of a shared prefix: it parts nowhere). 32 B each: 2 MiB.
inline constexpr std::uint32_t kLearnedEvictions = 1u << 16;

class SuffixLengths {
 public:
  static constexpr std::size_t kCapacity = 256, kMin = 8;
  explicit SuffixLengths(std::uint32_t most) : most_(most) {}
  bool enabled() const { return most_ > 0; }
  void add(std::uint64_t s) {
    if (!enabled() || s == 0) return;
    ring_[n_ % kCapacity] = static_cast<std::uint32_t>(std::min<std::uint64_t>(s, most_));
    ++n_;
    dirty_ = true;
  }
  // {lo, hi} (0, 0: too few known).
  std::pair<std::uint64_t, std::uint64_t> range() {
    if (n_ < kMin) return {0, 0};
    if (dirty_) {
      const std::size_t n = std::min<std::uint64_t>(n_, kCapacity);
      std::array<std::uint32_t, kCapacity> v;
      std::copy_n(ring_.begin(), n, v.begin());
      const auto at = [&](std::size_t k) {
        std::nth_element(v.begin(), v.begin() + k, v.begin() + n);
        return v[k];
      };
      lo_ = at(n / 20);
      hi_ = at(n - 1 - n / 20);
      dirty_ = false;
    }
    return {lo_, hi_};
  }
  void clear() { n_ = 0; }

 private:
  std::uint32_t most_;
  std::array<std::uint32_t, kCapacity> ring_{};
  std::uint64_t n_ = 0;
  std::uint64_t lo_ = 0, hi_ = 0;
  bool dirty_ = false;
};

// A page a request holds for a boundary after it left the page table's window.
struct HeldPage {
  GroupId group;
  PageId page;
  std::uint64_t index;  // in the request's row
  std::uint64_t step;   // when it was held (pressure releases the oldest first)
};

// Learned branch points: block hashes (of the anchor group, the first whole-prefix one) of
// the last page before a prefix length where a lookup's full-attention hit went further
// than the hit every group allowed. Direct-mapped, a newer point overwrites an older one
// in its slot: bounded memory, and a lost point is only a lost hint.
class BranchPoints {
 public:
  explicit BranchPoints(std::uint32_t capacity)
      : slots_(capacity == 0 ? 0 : std::bit_ceil(capacity)), mask_(slots_.empty() ? 0 : slots_.size() - 1) {}
  bool enabled() const { return !slots_.empty(); }
  void insert(const BlockHash& h) {
    if (enabled()) slots_[h.lo & mask_] = h;
  }
  bool contains(const BlockHash& h) const { return enabled() && slots_[h.lo & mask_] == h && !(h == BlockHash{}); }
  void clear() { std::fill(slots_.begin(), slots_.end(), BlockHash{}); }

 private:
  std::vector<BlockHash> slots_;
  std::uint64_t mask_;
};

}  // namespace kvmm::detail
