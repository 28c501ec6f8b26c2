// The kvmm Python module's KVCacheManager wrapper, shared by its units (manager.cpp: requests,
// plans, queries; batch.cpp: the batch calls, exports and the fused decode step): the
// per-manager single-thread guard, GIL release for long calls, array argument helpers, the
// batch calls' validation scratch and each group's last incremental-export table.
// Each helper is O(1) for a uint32 array (args.hpp: O(n) to check and convert another one).
#pragma once

#include "args.hpp"
#include "bindings.hpp"

#include "kvmm/error.hpp"
#include "kvmm/manager/kernel_exports.hpp"
#include "kvmm/manager/kv_cache_manager.hpp"
#include "kvmm/testing/manager_inspector.hpp"

#include <atomic>
#include <optional>
#include <vector>

namespace kvmm::py_bind {

// Calls with more elements (tokens, requests, pages) than this release the GIL: below it
// the release/re-acquire (~0.1-0.2 us) costs more than another thread could gain.
constexpr std::size_t kReleaseGilAt = 1024;

inline std::atomic<std::int64_t> g_live_managers{0};  // KVCacheManager objects alive (leak tests)

class Manager {
 public:
  Manager(KVLayout layout, KVCacheManagerOptions o, py::object arena) : arena_(std::move(arena)) {
    if (!arena_.is_none()) {
      Arena& a = arena_.cast<Arena&>();
      if (a.in_use) fail("arena: already the page source of another KVCacheManager");
      if (o.num_large_pages == 0) o.num_large_pages = a.pages->capacity();
      if (o.num_large_pages != a.pages->capacity())
        fail("num_large_pages = {}: the arena holds {}", o.num_large_pages, a.pages->capacity());
      if (a.arena->layout().large_page_bytes() != layout.large_page_bytes())
        fail("arena: planned for large pages of {} bytes, the layout's are {}", a.arena->layout().large_page_bytes(),
             layout.large_page_bytes());
      o.large_page_source = a.pages.get();
      kv_.emplace(std::move(layout), o);
      a.in_use = true;
    } else {
      kv_.emplace(std::move(layout), o);
    }
    prefix_caching_ = o.prefix_caching;
    last_tables_.resize(kv_->layout().num_groups());
    for (GroupId g = 0; g < kv_->layout().num_groups(); ++g)
      if (kv_->layout().group(g).is_decoder()) {
        decoder_group_ = g;
        break;
      }
    ++g_live_managers;
  }
  ~Manager() {
    kv_.reset();
    if (!arena_.is_none()) arena_.cast<Arena&>().in_use = false;
    --g_live_managers;
  }
  Manager(const Manager&) = delete;
  Manager& operator=(const Manager&) = delete;

  // Marks the manager in use for one call; a second thread (possible while a call runs
  // with the GIL released) or a log callback calling back gets kvmm.Error.
  class Use {
   public:
    explicit Use(Manager& m) : m_(m) {
      if (m_.busy_.exchange(true, std::memory_order_acquire))
        fail("KVCacheManager: called while another call runs (single-threaded by contract)");
    }
    ~Use() { m_.busy_.store(false, std::memory_order_release); }
    Use(const Use&) = delete;
    Use& operator=(const Use&) = delete;
    KVCacheManager* operator->() { return &*m_.kv_; }
    KVCacheManager& operator*() { return *m_.kv_; }

   private:
    Manager& m_;
  };
  Use use() { return Use(*this); }
  const KVCacheManager& kv() const { return *kv_; }
  GroupId decoder_group() const { return decoder_group_; }
  std::vector<CacheEvent>& events() { return events_; }
  KvEventBatch& kv_events() { return kv_events_; }
  // decode_step's scratch: the tables' buffer views and spans (capacity kept: no heap
  // allocation per step).
  std::vector<Py_buffer>& step_views() { return step_views_; }
  std::vector<BlockTableOut>& step_tables() { return step_tables_; }
  bool prefix_caching() const { return prefix_caching_; }
  // Why the last allocate() from Python answered as it did (last_allocate_result).
  AllocateStatus& last_allocate() { return last_allocate_; }
  // The table each group's last incremental export went into, referenced until the next
  // one: while it is, no other array can be allocated at its address, so the C++ side's
  // address check tells another table from it exactly.
  std::vector<py::object>& last_tables() { return last_tables_; }
  // A batch's validation scratch, indexed by request row: the value a request reaches after
  // its earlier elements in the batch (a request may appear more than once), valid where
  // mark[row] == stamp. O(1) per element, no heap allocation in steady state.
  struct BatchScratch {
    std::vector<std::uint64_t> value;
    std::vector<std::uint32_t> mark;
    std::uint32_t stamp = 0;
    std::vector<std::uint64_t> element;  // a value per batch element (commit_batch's targets)
    void begin() {
      if (++stamp == 0) {  // wrapped: forget every mark
        std::fill(mark.begin(), mark.end(), 0);
        stamp = 1;
      }
    }
    // The value of `row` so far in this batch, `initial` the first time.
    std::uint64_t& at(std::uint32_t row, std::uint64_t initial) {
      if (row >= mark.size()) {  // grows to the rows in use (at most max_requests); marks kept
        value.resize(std::size_t{row} + 1);
        mark.resize(std::size_t{row} + 1, 0);
      }
      if (mark[row] != stamp) {
        mark[row] = stamp;
        value[row] = initial;
      }
      return value[row];
    }
  };
  BatchScratch& scratch() { return scratch_; }

 private:
  py::object arena_;  // declared first: outlives kv_
  std::optional<KVCacheManager> kv_;
  std::atomic<bool> busy_{false};
  GroupId decoder_group_ = 0;
  std::vector<CacheEvent> events_;
  KvEventBatch kv_events_;
  std::vector<Py_buffer> step_views_;
  std::vector<BlockTableOut> step_tables_;
  AllocateStatus last_allocate_ = AllocateStatus::kOk;
  bool prefix_caching_ = false;
  std::vector<py::object> last_tables_;
  BatchScratch scratch_;
};

// Releases the GIL for the scope when `release` (a long call).
struct MaybeRelease {
  std::optional<py::gil_scoped_release> r;
  explicit MaybeRelease(bool release) {
    if (release) r.emplace();
  }
};

// An ids or tokens argument: the checked uint32 array (args.hpp), held for the call, and
// its elements.
struct U32Arg {
  py::array_t<std::uint32_t> array;
  std::span<const std::uint32_t> span;
  U32Arg(const py::handle& obj, const char* what)
      : array(int_array<std::uint32_t>(obj, what)), span(array.data(), static_cast<std::size_t>(array.size())) {}
  std::size_t size() const { return span.size(); }
  std::uint32_t operator[](std::size_t i) const { return span[i]; }
};

// One value per request: an int broadcast, or an integer array or sequence of the batch's
// length, checked as int_array / int_scalar check them (naming `what`).
template <typename T>
struct PerRequest {
  std::optional<py::array_t<T>> array;
  T scalar = 0;
  PerRequest(const py::object& v, std::size_t n, const char* what) {
    const bool many = py::isinstance<py::array>(v) || PyObject_CheckBuffer(v.ptr()) ||
                      (PySequence_Check(v.ptr()) && !PyUnicode_Check(v.ptr()));
    if (!many) {
      scalar = int_scalar<T>(v, what);
      return;
    }
    array.emplace(int_array<T>(v, what));
    if (static_cast<std::size_t>(array->size()) != n) fail("{}: {} values for a batch of {}", what, array->size(), n);
  }
  T operator[](std::size_t i) const { return array ? array->data()[i] : scalar; }
};

// The batch calls, the exports and decode_step (batch.cpp).
void bind_batch(py::class_<Manager>& c);

}  // namespace kvmm::py_bind
