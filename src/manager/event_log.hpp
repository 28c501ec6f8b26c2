// EventLog (private to src/manager/): what the manager records for take_events() when
// record_events (page events) or record_kv_events (a router's KvEventBatch) is on. Off,
// each record is one predictable branch. Page events: an append to a vector whose
// capacity is reused. KV events: a stored page extends the open run of its (request,
// group) or opens one (O(1) plus its token ids and the items overlapping it); a removed
// page extends the batch's last removed run of its group or opens one; reset_prefix_cache
// records one cleared event instead of a removal per page. Both take() swap buffers, so a
// caller that passes back the same vector/batch makes no heap allocation in steady state.
#pragma once

#include "kvmm/caching/request_hashes.hpp"
#include "kvmm/manager/kv_events.hpp"

#include <algorithm>
#include <utility>
#include <vector>

namespace kvmm::detail {

class EventLog {
 public:
  EventLog(bool pages, bool runs) : pages_on_(pages), runs_on_(runs) {
    if (pages_on_) pages_.reserve(4096);
  }
  bool on() const { return pages_on_ || runs_on_; }
  bool runs_on() const { return runs_on_; }

  // A page became cached under h. The page event only: its KV event comes from the caller,
  // who knows the request (stored_page below).
  void stored(GroupId g, PageId p, const BlockHash& h) {
    if (pages_on_) pages_.push_back(CacheEvent{CacheEventKind::kStored, g, p, h});
  }
  // A page left the cache (evicted, dropped at a reset). Pages of groups a router is not
  // told of (Group::announced: encoder-token groups, keyed by image; successor-keyed
  // drafts, never stored for it) make page events only.
  void removed(GroupId g, PageId p, const BlockHash& h, bool announced) {
    if (pages_on_) pages_.push_back(CacheEvent{CacheEventKind::kRemoved, g, p, h});
    if (runs_on_ && announced && !clearing_) removed_run(g, h);
  }
  // A page's hash moved to another page holding the same content (PageStore::hand_over):
  // page events say so; for a router the hash never left the cache, so no KV event.
  void moved(GroupId g, PageId from, PageId to, const BlockHash& h) {
    if (!pages_on_) return;
    pages_.push_back(CacheEvent{CacheEventKind::kRemoved, g, from, h});
    pages_.push_back(CacheEvent{CacheEventKind::kStored, g, to, h});
  }

  // Page `index` of a request (its hashes `ids`, chain `chain` of its group's page size
  // P) was newly cached in decoder group g. Consecutive calls for the next index extend
  // the open run; end_run() closes it (the caller's loop over one request and group ends).
  void stored_page(GroupId g, const RequestHashes& ids, const BlockHash* chain, std::uint64_t index, std::uint32_t P) {
    if (!runs_on_) return;
    KvEvent* e = open_ ? &batch_.events.back() : nullptr;
    if (e == nullptr || e->group != g || e->first_page + e->num_pages != index) {
      KvEvent n;
      n.kind = KvEventKind::kStored;
      n.group = g;
      n.hash_begin = static_cast<std::uint32_t>(batch_.hashes.size());
      n.has_parent = index > 0;
      if (index > 0) n.parent = chain[index - 1];
      n.first_page = index;
      n.tokens_per_page = P;
      n.token_begin = batch_.tokens.size();
      n.lora_id = ids.lora_id();
      n.item_begin = static_cast<std::uint32_t>(batch_.items.size());
      if (index == 0 && !ids.salt().empty()) {
        n.salt_begin = static_cast<std::uint32_t>(batch_.text.size());
        n.salt_size = static_cast<std::uint32_t>(ids.salt().size());
        batch_.text.append(ids.salt());
      }
      batch_.events.push_back(n);
      e = &batch_.events.back();
      open_ = true;
    }
    batch_.hashes.push_back(chain[index]);
    const std::span<const std::uint32_t> tok = ids.ids(index * P, P);
    batch_.tokens.insert(batch_.tokens.end(), tok.begin(), tok.end());
    // The page's multimodal items (the extra keys its hash was chained with).
    const std::uint64_t start = index * P, end = start + P;
    const std::span<const MultimodalItem> items = ids.items();
    auto it = std::partition_point(items.begin(), items.end(),
                                   [&](const MultimodalItem& m) { return m.offset + m.length <= start; });
    for (; it != items.end() && it->offset < end; ++it) {
      batch_.items.push_back(KvEventItemKey{e->num_pages, it->hash,
                                            static_cast<std::int64_t>(start) - static_cast<std::int64_t>(it->offset)});
      ++e->num_items;
    }
    ++e->num_pages;
  }
  void end_run() { open_ = false; }

  // reset_prefix_cache: the removals between begin_clear() and end_clear() become one
  // cleared event.
  void begin_clear() { clearing_ = runs_on_; }
  void end_clear() {
    if (!runs_on_) return;
    clearing_ = false;
    open_ = false;
    KvEvent e;
    e.kind = KvEventKind::kCleared;
    batch_.events.push_back(e);
  }

  // Moves the events into out (cleared first; capacities swap).
  void take(std::vector<CacheEvent>& out) {
    out.clear();
    std::swap(out, pages_);
  }
  void take(KvEventBatch& out) {
    out.clear();
    std::swap(out, batch_);
    open_ = false;
  }

 private:
  void removed_run(GroupId g, const BlockHash& h) {
    open_ = false;
    if (batch_.events.empty() || batch_.events.back().kind != KvEventKind::kRemoved ||
        batch_.events.back().group != g) {
      KvEvent e;
      e.kind = KvEventKind::kRemoved;
      e.group = g;
      e.hash_begin = static_cast<std::uint32_t>(batch_.hashes.size());
      batch_.events.push_back(e);
    }
    batch_.hashes.push_back(h);
    ++batch_.events.back().num_pages;
  }

  bool pages_on_, runs_on_;
  bool open_ = false;      // batch_.events.back() is a stored run that may still grow
  bool clearing_ = false;  // inside reset_prefix_cache
  std::vector<CacheEvent> pages_;
  KvEventBatch batch_;
};

}  // namespace kvmm::detail
