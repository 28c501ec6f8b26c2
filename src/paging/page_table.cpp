#include "kvmm/paging/page_table.hpp"

#include "kvmm/checked.hpp"

#include <algorithm>
#include <limits>
#include <type_traits>

namespace kvmm {

PageTableSet::PageTableSet(std::uint32_t max_requests, std::uint32_t tokens_per_page)
    : tokens_per_page_(tokens_per_page) {
  // Checked before the rows are allocated: 2^32-1 rows would be 128 GiB.
  if (max_requests == 0 || max_requests == kNoRequest) fail("max_requests = {}: must be in [1, 2^32-1)", max_requests);
  if (tokens_per_page == 0) fail("tokens_per_page = 0: must be >= 1");
  rows_.resize(max_requests);
  tokens_.assign(max_requests, 0);
  last_batch_.assign(max_requests, kNoRow);
  last_len_.assign(max_requests, 0);
  export_len_.assign(max_requests, 0);
}

void PageTableSet::bad_count(Row r, std::uint64_t count) const {
  fail("count = {}: request {} would hold more than 2^31-1 pages ({} now)", count, r, rows_[r.index].pages.size());
}

void PageTableSet::bad_request(Row r) const { fail("request = {}: out of range, max_requests is {}", r, rows_.size()); }

void PageTableSet::set(Row r, std::uint32_t index, PageId page) {
  Entries& w = row(r);
  if (index >= w.pages.size()) fail("index = {}: request {} has {} pages", index, r, w.pages.size());
  w.pages[index] = page;
  mark(w, index);
}

PageId PageTableSet::pop_back(Row r) {
  Entries& w = row(r);
  if (w.pages.empty()) fail("request = {}: pop_back on an empty page table", r);
  const PageId p = w.pages.back();
  w.pages.pop_back();
  mark(w, w.pages.size());
  return p;
}

void PageTableSet::clear(Row r) {
  Entries& w = row(r);
  w.pages.clear();
  tokens_[r.index] = 0;
  w.dirty_lo = 0;
}

std::uint32_t PageTableSet::last_page_len_of(std::uint64_t tokens) const {
  if (tokens == 0) return 0;
  return static_cast<std::uint32_t>((tokens - 1) % tokens_per_page_) + 1;
}

std::uint32_t PageTableSet::last_page_len(Row r) const {
  (void)row(r);
  return last_page_len_of(tokens_[r.index]);
}

namespace {

constexpr auto kInt32Max = static_cast<std::uint64_t>(std::numeric_limits<std::int32_t>::max());

// One page id as a buffer of T holds it: kNullPage as -1 in int32, ids past 2^31-1 refused
// there (`what` names the quantity: a page id, pad, null_page).
template <typename T>
T out_id(PageId p, const char* what, Row r) {
  if constexpr (std::is_same_v<T, std::int32_t>) {
    if (p == kNullPage) return -1;
    if (p > kInt32Max) fail("{} = {} (request {}): past 2^31-1, an int32 buffer cannot hold it", what, p, r);
  }
  return static_cast<T>(p);
}

// n ids of a row into out, kNullPage replaced by null_page.
template <typename T>
void write_ids(const PageId* in, std::uint32_t n, T* out, PageId null_page, Row r) {
  if (std::is_same_v<T, PageId> && null_page == kNullPage) {  // the plain copy
    std::copy(in, in + n, out);
    return;
  }
  for (std::uint32_t k = 0; k < n; ++k) out[k] = out_id<T>(in[k] == kNullPage ? null_page : in[k], "page id", r);
}

}  // namespace

std::uint32_t PageTableSet::exported_pages(std::span<const Row> batch, std::size_t i, const ExportOptions& o,
                                           std::uint32_t* last) const {
  const Row r = batch[i];
  const auto held = static_cast<std::uint32_t>(row(r).pages.size());
  if (o.kv_lens.empty()) {
    *last = last_page_len_of(tokens_[r.index]);
    return held;
  }
  const std::uint64_t kv = o.kv_lens[i];
  const std::uint64_t n = ceil_div(kv, tokens_per_page_);
  if (kv == 0 || n > held)
    fail("kv_lens[{}] = {}: request {} (row {}) holds {} pages of {} tokens, the kv length must be in [1, {}]", i, kv,
         r, i, held, tokens_per_page_, std::uint64_t{held} * tokens_per_page_);
  *last = static_cast<std::uint32_t>(kv - (n - 1) * tokens_per_page_);
  return static_cast<std::uint32_t>(n);
}

template <typename T>
std::size_t PageTableSet::csr(std::span<const Row> batch, std::span<T> indptr, std::span<T> indices,
                              std::span<T> last_page_len, const ExportOptions& o, std::span<T> first_page) const {
  if (indptr.size() < batch.size() + 1) fail("indptr: size {} < batch size + 1 = {}", indptr.size(), batch.size() + 1);
  if (last_page_len.size() < batch.size())
    fail("last_page_len: size {} < batch size {}", last_page_len.size(), batch.size());
  if (o.trim && first_page.size() < batch.size())
    fail("first_page: size {} < batch size {} (trim writes one offset per row)", first_page.size(), batch.size());
  if (!o.kv_lens.empty() && o.kv_lens.size() != batch.size())
    fail("kv_lens: size {} != batch size {}", o.kv_lens.size(), batch.size());
  (void)out_id<T>(o.null_page, "null_page", kNoRow);
  // First pass: every row checked and counted before anything is written.
  std::size_t nnz = 0;
  for (std::size_t i = 0; i < batch.size(); ++i) {
    std::uint32_t last = 0;
    const std::uint32_t n = exported_pages(batch, i, o, &last);
    std::uint32_t first = 0;
    if (o.trim) {
      const Entries& w = rows_[batch[i].index];
      while (first < n && w.pages[first] == kNullPage) ++first;
      if (n > 0 && first == n)
        fail("trim: request {} (row {}) has only null pages in its {} exported pages", batch[i], i, n);
    }
    nnz += n - first;
  }
  if (nnz > std::numeric_limits<T>::max()) fail("indices: {} pages in the batch do not fit the indptr type", nnz);
  if (indices.size() < nnz) fail("indices: size {} < {} pages in the batch", indices.size(), nnz);
  std::size_t at = 0;
  indptr[0] = 0;
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const Row r = batch[i];
    const Entries& w = rows_[r.index];
    std::uint32_t last = 0;
    const std::uint32_t n = exported_pages(batch, i, o, &last);
    std::uint32_t first = 0;
    if (o.trim) {
      while (first < n && w.pages[first] == kNullPage) ++first;
      first_page[i] = static_cast<T>(first);
    }
    write_ids(w.pages.data() + first, n - first, indices.data() + at, o.null_page, r);
    at += n - first;
    indptr[i + 1] = static_cast<T>(at);
    last_page_len[i] = static_cast<T>(last);  // <= tokens_per_page: checked below 2^31 for int32
  }
  return at;
}

std::size_t PageTableSet::export_csr(std::span<const Row> batch, std::span<std::uint32_t> indptr,
                                     std::span<PageId> indices, std::span<std::uint32_t> last_page_len) const {
  return csr<std::uint32_t>(batch, indptr, indices, last_page_len, ExportOptions{}, {});
}

std::size_t PageTableSet::export_csr(std::span<const Row> batch, std::span<std::uint32_t> indptr,
                                     std::span<PageId> indices, std::span<std::uint32_t> last_page_len,
                                     const ExportOptions& o, std::span<std::uint32_t> first_page) const {
  return csr<std::uint32_t>(batch, indptr, indices, last_page_len, o, first_page);
}

std::size_t PageTableSet::export_csr(std::span<const Row> batch, std::span<std::int32_t> indptr,
                                     std::span<std::int32_t> indices, std::span<std::int32_t> last_page_len,
                                     const ExportOptions& o, std::span<std::int32_t> first_page) const {
  if (tokens_per_page_ > kInt32Max)
    fail("tokens_per_page = {}: last_page_len past 2^31-1 does not fit int32", tokens_per_page_);
  return csr<std::int32_t>(batch, indptr, indices, last_page_len, o, first_page);
}

void PageTableSet::check_dense(std::span<const Row> batch, std::size_t table_size, std::uint32_t max_pages,
                               const ExportOptions& o, std::uint32_t* lens) const {
  if (batch.size() > rows_.size()) fail("batch: size {} > max_requests {}", batch.size(), rows_.size());
  if (table_size < batch.size() * std::size_t{max_pages})
    fail("table: size {} < batch {} x max_pages {}", table_size, batch.size(), max_pages);
  if (o.trim) fail("trim: only export_csr trims rows (a dense table keeps page indices)");
  if (!o.kv_lens.empty() && o.kv_lens.size() != batch.size())
    fail("kv_lens: size {} != batch size {}", o.kv_lens.size(), batch.size());
  for (std::size_t i = 0; i < batch.size(); ++i) {
    std::uint32_t last = 0;
    const std::uint32_t n = exported_pages(batch, i, o, &last);
    if (n > max_pages) fail("max_pages = {}: request {} has {} pages", max_pages, batch[i], n);
    if (lens != nullptr) lens[i] = n;
  }
}

template <typename T>
void PageTableSet::dense(std::span<const Row> batch, std::span<T> table, std::uint32_t max_pages,
                         const ExportOptions& o, PageId pad) const {
  check_dense(batch, table.size(), max_pages, o);
  (void)out_id<T>(o.null_page, "null_page", kNoRow);
  const T pad_out = out_id<T>(pad, "pad", kNoRow);
  for (std::size_t i = 0; i < batch.size(); ++i) {
    std::uint32_t last = 0;
    const std::uint32_t n = exported_pages(batch, i, o, &last);
    T* out = table.data() + i * max_pages;
    write_ids(rows_[batch[i].index].pages.data(), n, out, o.null_page, batch[i]);
    std::fill(out + n, out + max_pages, pad_out);
  }
}

void PageTableSet::export_dense(std::span<const Row> batch, std::span<PageId> table, std::uint32_t max_pages,
                                PageId pad) const {
  dense<PageId>(batch, table, max_pages, ExportOptions{}, pad);
}

void PageTableSet::export_dense(std::span<const Row> batch, std::span<PageId> table, std::uint32_t max_pages,
                                const ExportOptions& o) const {
  dense<PageId>(batch, table, max_pages, o, o.null_page);
}

void PageTableSet::export_dense(std::span<const Row> batch, std::span<std::int32_t> table, std::uint32_t max_pages,
                                const ExportOptions& o) const {
  dense<std::int32_t>(batch, table, max_pages, o, o.null_page);
}

template <typename T>
std::size_t PageTableSet::dense_incremental(std::span<const Row> batch, std::span<T> table, std::uint32_t max_pages,
                                            const ExportOptions& o, PageId pad) {
  // The check pass keeps each row's length (export_len_): the write pass divides nothing.
  check_dense(batch, table.size(), max_pages, o, export_len_.data());
  (void)out_id<T>(o.null_page, "null_page", kNoRow);
  const T pad_out = out_id<T>(pad, "pad", kNoRow);
  constexpr bool kInt32 = std::is_same_v<T, std::int32_t>;
  if (max_pages != last_max_pages_ || pad != last_pad_ || o.null_page != last_null_ || kInt32 != last_int32_ ||
      static_cast<const void*>(table.data()) != last_table_)
    invalidate_incremental();
  std::size_t written = 0;
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const Entries& w = rows_[batch[i].index];
    T* out = table.data() + i * max_pages;
    const std::uint32_t len = export_len_[i];
    std::uint32_t from = 0, pad_to = max_pages;
    if (i < last_rows_ && last_batch_[i] == batch[i]) {
      // Entries past the previous export's length were padding: rewrite them too (a kv
      // length may grow over pages that did not change).
      from = std::min({w.dirty_lo, len, last_len_[i]});
      pad_to = std::max(last_len_[i], len);
    }
    write_ids(w.pages.data() + from, len - from, out + from, o.null_page, batch[i]);
    std::fill(out + len, out + pad_to, pad_out);
    written += (len - from) + (pad_to - len);
    last_batch_[i] = batch[i];
    last_len_[i] = len;
  }
  // Dirty marks are cleared only after every row was written: a request twice in the
  // batch needs its mark at both rows.
  for (Row r : batch) rows_[r.index].dirty_lo = kClean;
  last_rows_ = static_cast<std::uint32_t>(batch.size());
  last_max_pages_ = max_pages;
  last_pad_ = pad;
  last_null_ = o.null_page;
  last_int32_ = kInt32;
  last_table_ = table.data();
  return written;
}

std::size_t PageTableSet::export_dense_incremental(std::span<const Row> batch, std::span<PageId> table,
                                                   std::uint32_t max_pages, PageId pad) {
  return dense_incremental<PageId>(batch, table, max_pages, ExportOptions{}, pad);
}

std::size_t PageTableSet::export_dense_incremental(std::span<const Row> batch, std::span<PageId> table,
                                                   std::uint32_t max_pages, const ExportOptions& o) {
  return dense_incremental<PageId>(batch, table, max_pages, o, o.null_page);
}

std::size_t PageTableSet::export_dense_incremental(std::span<const Row> batch, std::span<std::int32_t> table,
                                                   std::uint32_t max_pages, const ExportOptions& o) {
  return dense_incremental<std::int32_t>(batch, table, max_pages, o, o.null_page);
}

void PageTableSet::invalidate_incremental() { last_rows_ = 0; }

}  // namespace kvmm
