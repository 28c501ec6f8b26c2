// The vAttention path: the same model with its KV in VirtualKVCache's virtual tensors
// (one slot per request, backed on demand by HostMemory chunks) and the contiguous
// write_kv / attention references. The recurrent state lives in a plain per-slot array.
#include "mini_engine.hpp"

#include "kvmm/error.hpp"

#include <fmt/format.h>
#include <algorithm>
#include <cstring>

namespace mini {

namespace kk = kvmm::kernels;

class VAttentionEngine::ContiguousStore final : public KVStore {
 public:
  ContiguousStore(const Model& model, const kvmm::VirtualKVCache& cache, std::uint32_t slots)
      : model_(model), cache_(cache) {
    std::uint32_t recurrent = 0;
    for (std::uint32_t l = 0; l < model.config().layers.size(); ++l) {
      const bool rec = model.config().layers[l] == LayerType::kRecurrent;
      tensor_.push_back(rec ? recurrent++ : attention_++);
    }
    states_.assign(std::size_t{slots} * recurrent * model.state_floats(), 0.0f);
    recurrent_ = recurrent;
  }
  std::uint32_t attention_layers() const { return attention_; }

  void prepare(std::span<const BatchSeq> batch) {
    slot_of_token_.clear();
    positions_.clear();
    slots_.clear();
    kv_lens_.clear();
    q_indptr_.assign(1, 0);
    for (const BatchSeq& s : batch) {
      for (std::uint32_t j = 0; j < s.len; ++j) {
        slot_of_token_.push_back(s.handle);
        positions_.push_back(s.start + j);
      }
      slots_.push_back(s.handle);
      kv_lens_.push_back(s.start + s.len);
      q_indptr_.push_back(q_indptr_.back() + s.len);
    }
  }

  void attention(std::uint32_t layer, std::span<const BatchSeq> batch, std::uint32_t tokens, const std::uint16_t* q,
                 const std::uint16_t* k, const std::uint16_t* v, std::uint16_t* o) override {
    const ModelConfig& cfg = model_.config();
    const kvmm::TensorView kt = cache_.k(tensor_[layer]), vt = cache_.v(tensor_[layer]);
    const kk::ContiguousKVCache c{reinterpret_cast<void*>(static_cast<std::uintptr_t>(kt.base)),
                                  reinterpret_cast<void*>(static_cast<std::uintptr_t>(vt.base)),
                                  kt.slot_stride,
                                  cache_.options().max_context,
                                  cfg.kv_heads,
                                  cfg.head_dim,
                                  kk::DType::kF16};
    kk::cpu::write_kv(kk::ContiguousWriteParams{c, k, v, slot_of_token_.data(), positions_.data(), tokens});
    kk::ContiguousAttentionParams p;
    p.query = kk::QueryBatch{
        q, o, tokens, static_cast<std::uint32_t>(batch.size()), cfg.q_heads, kv_lens_.data(), q_indptr_.data()};
    p.cache = c;
    p.slot_idx = slots_.data();
    if (cfg.layers[layer] == LayerType::kSliding) p.options.mask = kk::MaskKind::kSlidingWindow;
    p.options.window = cfg.window;
    kk::cpu::contiguous_prefill_attention(p);
  }
  void load_state(std::uint32_t layer, const BatchSeq& s, std::uint32_t, float* state) override {
    std::memcpy(state, slot_state(layer, s.handle), model_.state_floats() * sizeof(float));
  }
  void store_state(std::uint32_t layer, const BatchSeq& s, std::uint32_t, const float* state) override {
    std::memcpy(slot_state(layer, s.handle), state, model_.state_floats() * sizeof(float));
  }

 private:
  float* slot_state(std::uint32_t layer, std::uint32_t slot) {
    return &states_[(std::size_t{slot} * recurrent_ + tensor_[layer]) * model_.state_floats()];
  }
  const Model& model_;
  const kvmm::VirtualKVCache& cache_;
  std::vector<std::uint32_t> tensor_;  // per model layer: attention tensor or recurrent index
  std::uint32_t attention_ = 0, recurrent_ = 0;
  std::vector<float> states_;
  std::vector<std::uint32_t> slot_of_token_, positions_, slots_, kv_lens_, q_indptr_;
};

namespace {
std::uint32_t count_attention(const ModelConfig& cfg) {
  return static_cast<std::uint32_t>(
      std::count_if(cfg.layers.begin(), cfg.layers.end(), [](LayerType t) { return t != LayerType::kRecurrent; }));
}
std::uint32_t token_bytes(const ModelConfig& cfg) { return cfg.kv_heads * cfg.head_dim * 2; }
}  // namespace

VAttentionEngine::VAttentionEngine(Model& model, const VAttentionOptions& options)
    : model_(model),
      opt_(options),
      backend_({.chunk_bytes = 4096, .max_chunks = 0}),
      // Enough 4 KiB chunks to back every slot of every K and V tensor at full context.
      chunks_(backend_, {.max_chunks = 2 * count_attention(model.config()) * options.max_batch *
                                       ((options.max_context * token_bytes(model.config()) + 4095) / 4096),
                         .precreate_chunks = 0}) {
  const ModelConfig& cfg = model.config();
  const std::uint32_t attn = count_attention(cfg);
  if (attn == 0) kvmm::fail("config.layers: no attention layer to serve through virtual tensors");
  cache_ =
      std::make_unique<kvmm::VirtualKVCache>(chunks_, kvmm::VirtualKVCacheOptions{.num_layers = attn,
                                                                                  .max_batch = options.max_batch,
                                                                                  .max_context = options.max_context,
                                                                                  .kv_heads = cfg.kv_heads,
                                                                                  .head_dim = cfg.head_dim,
                                                                                  .dtype_bytes = 2,
                                                                                  .page_group_bytes = 4096,
                                                                                  .background_mapper = false});
  store_ = std::make_unique<ContiguousStore>(model_, *cache_, options.max_batch);
}

VAttentionEngine::~VAttentionEngine() = default;

void VAttentionEngine::submit(const Request& r) {
  if (r.prompt.empty() || r.max_new_tokens == 0 || r.n == 0)
    kvmm::fail("request {}: needs a prompt, max_new_tokens > 0 and n > 0", next_request_);
  if (r.prompt.size() + r.max_new_tokens > opt_.max_context)
    kvmm::fail("request {}: {} tokens exceed max_context = {}", next_request_, r.prompt.size() + r.max_new_tokens,
               opt_.max_context);
  for (std::uint32_t k = 0; k < r.n; ++k)
    waiting_.push_back(Seq{.request = next_request_,
                           .sample = k,
                           .rank = r.first_rank + k,
                           .prompt_len = static_cast<std::uint32_t>(r.prompt.size()),
                           .max_new = r.max_new_tokens,
                           .tokens = r.prompt});
  ++next_request_;
}

std::vector<Output> VAttentionEngine::run() {
  std::vector<BatchSeq> batch;
  std::vector<std::uint32_t> tokens, seq_lens(opt_.max_batch);
  std::vector<std::uint8_t> want;
  std::vector<float> logits;
  const std::uint32_t V = model_.config().vocab;
  while (!waiting_.empty() || !running_.empty()) {
    // vAttention's alloc_reqid: a slot per request.
    while (!waiting_.empty()) {
      const std::optional<std::uint32_t> slot = cache_->alloc_reqid();
      if (!slot) break;
      running_.push_back(std::move(waiting_.front()));
      waiting_.pop_front();
      running_.back().slot = *slot;
    }
    batch.clear();
    tokens.clear();
    want.clear();
    std::fill(seq_lens.begin(), seq_lens.end(), 0u);
    std::uint32_t budget = opt_.token_budget;
    for (const Seq& s : running_) {
      seq_lens[s.slot] = s.computed;
      const auto n = std::min<std::uint32_t>(static_cast<std::uint32_t>(s.tokens.size()) - s.computed, budget);
      if (n == 0) continue;
      batch.push_back({s.slot, s.computed, n});
      tokens.insert(tokens.end(), s.tokens.begin() + s.computed, s.tokens.begin() + s.computed + n);
      want.push_back(s.computed + n == s.tokens.size());
      seq_lens[s.slot] = s.computed + n;
      budget -= n;
    }
    // vAttention's step(seq_lens): back every slot up to its new length.
    if (!cache_->step(seq_lens)) kvmm::fail("VirtualKVCache::step: out of memory for {} slots", running_.size());
    store_->prepare(batch);
    model_.forward(batch, tokens, want, *store_, logits);
    for (std::size_t i = 0, b = 0; i < running_.size(); ++i) {
      Seq& s = running_[i];
      if (b == batch.size() || batch[b].handle != s.slot) continue;
      s.computed += batch[b].len;
      if (want[b]) {
        const bool first = s.tokens.size() == s.prompt_len;
        s.tokens.push_back(
            pick_token(std::span<const float>(logits).subspan(b * std::size_t{V}, V), first ? s.rank : 0));
      }
      ++b;
    }
    for (Seq& s : running_)
      if (s.tokens.size() - s.prompt_len == s.max_new) {
        cache_->free_reqid(s.slot);
        done_.push_back(
            {s.request, s.sample, std::vector<std::uint32_t>(s.tokens.begin() + s.prompt_len, s.tokens.end())});
      }
    std::erase_if(running_, [](const Seq& s) { return s.tokens.size() - s.prompt_len == s.max_new; });
  }
  std::vector<Output> out = std::move(done_);
  done_.clear();
  std::sort(out.begin(), out.end(), [](const Output& a, const Output& b) {
    return a.request != b.request ? a.request < b.request : a.sample < b.sample;
  });
  return out;
}

std::string format_report(const EngineStats& s, double seconds) {
  const std::uint64_t tokens = s.prefill_tokens + s.decode_tokens;
  std::string r;
  r += fmt::format("requests served     {} samples ({} forked) in {} steps\n", s.requests_finished, s.forks, s.steps);
  r += fmt::format("tokens computed     {} prefill + {} decode, {:.0f} tokens/s (CPU reference kernels)\n",
                   s.prefill_tokens, s.decode_tokens, seconds > 0 ? tokens / seconds : 0.0);
  r += fmt::format("prefix hit rate     {:.1f}% ({} of {} looked-up prompt tokens)\n",
                   s.lookup_tokens ? 100.0 * s.hit_tokens / s.lookup_tokens : 0.0, s.hit_tokens, s.lookup_tokens);
  r += fmt::format("preemptions         {} recompute, {} swap ({} swap-ins, {} pages moved); {} copy-on-write pages\n",
                   s.preempt_recompute, s.preempt_swap, s.swap_ins, s.pages_swapped, s.cow_copies);
  r += fmt::format("peak KV memory      {} bytes in used pages\n", s.peak_kv_bytes);
  r += fmt::format("  {:<10} {:>12} {:>12} {:>7} {:>10} {:>8}\n", "group", "peak bytes", "waste", "waste%", "hit pages",
                   "evicted");
  for (const GroupReport& g : s.groups)
    r += fmt::format("  {:<10} {:>12} {:>12} {:>6.1f}% {:>10} {:>8}\n", g.name, g.peak_allocated_bytes,
                     g.waste_at_peak_bytes,
                     g.peak_allocated_bytes ? 100.0 * g.waste_at_peak_bytes / g.peak_allocated_bytes : 0.0, g.hit_pages,
                     g.evicted_pages);
  return r;
}

}  // namespace mini
