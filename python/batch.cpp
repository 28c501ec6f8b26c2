// The kvmm Python module, part 3: KVCacheManager's batch calls (append / allocate / commit a
// whole step's requests), the page-table exports into caller arrays or new Buffers, and the
// fused decode step: one crossing each, O(batch) in C++ plus the pages written. Each batch
// call checks the whole batch before it changes anything (a few O(1) queries per element):
// one that raises leaves the manager as it was, its error naming the element's index.
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

// Runs body(); a kvmm::Error naming a handle of `ids` ("request = 7: ...", a stale or
// swapped one) is raised again with its index (`batch[3]: request = 7: ...`). Free unless
// it raises.
template <class F>
auto indexed(std::span<const RequestId> ids, const char* what, F&& body) -> decltype(body()) {
  try {
    return body();
  } catch (const Error& e) {
    const std::string_view msg = e.what();
    if (msg.starts_with("request = "))
      for (std::size_t i = 0; i < ids.size(); ++i)
        if (msg.starts_with(fmt::format("request = {}:", ids[i]))) fail("{}[{}]: {}", what, i, msg);
    throw;
  }
}

// export_csr: into the caller's int32 arrays (returns the number of indices written), or
// into new package-owned Buffers (returns numpy views (indptr, indices, last_page_len,
// first_page or None)).
py::object export_csr_of(Manager& m, Int<GroupId> g, std::span<const RequestId> batch, const py::object& indptr,
                         const py::object& indices, const py::object& last_page_len, Int<PageId> null_page, bool trim,
                         const py::object& first_page);

py::object export_csr(Manager& m, Int<GroupId> g, const py::object& batch_arg, const py::object& indptr,
                      const py::object& indices, const py::object& last_page_len, Int<PageId> null_page, bool trim,
                      const py::object& first_page) {
  const U32Arg batch_arr(batch_arg, "batch");
  const std::span<const RequestId> batch = batch_arr.span;
  return indexed(batch, "batch", [&] {
    return export_csr_of(m, g, batch, indptr, indices, last_page_len, null_page, trim, first_page);
  });
}

py::object export_csr_of(Manager& m, Int<GroupId> g, std::span<const RequestId> batch, const py::object& indptr,
                         const py::object& indices, const py::object& last_page_len, Int<PageId> null_page, bool trim,
                         const py::object& first_page) {
  auto kv = m.use();
  const KernelExportOptions o{.null_page = null_page, .trim = trim};
  const int given = !indptr.is_none() + !indices.is_none() + !last_page_len.is_none();
  if (given == 3) {
    const Int32Out p = int32_out(indptr, "indptr"), i = int32_out(indices, "indices"),
                   l = int32_out(last_page_len, "last_page_len");
    std::optional<Int32Out> f;
    if (!first_page.is_none()) f.emplace(int32_out(first_page, "first_page"));
    MaybeRelease release(i.size >= kReleaseGilAt);
    return py::int_(
        KernelExports(*kv).export_csr(g, batch, {p.data, p.size}, {i.data, i.size}, {l.data, l.size}, o,
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
    nnz = KernelExports(*kv).export_csr(
        g, batch, bp.data, bi.data, bl.data, o,
        trim ? std::span<std::int32_t>(f.cast<Buffer&>().data) : std::span<std::int32_t>());
  }
  return py::make_tuple(view_of(p), view_prefix(i, static_cast<py::ssize_t>(nnz)), view_of(l),
                        trim ? py::object(view_of(f)) : py::object(py::none()));
}

py::object export_dense_of(Manager& m, Int<GroupId> g, std::span<const RequestId> batch,
                           std::optional<std::uint32_t> max_pages, const py::object& block_table,
                           Int<PageId> null_page) {
  auto kv = m.use();
  const KernelExportOptions o{.null_page = null_page};
  if (!block_table.is_none()) {
    const Int32Out t = int32_out(block_table, "block_table");
    const std::uint32_t width = table_width(max_pages, t.info.ndim, t.info.shape.data(), "export_dense: block_table");
    MaybeRelease release(t.size >= kReleaseGilAt);
    KernelExports(*kv).export_dense(g, batch, {t.data, t.size}, width, o);
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
    KernelExports(*kv).export_dense(g, batch, bt.data, width, o);
  }
  return view_of(t);
}

py::object export_dense(Manager& m, Int<GroupId> g, const py::object& batch_arg, std::optional<std::uint32_t> max_pages,
                        const py::object& block_table, Int<PageId> null_page) {
  const U32Arg batch(batch_arg, "batch");
  return indexed(batch.span, "batch",
                 [&] { return export_dense_of(m, g, batch.span, max_pages, block_table, null_page); });
}

py::int_ export_dense_incremental(Manager& m, Int<GroupId> g, const py::object& batch_arg,
                                  const py::object& block_table, std::optional<std::uint32_t> max_pages,
                                  Int<PageId> null_page) {
  const U32Arg batch_arr(batch_arg, "batch");
  const std::span<const RequestId> batch = batch_arr.span;
  auto kv = m.use();
  const Int32Out t = int32_out(block_table, "block_table");
  const std::uint32_t width =
      table_width(max_pages, t.info.ndim, t.info.shape.data(), "export_dense_incremental: block_table");
  std::size_t written = 0;
  {
    MaybeRelease release(batch.size() >= kReleaseGilAt);
    written = indexed(batch, "batch", [&] {
      return KernelExports(*kv).export_dense_incremental(g, batch, {t.data, t.size}, width, {.null_page = null_page});
    });
  }
  m.last_tables()[g] = block_table;  // a valid group: the export checked it
  return py::int_(written);
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

// After decode_step's other checks (which the C++ call makes first), the row every table
// will hold: ceil(kv_len / P) pages, the step's token counted, at most the tables' width. The
// C++ call would find a row too long only at its export, after the allocations. Decoder
// groups share a request's kv length: one query per request, the longest against each
// group. A stale handle raises here (naming it), as the C++ call would.
void check_step_widths(KVCacheManager& kv, GroupId dg, std::span<const RequestId> ids,
                       std::span<const BlockTableOut> tables, std::uint32_t width) {
  std::uint32_t min_tpp = 0;
  for (const BlockTableOut& t : tables) {
    if (t.group >= kv.layout().num_groups()) return;  // the C++ call names it
    const LayerGroup& spec = kv.layout().group(t.group);
    if (spec.is_decoder() && !spec.is_state() && (min_tpp == 0 || spec.tokens_per_page < min_tpp))
      min_tpp = spec.tokens_per_page;  // fixed-length rows (states, images) are not checked
  }
  if (min_tpp == 0) return;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    std::uint64_t len = 0;
    try {
      len = KernelExports(kv).kv_len(ids[i], dg) + 1;
    } catch (const Error& e) {
      fail("ids[{}]: {}", i, e.what());
    }
    const std::uint64_t pages = (len + min_tpp - 1) / min_tpp;
    if (pages > width)
      fail("ids[{}] = {}: its rows will hold {} pages of {} tokens, the tables have {} columns (max_pages)", i, ids[i],
           pages, min_tpp, width);
  }
}

std::size_t decode_step(Manager& m, const py::object& ids_arg, const py::object& tokens_arg, const py::sequence& tables,
                        std::optional<std::uint32_t> max_pages, Int<PageId> null_page) {
  const U32Arg ids(ids_arg, "ids");
  const U32Arg tokens(tokens_arg, "tokens");
  auto kv = m.use();
  const StepTables st(m, tables, max_pages);
  std::size_t done = 0;
  {
    MaybeRelease release(ids.size() >= kReleaseGilAt);
    check_step_widths(*kv, m.decoder_group(), ids.span, st.outs(), st.width());
    done = indexed(ids.span, "ids", [&] {
      return KernelExports(*kv).decode_step(ids.span, tokens.span, st.outs(), st.width(), {.null_page = null_page});
    });
  }
  if (done == ids.size())  // the tables were written
    for (std::size_t g = 0; g < tables.size(); ++g)
      if (!tables[g].is_none()) m.last_tables()[g] = tables[g];
  return done;
}

// A batch call's validation, before anything changes (issue 29). Each element costs a few
// O(1) queries (~3 ns each); the first query of a handle raises for a stale one, named by
// its index. (A Python manager has no tier: no request is ever loading.)
template <class F>
auto named(std::size_t i, F&& query) {
  try {
    return query();
  } catch (const Error& e) {
    fail("ids[{}]: {}", i, e.what());
  }
}

void check_not_swapped(KVCacheManager& kv, std::span<const RequestId> ids, std::size_t i) {
  if (kv.is_swapped(ids[i])) fail("ids[{}]: request = {}: swapped out (swap_in first)", i, ids[i]);
}

void append_batch(Manager& m, const py::object& ids_arg, const py::object& tokens_arg) {
  const U32Arg ids(ids_arg, "ids"), tokens(tokens_arg, "tokens");
  auto kv = m.use();
  if (ids.size() != tokens.size())
    fail("append_batch: {} tokens for {} requests (one each)", tokens.size(), ids.size());
  constexpr std::uint64_t kMax = KVCacheManager::kMaxTokens;
  bool near_limit = false;
  for (std::size_t i = 0; i < ids.size(); ++i)
    near_limit |= named(i, [&] { return kv->num_tokens(ids[i]); }) > kMax - ids.size();
  if (near_limit) {  // count each request's tokens in the batch (it may come more than once)
    Manager::BatchScratch& k = m.scratch();
    k.begin();
    for (std::size_t i = 0; i < ids.size(); ++i) {
      std::uint64_t& n = k.at(KernelExports(*kv).row(ids[i]).index, kv->num_tokens(ids[i]));
      if (n == kMax) fail("ids[{}]: request = {} would have {} tokens, at most {}", i, ids[i], n + 1, kMax);
      ++n;
    }
  }
  MaybeRelease release(ids.size() >= kReleaseGilAt);
  for (std::size_t i = 0; i < ids.size(); ++i) kv->append_token(ids[i], tokens[i]);
}

std::size_t allocate_batch(Manager& m, const py::object& ids_arg, const py::object& num_new_tokens,
                           const py::object& lookahead) {
  const U32Arg ids(ids_arg, "ids");
  const PerRequest<std::uint32_t> n(num_new_tokens, ids.size(), "num_new_tokens");
  const PerRequest<std::uint32_t> la(lookahead, ids.size(), "lookahead");
  auto kv = m.use();
  for (std::size_t i = 0; i < ids.size(); ++i) {
    // allocate does not move computed: a request twice in the batch needs no count
    const std::uint64_t target = named(i, [&] { return kv->num_computed(ids[i]); }) + n[i] + la[i];
    check_not_swapped(*kv, ids.span, i);
    if (target > KVCacheManager::kMaxTokens)
      fail("num_new_tokens[{}] = {}, lookahead[{}] = {}: request {} would hold {} tokens, at most {}", i, n[i], i,
           la[i], ids[i], target, KVCacheManager::kMaxTokens);
  }
  MaybeRelease release(ids.size() >= kReleaseGilAt);
  std::size_t done = 0;
  for (; done < ids.size(); ++done) {
    AllocateResult res;
    if (done == 0) {  // raising here leaves the manager as it was
      res = kv->allocate(ids[0], n[0], la[0]);
    } else {
      // What validation cannot see: a prefix hit the batch's earlier allocations evicted
      // (kHitLost), or a page source that raised. That allocate changed nothing: the batch
      // stops there as at a refusal (the manager logs it; last_allocate_result says why).
      try {
        res = kv->allocate(ids[done], n[done], la[done]);
      } catch (const std::exception&) {
        break;
      }
    }
    m.last_allocate() = res.kind;
    if (!res) break;
  }
  return done;
}

void commit_batch(Manager& m, const py::object& ids_arg, const py::object& num_computed) {
  const U32Arg ids(ids_arg, "ids");
  std::optional<PerRequest<std::uint64_t>> upto;
  if (!num_computed.is_none()) upto.emplace(num_computed, ids.size(), "num_computed");
  auto kv = m.use();
  const GroupId dg = m.decoder_group();
  Manager::BatchScratch& k = m.scratch();
  k.begin();
  k.element.resize(ids.size());
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const RequestId r = ids[i];
    const std::uint32_t s = named(i, [&] { return KernelExports(*kv).row(r); }).index;
    check_not_swapped(*kv, ids.span, i);
    const std::uint64_t c = upto ? (*upto)[i] : KernelExports(*kv).kv_len(r, dg);
    const std::uint64_t computed = kv->num_computed(r), allocated = kv->num_allocated(r);
    const auto name = [&] { return upto ? fmt::format("num_computed[{}]", i) : fmt::format("ids[{}]: kv_len", i); };
    // A prefix hit not pinned yet counts as computed and allocated, with no pages in the rows
    // (an admitted request's rows hold its allocated tokens): commit refuses it.
    if (computed == allocated && allocated > 0 && kv->page_table(r, dg).empty())
      fail("ids[{}]: request = {}: commit before the allocate that pins its prefix hit", i, r);
    // computed after the batch's earlier elements (a request may come twice)
    std::uint64_t& done = k.at(s, computed);
    if (c < done) fail("{} = {}: request {} already has {} computed", name(), c, r, done);
    if (c > allocated) fail("{} = {}: request {} has pages for {} tokens only", name(), c, r, allocated);
    if (m.prefix_caching() && c > done && c > kv->num_tokens(r))
      fail("{} = {}: request {} has {} token ids (append_tokens first)", name(), c, r, kv->num_tokens(r));
    // The rest of what commit refuses (a write into a page shared since fork), asked of the
    // manager for a request's first commit of the batch; a second one starts where the
    // first ends, past the page a fork shares.
    if (done == computed) named(i, [&] { kv->check_commit(r, c); });
    done = c;
    k.element[i] = c;  // kv_len as it is now: a commit moves no other request's
  }
  MaybeRelease release(ids.size() >= kReleaseGilAt);
  for (std::size_t i = 0; i < ids.size(); ++i) kv->commit(ids[i], k.element[i]);
}

}  // namespace

void bind_batch(py::class_<Manager>& c) {
  c.def("append_batch", &append_batch, py::arg("ids"), py::arg("tokens"),
        "append_token(ids[i], tokens[i]) for every i, one crossing. The whole batch is checked first: a raising "
        "call changes nothing")
      .def("allocate_batch", &allocate_batch, py::arg("ids"), py::arg("num_new_tokens") = 1, py::arg("lookahead") = 0,
           "allocate() for ids in order, stopping at the first refused one; returns how many got their pages "
           "(the refused one and those after it are unchanged). The whole batch is checked first: a raising call "
           "changes nothing")
      .def("commit_batch", &commit_batch, py::arg("ids"), py::arg("num_computed") = py::none(),
           "commit() for each id; num_computed None: what its last allocate scheduled (kv_len). The whole batch is "
           "checked first: a raising call changes nothing")
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
