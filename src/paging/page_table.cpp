#include "kvmm/paging/page_table.hpp"

#include <algorithm>

namespace kvmm {

PageTableSet::PageTableSet(std::uint32_t max_requests, std::uint32_t tokens_per_page)
    : tokens_per_page_(tokens_per_page) {
  // Checked before the rows are allocated: 2^32-1 rows would be 128 GiB.
  if (max_requests == 0 || max_requests == kNoRequest)
    fail("max_requests = {}: must be in [1, 2^32-1)", max_requests);
  if (tokens_per_page == 0) fail("tokens_per_page = 0: must be >= 1");
  rows_.resize(max_requests);
  tokens_.assign(max_requests, 0);
  last_batch_.assign(max_requests, kNoRequest);
  last_len_.assign(max_requests, 0);
}

void PageTableSet::bad_count(RequestId r, std::uint64_t count) const {
  fail("count = {}: request {} would hold more than 2^31-1 pages ({} now)", count, r, rows_[r].pages.size());
}

void PageTableSet::bad_request(RequestId r) const {
  fail("request = {}: out of range, max_requests is {}", r, rows_.size());
}

void PageTableSet::set(RequestId r, std::uint32_t index, PageId page) {
  Row& w = row(r);
  if (index >= w.pages.size())
    fail("index = {}: request {} has {} pages", index, r, w.pages.size());
  w.pages[index] = page;
  mark(w, index);
}

PageId PageTableSet::pop_back(RequestId r) {
  Row& w = row(r);
  if (w.pages.empty()) fail("request = {}: pop_back on an empty page table", r);
  const PageId p = w.pages.back();
  w.pages.pop_back();
  mark(w, w.pages.size());
  return p;
}

void PageTableSet::clear(RequestId r) {
  Row& w = row(r);
  w.pages.clear();
  tokens_[r] = 0;
  w.dirty_lo = 0;
}

std::uint32_t PageTableSet::last_page_len_of(std::uint64_t tokens) const {
  if (tokens == 0) return 0;
  return static_cast<std::uint32_t>((tokens - 1) % tokens_per_page_) + 1;
}

std::uint32_t PageTableSet::last_page_len(RequestId r) const {
  (void)row(r);
  return last_page_len_of(tokens_[r]);
}

std::size_t PageTableSet::export_csr(std::span<const RequestId> batch,
                                     std::span<std::uint32_t> indptr, std::span<PageId> indices,
                                     std::span<std::uint32_t> last_page_len) const {
  if (indptr.size() < batch.size() + 1)
    fail("indptr: size {} < batch size + 1 = {}", indptr.size(), batch.size() + 1);
  if (last_page_len.size() < batch.size())
    fail("last_page_len: size {} < batch size {}", last_page_len.size(), batch.size());
  std::size_t nnz = 0;
  for (RequestId r : batch) nnz += row(r).pages.size();
  if (indices.size() < nnz) fail("indices: size {} < {} pages in the batch", indices.size(), nnz);
  std::size_t at = 0;
  indptr[0] = 0;
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const Row& w = rows_[batch[i]];
    std::copy(w.pages.begin(), w.pages.end(), indices.begin() + static_cast<std::ptrdiff_t>(at));
    at += w.pages.size();
    indptr[i + 1] = static_cast<std::uint32_t>(at);
    last_page_len[i] = last_page_len_of(tokens_[batch[i]]);
  }
  return at;
}

void PageTableSet::check_dense(std::span<const RequestId> batch, std::span<PageId> table,
                               std::uint32_t max_pages) const {
  if (batch.size() > rows_.size())
    fail("batch: size {} > max_requests {}", batch.size(), rows_.size());
  if (table.size() < batch.size() * std::size_t{max_pages})
    fail("table: size {} < batch {} x max_pages {}", table.size(), batch.size(), max_pages);
  for (RequestId r : batch)
    if (row(r).pages.size() > max_pages)
      fail("max_pages = {}: request {} has {} pages", max_pages, r, rows_[r].pages.size());
}

void PageTableSet::export_dense(std::span<const RequestId> batch, std::span<PageId> table,
                                std::uint32_t max_pages, PageId pad) const {
  check_dense(batch, table, max_pages);
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const Row& w = rows_[batch[i]];
    PageId* out = table.data() + i * max_pages;
    std::copy(w.pages.begin(), w.pages.end(), out);
    std::fill(out + w.pages.size(), out + max_pages, pad);
  }
}

std::size_t PageTableSet::export_dense_incremental(std::span<const RequestId> batch,
                                                   std::span<PageId> table,
                                                   std::uint32_t max_pages, PageId pad) {
  check_dense(batch, table, max_pages);
  if (max_pages != last_max_pages_ || pad != last_pad_) invalidate_incremental();
  std::size_t written = 0;
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const Row& w = rows_[batch[i]];
    PageId* out = table.data() + i * max_pages;
    const auto len = static_cast<std::uint32_t>(w.pages.size());
    std::uint32_t from = 0, pad_to = max_pages;
    if (i < last_rows_ && last_batch_[i] == batch[i]) {
      from = std::min(w.dirty_lo, len);
      pad_to = std::max(last_len_[i], len);
    }
    std::copy(w.pages.begin() + from, w.pages.end(), out + from);
    std::fill(out + len, out + pad_to, pad);
    written += (len - from) + (pad_to - len);
    last_batch_[i] = batch[i];
    last_len_[i] = len;
  }
  // Dirty marks are cleared only after every row was written: a request twice in the
  // batch needs its mark at both rows.
  for (RequestId r : batch) rows_[r].dirty_lo = kClean;
  last_rows_ = static_cast<std::uint32_t>(batch.size());
  last_max_pages_ = max_pages;
  last_pad_ = pad;
  return written;
}

void PageTableSet::invalidate_incremental() {
  last_rows_ = 0;
}

}  // namespace kvmm
