// The paged engine: a continuous-batching scheduler on KVCacheManager, the KV bytes in a
// KVArena addressed by the page-layer layout, kernels behind DeviceOps.
#include "engine_seq.hpp"

#include "kvmm/checked.hpp"
#include "kvmm/error.hpp"
#include "kvmm/kernels/layout_cache.hpp"

#include <algorithm>
#include <cstring>

namespace mini {

namespace kk = kvmm::kernels;

void CpuOps::write_kv(const kk::PagedWriteParams& p) { kk::cpu::write_kv(p); }
void CpuOps::attention(const kk::PagedAttentionParams& p, bool prefill) {
  if (prefill)
    kk::cpu::paged_prefill_attention(p);
  else
    kk::cpu::paged_decode_attention(p);
}
void CpuOps::copy_pages(const kk::PageCopyParams& p) { kk::cpu::copy_pages(p); }
void CpuOps::swap_pages(const kk::PageCopyParams& p) { kk::cpu::swap_pages(p); }

// ---------------------------------------------------------------------------------------
// KVStore over the manager's page tables. prepare() turns the step's batch into the
// kernels' inputs once per group (slot mapping, CSR tables, lengths); every layer of the
// group reuses them with its own K/V offsets inside the small page.
class Engine::PagedStore final : public KVStore {
 public:
  PagedStore(const Model& model, const kvmm::KVCacheManager& kv, std::byte* arena, DeviceOps& ops)
      : model_(model), kv_(kv), layout_(kv.layout()), arena_(arena), ops_(ops), groups_(layout_.num_groups()) {}

  void prepare(std::span<const BatchSeq> batch) {
    decode_ = true;
    kv_lens_.clear();
    q_indptr_.assign(1, 0);
    for (const BatchSeq& s : batch) {
      kv_lens_.push_back(s.start + s.len);
      q_indptr_.push_back(q_indptr_.back() + s.len);
      decode_ = decode_ && s.len == 1;
    }
    for (kvmm::GroupId g = 0; g < layout_.num_groups(); ++g) {
      const kvmm::LayerGroup& spec = layout_.group(g);
      if (spec.is_state()) continue;
      Tables& t = groups_[g];
      const std::uint32_t P = spec.tokens_per_page;
      t.page_ids.clear();
      t.offsets.clear();
      t.indptr.assign(1, 0);
      t.indices.clear();
      for (const BatchSeq& s : batch) {
        const std::span<const kvmm::PageId> row = kv_.page_table(s.handle, g);
        for (std::uint32_t pos = s.start; pos < s.start + s.len; ++pos) {
          t.page_ids.push_back(row[pos / P]);
          t.offsets.push_back(pos % P);
        }
        const std::uint32_t pages = (s.start + s.len + P - 1) / P;
        t.indices.insert(t.indices.end(), row.begin(), row.begin() + pages);
        t.indptr.push_back(static_cast<std::uint32_t>(t.indices.size()));
      }
    }
  }

  void attention(std::uint32_t layer, std::span<const BatchSeq> batch, std::uint32_t tokens, const std::uint16_t* q,
                 const std::uint16_t* k, const std::uint16_t* v, std::uint16_t* o) override {
    const kvmm::GroupId g = model_.group_of(layer);
    const std::uint32_t li = model_.index_in_group(layer);
    const kvmm::LayerGroup& spec = layout_.group(g);
    const Tables& t = groups_[g];
    // One layer of the group: its K and V slices, the whole small page as the stride, the
    // group's kv_order.
    const kk::PagedKVCache cache = kk::paged_cache(layout_, arena_, g, li, kk::DType::kF16);
    ops_.write_kv(kk::PagedWriteParams{cache, k, v, t.page_ids.data(), t.offsets.data(), tokens});
    kk::PagedAttentionParams p;
    p.query = kk::QueryBatch{q,
                             o,
                             tokens,
                             static_cast<std::uint32_t>(batch.size()),
                             model_.config().q_heads,
                             kv_lens_.data(),
                             decode_ ? nullptr : q_indptr_.data()};
    p.cache = cache;
    p.table = kk::PageTableView{t.indptr.data(), t.indices.data(), 0};
    if (spec.kind == kvmm::LayerKind::kSlidingWindow) p.options.mask = kk::MaskKind::kSlidingWindow;
    p.options.window = spec.window;
    ops_.attention(p, !decode_);
  }

  // Recurrent state: page i of the group holds the state after token (i+1)*C - 1 (the
  // manager's Mamba contract), so token pos continues from page (pos-1)/C and writes page pos/C.
  void load_state(std::uint32_t layer, const BatchSeq& s, std::uint32_t pos, float* state) override {
    std::memcpy(state, state_ptr(layer, s, pos - 1), model_.state_floats() * sizeof(float));
  }
  void store_state(std::uint32_t layer, const BatchSeq& s, std::uint32_t pos, const float* state) override {
    std::memcpy(state_ptr(layer, s, pos), state, model_.state_floats() * sizeof(float));
  }

 private:
  std::byte* state_ptr(std::uint32_t layer, const BatchSeq& s, std::uint32_t pos) const {
    const kvmm::GroupId g = model_.group_of(layer);
    const kvmm::PageId page = kv_.page_table(s.handle, g)[pos / layout_.group(g).tokens_per_page];
    if (page == kvmm::kNullPage) kvmm::fail("pos = {}: request {} holds no state page there", pos, s.handle);
    return arena_ + std::uint64_t{page} * layout_.small_page_bytes(g) +
           layout_.state_offset(g, model_.index_in_group(layer));
  }

  struct Tables {
    std::vector<kvmm::PageId> page_ids;  // slot mapping of the new tokens
    std::vector<std::uint32_t> offsets;
    std::vector<std::uint32_t> indptr;  // CSR page tables of the batch
    std::vector<kvmm::PageId> indices;
  };
  const Model& model_;
  const kvmm::KVCacheManager& kv_;
  const kvmm::KVLayout& layout_;
  std::byte* arena_;
  DeviceOps& ops_;
  std::vector<Tables> groups_;
  std::vector<std::uint32_t> kv_lens_, q_indptr_;
  bool decode_ = true;
};

// ---------------------------------------------------------------------------------------

namespace {
// Elastic: small chunks (one OS page), so chunks are backed and released page by page.
std::uint64_t chunk_bytes(const EngineOptions& o) { return o.elastic_arena ? 4096 : 64 << 10; }
kvmm::HostMemoryOptions host_options(const EngineOptions& o) {
  return {.chunk_bytes = chunk_bytes(o), .max_chunks = o.elastic_arena ? o.max_backed_chunks : 0};
}
std::uint32_t arena_chunks(const kvmm::KVLayout& layout, const EngineOptions& o) {
  const std::uint64_t c = chunk_bytes(o);
  return static_cast<std::uint32_t>((std::uint64_t{o.num_large_pages} * layout.large_page_bytes() + c - 1) / c);
}
}  // namespace

Engine::Engine(Model& model, const EngineOptions& options, std::unique_ptr<DeviceOps> ops)
    : model_(model),
      opt_(options),
      layout_(model.layout()),
      ops_(ops ? std::move(ops) : std::make_unique<CpuOps>()),
      backend_(host_options(options)),
      chunks_(backend_, {.max_chunks = arena_chunks(layout_, options), .precreate_chunks = 0}),
      arena_(chunks_, layout_,
             {.num_large_pages = options.num_large_pages,
              .backing = options.elastic_arena ? kvmm::ArenaBacking::kElastic : kvmm::ArenaBacking::kFull}),
      source_(options.elastic_arena ? std::make_unique<kvmm::ArenaPagePool>(arena_) : nullptr),
      kv_(layout_, {.num_large_pages = options.num_large_pages,
                    .num_host_large_pages = options.num_host_large_pages,
                    .max_requests = options.max_requests,
                    .prefix_caching = options.prefix_caching,
                    .record_events = options.tier != nullptr,
                    .record_kv_events = static_cast<bool>(options.kv_events),
                    .large_page_source = source_.get()}),
      host_(new std::byte[std::max<std::uint64_t>(
          1, std::uint64_t{options.num_host_large_pages} * layout_.large_page_bytes())]),
      store_(std::make_unique<PagedStore>(model_, kv_, arena_.data(), *ops_)) {
  if (options.token_budget == 0) kvmm::fail("options.token_budget = 0: a step must compute a token");
  if (options.max_running == 0) kvmm::fail("options.max_running = 0: nothing could run");
  for (kvmm::GroupId g = 0; g < layout_.num_groups(); ++g) stats_.groups.push_back({.name = layout_.group(g).name});
  if (options.tier) {
    if (options.tier_store_pages == 0) kvmm::fail("options.tier_store_pages = 0: a tier needs offload slots");
    for (kvmm::GroupId g = 0; g < layout_.num_groups(); ++g)
      slot_bytes_ = std::max(slot_bytes_, layout_.small_page_bytes(g));
    offload_.reset(new std::byte[kvmm::checked_mul(slot_bytes_, options.tier_store_pages, "tier offload bytes")]);
    slot_ticket_.assign(options.tier_store_pages, 0);
    for (std::uint32_t i = options.tier_store_pages; i-- > 0;) free_slots_.push_back(i);
  }
}

Engine::~Engine() { tier_shutdown(); }  // tier operations in flight write or read our memory

void Engine::submit(const Request& r) {
  if (r.prompt.empty()) kvmm::fail("request.prompt: empty");
  if (r.max_new_tokens == 0) kvmm::fail("request.max_new_tokens = 0: nothing to generate");
  if (r.n == 0) kvmm::fail("request.n = 0: at least one sample");
  Seq s;
  s.request =
      static_cast<std::uint32_t>(std::count_if(seqs_.begin(), seqs_.end(), [](const Seq& q) { return q.sample == 0; }));
  s.rank = r.first_rank;
  s.pending_forks = r.n - 1;
  s.max_new = r.max_new_tokens;
  s.prompt_len = static_cast<std::uint32_t>(r.prompt.size());
  s.tokens = r.prompt;
  seqs_.push_back(std::move(s));
  waiting_.push_back(static_cast<std::uint32_t>(seqs_.size() - 1));
}

std::uint32_t Engine::num_unfinished() const {
  return static_cast<std::uint32_t>(
      std::count_if(seqs_.begin(), seqs_.end(), [](const Seq& q) { return !q.finished; }));
}

// Preemption: swap the request's pages to host memory if the host pool has room (the
// manager's plan is all or nothing), else drop them and recompute later.
Engine::Preempted Engine::preempt(std::uint32_t seq) {
  Seq& q = seqs_[seq];
  if (opt_.num_host_large_pages > 0) {
    if (auto plan = kv_.swap_out(q.rid)) {
      swap_plan(*plan, true);  // before anything else can reuse the device pages
      swapped_.push_front(seq);
      ++stats_.preempt_swap;
      return Preempted::kSwap;
    }
  }
  kv_.free(q.rid);
  q.rid = kvmm::kNoRequest;
  q.computed = 0;
  waiting_.push_front(seq);
  ++stats_.preempt_recompute;
  return Preempted::kRecompute;
}

// Copies a swap plan's pages, one swap_pages call per group (page stride = small page).
void Engine::swap_plan(std::span<const kvmm::PageCopy> plan, bool out) {
  for (kvmm::GroupId g = 0; g < layout_.num_groups(); ++g) {
    src_.clear();
    dst_.clear();
    for (const kvmm::PageCopy& c : plan)
      if (c.group == g) {
        src_.push_back(c.src);
        dst_.push_back(c.dst);
      }
    if (src_.empty()) continue;
    const std::uint64_t bytes = layout_.small_page_bytes(g);
    ops_->swap_pages(
        kk::PageCopyParams{out ? static_cast<void*>(host_.get()) : static_cast<void*>(arena_.data()),
                           out ? static_cast<const void*>(arena_.data()) : static_cast<const void*>(host_.get()), bytes,
                           bytes, bytes, src_.data(), dst_.data(), static_cast<std::uint32_t>(src_.size())});
    stats_.pages_swapped += src_.size();
  }
}

void Engine::run_copies(std::span<const kvmm::PageCopy> copies) {
  for (kvmm::GroupId g = 0; g < layout_.num_groups(); ++g) {
    src_.clear();
    dst_.clear();
    for (const kvmm::PageCopy& c : copies)
      if (c.group == g) {
        src_.push_back(c.src);
        dst_.push_back(c.dst);
      }
    if (src_.empty()) continue;
    const std::uint64_t bytes = layout_.small_page_bytes(g);
    ops_->copy_pages(kk::PageCopyParams{arena_.data(), arena_.data(), bytes, bytes, bytes, src_.data(), dst_.data(),
                                        static_cast<std::uint32_t>(src_.size())});
    stats_.cow_copies += src_.size();
  }
}

// Admission: register the known tokens (prompt, plus what was generated before a
// recompute preemption), take the cached prefix, allocate the first chunk.
bool Engine::admit(std::uint32_t seq) {
  Seq& q = seqs_[seq];
  if (opt_.tier) {  // registered and looked up by tier_probe; the contains answered
    q.computed = tier_adm_.extend_prefix(q.rid, q.tier_status);
    q.tier_hit = q.computed;
  } else {
    q.rid = kv_.add_request(q.tokens, {.max_tokens = std::uint64_t{q.prompt_len} + q.max_new});
    q.computed = kv_.lookup_prefix(q.rid);
  }
  q.prefill_end = q.tokens.size();
  return true;
}

bool Engine::step() {
  const bool more = schedule_step();
  if (opt_.tier) tier_store();
  if (opt_.kv_events) {
    kv_.take_events(events_);
    if (!events_.empty()) opt_.kv_events(events_);
  }
  return more;
}

bool Engine::schedule_step() {
  idle_ = false;
  if (running_.empty() && waiting_.empty() && swapped_.empty() && loading_.empty()) return false;
  kv_.begin_step();
  ++stats_.steps;
  batch_.clear();
  batch_seq_.clear();
  tier_poll();  // completed contains, loads (they join running_) and puts

  // 1. Swapped requests come back first, oldest first (their plan is host -> device).
  while (!swapped_.empty() && running_.size() < opt_.max_running) {
    const std::uint32_t s = swapped_.front();
    auto plan = kv_.swap_in(seqs_[s].rid);
    if (!plan) break;
    swap_plan(*plan, false);
    ++stats_.swap_ins;
    swapped_.pop_front();
    running_.push_back(s);
  }

  // 2. Running requests in arrival order: a decode token or the next prefill chunk. When
  //    memory is short, preempt the youngest (possibly the request itself).
  std::uint32_t budget = opt_.token_budget;
  for (std::size_t i = 0; i < running_.size() && budget > 0;) {
    const std::uint32_t s = running_[i];
    const auto n =
        static_cast<std::uint32_t>(std::min<std::uint64_t>(seqs_[s].tokens.size() - seqs_[s].computed, budget));
    bool ok = static_cast<bool>(kv_.allocate(seqs_[s].rid, n));
    while (!ok) {
      if (running_.size() == 1 && batch_.empty() && loading_.empty())  // alone, all else evictable
        kvmm::fail("request {}: {} tokens do not fit in {} large pages", seqs_[s].request, seqs_[s].computed + n,
                   opt_.num_large_pages);
      const std::uint32_t victim = running_.back();
      running_.pop_back();
      preempt(victim);
      if (victim == s) break;
      ok = static_cast<bool>(kv_.allocate(seqs_[s].rid, n));
    }
    if (!ok) break;
    batch_.push_back({seqs_[s].rid, static_cast<std::uint32_t>(seqs_[s].computed), n});
    batch_seq_.push_back(s);
    budget -= n;
    ++i;
  }

  // 3. New (or recompute-preempted) requests while the budget lasts; none while some are
  //    swapped out, so those are not starved.
  //    With a tier, a request is admitted once its contains answered (the queue waits for
  //    its front; the probes of the next few are already in flight).
  if (opt_.tier && swapped_.empty()) tier_probe_ahead();
  while (budget > 0 && swapped_.empty() && !waiting_.empty() && running_.size() + loading_.size() < opt_.max_running) {
    const std::uint32_t s = waiting_.front();
    if (opt_.tier && seqs_[s].tier != Seq::TierPhase::kProbed) break;
    admit(s);
    Seq& q = seqs_[s];
    const auto n = static_cast<std::uint32_t>(std::min<std::uint64_t>(q.tokens.size() - q.computed, budget));
    if (!kv_.allocate(q.rid, n)) {
      kv_.free(q.rid);  // its prefix hit goes back to the cache; with a tier it asks again
      q.rid = kvmm::kNoRequest;
      q.computed = 0;
      q.tier = Seq::TierPhase::kNone;
      if (running_.empty() && batch_.empty() && loading_.empty())
        kvmm::fail("request {}: {} tokens do not fit in {} large pages", q.request, q.tokens.size(),
                   opt_.num_large_pages);
      break;
    }
    waiting_.pop_front();
    stats_.lookup_tokens += q.tokens.size();
    if (opt_.tier && tier_start_loads(s)) continue;  // joins running_ when its get completes
    running_.push_back(s);
    stats_.hit_tokens += q.computed;
    batch_.push_back({q.rid, static_cast<std::uint32_t>(q.computed), n});
    batch_seq_.push_back(s);
    budget -= n;
  }
  if (batch_.empty()) {
    if (!swapped_.empty() && running_.empty() && loading_.empty())
      kvmm::fail("swap_in: device memory cannot hold a swapped request");
    idle_ = true;
    return true;
  }

  // 4. Copy-on-write copies (forks) before the kernels; then the model.
  run_copies(kv_.copies());
  tokens_.clear();
  want_logits_.clear();
  for (std::size_t i = 0; i < batch_.size(); ++i) {
    const Seq& q = seqs_[batch_seq_[i]];
    const BatchSeq& b = batch_[i];
    tokens_.insert(tokens_.end(), q.tokens.begin() + b.start, q.tokens.begin() + b.start + b.len);
    want_logits_.push_back(b.start + b.len == q.tokens.size());
  }
  store_->prepare(batch_);
  model_.forward(batch_, tokens_, want_logits_, *store_, logits_);

  // 5. Commit the new KV (full pages become cached), sample, finish.
  const std::uint32_t V = model_.config().vocab;
  for (std::size_t i = 0; i < batch_.size(); ++i) {
    const std::uint32_t s = batch_seq_[i];
    Seq& q = seqs_[s];
    (q.computed >= q.prefill_end ? stats_.decode_tokens : stats_.prefill_tokens) += batch_[i].len;
    q.computed += batch_[i].len;
    kv_.commit(q.rid, q.computed);
    if (want_logits_[i]) sample(s, std::span<const float>(logits_).subspan(i * std::size_t{V}, V));
  }
  std::erase_if(running_, [&](std::uint32_t s) { return seqs_[s].finished; });
  record_peaks();
  return true;
}

// Greedy sampling. The first token of a request with n > 1 forks the other samples: each
// shares the prompt's pages (a shared partial page is copied on its first write).
void Engine::sample(std::uint32_t seq, std::span<const float> logits) {
  const bool first = seqs_[seq].tokens.size() == seqs_[seq].prompt_len;
  if (first) {
    for (std::uint32_t k = 1; k <= seqs_[seq].pending_forks; ++k) {
      Seq child = seqs_[seq];
      child.sample = k;
      child.rank = seqs_[seq].rank + k;
      child.pending_forks = 0;
      child.rid = kv_.fork(seqs_[seq].rid);
      child.prefill_end = child.computed;
      seqs_.push_back(std::move(child));
      const auto c = static_cast<std::uint32_t>(seqs_.size() - 1);
      running_.push_back(c);
      ++stats_.forks;
      sample(c, logits);
    }
    seqs_[seq].pending_forks = 0;
  }
  Seq& q = seqs_[seq];
  const std::uint32_t token = pick_token(logits, first ? q.rank : 0);
  q.tokens.push_back(token);
  kv_.append_token(q.rid, token);
  if (q.tokens.size() - q.prompt_len == q.max_new) finish(seq);
}

void Engine::finish(std::uint32_t seq) {
  Seq& q = seqs_[seq];
  kv_.free(q.rid);
  q.rid = kvmm::kNoRequest;
  q.finished = true;
  ++stats_.requests_finished;
  done_.push_back({q.request, q.sample, std::vector<std::uint32_t>(q.tokens.begin() + q.prompt_len, q.tokens.end())});
}

// Peak KV memory: the step whose used pages (all groups) held the most bytes.
// stats() is O(pages); fine for this tiny model, an engine would sample it.
void Engine::record_peaks() {
  const kvmm::CacheStats cs = kv_.stats();
  std::uint64_t total = 0;
  for (const kvmm::GroupStats& g : cs.groups) total += g.allocated_bytes;
  if (total > stats_.peak_kv_bytes) {
    stats_.peak_kv_bytes = total;
    for (std::size_t g = 0; g < cs.groups.size(); ++g) {
      stats_.groups[g].peak_allocated_bytes = cs.groups[g].allocated_bytes;
      stats_.groups[g].waste_at_peak_bytes = cs.groups[g].waste_bytes;
    }
  }
  for (std::size_t g = 0; g < cs.groups.size(); ++g) {
    stats_.groups[g].hit_pages = cs.groups[g].hit_pages;
    stats_.groups[g].evicted_pages = cs.groups[g].evicted_pages;
  }
}

std::vector<Output> Engine::run() {
  // Nothing could run: only the tier has work; sleep on its event fd, bounded, then step.
  while (step())
    if (idle_) wait_tier(std::chrono::milliseconds(50));
  drain_tier(opt_.tier_drain);  // a process that exits has stored its pages
  std::vector<Output> out = std::move(done_);
  done_.clear();
  std::sort(out.begin(), out.end(), [](const Output& a, const Output& b) {
    return a.request != b.request ? a.request < b.request : a.sample < b.sample;
  });
  return out;
}

}  // namespace mini
