// mini_engine: a tiny hybrid decoder (full attention, sliding window, Mamba-like recurrent
// layer; seeded weights, greedy decoding) served on kvmm by a continuous-batching scheduler:
// KVCacheManager pages and prefix caching, fork, recompute/swap preemption, write_kv + paged
// attention over a KVArena, a shared KVTier (docs/tier.md) for prefix hits past the local
// cache; VAttentionEngine serves it through VirtualKVCache. A step costs O(batch tokens x
// model size) of C++ arithmetic plus O(groups) manager work per request; it never waits on
// the tier (the tier's own threads do its I/O).
#pragma once

#include "kvmm/distributed/kv_tier.hpp"
#include "kvmm/kernels/attention.hpp"
#include "kvmm/kernels/cache_ops.hpp"
#include "kvmm/manager/kv_cache_manager.hpp"
#include "kvmm/manager/tier_admission.hpp"
#include "kvmm/memory/arena_page_pool.hpp"
#include "kvmm/memory/chunk_pool.hpp"
#include "kvmm/memory/host_memory.hpp"
#include "kvmm/memory/kv_arena.hpp"
#include "kvmm/memory/virtual_kv_cache.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace mini {

// ---------------------------------------------------------------------------------------
// The model.

enum class LayerType : std::uint8_t { kFull, kSliding, kRecurrent };

struct ModelConfig {
  std::uint32_t vocab = 96;
  std::uint32_t hidden = 64;
  std::uint32_t q_heads = 2;
  std::uint32_t kv_heads = 1;
  std::uint32_t head_dim = 64;  // the kernels support 64/128/256
  std::uint32_t ffn = 128;
  std::uint32_t state_dim = 4;        // recurrent state: hidden x state_dim floats per request
  std::uint32_t window = 8;           // sliding-window layers
  std::uint32_t tokens_per_page = 4;  // also the recurrent group's checkpoint interval
  // The order inside the attention groups' pages (LayerGroup::kv_order): the paged engine
  // passes it to the kernels through kernels::paged_cache.
  kvmm::KVOrder kv_order = kvmm::KVOrder::kTokenMajor;
  std::vector<LayerType> layers = {LayerType::kFull, LayerType::kSliding, LayerType::kRecurrent, LayerType::kFull,
                                   LayerType::kSliding};
  std::uint64_t seed = 42;
};

// One request's slice of a step's batch: tokens [start, start + len) of the request
// `handle` (a RequestId in the paged engine, a slot in the vAttention engine).
struct BatchSeq {
  std::uint32_t handle = 0;
  std::uint32_t start = 0;
  std::uint32_t len = 0;
};

// Where the model keeps its per-request memory. The paged and the virtual-tensor engine
// each implement it; the model itself never sees pages or slots.
class KVStore {
 public:
  virtual ~KVStore() = default;
  // Stores the new tokens' K/V of attention layer `layer` (model index), then computes the
  // attention output o of every new token. q, o: [tokens, q_heads, head_dim]; k, v:
  // [tokens, kv_heads, head_dim]; fp16, 16-byte aligned.
  virtual void attention(std::uint32_t layer, std::span<const BatchSeq> batch, std::uint32_t tokens,
                         const std::uint16_t* q, const std::uint16_t* k, const std::uint16_t* v, std::uint16_t* o) = 0;
  // Recurrent layer state of s after token pos - 1 (pos > 0) / after token pos.
  virtual void load_state(std::uint32_t layer, const BatchSeq& s, std::uint32_t pos, float* state) = 0;
  virtual void store_state(std::uint32_t layer, const BatchSeq& s, std::uint32_t pos, const float* state) = 0;
};

class Model {
 public:
  explicit Model(ModelConfig config);
  const ModelConfig& config() const { return cfg_; }

  // The kvmm layout of this model: one group per layer kind (full, sliding, recurrent).
  kvmm::KVLayout layout() const;
  // Group of a layer and its index inside the group (layout()'s layer map).
  kvmm::GroupId group_of(std::uint32_t layer) const { return group_[layer]; }
  std::uint32_t index_in_group(std::uint32_t layer) const { return index_[layer]; }
  std::uint32_t state_floats() const { return cfg_.hidden * cfg_.state_dim; }

  // Runs the batch's new tokens (token ids in batch order, positions implied by BatchSeq)
  // through every layer. logits_for[i] != 0 asks for the logits of batch[i]'s last token,
  // written to logits[i * vocab ..]. Every token's arithmetic is independent of the batch.
  void forward(std::span<const BatchSeq> batch, std::span<const std::uint32_t> tokens,
               std::span<const std::uint8_t> logits_for, KVStore& store, std::vector<float>& logits);

 private:
  ModelConfig cfg_;
  std::vector<kvmm::GroupId> group_;
  std::vector<std::uint32_t> index_;
  std::vector<float> embed_, unembed_;
  struct Layer {
    std::vector<float> wq, wk, wv, wo;      // attention
    std::vector<float> win, a, b, c, wout;  // recurrent
    std::vector<float> w1, w2;              // MLP
  };
  std::vector<Layer> w_;
  // Scratch reused across steps.
  std::vector<float> h_, x_, t1_, t2_;
  std::vector<std::uint16_t> q16_, k16_, v16_, o16_;
  std::vector<float> state_;
  std::vector<std::uint32_t> pos_;
};

// Greedy decoding: the index of the largest logit (lowest index on ties); rank r > 0 picks
// the (r+1)-th largest, used for the first token of parallel samples.
std::uint32_t pick_token(std::span<const float> logits, std::uint32_t rank);

// ---------------------------------------------------------------------------------------
// Kernels behind one seam: the CPU references here. A GPU build would implement the same
// four calls with the kvmm::cuda launchers and device buffers.

class DeviceOps {
 public:
  virtual ~DeviceOps() = default;
  virtual void write_kv(const kvmm::kernels::PagedWriteParams& p) = 0;
  virtual void attention(const kvmm::kernels::PagedAttentionParams& p, bool prefill) = 0;
  virtual void copy_pages(const kvmm::kernels::PageCopyParams& p) = 0;  // device -> device
  virtual void swap_pages(const kvmm::kernels::PageCopyParams& p) = 0;  // device <-> host
};

class CpuOps final : public DeviceOps {
 public:
  void write_kv(const kvmm::kernels::PagedWriteParams& p) override;
  void attention(const kvmm::kernels::PagedAttentionParams& p, bool prefill) override;
  void copy_pages(const kvmm::kernels::PageCopyParams& p) override;
  void swap_pages(const kvmm::kernels::PageCopyParams& p) override;
};

// ---------------------------------------------------------------------------------------
// Requests and results.

struct Request {
  std::vector<std::uint32_t> prompt;
  std::uint32_t max_new_tokens = 8;
  // Parallel samples: the prompt is prefilled once, then forked; sample k's first token
  // is the (k+1)-th best, later tokens are greedy.
  std::uint32_t n = 1;
  std::uint32_t first_rank = 0;  // rank of sample 0's first token
};

struct Output {
  std::uint32_t request = 0;  // index in the submitted order
  std::uint32_t sample = 0;
  std::vector<std::uint32_t> tokens;  // generated tokens only
  friend bool operator==(const Output&, const Output&) = default;
};

struct GroupReport {
  std::string name;
  std::uint64_t peak_allocated_bytes = 0;  // used pages x page size, at the step of the peak
  std::uint64_t waste_at_peak_bytes = 0;   // of which not holding a token
  std::uint64_t hit_pages = 0;
  std::uint64_t evicted_pages = 0;
};

struct EngineStats {
  std::uint64_t steps = 0;
  std::uint64_t prefill_tokens = 0;  // tokens computed in prefill (recomputation included)
  std::uint64_t decode_tokens = 0;
  std::uint64_t requests_finished = 0;  // samples finished
  std::uint64_t preempt_recompute = 0;
  std::uint64_t preempt_swap = 0;
  std::uint64_t swap_ins = 0;
  std::uint64_t pages_swapped = 0;  // out and in
  std::uint64_t cow_copies = 0;
  std::uint64_t forks = 0;
  std::uint64_t lookup_tokens = 0;  // tokens of admitted requests (a re-admission counts again)
  std::uint64_t hit_tokens = 0;     // of which the prefix cache held the KV
  std::uint64_t peak_kv_bytes = 0;  // all groups
  std::vector<GroupReport> groups;
  // With a tier (EngineOptions::tier): admissions that asked it (contains), tokens its pages
  // added to admitted hits, pages loaded (kOk) and loads that failed, tokens the failures
  // cut from hits (recomputed); pages put (submitted, stored or already there, failed,
  // skipped for want of a free offload slot); the tier's health at the last step.
  std::uint64_t tier_probes = 0, tier_hit_tokens = 0, tier_loaded_pages = 0, tier_failed_pages = 0;
  std::uint64_t tier_cut_tokens = 0;
  std::uint64_t tier_puts = 0, tier_puts_ok = 0, tier_puts_failed = 0, tier_puts_skipped = 0;
  kvmm::TierHealth tier_health;
};

struct EngineOptions {
  std::uint32_t num_large_pages = 64;      // device KV memory (large pages)
  std::uint32_t num_host_large_pages = 0;  // host swap space; 0: preempt by recompute only
  bool prefix_caching = true;
  std::uint32_t max_running = 8;    // requests in one batch
  std::uint32_t token_budget = 16;  // tokens per step (decodes first, then prefill chunks)
  std::uint32_t max_requests = 64;  // manager rows
  // The arena backs its chunks as pages are taken and releases them as pages are freed
  // (kvmm::ArenaPagePool as the manager's large-page source; at most max_backed_chunks
  // chunks at once, 0: all), instead of backing every chunk up front.
  bool elastic_arena = false;
  std::uint32_t max_backed_chunks = 0;
  // Called after every step with that step's KV events (the manager's record_kv_events is
  // on when set), e.g. to hand them to a kvmm::KvEventPublisher for a KV-aware router. The
  // batch is reused: copy what must outlive the call.
  std::function<void(const kvmm::KvEventBatch&)> kv_events = {};
  // A shared KV tier (not owned; it must outlive the engine): each admission asks it for
  // the pages past its local hit and loads them into its device pages; every page the
  // prefix cache newly stores is copied to a slot of a host offload buffer and put
  // (docs/tier.md, "The engine"). The engine never waits on it inside a step.
  kvmm::KVTier* tier = nullptr;
  std::uint32_t tier_store_pages = 256;  // offload slots (one small page each): puts in flight
  // run() and the destructor wait at most this long for outstanding tier operations.
  std::chrono::milliseconds tier_drain{3000};
  // Called with every page copied for a put (stored = true) and every page a get loaded
  // (false), its bytes; for tests and tracing. The bytes are valid during the call only.
  std::function<void(const kvmm::TierKey&, std::span<const std::byte>, bool stored)> tier_page = {};
};

// ---------------------------------------------------------------------------------------
// The paged engine.

class Engine {
 public:
  Engine(Model& model, const EngineOptions& options, std::unique_ptr<DeviceOps> ops = nullptr);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  void submit(const Request& r);
  // One scheduler step; false when nothing is left to do. Never waits on the tier.
  bool step();
  // Steps until every request finished, waiting on the tier while only it has work;
  // then waits (<= tier_drain) for the last puts. Outputs sorted by (request, sample).
  std::vector<Output> run();
  // With a tier: whether the last step computed nothing (every request waits on the tier).
  bool idle() const { return idle_; }
  // Tier operations (contains, get, put tickets) not completed yet.
  std::uint32_t tier_in_flight() const;
  std::uint32_t num_loading() const { return static_cast<std::uint32_t>(loading_.size()); }
  // Waits until a tier completion is ready to be polled, at most `limit` (poll() on the
  // tier's event fd); at once when nothing is outstanding. The next step() collects it.
  void wait_tier(std::chrono::milliseconds limit) const;
  // Collects completions until no tier operation is outstanding, at most `limit`; true
  // when none is left. Puts complete here; loads finish as in a step.
  bool drain_tier(std::chrono::milliseconds limit);

  const EngineStats& stats() const { return stats_; }
  const kvmm::KVCacheManager& manager() const { return kv_; }
  const kvmm::KVArena& arena() const { return arena_; }
  std::uint32_t num_unfinished() const;

 private:
  struct Seq;
  class PagedStore;
  enum class Preempted : std::uint8_t { kSwap, kRecompute };

  Preempted preempt(std::uint32_t seq);
  bool schedule_step();  // step() without handing the events over
  bool admit(std::uint32_t seq);
  void swap_plan(std::span<const kvmm::PageCopy> plan, bool out);
  void run_copies(std::span<const kvmm::PageCopy> copies);
  void sample(std::uint32_t seq, std::span<const float> logits);
  void finish(std::uint32_t seq);
  void record_peaks();
  // The tier's part (tier.cpp).
  void tier_poll();
  void tier_probe_ahead();
  void tier_probe(std::uint32_t seq);
  bool tier_start_loads(std::uint32_t seq);
  void tier_finish_loads(std::uint32_t seq, std::span<const kvmm::TierStatus> statuses);
  void tier_store();
  void tier_shutdown();  // the destructor's wait for operations in flight

  Model& model_;
  EngineOptions opt_;
  kvmm::KVLayout layout_;
  std::unique_ptr<DeviceOps> ops_;
  // Device KV memory: a KVArena over host memory (page-layer layout), fully or elastically
  // backed; host swap space in the same layout (host page p of group g at host_ + p *
  // small_page_bytes(g)).
  kvmm::HostMemory backend_;
  kvmm::ChunkPool chunks_;
  kvmm::KVArena arena_;
  std::unique_ptr<kvmm::ArenaPagePool> source_;  // elastic_arena: the manager's page source
  kvmm::KVCacheManager kv_;
  kvmm::TierAdmission tier_adm_{kv_};  // the shared tier's calls on kv_
  std::unique_ptr<std::byte[]> host_;
  std::unique_ptr<PagedStore> store_;

  std::vector<Seq> seqs_;
  std::deque<std::uint32_t> waiting_;  // seq indices
  std::vector<std::uint32_t> running_;
  std::deque<std::uint32_t> swapped_;
  std::vector<Output> done_;
  EngineStats stats_;
  // Scratch reused across steps.
  std::vector<BatchSeq> batch_;
  kvmm::KvEventBatch events_;
  std::vector<std::uint32_t> batch_seq_, tokens_;
  std::vector<std::uint8_t> want_logits_;
  std::vector<float> logits_;
  std::vector<kvmm::PageId> src_, dst_;
  bool idle_ = false;
  // The tier's state. loading_: admitted requests whose tier pages are loading (they hold
  // pages and count as running, but are not in running_, so never preempted or freed while
  // a get writes into them). tier_ops_: contains/get tickets and their seq.
  struct TierWait {
    kvmm::TierTicket ticket = 0;
    std::uint32_t seq = 0;
  };
  std::vector<std::uint32_t> loading_;
  std::vector<TierWait> tier_ops_;
  kvmm::TierResults tier_results_;
  // Host offload buffer: slot i at offload_ + i * slot_bytes_, owned by the put ticket
  // slot_ticket_[i] until it completes (0: free).
  std::unique_ptr<std::byte[]> offload_;
  std::uint64_t slot_bytes_ = 0;
  std::vector<kvmm::TierTicket> slot_ticket_;
  std::vector<std::uint32_t> free_slots_, step_slots_;
  std::uint32_t puts_in_flight_ = 0;
  std::vector<kvmm::TierPage> put_pages_;
  std::vector<kvmm::CacheEvent> cache_events_;
  std::vector<kvmm::CacheEvent> just_loaded_;  // this step's loaded pages: not stored again
};

// ---------------------------------------------------------------------------------------
// The vAttention engine: one virtual-tensor slot per running request (no prefix caching,
// no preemption: a request waits for a free slot), contiguous write_kv and attention.

struct VAttentionOptions {
  std::uint32_t max_batch = 8;      // slots
  std::uint32_t max_context = 128;  // tokens per slot
  std::uint32_t token_budget = 16;
};

class VAttentionEngine {
 public:
  VAttentionEngine(Model& model, const VAttentionOptions& options);
  ~VAttentionEngine();
  VAttentionEngine(const VAttentionEngine&) = delete;
  VAttentionEngine& operator=(const VAttentionEngine&) = delete;

  void submit(const Request& r);  // n > 1 runs as n independent sequences
  std::vector<Output> run();
  const kvmm::VirtualKVCache& cache() const { return *cache_; }

 private:
  class ContiguousStore;
  struct Seq {
    std::uint32_t request = 0, sample = 0, rank = 0, prompt_len = 0, max_new = 0;
    std::uint32_t slot = 0, computed = 0;
    std::vector<std::uint32_t> tokens;
  };
  Model& model_;
  VAttentionOptions opt_;
  kvmm::HostMemory backend_;
  kvmm::ChunkPool chunks_;
  std::unique_ptr<kvmm::VirtualKVCache> cache_;
  std::unique_ptr<ContiguousStore> store_;
  std::deque<Seq> waiting_;
  std::vector<Seq> running_;
  std::vector<Output> done_;
  std::uint32_t next_request_ = 0;
};

// A seeded workload of `count` requests over a few shared system prompts (so prefix
// caching hits), every third request with n = 2 or 3 parallel samples.
// With suffix_seed != seed the system prompts come from `seed` and everything else from
// `suffix_seed`: two engines share prefixes (the tier demo) without sharing whole prompts.
std::vector<Request> shared_prefix_workload(std::uint32_t count, std::uint32_t vocab, std::uint64_t seed);
std::vector<Request> shared_prefix_workload(std::uint32_t count, std::uint32_t vocab, std::uint64_t seed,
                                            std::uint64_t suffix_seed);

// One line per group and totals; used by the demo.
std::string format_report(const EngineStats& s, double seconds);
// The tier lines of the report (hits, loads, cut-backs, puts, the tier's health).
std::string format_tier_report(const EngineStats& s);

}  // namespace mini
