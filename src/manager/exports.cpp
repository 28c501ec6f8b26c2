// Exports's calls: see exports.hpp.
#include "manager_core.hpp"

#include "kvmm/error.hpp"
#include "prefetch.hpp"

#include <algorithm>

namespace kvmm::detail {

std::span<const Row> Exports::export_rows() const { return m_.export_rows_; }

std::uint64_t Exports::kv_len(RequestId r, GroupId g) const {
  const Row s = m_.reqs_.row(r);
  return kv_len_at(s, m_.check_group(g));
}

std::uint64_t Exports::kv_len_at(Row s, GroupId g) const {
  const Request& q = m_.reqs_[s];
  const Group& grp = m_.groups_[g];
  if (grp.decoder) return std::max(q.progress.computed, q.progress.step_end);
  const std::span<const MultimodalItem> items = q.ids.items();
  if (items.empty()) return 0;
  const auto k = items.size() - 1;
  return q.images.page[g][k] * grp.P + items[k].length;
}

ExportOptions Exports::export_options(GroupId g, std::span<const RequestId> batch, const KernelExportOptions& o) const {
  m_.check_group(g);
  m_.export_rows_.resize(batch.size());
  m_.export_lens_.resize(batch.size());
  for (std::size_t i = 0; i < batch.size(); ++i) {
    m_.export_rows_[i] = m_.reqs_.row(batch[i]);
    m_.export_lens_[i] = kv_len_at(m_.export_rows_[i], g);
  }
  return ExportOptions{.kv_lens = m_.export_lens_, .null_page = o.null_page, .trim = o.trim};
}

void Exports::check_block_tables(std::size_t batch, std::span<const BlockTableOut> tables,
                                 std::uint32_t max_pages) const {
  for (std::size_t k = 0; k < tables.size(); ++k) {
    const GroupId g = m_.check_group(tables[k].group);
    for (std::size_t j = 0; j < k; ++j)
      if (tables[j].group == g) fail("tables[{}].group = {}: tables[{}] is that group's already", k, g, j);
    if (tables[k].table.size() < batch * std::size_t{max_pages})
      fail("tables[{}]: size {} < batch {} x max_pages {}", k, tables[k].table.size(), batch, max_pages);
  }
}

std::size_t Exports::export_incremental(std::span<const RequestId> batch, std::span<const BlockTableOut> tables,
                                        std::uint32_t max_pages, const KernelExportOptions& o) {
  check_block_tables(batch.size(), tables, max_pages);
  m_.export_rows_.resize(batch.size());
  for (std::size_t i = 0; i < batch.size(); ++i) m_.export_rows_[i] = m_.reqs_.row(batch[i]);
  return export_rows_incremental(tables, max_pages, o);
}

std::size_t Exports::export_rows_incremental(std::span<const BlockTableOut> tables, std::uint32_t max_pages,
                                             const KernelExportOptions& o) {
  const std::size_t n = m_.export_rows_.size();
  // Decoder groups share a request's kv length (computed + the step's tokens): once per row.
  m_.export_lens_.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    const Request& q = m_.reqs_[m_.export_rows_[i]];
    m_.export_lens_[i] = std::max(q.progress.computed, q.progress.step_end);
  }
  std::size_t written = 0;
  for (const BlockTableOut& t : tables) {
    Group& grp = m_.groups_[t.group];
    std::span<const std::uint64_t> lens = m_.export_lens_;
    if (!grp.decoder) {  // image tokens: the group's own lengths
      m_.export_enc_lens_.resize(n);
      for (std::size_t i = 0; i < n; ++i) m_.export_enc_lens_[i] = kv_len_at(m_.export_rows_[i], t.group);
      lens = m_.export_enc_lens_;
    }
    const ExportOptions eo{.kv_lens = lens, .null_page = o.null_page, .trim = o.trim};
    written += grp.table.export_dense_incremental(m_.export_rows_, t.table, max_pages, eo);
  }
  return written;
}

std::size_t Exports::decode_step(std::span<const RequestId> batch, std::span<const std::uint32_t> tokens,
                                 std::span<const BlockTableOut> tables, std::uint32_t max_pages,
                                 const KernelExportOptions& o) {
  if (tokens.size() != batch.size())
    fail("tokens: {} tokens for a batch of {} requests (one each)", tokens.size(), batch.size());
  if (batch.size() > m_.reqs_.capacity()) fail("batch: size {} > max_requests {}", batch.size(), m_.reqs_.capacity());
  if (o.trim) fail("trim: only export_csr trims rows (a dense table keeps page indices)");
  check_block_tables(batch.size(), tables, max_pages);
  m_.export_rows_.resize(batch.size());
  for (std::size_t i = 0; i < batch.size(); ++i) {  // every handle before anything changes
    const RequestId r = batch[i];
    m_.export_rows_[i] = m_.running(r);
    const Request& q = m_.reqs_[m_.export_rows_[i]];
    const std::uint64_t scheduled = std::max(q.progress.computed, q.progress.step_end);
    if (!q.admitted()) fail("request = {}: decode_step before its first allocate (admit it with allocate)", r);
    if (q.loading()) m_.loading_error(r, "decode_step");
    if (m_.options_.prefix_caching && scheduled > q.ids.num_tokens())
      fail("request = {}: its last allocate scheduled {} tokens, it has {} token ids (append_tokens first)", r,
           scheduled, q.ids.num_tokens());
    if (q.ids.num_tokens() == KVCacheManager::kMaxTokens)
      fail("request = {}: has {} tokens, the most a request holds", r, KVCacheManager::kMaxTokens);
    m_.lifecycle.check_commit_at(r, m_.export_rows_[i], scheduled);  // e.g. a write into a page shared since fork
  }
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const Request& q = m_.reqs_[m_.export_rows_[i]];
    m_.lifecycle.commit_at(batch[i], m_.export_rows_[i], std::max(q.progress.computed, q.progress.step_end));
  }
  for (std::size_t i = 0; i < batch.size(); ++i) {
    m_.reqs_[m_.export_rows_[i]].ids.append({&tokens[i], 1});
    if (!m_.admission.allocate_at(batch[i], m_.export_rows_[i], 1, 0)) return i;
  }
  export_rows_incremental(tables, max_pages, o);
  return batch.size();
}

}  // namespace kvmm::detail
