// EventLog (private to src/manager/): what the manager records for take_events() when
// record_events is on: one event per page cached (stored) or evicted (removed). Off, each
// record is one predictable branch; on, an append to a vector whose capacity is reused.
#pragma once

#include "kvmm/manager/kv_events.hpp"

#include <utility>
#include <vector>

namespace kvmm::detail {

class EventLog {
 public:
  explicit EventLog(bool on) : on_(on) {
    if (on_) pages_.reserve(4096);
  }
  bool on() const { return on_; }
  void stored(GroupId g, PageId p, const BlockHash& h) {
    if (on_) pages_.push_back(CacheEvent{CacheEventKind::kStored, g, p, h});
  }
  void removed(GroupId g, PageId p, const BlockHash& h) {
    if (on_) pages_.push_back(CacheEvent{CacheEventKind::kRemoved, g, p, h});
  }
  // Moves the events into out (cleared first; capacities swap).
  void take(std::vector<CacheEvent>& out) {
    out.clear();
    std::swap(out, pages_);
  }

 private:
  bool on_;
  std::vector<CacheEvent> pages_;
};

}  // namespace kvmm::detail
