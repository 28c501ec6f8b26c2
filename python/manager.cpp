// The kvmm Python module (_kvmm), part 2: KVCacheManager as kvmm.KVCacheManager. Request
// handles are ints; token and id arrays cross as numpy uint32 without a copy; batch calls
// (append / allocate / commit a whole step) and the CSR / dense exports are one crossing
// each, O(batch) in C++. The GIL is released in calls that may take long (hashing long
// prompts, lookups, big batches); a per-manager flag rejects a second thread meanwhile.
#include "bindings.hpp"

#include "kvmm/error.hpp"
#include "kvmm/manager/kv_cache_manager.hpp"

#include <pybind11/stl.h>

#include <atomic>
#include <optional>
#include <string>

namespace kvmm::py_bind {

namespace {

using U32Array = py::array_t<std::uint32_t, py::array::c_style | py::array::forcecast>;
using U64Array = py::array_t<std::uint64_t, py::array::c_style | py::array::forcecast>;

// Calls with more elements (tokens, requests, pages) than this release the GIL: below it
// the release/re-acquire (~0.1-0.2 us) costs more than another thread could gain.
constexpr std::size_t kReleaseGilAt = 1024;

std::atomic<std::int64_t> g_live_managers{0};

py::int_ hash_to_int(const BlockHash& h) {
  return py::reinterpret_borrow<py::int_>((py::int_(h.hi) << py::int_(64)) | py::int_(h.lo));
}

BlockHash hash_from(const py::handle& h, const char* what) {
  if (!py::isinstance<py::int_>(h)) throw py::type_error(fmt::format("{}: expected an int (128-bit hash)", what));
  py::int_ v = py::reinterpret_borrow<py::int_>(h);
  if (v < py::int_(0) || v >= (py::int_(1) << py::int_(128)))
    fail("{} = {}: a 128-bit hash is in [0, 2^128)", what, std::string(py::str(v)));
  const py::int_ mask = py::reinterpret_borrow<py::int_>((py::int_(1) << py::int_(64)) - py::int_(1));
  return {.lo = py::reinterpret_borrow<py::int_>(v & mask).cast<std::uint64_t>(),
          .hi = py::reinterpret_borrow<py::int_>(v >> py::int_(64)).cast<std::uint64_t>()};
}

// (hash, offset, length) tuples, sorted by offset (the manager checks the order).
std::vector<MultimodalItem> items_from(const py::object& items) {
  std::vector<MultimodalItem> out;
  if (items.is_none()) return out;
  for (const py::handle& it : items) {
    const py::tuple t = py::reinterpret_borrow<py::object>(it).cast<py::tuple>();
    if (t.size() != 3) fail("items: each item is (hash, offset, length), got {} fields", t.size());
    out.push_back({.hash = hash_from(t[0], "item hash"),
                   .offset = t[1].cast<std::uint64_t>(),
                   .length = t[2].cast<std::uint32_t>()});
  }
  return out;
}

py::array copies_array(std::span<const PageCopy> copies) {
  py::array_t<std::uint32_t> out({static_cast<py::ssize_t>(copies.size()), py::ssize_t{3}});
  auto w = out.mutable_unchecked<2>();
  for (std::size_t i = 0; i < copies.size(); ++i) {
    const auto k = static_cast<py::ssize_t>(i);
    w(k, 0) = copies[i].group;
    w(k, 1) = copies[i].src;
    w(k, 2) = copies[i].dst;
  }
  return out;
}

py::array ids_array(std::span<const PageId> ids) {
  py::array_t<std::uint32_t> out(static_cast<py::ssize_t>(ids.size()));
  std::copy(ids.begin(), ids.end(), out.mutable_data());
  return out;
}

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

 private:
  py::object arena_;  // declared first: outlives kv_
  std::optional<KVCacheManager> kv_;
  std::atomic<bool> busy_{false};
  GroupId decoder_group_ = 0;
  std::vector<CacheEvent> events_;
};

// Releases the GIL for the scope when `release` (a long call).
struct MaybeRelease {
  std::optional<py::gil_scoped_release> r;
  explicit MaybeRelease(bool release) {
    if (release) r.emplace();
  }
};

std::span<const std::uint32_t> span_of(const U32Array& a, const char* what) {
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

KVCacheManagerOptions options_from(std::uint32_t num_large_pages, std::uint32_t num_host_large_pages,
                                   std::uint32_t max_requests, bool prefix_caching, bool record_events,
                                   const py::object& log, std::uint64_t seed) {
  KVCacheManagerOptions o{.num_large_pages = num_large_pages,
                          .num_host_large_pages = num_host_large_pages,
                          .max_requests = max_requests,
                          .prefix_caching = prefix_caching,
                          .record_events = record_events,
                          .seed = seed};
  if (!log.is_none()) {
    if (!PyCallable_Check(log.ptr())) throw py::type_error("log: expected a callable(level: str, message: str)");
    // The callable is called with the GIL held; an exception it raises is reported as
    // unraisable (it must not unwind through the manager's call). Its last reference may
    // drop without the GIL (a manager freed on another thread): a deleter that takes it.
    std::shared_ptr<py::object> guarded(new py::object(log), [](py::object* p) {
      py::gil_scoped_acquire gil;
      delete p;
    });
    o.log = [guarded](LogLevel level, std::string_view msg) {
      py::gil_scoped_acquire gil;
      const char* name = level == LogLevel::kDebug ? "debug" : level == LogLevel::kInfo ? "info" : "warning";
      try {
        (*guarded)(name, py::str(msg.data(), msg.size()));
      } catch (py::error_already_set& e) {
        e.discard_as_unraisable("kvmm.KVCacheManager log callback");
      }
    };
  }
  return o;
}

void bind_stats(py::module_& m) {
  py::class_<GroupStats>(m, "GroupStats")
      .def_readonly("used_pages", &GroupStats::used_pages)
      .def_readonly("evictable_pages", &GroupStats::evictable_pages)
      .def_readonly("empty_pages", &GroupStats::empty_pages)
      .def_readonly("large_pages", &GroupStats::large_pages)
      .def_readonly("allocated_bytes", &GroupStats::allocated_bytes)
      .def_readonly("needed_bytes", &GroupStats::needed_bytes)
      .def_readonly("waste_bytes", &GroupStats::waste_bytes)
      .def_readonly("hit_pages", &GroupStats::hit_pages)
      .def_readonly("evicted_pages", &GroupStats::evicted_pages);
  py::class_<CacheStats>(m, "CacheStats")
      .def_readonly("groups", &CacheStats::groups)
      .def_readonly("free_large_pages", &CacheStats::free_large_pages)
      .def_readonly("lookups", &CacheStats::lookups)
      .def_readonly("lookup_tokens", &CacheStats::lookup_tokens)
      .def_readonly("hit_tokens", &CacheStats::hit_tokens);
  py::class_<ManagerCounters>(m, "ManagerCounters")
      .def_readonly("lookups", &ManagerCounters::lookups)
      .def_readonly("lookup_tokens", &ManagerCounters::lookup_tokens)
      .def_readonly("hit_tokens", &ManagerCounters::hit_tokens)
      .def_readonly("admissions", &ManagerCounters::admissions)
      .def_readonly("admitted_lookup_tokens", &ManagerCounters::admitted_lookup_tokens)
      .def_readonly("admitted_hit_tokens", &ManagerCounters::admitted_hit_tokens)
      .def_readonly("refused_admissions", &ManagerCounters::refused_admissions)
      .def_readonly("refused_allocations", &ManagerCounters::refused_allocations)
      .def_readonly("lost_hits", &ManagerCounters::lost_hits)
      .def_readonly("cow_copies", &ManagerCounters::cow_copies)
      .def_readonly("swapped_out_pages", &ManagerCounters::swapped_out_pages)
      .def_readonly("swapped_in_pages", &ManagerCounters::swapped_in_pages)
      .def_readonly("evicted_pages", &ManagerCounters::evicted_pages)
      .def_readonly("active_requests", &ManagerCounters::active_requests)
      .def_readonly("free_large_pages", &ManagerCounters::free_large_pages)
      .def_readonly("large_pages", &ManagerCounters::large_pages)
      .def_readonly("used_pages", &ManagerCounters::used_pages)
      .def_readonly("evictable_pages", &ManagerCounters::evictable_pages);
}

// export_csr: into the caller's int32 arrays (returns the number of indices written), or
// into new package-owned Buffers (returns numpy views (indptr, indices, last_page_len,
// first_page or None)).
py::object export_csr(Manager& m, GroupId g, const U32Array& batch_arr, const py::object& indptr,
                      const py::object& indices, const py::object& last_page_len, PageId null_page, bool trim,
                      const py::object& first_page) {
  auto kv = m.use();
  const std::span<const RequestId> batch = span_of(batch_arr, "batch");
  const KernelExportOptions o{.null_page = null_page, .trim = trim};
  const int given = !indptr.is_none() + !indices.is_none() + !last_page_len.is_none();
  if (given == 3) {
    const Int32Out p = int32_out(indptr, "indptr"), i = int32_out(indices, "indices"),
                   l = int32_out(last_page_len, "last_page_len");
    std::optional<Int32Out> f;
    if (!first_page.is_none()) f.emplace(int32_out(first_page, "first_page"));
    MaybeRelease release(i.size >= kReleaseGilAt);
    return py::int_(kv->export_csr(g, batch, {p.data, p.size}, {i.data, i.size}, {l.data, l.size}, o,
                                   f ? std::span<std::int32_t>(f->data, f->size) : std::span<std::int32_t>()));
  }
  if (given != 0) fail("export_csr: give indptr, indices and last_page_len together, or none of them");
  if (!first_page.is_none()) fail("export_csr: first_page goes with caller-given arrays");
  std::uint64_t bound = 0;  // a row exports at most the pages its table holds
  for (RequestId r : batch) bound += kv->page_table(r, g).size();
  const auto n = static_cast<py::ssize_t>(batch.size());
  py::object p = py::cast(Buffer({n + 1})), i = py::cast(Buffer({static_cast<py::ssize_t>(bound)})),
             l = py::cast(Buffer({n}));
  py::object f = trim ? py::cast(Buffer({n})) : py::none();
  Buffer &bp = p.cast<Buffer&>(), &bi = i.cast<Buffer&>(), &bl = l.cast<Buffer&>();
  std::size_t nnz = 0;
  {
    MaybeRelease release(bound >= kReleaseGilAt);
    nnz = kv->export_csr(g, batch, bp.data, bi.data, bl.data, o,
                         trim ? std::span<std::int32_t>(f.cast<Buffer&>().data) : std::span<std::int32_t>());
  }
  return py::make_tuple(view_of(p), view_prefix(i, static_cast<py::ssize_t>(nnz)), view_of(l),
                        trim ? py::object(view_of(f)) : py::object(py::none()));
}

py::object export_dense(Manager& m, GroupId g, const U32Array& batch_arr, std::optional<std::uint32_t> max_pages,
                        const py::object& block_table, PageId null_page) {
  auto kv = m.use();
  const std::span<const RequestId> batch = span_of(batch_arr, "batch");
  const KernelExportOptions o{.null_page = null_page};
  if (!block_table.is_none()) {
    std::uint32_t width = 0;
    const Int32Out t = int32_out(block_table, "block_table");
    if (max_pages) {
      width = *max_pages;
    } else if (t.info.ndim == 2) {
      width = static_cast<std::uint32_t>(t.info.shape[1]);
    } else {
      fail("export_dense: max_pages is needed with a 1-D block_table");
    }
    MaybeRelease release(t.size >= kReleaseGilAt);
    kv->export_dense(g, batch, {t.data, t.size}, width, o);
    return py::none();
  }
  std::uint32_t width = 0;
  if (max_pages) {
    width = *max_pages;
  } else {
    for (RequestId r : batch)
      width = std::max<std::uint32_t>(width, static_cast<std::uint32_t>(kv->page_table(r, g).size()));
  }
  py::object t = py::cast(Buffer({static_cast<py::ssize_t>(batch.size()), static_cast<py::ssize_t>(width)}));
  Buffer& bt = t.cast<Buffer&>();
  {
    MaybeRelease release(bt.data.size() >= kReleaseGilAt);
    kv->export_dense(g, batch, bt.data, width, o);
  }
  return view_of(t);
}

py::int_ export_dense_incremental(Manager& m, GroupId g, const U32Array& batch_arr, const py::object& block_table,
                                  std::optional<std::uint32_t> max_pages, PageId null_page) {
  auto kv = m.use();
  const std::span<const RequestId> batch = span_of(batch_arr, "batch");
  const Int32Out t = int32_out(block_table, "block_table");
  std::uint32_t width = 0;
  if (max_pages) {
    width = *max_pages;
  } else if (t.info.ndim == 2) {
    width = static_cast<std::uint32_t>(t.info.shape[1]);
  } else {
    fail("export_dense_incremental: max_pages is needed with a 1-D block_table");
  }
  MaybeRelease release(batch.size() >= kReleaseGilAt);
  return py::int_(kv->export_dense_incremental(g, batch, {t.data, t.size}, width, {.null_page = null_page}));
}

void bind_batch(py::class_<Manager>& c) {
  c.def(
       "append_batch",
       [](Manager& m, const U32Array& ids, const U32Array& tokens) {
         auto kv = m.use();
         const auto r = span_of(ids, "ids");
         const auto t = span_of(tokens, "tokens");
         if (r.size() != t.size()) fail("append_batch: {} tokens for {} requests (one each)", t.size(), r.size());
         MaybeRelease release(r.size() >= kReleaseGilAt);
         for (std::size_t i = 0; i < r.size(); ++i) kv->append_token(r[i], t[i]);
       },
       py::arg("ids"), py::arg("tokens"), "append_token(ids[i], tokens[i]) for every i, one crossing")
      .def(
          "allocate_batch",
          [](Manager& m, const U32Array& ids, const py::object& num_new_tokens, const py::object& lookahead) {
            auto kv = m.use();
            const auto r = span_of(ids, "ids");
            const PerRequest<std::uint32_t, U32Array> n(num_new_tokens, r.size(), "num_new_tokens");
            const PerRequest<std::uint32_t, U32Array> la(lookahead, r.size(), "lookahead");
            MaybeRelease release(r.size() >= kReleaseGilAt);
            std::size_t done = 0;
            while (done < r.size() && kv->allocate(r[done], n[done], la[done])) ++done;
            return done;
          },
          py::arg("ids"), py::arg("num_new_tokens") = 1, py::arg("lookahead") = 0,
          "allocate() for ids in order, stopping at the first refused one; returns how many got their pages "
          "(the refused one and those after it are unchanged)")
      .def(
          "commit_batch",
          [](Manager& m, const U32Array& ids, const py::object& num_computed) {
            auto kv = m.use();
            const auto r = span_of(ids, "ids");
            if (num_computed.is_none()) {
              const GroupId g = m.decoder_group();
              MaybeRelease release(r.size() >= kReleaseGilAt);
              for (RequestId id : r) kv->commit(id, kv->kv_len(id, g));
              return;
            }
            const PerRequest<std::uint64_t, U64Array> upto(num_computed, r.size(), "num_computed");
            MaybeRelease release(r.size() >= kReleaseGilAt);
            for (std::size_t i = 0; i < r.size(); ++i) kv->commit(r[i], upto[i]);
          },
          py::arg("ids"), py::arg("num_computed") = py::none(),
          "commit() for each id; num_computed None: what its last allocate scheduled (kv_len)")
      .def("export_csr", &export_csr, py::arg("group"), py::arg("batch"), py::arg("indptr") = py::none(),
           py::arg("indices") = py::none(), py::arg("last_page_len") = py::none(), py::kw_only(),
           py::arg("null_page") = kNullPage, py::arg("trim") = false, py::arg("first_page") = py::none(),
           "Group g's CSR page tables of the batch (FlashInfer plan() format). With indptr, indices and "
           "last_page_len (writable int32 arrays) given: fills them, returns the number of indices. Without: "
           "returns zero-copy numpy views (indptr, indices, last_page_len, first_page or None) of new kvmm.Buffers")
      .def("export_dense", &export_dense, py::arg("group"), py::arg("batch"), py::arg("max_pages") = py::none(),
           py::arg("block_table") = py::none(), py::kw_only(), py::arg("null_page") = kNullPage,
           "Group g's [batch, max_pages] block table: into block_table (returns None) or a new Buffer's view")
      .def("export_dense_incremental", &export_dense_incremental, py::arg("group"), py::arg("batch"),
           py::arg("block_table"), py::arg("max_pages") = py::none(), py::kw_only(), py::arg("null_page") = kNullPage,
           "export_dense into block_table, which holds this manager's previous incremental export of the group "
           "(same array, max_pages, null_page): rows of unchanged requests get only their changed entries. "
           "Returns the number of entries written");
}

void bind_requests(py::class_<Manager>& c) {
  c.def(
       "add_request",
       [](Manager& m, const U32Array& tokens, std::uint32_t lora_id, const py::object& items,
          std::uint64_t prompt_tokens, const std::string& cache_salt, std::uint32_t priority,
          std::uint64_t max_tokens) {
         auto kv = m.use();
         const auto t = span_of(tokens, "tokens");
         const std::vector<MultimodalItem> it = items_from(items);
         const RequestExtras extras{.lora_id = lora_id,
                                    .items = it,
                                    .prompt_tokens = prompt_tokens,
                                    .cache_salt = cache_salt,
                                    .priority = priority,
                                    .max_tokens = max_tokens};
         MaybeRelease release(t.size() >= kReleaseGilAt);
         return kv->add_request(t, extras);
       },
       py::arg("tokens"), py::kw_only(), py::arg("lora_id") = 0, py::arg("items") = py::none(),
       py::arg("prompt_tokens") = 0, py::arg("cache_salt") = "", py::arg("priority") = 0, py::arg("max_tokens") = 0,
       "Registers a request (prompt token ids; items: (hash, offset, length) images) and returns its handle")
      .def(
          "append_tokens",
          [](Manager& m, RequestId r, const U32Array& tokens) {
            auto kv = m.use();
            const auto t = span_of(tokens, "tokens");
            MaybeRelease release(t.size() >= kReleaseGilAt);
            kv->append_tokens(r, t);
          },
          py::arg("r"), py::arg("tokens"))
      .def(
          "append_token", [](Manager& m, RequestId r, std::uint32_t t) { m.use()->append_token(r, t); }, py::arg("r"),
          py::arg("token"))
      .def(
          "lookup_prefix",
          [](Manager& m, RequestId r) {
            auto kv = m.use();
            MaybeRelease release(kv->num_tokens(r) >= kReleaseGilAt);
            return kv->lookup_prefix(r);
          },
          py::arg("r"))
      .def(
          "allocate",
          [](Manager& m, RequestId r, std::uint32_t n, std::uint32_t lookahead) {
            auto kv = m.use();
            MaybeRelease release(n >= kReleaseGilAt);
            return kv->allocate(r, n, lookahead);
          },
          py::arg("r"), py::arg("num_new_tokens"), py::arg("lookahead") = 0)
      .def(
          "commit", [](Manager& m, RequestId r, std::uint64_t n) { m.use()->commit(r, n); }, py::arg("r"),
          py::arg("num_computed_tokens"))
      .def(
          "fork", [](Manager& m, RequestId r) { return m.use()->fork(r); }, py::arg("parent"))
      .def(
          "free", [](Manager& m, RequestId r) { m.use()->free(r); }, py::arg("r"))
      .def(
          "reset", [](Manager& m, RequestId r) { m.use()->reset(r); }, py::arg("r"));
}

// Preemption plans, copy-on-write copies, the prefix cache's pins and priorities.
void bind_plans(py::class_<Manager>& c) {
  c.def(
       "swap_out",
       [](Manager& m, RequestId r) -> py::object {
         auto plan = m.use()->swap_out(r);
         return plan ? py::object(copies_array(*plan)) : py::object(py::none());
       },
       py::arg("r"), "Every page of r to the host pool: [n, 3] uint32 (group, src, dst), or None (host full)")
      .def(
          "swap_in",
          [](Manager& m, RequestId r) -> py::object {
            auto plan = m.use()->swap_in(r);
            return plan ? py::object(copies_array(*plan)) : py::object(py::none());
          },
          py::arg("r"))
      .def(
          "copies", [](Manager& m) { return copies_array(m.use()->copies()); },
          "Copy-on-write copies since begin_step(): [n, 3] uint32 (group, src, dst)")
      .def("reset_prefix_cache",
           [](Manager& m) {
             auto kv = m.use();
             py::gil_scoped_release release;
             kv->reset_prefix_cache();
           })
      .def(
          "pin_prefix", [](Manager& m, RequestId r) { return m.use()->pin_prefix(r); }, py::arg("r"))
      .def(
          "unpin", [](Manager& m, PinId p) { m.use()->unpin(p); }, py::arg("pin"))
      .def(
          "set_priority", [](Manager& m, RequestId r, std::uint32_t p) { m.use()->set_priority(r, p); }, py::arg("r"),
          py::arg("priority"))
      .def(
          "cached_image",
          [](Manager& m, const py::object& hash, std::uint32_t length, std::uint32_t lora_id) {
            const MultimodalItem item{.hash = hash_from(hash, "hash"), .offset = 0, .length = length};
            return m.use()->cached_image(item, lora_id);
          },
          py::arg("hash"), py::arg("length"), py::arg("lora_id") = 0);
}

void bind_queries(py::class_<Manager>& c) {
  c.def_property_readonly("layout", [](Manager& m) { return m.kv().layout(); })
      .def("begin_step", [](Manager& m) { return m.use()->begin_step(); })
      .def_property_readonly("step", [](Manager& m) { return m.use()->step(); })
      .def("stats",
           [](Manager& m) {
             auto kv = m.use();
             py::gil_scoped_release release;
             return kv->stats();
           })
      .def("counters", [](Manager& m) { return m.use()->counters(); })
      .def(
          "take_events",
          [](Manager& m) {
            auto kv = m.use();
            kv->take_events(m.events());
            py::list out;
            for (const CacheEvent& e : m.events())
              out.append(py::make_tuple(e.kind == CacheEventKind::kStored ? "stored" : "removed", e.group, e.page,
                                        hash_to_int(e.hash)));
            return out;
          },
          "Recorded events since the last take: [(kind 'stored'|'removed', group, page, hash)]")
      .def(
          "is_active", [](Manager& m, RequestId r) { return m.use()->is_active(r); }, py::arg("r"))
      .def(
          "is_swapped", [](Manager& m, RequestId r) { return m.use()->is_swapped(r); }, py::arg("r"))
      .def_property_readonly("num_active", [](Manager& m) { return m.use()->num_active(); })
      .def(
          "num_computed", [](Manager& m, RequestId r) { return m.use()->num_computed(r); }, py::arg("r"))
      .def(
          "num_allocated", [](Manager& m, RequestId r) { return m.use()->num_allocated(r); }, py::arg("r"))
      .def(
          "num_tokens", [](Manager& m, RequestId r) { return m.use()->num_tokens(r); }, py::arg("r"))
      .def(
          "page_table", [](Manager& m, RequestId r, GroupId g) { return ids_array(m.use()->page_table(r, g)); },
          py::arg("r"), py::arg("group"), "A copy of r's page ids in group g (uint32; NULL_PAGE for freed ones)")
      .def(
          "host_page_table",
          [](Manager& m, RequestId r, GroupId g) { return ids_array(m.use()->host_page_table(r, g)); }, py::arg("r"),
          py::arg("group"))
      .def(
          "kv_len", [](Manager& m, RequestId r, GroupId g) { return m.use()->kv_len(r, g); }, py::arg("r"),
          py::arg("group"))
      .def(
          "row", [](Manager& m, RequestId r) { return m.use()->row(r); }, py::arg("r"))
      .def_property_readonly("free_large_pages", [](Manager& m) { return m.use()->large_pages().num_free(); })
      .def(
          "num_used_pages", [](Manager& m, GroupId g) { return m.use()->num_used_pages(g); }, py::arg("group"))
      .def(
          "num_evictable_pages", [](Manager& m, GroupId g) { return m.use()->num_evictable_pages(g); },
          py::arg("group"))
      .def(
          "num_evicted_pages", [](Manager& m, GroupId g) { return m.use()->num_evicted_pages(g); }, py::arg("group"))
      .def("check_invariants", [](Manager& m) {
        auto kv = m.use();
        py::gil_scoped_release release;
        kv->check_invariants();
      });
}

}  // namespace

void bind_manager(py::module_& m) {
  bind_stats(m);
  const KVCacheManagerOptions d;
  py::class_<Manager> c(m, "KVCacheManager", "What a scheduler calls each step (see docs/python.md)");
  c.def(py::init([](const KVLayout& layout, std::uint32_t num_large_pages, std::uint32_t num_host_large_pages,
                    std::uint32_t max_requests, bool prefix_caching, bool record_events, const py::object& log,
                    std::uint64_t seed, const py::object& arena) {
          if (!arena.is_none() && !py::isinstance<Arena>(arena)) throw py::type_error("arena: expected a kvmm.Arena");
          return std::make_unique<Manager>(layout,
                                           options_from(num_large_pages, num_host_large_pages, max_requests,
                                                        prefix_caching, record_events, log, seed),
                                           arena);
        }),
        py::arg("layout"), py::kw_only(), py::arg("num_large_pages") = 0, py::arg("num_host_large_pages") = 0,
        py::arg("max_requests") = d.max_requests, py::arg("prefix_caching") = d.prefix_caching,
        py::arg("record_events") = d.record_events, py::arg("log") = py::none(), py::arg("seed") = d.seed,
        py::arg("arena") = py::none());
  c.attr("MAX_TOKENS") = KVCacheManager::kMaxTokens;
  c.attr("MAX_REQUESTS") = KVCacheManager::kMaxRequests;
  bind_requests(c);
  bind_plans(c);
  bind_batch(c);
  bind_queries(c);
  m.def(
      "_live_managers", [] { return g_live_managers.load(); }, "KVCacheManager objects alive (leak tests)");
}

}  // namespace kvmm::py_bind
