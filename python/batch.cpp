// The kvmm Python module, part 3: KVCacheManager's batch calls (append / allocate / commit a
// whole step's requests), the page-table exports into caller arrays or new Buffers, and the
// fused decode step: one crossing each, O(batch) in C++ plus the pages written.
#include "manager.hpp"

#include <pybind11/stl.h>

#include <algorithm>
#include <span>
#include <string>
#include <string_view>

namespace kvmm::py_bind {

namespace {

// The columns of a caller's block table: max_pages when given, else a 2-D table's second
// dimension; `what` names the table in the error for a 1-D one without max_pages.
template <class... Args>
std::uint32_t table_width(std::optional<std::uint32_t> max_pages, py::ssize_t ndim, const py::ssize_t* shape,
                          fmt::format_string<Args...> what, Args&&... args) {
  if (max_pages) return *max_pages;
  if (ndim == 2) return static_cast<std::uint32_t>(shape[1]);
  fail("{}: max_pages is needed with a {}-D table", fmt::format(what, std::forward<Args>(args)...), ndim);
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
    const Int32Out t = int32_out(block_table, "block_table");
    const std::uint32_t width = table_width(max_pages, t.info.ndim, t.info.shape.data(), "export_dense: block_table");
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
  const std::uint32_t width =
      table_width(max_pages, t.info.ndim, t.info.shape.data(), "export_dense_incremental: block_table");
  MaybeRelease release(batch.size() >= kReleaseGilAt);
  return py::int_(kv->export_dense_incremental(g, batch, {t.data, t.size}, width, {.null_page = null_page}));
}

// decode_step's tables, held for the call: tables[g] is group g's writable C-contiguous int32
// block table, or None for a group the step does not export. The views live in the
// manager's scratch, released when this goes, or when the constructor raises part way
// (int32_out's buffer_info would copy the shape and format of each: heap allocations).
class StepTables {
 public:
  StepTables(Manager& m, const py::sequence& tables, std::optional<std::uint32_t> max_pages)
      : views_(m.step_views()), outs_(m.step_tables()) {
    outs_.clear();
    for (std::size_t g = 0; g < tables.size(); ++g) {
      const py::object t = tables[g];
      if (t.is_none()) continue;
      if (!PyObject_CheckBuffer(t.ptr()))
        throw py::type_error(fmt::format("tables[{}]: expected a writable int32 array or None, got {}", g,
                                         std::string(py::str(t.get_type().attr("__name__")))));
      Py_buffer v{};
      if (PyObject_GetBuffer(t.ptr(), &v, PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_ND | PyBUF_C_CONTIGUOUS) != 0) {
        PyErr_Clear();
        throw py::type_error(fmt::format("tables[{}]: the array must be writable and C-contiguous", g));
      }
      views_.held.push_back(v);  // released by Views' destructor from here on
      const std::string_view f = v.format != nullptr ? v.format : "B";
      if (v.itemsize != 4 || !(f == "i" || f == "=i" || f == "<i" || (f == "l" && sizeof(long) == 4)))
        throw py::type_error(
            fmt::format("tables[{}]: dtype must be int32, got format '{}' of {} bytes", g, f, v.itemsize));
      const std::uint32_t w = table_width(max_pages, v.ndim, v.shape, "tables[{}]", g);
      if (!outs_.empty() && w != width_)
        fail("tables[{}]: {} columns, tables before it have {} (give max_pages)", g, w, width_);
      width_ = w;
      outs_.push_back({.group = static_cast<GroupId>(g),
                       .table = {static_cast<std::int32_t*>(v.buf), static_cast<std::size_t>(v.len / 4)}});
    }
  }
  StepTables(const StepTables&) = delete;
  StepTables& operator=(const StepTables&) = delete;
  std::span<const BlockTableOut> outs() const { return outs_; }
  std::uint32_t width() const { return width_; }

 private:
  struct Views {  // a member: destroyed when the constructor's body raises, too
    std::vector<Py_buffer>& held;
    explicit Views(std::vector<Py_buffer>& v) : held(v) { held.clear(); }
    ~Views() {
      for (Py_buffer& v : held) PyBuffer_Release(&v);
      held.clear();
    }
    Views(const Views&) = delete;
    Views& operator=(const Views&) = delete;
  };
  Views views_;
  std::vector<BlockTableOut>& outs_;
  std::uint32_t width_ = 0;
};

std::size_t decode_step(Manager& m, const U32Array& ids, const U32Array& tokens, const py::sequence& tables,
                        std::optional<std::uint32_t> max_pages, PageId null_page) {
  auto kv = m.use();
  const auto r = span_of(ids, "ids");
  const auto t = span_of(tokens, "tokens");
  const StepTables st(m, tables, max_pages);
  MaybeRelease release(r.size() >= kReleaseGilAt);
  return kv->decode_step(r, t, st.outs(), st.width(), {.null_page = null_page});
}

}  // namespace

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
           "Returns the number of entries written")
      .def("decode_step", &decode_step, py::arg("ids"), py::arg("tokens"), py::arg("tables"),
           py::arg("max_pages") = py::none(), py::kw_only(), py::arg("null_page") = kNullPage,
           "A decode step of running requests in one crossing: commit_batch(ids) (each one's last allocate is "
           "computed), append_batch(ids, tokens), allocate_batch(ids, 1), and if every request got its page, "
           "export_dense_incremental of group g into tables[g] (an int32 [batch, max_pages] array holding the "
           "group's previous incremental export, or None to skip the group). Returns how many requests got their "
           "page (len(ids): tables written; fewer: tables untouched)");
}

}  // namespace kvmm::py_bind
