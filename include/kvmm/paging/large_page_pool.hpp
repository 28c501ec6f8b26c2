// LargePagePool: the first level of Jenga's two-level allocator. Hands out large page
// ids [0, capacity) and records which layer group owns each one. allocate/free are
// O(1) (a LIFO stack in a flat array, so recently freed, cache-warm pages go out
// first) and never touch the heap after construction.
#pragma once

#include "kvmm/error.hpp"
#include "kvmm/types.hpp"

#include <cstdint>
#include <optional>
#include <vector>

namespace kvmm {

inline constexpr GroupId kNoGroup = ~GroupId{0};

class LargePagePool {
 public:
  explicit LargePagePool(std::uint32_t capacity) : free_(capacity), owner_(capacity, kNoGroup) {
    if (capacity == kNullPage) fail("capacity = {}: must be below 2^32-1", capacity);
    // Low ids on top of the stack: a fresh pool hands out 0, 1, 2, ...
    for (std::uint32_t i = 0; i < capacity; ++i) free_[i] = capacity - 1 - i;
    top_ = capacity;
  }

  // O(1). std::nullopt when every large page is in use (not an error).
  std::optional<PageId> allocate(GroupId owner) {
    if (top_ == 0) return std::nullopt;
    const PageId id = free_[--top_];
    owner_[id] = owner;
    return id;
  }

  // O(1). Raises kvmm::Error for an id out of range or already free.
  void free(PageId id) {
    if (id >= owner_.size()) fail("large page id = {}: pool capacity is {}", id, owner_.size());
    if (owner_[id] == kNoGroup) fail("large page id = {}: double free (page is already free)", id);
    owner_[id] = kNoGroup;
    free_[top_++] = id;
  }

  std::uint32_t capacity() const { return static_cast<std::uint32_t>(owner_.size()); }
  std::uint32_t num_free() const { return top_; }
  std::uint32_t num_used() const { return capacity() - top_; }
  // kNoGroup while the page is free.
  GroupId owner(PageId id) const {
    if (id >= owner_.size()) fail("large page id = {}: pool capacity is {}", id, owner_.size());
    return owner_[id];
  }

 private:
  std::vector<PageId> free_;    // stack of free ids, [0, top_)
  std::vector<GroupId> owner_;  // per large page: owning group or kNoGroup
  std::uint32_t top_ = 0;
};

}  // namespace kvmm
