// PageTableSet: the page tables of one layer group, one row per request slot: the
// ordered small page ids of the request plus its token count. Exports into
// caller-owned buffers as CSR (indptr, indices, last_page_len; FlashInfer's paged-KV
// format) or as a dense [batch, max_pages] table; the incremental dense export rewrites
// only entries changed since the previous one (O(changed) per row). ExportOptions shape
// the export for a kernel as it is (int32 buffers, a reserved null page id, rows trimmed
// to their window, kv lengths of the step); each costs O(1) per entry on top of the copy.
// Rows keep their capacity when cleared, so steady-state appends do not touch the heap.
#pragma once

#include "kvmm/error.hpp"
#include "kvmm/types.hpp"

#include <cstdint>
#include <span>
#include <vector>

namespace kvmm {

// How the kernel-facing exports (the overloads that take it) shape a row. The defaults
// export the row as the plain overloads do.
struct ExportOptions {
  // Per batch row, the tokens the step will have computed (the table's num_tokens may
  // count lookahead slots). Empty: the table's num_tokens. Row i goes out with
  // ceil(kv_lens[i] / P) pages (fewer than it holds when lookahead pages exist) and
  // last_page_len = kv_lens[i] - (ceil(kv_lens[i] / P) - 1) * P. kv_lens[i] = 0 or past
  // the row's pages raises kvmm::Error naming the row and the value.
  std::span<const std::uint64_t> kv_lens = {};
  // Written for every kNullPage entry, and as the dense padding: e.g. a zero-filled page
  // the engine reserves, so that FlashInfer and FlashAttention never read kNullPage.
  PageId null_page = kNullPage;
  // CSR only: each row starts at its first page that is not kNullPage (a sliding window's
  // freed pages are leading); first_page[i] receives that page's index in the row, so a
  // kernel adds first_page[i] * P to positions. A row with no page left raises.
  bool trim = false;
};

class PageTableSet {
 public:
  // Raises kvmm::Error, before allocating, for max_requests outside [1, 2^32-1) or
  // tokens_per_page = 0.
  PageTableSet(std::uint32_t max_requests, std::uint32_t tokens_per_page);

  std::uint32_t max_requests() const { return static_cast<std::uint32_t>(rows_.size()); }
  std::uint32_t tokens_per_page() const { return tokens_per_page_; }

  std::span<const PageId> pages(Row r) const { return row(r).pages; }
  std::uint32_t num_pages(Row r) const { return static_cast<std::uint32_t>(row(r).pages.size()); }
  std::uint64_t num_tokens(Row r) const {
    (void)row(r);
    return tokens_[r.index];
  }

  void append(Row r, PageId page) {
    Entries& w = row(r);
    mark(w, w.pages.size());
    w.pages.push_back(page);
  }
  // Bulk forms of append: `pages` in order, or `count` copies of `page`. O(count).
  // A row holds at most 2^31-1 pages (a row indexes with int32 in FlashInfer's and
  // FlashAttention's tables): kvmm::Error naming `count` past that, nothing appended.
  void append(Row r, std::span<const PageId> pages) {
    Entries& w = row(r);
    if (pages.size() > kMaxPages - w.pages.size()) bad_count(r, pages.size());
    mark(w, w.pages.size());
    w.pages.insert(w.pages.end(), pages.begin(), pages.end());
  }
  void append(Row r, std::uint64_t count, PageId page) {
    Entries& w = row(r);
    if (count > kMaxPages - w.pages.size()) bad_count(r, count);
    mark(w, w.pages.size());
    w.pages.insert(w.pages.end(), count, page);
  }
  // Replaces entry `index` (kNullPage for a freed out-of-window page, or a COW copy).
  void set(Row r, std::uint32_t index, PageId page);
  PageId pop_back(Row r);
  void set_num_tokens(Row r, std::uint64_t num_tokens) {
    if (r.index >= rows_.size()) bad_request(r);
    tokens_[r.index] = num_tokens;
  }
  // Empties the row (capacity kept).
  void clear(Row r);

  // Tokens in the request's last page: ((num_tokens - 1) % tokens_per_page) + 1, 0 if empty.
  std::uint32_t last_page_len(Row r) const;

  // CSR for `batch` rows: indptr[batch.size() + 1], indices[indptr.back()],
  // last_page_len[batch.size()]. Returns the number of indices written. Buffers that are
  // too small raise kvmm::Error naming the buffer and the size it needs.
  std::size_t export_csr(std::span<const Row> batch, std::span<std::uint32_t> indptr, std::span<PageId> indices,
                         std::span<std::uint32_t> last_page_len) const;

  // The same shaped by `o`, into uint32 or int32 buffers (FlashInfer's indptr, indices and
  // last_page_len are int32). first_page[batch.size()] is written when o.trim (required
  // then). In int32 buffers kNullPage (where o.null_page leaves it) goes out as -1 and any
  // other id past 2^31-1 raises kvmm::Error naming it; after an error the buffers'
  // contents are unspecified, the table is unchanged. O(pages exported).
  std::size_t export_csr(std::span<const Row> batch, std::span<std::uint32_t> indptr, std::span<PageId> indices,
                         std::span<std::uint32_t> last_page_len, const ExportOptions& o,
                         std::span<std::uint32_t> first_page = {}) const;
  std::size_t export_csr(std::span<const Row> batch, std::span<std::int32_t> indptr, std::span<std::int32_t> indices,
                         std::span<std::int32_t> last_page_len, const ExportOptions& o = {},
                         std::span<std::int32_t> first_page = {}) const;

  // Dense row-major [batch.size(), max_pages]; entries past a row's pages hold `pad`.
  void export_dense(std::span<const Row> batch, std::span<PageId> table, std::uint32_t max_pages,
                    PageId pad = kNullPage) const;
  // The same shaped by `o` (kv_lens, null_page; o.trim raises), into uint32 or int32
  // buffers (FlashAttention's block_table is int32); entries past a row's exported pages
  // hold o.null_page. int32 ids as for export_csr.
  void export_dense(std::span<const Row> batch, std::span<PageId> table, std::uint32_t max_pages,
                    const ExportOptions& o) const;
  void export_dense(std::span<const Row> batch, std::span<std::int32_t> table, std::uint32_t max_pages,
                    const ExportOptions& o = {}) const;

  // Like export_dense, for a buffer that holds this set's previous incremental export:
  // a row whose request is the same as last time gets only its changed entries (and
  // the padding of pages it lost) rewritten. A request may appear in several rows.
  // A buffer at another address than the previous export's gets every row (the address
  // decides, not the size: a prefix of the same buffer keeps its rows).
  // Returns the number of entries written.
  std::size_t export_dense_incremental(std::span<const Row> batch, std::span<PageId> table, std::uint32_t max_pages,
                                       PageId pad = kNullPage);
  // The same shaped by `o` as export_dense is. Changing null_page, the buffer or its type
  // rewrites every row.
  std::size_t export_dense_incremental(std::span<const Row> batch, std::span<PageId> table, std::uint32_t max_pages,
                                       const ExportOptions& o);
  std::size_t export_dense_incremental(std::span<const Row> batch, std::span<std::int32_t> table,
                                       std::uint32_t max_pages, const ExportOptions& o = {});
  // Forgets the previous incremental export (next one rewrites every row).
  void invalidate_incremental();

 private:
  static constexpr std::uint32_t kClean = ~std::uint32_t{0};
  static constexpr std::uint64_t kMaxPages = (std::uint64_t{1} << 31) - 1;  // pages per row
  struct Entries {
    std::vector<PageId> pages;
    std::uint32_t dirty_lo = 0;  // lowest entry changed since the last incremental export
  };
  Entries& row(Row r) {
    if (r.index >= rows_.size()) bad_request(r);
    return rows_[r.index];
  }
  const Entries& row(Row r) const {
    if (r.index >= rows_.size()) bad_request(r);
    return rows_[r.index];
  }
  static void mark(Entries& w, std::size_t index) {
    if (index < w.dirty_lo) w.dirty_lo = static_cast<std::uint32_t>(index);
  }
  std::uint32_t last_page_len_of(std::uint64_t tokens) const;
  [[noreturn, gnu::cold]] void bad_request(Row r) const;
  [[noreturn, gnu::cold]] void bad_count(Row r, std::uint64_t count) const;
  // Pages row i of `batch` exports under `o` (all, or ceil(kv_lens[i] / P)), and its
  // last_page_len into *last; kvmm::Error naming the row for a bad kv length.
  std::uint32_t exported_pages(std::span<const Row> batch, std::size_t i, const ExportOptions& o,
                               std::uint32_t* last) const;
  template <typename T>
  std::size_t csr(std::span<const Row> batch, std::span<T> indptr, std::span<T> indices, std::span<T> last_page_len,
                  const ExportOptions& o, std::span<T> first_page) const;
  // Raises for a bad batch, buffer or row; each row's exported page count into lens[i]
  // where lens is given.
  void check_dense(std::span<const Row> batch, std::size_t table_size, std::uint32_t max_pages, const ExportOptions& o,
                   std::uint32_t* lens = nullptr) const;
  template <typename T>
  void dense(std::span<const Row> batch, std::span<T> table, std::uint32_t max_pages, const ExportOptions& o,
             PageId pad) const;
  template <typename T>
  std::size_t dense_incremental(std::span<const Row> batch, std::span<T> table, std::uint32_t max_pages,
                                const ExportOptions& o, PageId pad);

  std::vector<Entries> rows_;
  std::vector<std::uint64_t> tokens_;  // apart from the rows: a decode step writes only these
  std::uint32_t tokens_per_page_;
  // Previous incremental export: which request each row held and how many pages.
  std::vector<Row> last_batch_;
  std::vector<std::uint32_t> last_len_;
  std::vector<std::uint32_t> export_len_;  // scratch of an incremental export: row lengths
  std::uint32_t last_rows_ = 0;
  std::uint32_t last_max_pages_ = 0;
  PageId last_pad_ = kNullPage;
  PageId last_null_ = kNullPage;
  bool last_int32_ = false;  // the previous incremental export's buffer type
  // and its address: an export into another buffer rewrites every row (a buffer freed and
  // another allocated at its address cannot be told apart: the caller keeps it alive).
  const void* last_table_ = nullptr;
};

}  // namespace kvmm
