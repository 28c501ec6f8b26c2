// ManagerCore's calls for a whole step's batch: the incremental block-table export of several
// groups (each request's row and kv length resolved once, then O(1) per row and group plus
// the entries that changed) and the fused decode step (commit, append, allocate and that
// export in one call, each handle resolved once: what an engine would otherwise make as
// five batch calls).
#include "manager_core.hpp"

#include <algorithm>

namespace kvmm::detail {

void ManagerCore::check_block_tables(std::size_t batch, std::span<const BlockTableOut> tables,
                                     std::uint32_t max_pages) const {
  for (std::size_t k = 0; k < tables.size(); ++k) {
    const GroupId g = check_group(tables[k].group);
    for (std::size_t j = 0; j < k; ++j)
      if (tables[j].group == g) fail("tables[{}].group = {}: tables[{}] is that group's already", k, g, j);
    if (tables[k].table.size() < batch * std::size_t{max_pages})
      fail("tables[{}]: size {} < batch {} x max_pages {}", k, tables[k].table.size(), batch, max_pages);
  }
}

std::size_t ManagerCore::export_incremental(std::span<const RequestId> batch, std::span<const BlockTableOut> tables,
                                            std::uint32_t max_pages, const KernelExportOptions& o) {
  check_block_tables(batch.size(), tables, max_pages);
  export_rows_.resize(batch.size());
  for (std::size_t i = 0; i < batch.size(); ++i) export_rows_[i] = reqs_.row(batch[i]);
  return export_rows_incremental(tables, max_pages, o);
}

std::size_t ManagerCore::export_rows_incremental(std::span<const BlockTableOut> tables, std::uint32_t max_pages,
                                                 const KernelExportOptions& o) {
  const std::size_t n = export_rows_.size();
  // Decoder groups share a request's kv length (computed + the step's tokens): once per row.
  export_lens_.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    const Request& q = reqs_[export_rows_[i]];
    export_lens_[i] = std::max(q.computed, q.step_end);
  }
  std::size_t written = 0;
  for (const BlockTableOut& t : tables) {
    Group& grp = groups_[t.group];
    std::span<const std::uint64_t> lens = export_lens_;
    if (!grp.decoder) {  // image tokens: the group's own lengths
      export_enc_lens_.resize(n);
      for (std::size_t i = 0; i < n; ++i) export_enc_lens_[i] = kv_len_at(export_rows_[i], t.group);
      lens = export_enc_lens_;
    }
    const ExportOptions eo{.kv_lens = lens, .null_page = o.null_page, .trim = o.trim};
    written += grp.table.export_dense_incremental(export_rows_, t.table, max_pages, eo);
  }
  return written;
}

std::size_t ManagerCore::decode_step(std::span<const RequestId> batch, std::span<const std::uint32_t> tokens,
                                     std::span<const BlockTableOut> tables, std::uint32_t max_pages,
                                     const KernelExportOptions& o) {
  if (tokens.size() != batch.size())
    fail("tokens: {} tokens for a batch of {} requests (one each)", tokens.size(), batch.size());
  if (batch.size() > reqs_.capacity()) fail("batch: size {} > max_requests {}", batch.size(), reqs_.capacity());
  if (o.trim) fail("trim: only export_csr trims rows (a dense table keeps page indices)");
  check_block_tables(batch.size(), tables, max_pages);
  export_rows_.resize(batch.size());
  for (std::size_t i = 0; i < batch.size(); ++i) {  // every handle before anything changes
    const RequestId r = batch[i];
    export_rows_[i] = running(r);
    const Request& q = reqs_[export_rows_[i]];
    const std::uint64_t scheduled = std::max(q.computed, q.step_end);
    if (!q.admitted) fail("request = {}: decode_step before its first allocate (admit it with allocate)", r);
    if (q.loading) loading_error(r, "decode_step");
    if (options_.prefix_caching && scheduled > q.ids.num_tokens())
      fail("request = {}: its last allocate scheduled {} tokens, it has {} token ids (append_tokens first)", r,
           scheduled, q.ids.num_tokens());
    if (q.ids.num_tokens() == KVCacheManager::kMaxTokens)
      fail("request = {}: has {} tokens, the most a request holds", r, KVCacheManager::kMaxTokens);
    check_commit_at(r, export_rows_[i], scheduled);  // e.g. a write into a page shared since fork
  }
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const Request& q = reqs_[export_rows_[i]];
    commit_at(batch[i], export_rows_[i], std::max(q.computed, q.step_end));
  }
  for (std::size_t i = 0; i < batch.size(); ++i) {
    reqs_[export_rows_[i]].ids.append({&tokens[i], 1});
    if (!allocate_at(batch[i], export_rows_[i], 1, 0)) return i;
  }
  export_rows_incremental(tables, max_pages, o);
  return batch.size();
}

}  // namespace kvmm::detail
