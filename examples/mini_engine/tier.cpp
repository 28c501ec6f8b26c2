// The paged engine's KVTier part: probe waiting requests (contains), extend their hits and
// load the tier's pages straight into their device pages (get), store every newly cached
// page (put from a host offload buffer), all without waiting: the tier's own threads do the
// I/O and each step collects completions with poll(). Per step: O(completions + keys).
#include "engine_seq.hpp"

#include "kvmm/error.hpp"

#include <poll.h>

#include <fmt/format.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace mini {

std::uint32_t Engine::tier_in_flight() const { return static_cast<std::uint32_t>(tier_ops_.size()) + puts_in_flight_; }

void Engine::wait_tier(std::chrono::milliseconds limit) const {
  if (!opt_.tier || tier_in_flight() == 0) return;
  if (!opt_.tier->arm()) return;  // completions already wait
  pollfd p{opt_.tier->event_fd(), POLLIN, 0};
  ::poll(&p, 1, static_cast<int>(std::max<std::int64_t>(0, limit.count())));
}

bool Engine::drain_tier(std::chrono::milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (tier_in_flight() > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    wait_tier(left);
    tier_poll();
  }
  return tier_in_flight() == 0;
}

// A get writes into the arena and a put reads the offload buffer from the tier's threads:
// neither may outlive them. The tier completes every ticket within its timeouts, so this
// waits at most about one command timeout; a tier that broke that promise would write
// into freed memory, hence the abort.
void Engine::tier_shutdown() {
  if (!opt_.tier || tier_in_flight() == 0) return;
  try {
    if (drain_tier(std::max(opt_.tier_drain, std::chrono::milliseconds(10000)))) return;
  } catch (const kvmm::Error& e) {
    std::fprintf(stderr, "mini engine: draining the tier: %s\n", e.what());
    if (drain_tier(std::chrono::milliseconds(10000))) return;
  }
  std::fprintf(stderr, "mini engine: %u tier operations still in flight at destruction\n", tier_in_flight());
  std::abort();
}

// Completions of this step: contains answers (the request may be admitted), loads (the
// request continues from what loaded), puts (their offload slots are free again).
void Engine::tier_poll() {
  if (!opt_.tier) return;
  tier_results_.clear();
  if (opt_.tier->poll(tier_results_) == 0) return;
  for (const kvmm::TierCompletion& c : tier_results_.completions) {
    const std::span<const kvmm::TierStatus> st = tier_results_.status_of(c);
    if (c.op == kvmm::TierOp::kPut) {
      for (std::uint32_t i = 0; i < slot_ticket_.size(); ++i)
        if (slot_ticket_[i] == c.ticket) slot_ticket_[i] = 0, free_slots_.push_back(i);
      const auto ok = static_cast<std::uint64_t>(std::count(st.begin(), st.end(), kvmm::TierStatus::kOk));
      stats_.tier_puts_ok += ok;
      stats_.tier_puts_failed += st.size() - ok;
      --puts_in_flight_;
      continue;
    }
    const auto it =
        std::find_if(tier_ops_.begin(), tier_ops_.end(), [&](const TierWait& w) { return w.ticket == c.ticket; });
    if (it == tier_ops_.end()) kvmm::fail("tier ticket {}: completed but never submitted by this engine", c.ticket);
    const std::uint32_t s = it->seq;
    tier_ops_.erase(it);
    if (c.op == kvmm::TierOp::kContains) {
      seqs_[s].tier_status.assign(st.begin(), st.end());
      seqs_[s].tier = Seq::TierPhase::kProbed;
    } else {
      tier_finish_loads(s, st);
    }
  }
  stats_.tier_health = opt_.tier->health();
}

// Registers and looks up the next waiting requests that could be admitted soon (as many as
// free running places), and asks the tier about the pages past their local hits.
void Engine::tier_probe_ahead() {
  auto places =
      static_cast<std::int64_t>(opt_.max_running) - static_cast<std::int64_t>(running_.size() + loading_.size());
  for (auto it = waiting_.begin(); it != waiting_.end() && places > 0; ++it, --places)
    if (seqs_[*it].tier == Seq::TierPhase::kNone) tier_probe(*it);
}

void Engine::tier_probe(std::uint32_t seq) {
  Seq& q = seqs_[seq];
  q.rid = kv_.add_request(q.tokens, {.max_tokens = std::uint64_t{q.prompt_len} + q.max_new});
  q.computed = kv_.lookup_prefix(q.rid);
  q.tier_keys.clear();
  q.tier_status.clear();
  if (tier_adm_.tier_candidates(q.rid, q.tier_keys) == 0) {  // nothing past the local hit to ask for
    q.tier = Seq::TierPhase::kProbed;
    return;
  }
  tier_ops_.push_back({opt_.tier->contains(q.tier_keys), seq});
  q.tier = Seq::TierPhase::kProbing;
  ++stats_.tier_probes;
}

// After the admitting allocate: the get of the tier's pages, straight into the device pages
// (a GPU engine would fetch into pinned host memory and queue the H2D copy; the pages stay
// unread until the completion). False when the whole hit was local.
bool Engine::tier_start_loads(std::uint32_t seq) {
  Seq& q = seqs_[seq];
  const std::span<const kvmm::TierLoad> loads = tier_adm_.tier_loads(q.rid);
  q.tier_keys.clear();
  q.tier_status.clear();
  if (loads.empty()) {
    q.tier = Seq::TierPhase::kNone;
    return false;
  }
  put_pages_.clear();
  for (const kvmm::TierLoad& l : loads)
    put_pages_.push_back({l.key, arena_.data() + std::uint64_t{l.page} * layout_.small_page_bytes(l.key.group)});
  tier_ops_.push_back({opt_.tier->get(put_pages_), seq});
  q.tier = Seq::TierPhase::kLoading;
  q.computed = kv_.num_computed(q.rid);  // the local part; the rest once loaded
  stats_.hit_tokens += q.computed;
  stats_.tier_hit_tokens += q.tier_hit - q.computed;
  loading_.push_back(seq);
  return true;
}

// The get completed: the manager keeps the longest prefix every group serves (a failed
// page cuts the hit there; the rest is recomputed) and the request runs from there.
void Engine::tier_finish_loads(std::uint32_t seq, std::span<const kvmm::TierStatus> statuses) {
  Seq& q = seqs_[seq];
  const std::span<const kvmm::TierLoad> loads = tier_adm_.tier_loads(q.rid);
  if (loads.size() != statuses.size())
    kvmm::fail("tier get of request {}: {} statuses for {} loads", q.request, statuses.size(), loads.size());
  for (std::size_t i = 0; i < loads.size(); ++i) {
    if (statuses[i] != kvmm::TierStatus::kOk) {
      ++stats_.tier_failed_pages;
      continue;
    }
    ++stats_.tier_loaded_pages;
    just_loaded_.push_back({.group = loads[i].key.group, .page = loads[i].page, .hash = loads[i].key.hash});
    if (opt_.tier_page) {
      const std::uint64_t bytes = layout_.small_page_bytes(loads[i].key.group);
      opt_.tier_page(loads[i].key, {arena_.data() + std::uint64_t{loads[i].page} * bytes, bytes}, false);
    }
  }
  q.computed = tier_adm_.finish_loads(q.rid, statuses);
  stats_.tier_cut_tokens += q.tier_hit - q.computed;
  q.tier = Seq::TierPhase::kNone;
  std::erase(loading_, seq);
  running_.push_back(seq);
}

// After a step: every page the prefix cache newly stored (not one just loaded from the
// tier) is copied into a free offload slot and put, one put per step. The memcpy stands
// for the D2H copy a GPU engine queues on a copy stream; the network I/O is the tier's
// threads'. Best effort: with no free slot the page is skipped and counted, never waited on.
void Engine::tier_store() {
  kv_.take_events(cache_events_);
  put_pages_.clear();
  step_slots_.clear();
  for (std::size_t i = 0; i < cache_events_.size(); ++i) {
    const kvmm::CacheEvent& e = cache_events_[i];
    if (e.kind != kvmm::CacheEventKind::kStored) continue;
    const auto same_page = [&](const kvmm::CacheEvent& o) { return o.group == e.group && o.page == e.page; };
    if (std::any_of(just_loaded_.begin(), just_loaded_.end(), same_page)) continue;
    // Evicted again later in the step: its bytes may be another page's by now.
    if (std::any_of(
            cache_events_.begin() + static_cast<std::ptrdiff_t>(i) + 1, cache_events_.end(),
            [&](const kvmm::CacheEvent& o) { return o.kind == kvmm::CacheEventKind::kRemoved && same_page(o); }))
      continue;
    if (free_slots_.empty()) {
      ++stats_.tier_puts_skipped;
      continue;
    }
    const std::uint32_t slot = free_slots_.back();
    free_slots_.pop_back();
    const std::uint64_t bytes = layout_.small_page_bytes(e.group);
    std::byte* dst = offload_.get() + std::uint64_t{slot} * slot_bytes_;
    std::memcpy(dst, arena_.data() + std::uint64_t{e.page} * bytes, bytes);
    put_pages_.push_back({{e.group, e.hash}, dst});
    step_slots_.push_back(slot);
    if (opt_.tier_page) opt_.tier_page(put_pages_.back().key, {dst, bytes}, true);
  }
  just_loaded_.clear();
  if (put_pages_.empty()) return;
  const kvmm::TierTicket t = opt_.tier->put(put_pages_);
  for (std::uint32_t slot : step_slots_) slot_ticket_[slot] = t;
  stats_.tier_puts += put_pages_.size();
  ++puts_in_flight_;
}

std::string format_tier_report(const EngineStats& s) {
  const kvmm::TierHealth& h = s.tier_health;
  std::string r;
  r += fmt::format(
      "tier hits           {} tokens from the tier ({} admissions asked it): {} pages loaded, {} failed, "
      "{} tokens cut back and recomputed\n",
      s.tier_hit_tokens, s.tier_probes, s.tier_loaded_pages, s.tier_failed_pages, s.tier_cut_tokens);
  r += fmt::format(
      "tier puts           {} pages submitted: {} stored or already there, {} failed, {} skipped (no "
      "free offload slot)\n",
      s.tier_puts, s.tier_puts_ok, s.tier_puts_failed, s.tier_puts_skipped);
  r += fmt::format(
      "tier health         ok {}, miss {}, corrupt {}, timeout {}, unavailable {}; {} already stored; "
      "{} connects ({} failed), breaker {} ({} openings)\n",
      h.ok, h.misses, h.corrupt, h.timeouts, h.unavailable, h.put_existing, h.connects, h.connect_failures,
      h.breaker_open ? "open" : "closed", h.breaker_opens);
  return r;
}

}  // namespace mini
