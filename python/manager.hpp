// The kvmm Python module's KVCacheManager wrapper, shared by its units (manager.cpp: requests,
// plans, queries; batch.cpp: the batch calls, exports and the fused decode step): the
// per-manager single-thread guard, GIL release for long calls, array argument helpers.
// Each helper is O(1) (PerRequest: one array check).
#pragma once

#include "bindings.hpp"

#include "kvmm/error.hpp"
#include "kvmm/manager/kv_cache_manager.hpp"

#include <atomic>
#include <optional>
#include <vector>

namespace kvmm::py_bind {

using U32Array = py::array_t<std::uint32_t, py::array::c_style | py::array::forcecast>;
using U64Array = py::array_t<std::uint64_t, py::array::c_style | py::array::forcecast>;

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

 private:
  py::object arena_;  // declared first: outlives kv_
  std::optional<KVCacheManager> kv_;
  std::atomic<bool> busy_{false};
  GroupId decoder_group_ = 0;
  std::vector<CacheEvent> events_;
  KvEventBatch kv_events_;
  std::vector<Py_buffer> step_views_;
  std::vector<BlockTableOut> step_tables_;
};

// Releases the GIL for the scope when `release` (a long call).
struct MaybeRelease {
  std::optional<py::gil_scoped_release> r;
  explicit MaybeRelease(bool release) {
    if (release) r.emplace();
  }
};

inline std::span<const std::uint32_t> span_of(const U32Array& a, const char* what) {
  if (a.ndim() != 1) fail("{}: expected a 1-D array, got {} dimensions", what, a.ndim());
  return {a.data(), static_cast<std::size_t>(a.size())};
}

// One value per request: a scalar broadcast or an array of the batch's length.
template <typename T, typename A>
struct PerRequest {
  std::optional<A> array;
  T scalar = 0;
  PerRequest(const py::object& v, std::size_t n, const char* what) {
    if (py::isinstance<py::int_>(v) || (!py::isinstance<py::array>(v) && PyIndex_Check(v.ptr()))) {
      scalar = v.cast<T>();  // an int or a numpy integer scalar
      return;
    }
    array.emplace(A::ensure(v));
    if (!array->ptr()) throw py::type_error(fmt::format("{}: expected an int or an integer array", what));
    if (array->ndim() != 1 || static_cast<std::size_t>(array->size()) != n)
      fail("{}: {} values for a batch of {}", what, array->size(), n);
  }
  T operator[](std::size_t i) const { return array ? array->data()[i] : scalar; }
};

// The batch calls, the exports and decode_step (batch.cpp).
void bind_batch(py::class_<Manager>& c);

}  // namespace kvmm::py_bind
