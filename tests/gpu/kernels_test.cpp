// Every kernel against its CPU reference on fresh random inputs, outputs poisoned (NaN)
// before each run: attention (paged/contiguous, decode/prefill, every mask, GQA 1/4/8/16,
// page sizes 1/16/17, split-KV, soft cap, fp16/bf16, d 64/128/256), write_kv,
// copy_pages, swap_pages; paged vs contiguous kernels on the same data; and a decode
// launch captured in a CUDA graph and replayed with new context lengths.
#include "kernels/kernel_fixture.hpp"

#include <catch2/catch.hpp>

#include <cuda_runtime.h>

using namespace kvmm;
using namespace kvmm::kernels;
using namespace kvmm::test;

namespace {

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) FAIL(what << ": " << cudaGetErrorString(e));
}
#define CUDA_OK(x) cuda_check((x), #x)

// Device copy of a host array; freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes) { allocate(bytes); }
  DeviceBuffer(const void* host, std::size_t bytes) {
    allocate(bytes);
    CUDA_OK(cudaMemcpy(ptr_, host, bytes, cudaMemcpyHostToDevice));
  }
  template <typename T>
  explicit DeviceBuffer(const std::vector<T>& v) : DeviceBuffer(v.data(), v.size() * sizeof(T)) {}
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  void poison() {  // 0xffff: NaN in fp16 and bf16
    CUDA_OK(cudaMemset(ptr_, 0xff, bytes_));
    CUDA_OK(cudaDeviceSynchronize());
  }
  template <typename T>
  std::vector<T> download(std::size_t count) const {
    std::vector<T> out(count);
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(out.data(), ptr_, count * sizeof(T), cudaMemcpyDeviceToHost));
    return out;
  }

 private:
  void allocate(std::size_t bytes) {
    bytes_ = std::max<std::size_t>(bytes, 16);
    CUDA_OK(cudaMalloc(&ptr_, bytes_));
  }
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

// A scenario's inputs on the device; caches filled by the write_kv kernels.
struct DeviceScenario {
  Scenario& s;
  DeviceBuffer q, kv_lens, q_indptr, csr_indptr, csr_indices, dense, slot_idx, arena, cont_k, cont_v, out, workspace;

  explicit DeviceScenario(Scenario& sc)
      : s(sc),
        q(sc.q),
        kv_lens(sc.kv_lens),
        q_indptr(sc.q_indptr),
        csr_indptr(sc.csr_indptr),
        csr_indices(sc.csr_indices),
        dense(sc.dense),
        slot_idx(sc.slot_idx),
        arena(sc.arena.size()),
        cont_k(sc.cont_k.size()),
        cont_v(sc.cont_v.size()),
        out(sc.out_elems() * 2),
        workspace(attention_workspace_bytes(sc.rows, sc.q_heads, sc.cfg.head_dim, 64)) {
    // The host arena starts as 0x7b bytes: give the device arena the same background
    // so that the whole arena can be compared after write_kv.
    CUDA_OK(cudaMemset(arena.get(), 0x7b, sc.arena.size()));
    CUDA_OK(cudaMemset(cont_k.get(), 0, sc.cont_k.size()));
    CUDA_OK(cudaMemset(cont_v.get(), 0, sc.cont_v.size()));
    const Scenario::Writes w = sc.writes();
    DeviceBuffer k(w.k), v(w.v), ids(w.page_ids), offs(w.offsets), slots(w.slots), pos(w.positions);
    const auto n = static_cast<std::uint32_t>(w.page_ids.size());
    write_kv(
        PagedWriteParams{sc.paged_cache(arena.get()), k.get(), v.get(), ids.as<PageId>(), offs.as<std::uint32_t>(), n},
        nullptr);
    write_kv(ContiguousWriteParams{sc.contiguous_cache(cont_k.get(), cont_v.get()), k.get(), v.get(),
                                   slots.as<std::uint32_t>(), pos.as<std::uint32_t>(), n},
             nullptr);
    CUDA_OK(cudaDeviceSynchronize());
  }

  PagedAttentionParams paged(std::uint32_t splits, bool use_csr) {
    PagedAttentionParams p;
    p.query = s.query(q.get(), out.get(), kv_lens.as<std::uint32_t>(), q_indptr.as<std::uint32_t>());
    p.cache = s.paged_cache(arena.get());
    p.table = use_csr ? PageTableView{csr_indptr.as<std::uint32_t>(), csr_indices.as<PageId>(), 0}
                      : PageTableView{nullptr, dense.as<PageId>(), s.dense_stride};
    p.options = s.cfg.options;
    p.split = SplitKV{splits, workspace.get()};
    return p;
  }
  ContiguousAttentionParams contiguous(std::uint32_t splits) {
    ContiguousAttentionParams p;
    p.query = s.query(q.get(), out.get(), kv_lens.as<std::uint32_t>(), q_indptr.as<std::uint32_t>());
    p.cache = s.contiguous_cache(cont_k.get(), cont_v.get());
    p.slot_idx = slot_idx.as<std::uint32_t>();
    p.options = s.cfg.options;
    p.split = SplitKV{splits, workspace.get()};
    return p;
  }
  std::vector<std::uint16_t> run_paged(std::uint32_t splits, bool use_csr) {
    out.poison();
    const auto p = paged(splits, use_csr);
    if (s.cfg.prefill)
      paged_prefill_attention(p, nullptr);
    else
      paged_decode_attention(p, nullptr);
    return out.download<std::uint16_t>(s.out_elems());
  }
  std::vector<std::uint16_t> run_contiguous(std::uint32_t splits) {
    out.poison();
    const auto p = contiguous(splits);
    if (s.cfg.prefill)
      contiguous_prefill_attention(p, nullptr);
    else
      contiguous_decode_attention(p, nullptr);
    return out.download<std::uint16_t>(s.out_elems());
  }
};

// fp32 accumulation, exp2 approximations and one rounding: a few units of roundoff of
// the storage type, relative to max(|reference|, 1e-2).
double kernel_bound(DType t) { return 4.0 * unit_roundoff(t); }

}  // namespace

TEST_CASE("attention kernels match the CPU references", "[gpu][attention]") {
  const MaskKind masks[] = {MaskKind::kCausal, MaskKind::kSlidingWindow, MaskKind::kChunkedLocal};
  const std::uint32_t groups[] = {1, 4, 8, 16};
  const std::uint32_t page_sizes[] = {1, 16, 17};
  const std::uint32_t dims[] = {64, 128, 256};
  std::uint32_t index = 0;
  for (MaskKind mask : masks)
    for (std::uint32_t group : groups)
      for (std::uint32_t tpp : page_sizes)
        for (bool prefill : {false, true}) {
          ++index;
          std::mt19937_64 rng(5000 + index);
          ScenarioConfig c;
          c.options.mask = mask;
          c.options.window = std::uniform_int_distribution<std::uint32_t>(1, 300)(rng);
          c.options.chunk = std::uniform_int_distribution<std::uint32_t>(1, 300)(rng);
          c.group = group;
          c.tokens_per_page = tpp;
          c.prefill = prefill;
          c.head_dim = dims[index % 3];
          c.dtype = index % 2 ? DType::kBF16 : DType::kF16;
          c.options.soft_cap = index % 4 == 1 ? 1.5f : 0.0f;
          c.kv_heads = group >= 8 ? 1 : 2;
          c.batch = prefill ? 3 : 5;
          c.max_kv_len = index % 5 == 0 ? 2500 : 300;  // some long contexts: many tiles and splits
          c.max_q_len = 24;
          c.nulls = static_cast<NullMode>(index % 3);
          c.seed = 7000 + index;
          Scenario s(c);
          s.fill_host_caches();
          DeviceScenario dev(s);
          INFO("scenario " << index << " mask " << static_cast<int>(mask) << " group " << group << " tpp " << tpp
                           << " prefill " << prefill << " d " << c.head_dim << " bf16 " << (c.dtype == DType::kBF16)
                           << " cap " << c.options.soft_cap << " nulls " << static_cast<int>(c.nulls));
          // write_kv kernels wrote exactly what the references wrote (arena and slots).
          const auto arena = dev.arena.download<unsigned char>(s.arena.size());
          CHECK(std::memcmp(arena.data(), s.arena.data(), s.arena.size()) == 0);
          const auto ck = dev.cont_k.download<unsigned char>(s.cont_k.size());
          for (std::uint32_t b = 0; b < c.batch; ++b) {
            const std::size_t at = s.slot_idx[b] * s.slot_stride;
            CHECK(std::memcmp(ck.data() + at, static_cast<unsigned char*>(s.cont_k.data()) + at,
                              s.kv_lens[b] * s.row_bytes()) == 0);
          }
          for (std::uint32_t splits : {1u, 4u, 37u}) {
            INFO("splits " << splits);
            std::vector<std::uint16_t> ref(s.out_elems());
            auto hp = s.paged_params(ref.data(), splits, true);
            if (prefill)
              cpu::paged_prefill_attention(hp);
            else
              cpu::paged_decode_attention(hp);
            const std::vector<double> want = widen(c.dtype, ref);
            const auto got = dev.run_paged(splits, index % 2 == 0);
            CHECK(max_rel_error(c.dtype, got, want, 1e-2) <= kernel_bound(c.dtype));
            if (!s.any_null) {
              const auto cont = dev.run_contiguous(splits);
              CHECK(cont == got);  // same kernel arithmetic, different addressing
            }
          }
        }
}

TEST_CASE("rows past q_indptr[batch] are left untouched", "[gpu][attention]") {
  ScenarioConfig c;
  c.prefill = true;
  c.seed = 41;
  Scenario s(c);
  s.fill_host_caches();
  DeviceScenario dev(s);
  auto p = dev.paged(2, true);
  const std::uint32_t real_rows = s.rows;
  DeviceBuffer big_out((real_rows + 5) * std::size_t{s.q_heads} * c.head_dim * 2);
  DeviceBuffer ws(attention_workspace_bytes(real_rows + 5, s.q_heads, c.head_dim, 2));
  big_out.poison();
  p.query.o = big_out.get();
  p.query.rows = real_rows + 5;  // launch shape with spare rows
  p.split.workspace = ws.get();
  paged_prefill_attention(p, nullptr);
  const auto got = big_out.download<std::uint16_t>((real_rows + 5) * std::size_t{s.q_heads} * c.head_dim);
  const std::size_t used = s.out_elems();
  for (std::size_t i = used; i < got.size(); ++i) REQUIRE(got[i] == 0xffff);
  std::vector<std::uint16_t> ref(used);
  cpu::paged_prefill_attention(s.paged_params(ref.data(), 2, true));
  CHECK(max_rel_error(c.dtype, std::vector<std::uint16_t>(got.begin(), got.begin() + used), widen(c.dtype, ref),
                      1e-2) <= kernel_bound(c.dtype));
}

TEST_CASE("a decode launch captured in a CUDA graph replays with new context lengths", "[gpu][attention]") {
  ScenarioConfig c;
  c.group = 4;
  c.head_dim = 128;
  c.dtype = DType::kBF16;
  c.max_kv_len = 400;
  c.seed = 42;
  Scenario s(c);
  s.fill_host_caches();
  DeviceScenario dev(s);
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const auto p = dev.paged(4, true);
  cudaGraph_t graph;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  paged_decode_attention(p, stream);
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  std::mt19937_64 rng(43);
  for (int step = 0; step < 3; ++step) {
    // Shorter contexts each step (the cache holds max lengths): new lengths, same graph.
    for (auto& len : s.kv_lens) len = std::uniform_int_distribution<std::uint32_t>(1, len)(rng);
    CUDA_OK(cudaMemcpy(dev.kv_lens.get(), s.kv_lens.data(), s.kv_lens.size() * 4, cudaMemcpyHostToDevice));
    dev.out.poison();
    CUDA_OK(cudaGraphLaunch(exec, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    std::vector<std::uint16_t> ref(s.out_elems());
    cpu::paged_decode_attention(s.paged_params(ref.data(), 4, true));
    CHECK(max_rel_error(c.dtype, dev.out.download<std::uint16_t>(s.out_elems()), widen(c.dtype, ref), 1e-2) <=
          kernel_bound(c.dtype));
  }
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  CUDA_OK(cudaStreamDestroy(stream));
}

TEST_CASE("copy_pages and swap_pages kernels match the references", "[gpu][copy]") {
  std::mt19937_64 rng(44);
  for (std::uint64_t page_bytes : {std::uint64_t{4096}, std::uint64_t{1000}, std::uint64_t{262144 + 48}}) {
    const std::uint64_t stride = (page_bytes + 63) / 64 * 64 + (page_bytes % 16 ? 3 : 0);
    const std::uint32_t pages = 40;
    std::vector<unsigned char> arena(pages * stride);
    for (auto& b : arena) b = static_cast<unsigned char>(rng());
    std::vector<PageId> ids(pages);
    std::iota(ids.begin(), ids.end(), PageId{0});
    std::shuffle(ids.begin(), ids.end(), rng);
    std::vector<PageId> src(ids.begin(), ids.begin() + 12), dst(ids.begin() + 12, ids.begin() + 24);
    src[3] = src[2];  // one source copied twice (a page forked into two requests)
    DeviceBuffer d_arena(arena), d_src(src), d_dst(dst);
    copy_pages(PageCopyParams{d_arena.get(), d_arena.get(), stride, stride, page_bytes, d_src.as<PageId>(),
                              d_dst.as<PageId>(), 12},
               nullptr);
    cpu::copy_pages(PageCopyParams{arena.data(), arena.data(), stride, stride, page_bytes, src.data(), dst.data(), 12});
    CHECK(d_arena.download<unsigned char>(arena.size()) == arena);
    // Swap out into pinned host memory with a dense stride, then back into other pages.
    void* host = nullptr;
    CUDA_OK(cudaMallocHost(&host, 12 * page_bytes));
    std::memset(host, 0, 12 * page_bytes);
    std::vector<PageId> slots(12);
    std::iota(slots.begin(), slots.end(), PageId{0});
    std::shuffle(slots.begin(), slots.end(), rng);
    DeviceBuffer d_slots(slots);
    swap_pages(PageCopyParams{host, d_arena.get(), page_bytes, stride, page_bytes, d_src.as<PageId>(),
                              d_slots.as<PageId>(), 12},
               nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    for (int i = 0; i < 12; ++i)
      CHECK(std::memcmp(static_cast<unsigned char*>(host) + slots[i] * page_bytes, &arena[src[i] * stride],
                        page_bytes) == 0);
    std::vector<PageId> back(ids.begin() + 24, ids.begin() + 36);
    DeviceBuffer d_back(back);
    swap_pages(PageCopyParams{d_arena.get(), host, stride, page_bytes, page_bytes, d_slots.as<PageId>(),
                              d_back.as<PageId>(), 12},
               nullptr);
    cpu::swap_pages(PageCopyParams{arena.data(), host, stride, page_bytes, page_bytes, slots.data(), back.data(), 12});
    CHECK(d_arena.download<unsigned char>(arena.size()) == arena);
    CUDA_OK(cudaFreeHost(host));
  }
}
