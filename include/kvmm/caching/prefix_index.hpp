// PrefixIndex: block hash -> cached small page, per layer group. Open addressing with
// linear probing and backward-shift deletion in one flat table of 8-byte slots sized at
// construction (load <= 2/3: 8 MiB of slots index ~700k pages), so find/insert/erase are
// O(1) expected and never touch the heap. A slot keeps the page id, the group, its probe
// distance and a 16-bit fingerprint, not the hash: the caller keeps each page's hash
// (hash_of(g, page)), and a fingerprint match is confirmed against it, so answers are
// exact and the table is a third the size of one holding 128-bit keys.
#pragma once

#include "kvmm/caching/block_hash.hpp"
#include "kvmm/detail/prefetch.hpp"
#include "kvmm/error.hpp"
#include "kvmm/types.hpp"

#include <cstdint>
#include <vector>

namespace kvmm {

class PrefixIndex {
 public:
  static constexpr std::uint32_t kMaxGroups = 256;
  // Room for `max_entries` entries at once, over groups [0, num_groups).
  explicit PrefixIndex(std::uint64_t max_entries, std::uint32_t num_groups = kMaxGroups);

  // The page of group g cached under h, kNullPage when absent. hash_of(g, page) returns
  // the hash the caller inserted `page` under; it is read only on a fingerprint match.
  template <class HashOf>
  PageId find(GroupId g, const BlockHash& h, const HashOf& hash_of) const {
    const std::uint64_t m = mix(g, h);
    const std::uint16_t fp = fingerprint(m);
    for (std::uint64_t i = m & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.page == kNullPage) return kNullPage;
      if (s.fp == fp && s.group == g && hash_of(g, s.page) == h) return s.page;
    }
  }
  // Pulls the slot of (g, h) toward the cache ahead of a find or an insert.
  void prefetch(GroupId g, const BlockHash& h) const { detail::prefetch_read(&slots_[mix(g, h) & mask_]); }
  // false (nothing changed) when (g, h) is already present, or, for adversarial hashes
  // only, when its probe run is too long to record (the page then stays uncached).
  template <class HashOf>
  bool insert(GroupId g, const BlockHash& h, PageId page, const HashOf& hash_of) {
    if (page == kNullPage) fail("page = {}: the null page cannot be cached", page);
    check_group(g);
    const std::uint64_t m = mix(g, h);
    const std::uint16_t fp = fingerprint(m);
    std::uint64_t i = m & mask_;
    std::uint32_t dist = 0;
    for (;; i = (i + 1) & mask_, ++dist) {
      const Slot& s = slots_[i];
      if (s.page == kNullPage) break;
      if (s.fp == fp && s.group == g && hash_of(g, s.page) == h) return false;
    }
    if (dist > kMaxDist) return false;
    if (size_ >= max_) fail("prefix index: full with {} entries", size_);
    slots_[i] = Slot{page, static_cast<std::uint8_t>(g), static_cast<std::uint8_t>(dist), fp};
    ++size_;
    return true;
  }
  // Removes page `page` of group g, which must have been inserted under h (no hash_of
  // reads: a page is indexed under one hash at a time). false when absent.
  bool erase(GroupId g, const BlockHash& h, PageId page);
  std::uint64_t size() const { return size_; }
  std::uint64_t capacity() const { return max_; }
  std::uint32_t num_groups() const { return num_groups_; }
  void clear();

 private:
  static constexpr std::uint32_t kMaxDist = 255;
  struct Slot {
    PageId page = kNullPage;
    std::uint8_t group = 0;
    std::uint8_t dist = 0;  // slots from its home slot
    std::uint16_t fp = 0;
  };
  static std::uint64_t mix(GroupId g, const BlockHash& h) { return h.hi ^ (std::uint64_t{g} * 0x9e3779b97f4a7c15ULL); }
  // Bits the home slot does not use (tables stay below 2^32 slots).
  static std::uint16_t fingerprint(std::uint64_t m) { return static_cast<std::uint16_t>(m >> 48); }
  void check_group(GroupId g) const {
    if (g >= num_groups_) fail("group = {}: index holds groups [0, {})", g, num_groups_);
  }
  std::vector<Slot> slots_;
  std::uint64_t mask_ = 0;
  std::uint64_t size_ = 0;
  std::uint64_t max_ = 0;
  std::uint32_t num_groups_ = 0;
};

}  // namespace kvmm
