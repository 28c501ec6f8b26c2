#include "kvmm/memory/virtual_kv_cache.hpp"
#include "kvmm/error.hpp"
#include "kvmm/memory/host_memory.hpp"
#include "kvmm/testing/faulty_memory.hpp"

#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <vector>

using namespace kvmm;

namespace {
constexpr std::uint64_t kChunk = 4096;
std::byte* ptr(std::uint64_t a) { return reinterpret_cast<std::byte*>(static_cast<std::uintptr_t>(a)); }

// 2 layers, 2 KV heads x 64 dims x 2 bytes = 256 bytes per token per tensor: a 4 KiB
// page group holds 16 tokens; L = 128 gives 8 groups per slot.
VirtualKVCacheOptions small(bool mapper, std::uint32_t batch = 4) {
  VirtualKVCacheOptions o;
  o.num_layers = 2;
  o.max_batch = batch;
  o.max_context = 128;
  o.kv_heads = 2;
  o.head_dim = 64;
  o.dtype_bytes = 2;
  o.page_group_bytes = kChunk;
  o.background_mapper = mapper;
  return o;
}

// Writes a tag into every token [0, len) of every layer's K and V of a slot; reading
// it back later proves the memory stayed mapped and was never swapped under the slot.
void write_slot(const VirtualKVCache& c, std::uint32_t slot, std::uint32_t from, std::uint32_t len, std::uint8_t tag) {
  for (std::uint32_t l = 0; l < c.options().num_layers; ++l)
    for (const TensorView& v : {c.k(l), c.v(l)})
      for (std::uint32_t t = from; t < len; ++t) {
        std::byte* p = ptr(v.base + slot * v.slot_stride + t * v.token_stride);
        p[0] = std::byte(tag);
        p[c.token_bytes() / c.options().num_layers / (c.options().layout == TensorLayout::kSliced ? 1 : 1) - 1] =
            std::byte(t);
      }
}
bool slot_holds(const VirtualKVCache& c, std::uint32_t slot, std::uint32_t len, std::uint8_t tag) {
  for (std::uint32_t l = 0; l < c.options().num_layers; ++l)
    for (const TensorView& v : {c.k(l), c.v(l)})
      for (std::uint32_t t = 0; t < len; ++t)
        if (ptr(v.base + slot * v.slot_stride + t * v.token_stride)[0] != std::byte(tag)) return false;
  return true;
}
}  // namespace

TEST_CASE("VirtualKVCache: init reserves 2N tensors (or 2 sliced ones) with vAttention's sizes") {
  HostMemory host({.chunk_bytes = kChunk});
  ChunkPool pool(host, {.max_chunks = 64});
  {
    VirtualKVCache c(pool, small(false));
    CHECK(c.num_tensors() == 4);
    CHECK(c.token_bytes() == 256);  // H * D * P
    CHECK(c.groups_per_slot() == 8);
    CHECK(c.slot_bytes() == 128 * 256);                          // S = L * H * D * P
    CHECK(c.k(1).base == c.k(0).base + 2 * 4 * c.slot_bytes());  // tensors of B * S
    CHECK(c.v(0).base == c.k(0).base + 4 * c.slot_bytes());
    CHECK(c.k(0).token_stride == 256);
    CHECK(host.live_ranges() == 1);
    CHECK(pool.stats().mapped == 0);  // nothing backed before step
  }
  CHECK(host.live_ranges() == 0);
  auto o = small(false);
  o.layout = TensorLayout::kSliced;
  VirtualKVCache s(pool, o);
  CHECK(s.num_tensors() == 2);
  CHECK(s.token_bytes() == 2 * 256);  // [B, L, N, H, D]: a token holds every layer
  CHECK(s.groups_per_slot() == 16);
  CHECK(s.k(1).base == s.k(0).base + 256);  // layer n is slice [.., n:n+1, ..]
  CHECK(s.k(1).token_stride == 512);
  CHECK(s.v(0).base == s.k(0).base + 4 * s.slot_bytes());
  auto slot = s.alloc_reqid();
  REQUIRE(slot);
  std::vector<std::uint32_t> lens(4, 0);
  lens[*slot] = 9;  // 9 tokens x 512 bytes: 2 groups in each of the 2 tensors
  REQUIRE(s.step(lens));
  CHECK(s.backed_groups(*slot) == 2);
  CHECK(pool.stats().mapped == 4);
  write_slot(s, *slot, 0, 9, 0x42);
  CHECK(slot_holds(s, *slot, 9, 0x42));
  s.check_invariants();

  auto bad = small(false);
  bad.page_group_bytes = 6000;
  CHECK_THROWS_WITH(VirtualKVCache(pool, bad), Catch::Contains("page_group_bytes = 6000"));
  bad = small(false);
  bad.prefetch_tokens = 0;
  CHECK_THROWS_WITH(VirtualKVCache(pool, bad), Catch::Contains("prefetch_tokens = 0"));
  bad = small(false);
  bad.head_dim = 0;
  CHECK_THROWS_WITH(VirtualKVCache(pool, bad), Catch::Contains("head_dim = 0"));
  CHECK(host.live_ranges() == 1);
}

TEST_CASE("VirtualKVCache: step grows each active slot, free keeps its chunks and the next request reuses them") {
  HostMemory host({.chunk_bytes = kChunk});
  ChunkPool pool(host, {.max_chunks = 128});
  VirtualKVCache c(pool, small(false));
  std::vector<std::uint32_t> lens(4, 0);
  const auto a = c.alloc_reqid(), b = c.alloc_reqid();
  REQUIRE(a);
  REQUIRE(b);
  CHECK(*a != *b);
  lens[*a] = 20;  // prefill: 2 groups
  lens[*b] = 1;
  REQUIRE(c.step(lens));
  CHECK(c.backed_groups(*a) == 2);
  CHECK(c.backed_groups(*b) == 1);
  CHECK(pool.stats().mapped == (2 + 1) * 4);
  write_slot(c, *a, 0, 20, 0xA1);
  write_slot(c, *b, 0, 1, 0xB1);
  // Decode: one token per step; a new group only when crossing 16-token boundaries.
  for (std::uint32_t t = 0; t < 40; ++t) {
    ++lens[*a];
    ++lens[*b];
    REQUIRE(c.step(lens));
    write_slot(c, *a, lens[*a] - 1, lens[*a], 0xA1);
    write_slot(c, *b, lens[*b] - 1, lens[*b], 0xB1);
    CHECK(c.backed_groups(*a) == c.groups_for(lens[*a]));
    CHECK(c.backed_groups(*b) == c.groups_for(lens[*b]));
  }
  CHECK(slot_holds(c, *a, lens[*a], 0xA1));
  CHECK(slot_holds(c, *b, lens[*b], 0xB1));
  c.check_invariants();
  // Request a finishes: deferred reclamation keeps its 4 groups x 4 tensors mapped.
  const auto mapped = pool.stats().mapped;
  c.free_reqid(*a);
  lens[*a] = 0;
  CHECK(pool.stats().mapped == mapped);
  // The next request gets the backed slot; a prompt that fits maps nothing.
  const auto calls = pool.stats().backend_calls;
  const auto r = c.alloc_reqid();
  REQUIRE(r);
  CHECK(*r == *a);
  lens[*r] = 50;
  REQUIRE(c.step(lens));
  CHECK(pool.stats().backend_calls == calls);
  CHECK(c.stats().steps == 42);
  c.check_invariants();
}

TEST_CASE("VirtualKVCache: a step short of memory fails with no partial effect; cached chunks are reclaimed first") {
  HostMemory host({.chunk_bytes = kChunk});
  ChunkPool pool(host, {.max_chunks = 20});  // 5 groups x 4 tensors
  VirtualKVCache c(pool, small(false));
  std::vector<std::uint32_t> lens(4, 0);
  const auto a = *c.alloc_reqid(), b = *c.alloc_reqid();
  lens[a] = 16;
  lens[b] = 16;
  REQUIRE(c.step(lens));  // 2 groups x 4 tensors = 8 chunks
  // a wants 3 more groups (12 chunks), b 1 more (4): 16 > 12 left.
  lens[a] = 64;
  lens[b] = 17;
  const auto before = pool.stats();
  CHECK_FALSE(c.step(lens));
  CHECK(c.backed_groups(a) == 1);
  CHECK(c.backed_groups(b) == 1);
  CHECK(pool.stats().mapped == before.mapped);
  CHECK(pool.stats().created == before.created);
  CHECK(host.live_chunks() == before.created);
  CHECK(c.stats().failed_steps == 1);
  c.check_invariants();
  // Preempt b (the scheduler's answer): its chunks stay cached, and a's growth to 5
  // groups (+16 chunks, 12 free) reclaims them.
  c.free_reqid(b);
  lens[b] = 0;
  lens[a] = 80;
  REQUIRE(c.step(lens));
  CHECK(c.backed_groups(a) == 5);
  CHECK(c.backed_groups(b) == 0);
  CHECK(c.stats().reclaimed_groups == 1);
  c.check_invariants();
}

TEST_CASE("VirtualKVCache: a backend failure at every call position of a step leaves no trace") {
  HostMemory host({.chunk_bytes = kChunk});
  FaultyMemory faulty(host);
  ChunkPool pool(faulty, {.max_chunks = 128});
  VirtualKVCache c(pool, small(false));
  std::vector<std::uint32_t> lens(4, 0);
  const auto a = *c.alloc_reqid(), b = *c.alloc_reqid();
  lens[a] = 5;
  REQUIRE(c.step(lens));
  write_slot(c, a, 0, 5, 0x5A);
  lens[a] = 40;  // +2 groups
  lens[b] = 17;  // +2 groups
  std::uint64_t n = 1;
  for (;; ++n) {
    faulty.fail_at(n);
    const auto before = pool.stats();
    if (c.step(lens)) break;
    REQUIRE(faulty.fired());
    CHECK(c.backed_groups(a) == 1);
    CHECK(c.backed_groups(b) == 0);
    CHECK(pool.stats().mapped == before.mapped);
    CHECK(host.live_chunks() == pool.stats().created);
    CHECK(slot_holds(c, a, 5, 0x5A));
    c.check_invariants();
  }
  // 16 creates + 16 maps + one set_access per (slot, tensor) run: 8.
  CHECK(n - 1 == 16 + 16 + 8);
  CHECK(c.backed_groups(a) == 3);
  CHECK(c.backed_groups(b) == 2);
  c.check_invariants();
}

TEST_CASE("VirtualKVCache: misuse raises kvmm::Error naming the argument and changes nothing") {
  HostMemory host({.chunk_bytes = kChunk});
  ChunkPool pool(host, {.max_chunks = 64});
  VirtualKVCache c(pool, small(false));
  std::vector<std::uint32_t> lens(4, 0);
  const auto a = *c.alloc_reqid();
  lens[a] = 3;
  REQUIRE(c.step(lens));
  std::vector<std::uint32_t> bad(3, 0);
  CHECK_THROWS_WITH(c.step(bad), Catch::Contains("seq_lens.size() = 3"));
  lens[a] = 129;
  CHECK_THROWS_WITH(c.step(lens), Catch::Contains(fmt::format("seq_lens[{}] = 129", a)));
  lens[a] = 100;
  lens[(a + 1) % 4] = 4;
  CHECK_THROWS_WITH(c.step(lens), Catch::Contains(fmt::format("seq_lens[{}] = 4: slot is not active", (a + 1) % 4)));
  CHECK(c.backed_groups(a) == 1);  // validation happens before any mapping
  CHECK_THROWS_WITH(c.free_reqid(9), Catch::Contains("slot = 9"));
  c.free_reqid(a);
  CHECK_THROWS_WITH(c.free_reqid(a), Catch::Contains(fmt::format("slot = {}: not active", a)));
  for (int i = 0; i < 4; ++i) REQUIRE(c.alloc_reqid());
  CHECK_FALSE(c.alloc_reqid());  // B active: a normal nullopt
  CHECK(c.stats().steps == 1);
  c.check_invariants();
}

TEST_CASE("VirtualKVCache: the background mapper keeps an eager spare slot backed") {
  HostMemory host({.chunk_bytes = kChunk});
  ChunkPool pool(host, {.max_chunks = 128});
  auto o = small(true);
  o.eager_tokens = 32;
  VirtualKVCache c(pool, o);
  std::vector<std::uint32_t> lens(4, 0);
  const auto a = *c.alloc_reqid();  // triggers housekeeping: pick and back a spare
  c.wait_idle();
  std::uint32_t spare = 4, backed = 0;
  for (std::uint32_t s = 0; s < 4; ++s)
    if (s != a && c.backed_groups(s) > 0) spare = s, ++backed;
  REQUIRE(backed == 1);
  CHECK(c.backed_groups(spare) == c.groups_for(32));
  const auto b = *c.alloc_reqid();
  CHECK(b == spare);  // new request lands on the eagerly backed slot
  lens[a] = 1;
  lens[b] = 30;  // a prefill that fits the eager backing: only a needs a group
  const auto sync = c.stats().sync_groups;
  REQUIRE(c.step(lens));
  CHECK(c.stats().sync_groups == sync + 1);
  c.wait_idle();
  c.check_invariants();
}

TEST_CASE("VirtualKVCache: the background mapper serves thousands of decode steps with data intact") {
  // A polling mapper (step() never wakes it) and a sleeping one (step() wakes it), each
  // with the next step's token only and with a lookahead.
  const std::uint32_t poll = GENERATE(0u, 200u);
  const std::uint32_t ahead = GENERATE(1u, 8u);
  HostMemory host({.chunk_bytes = kChunk});
  ChunkPool pool(host, {.max_chunks = 8 * 8 * 4});
  auto o = small(true, 8);
  o.eager_tokens = 16;
  o.reclaim_below_chunks = 24;
  o.mapper_poll_us = poll;
  o.prefetch_tokens = ahead;
  VirtualKVCache c(pool, o);
  std::mt19937 rng(7);
  std::vector<std::uint32_t> lens(8, 0);
  std::vector<std::uint8_t> tag(8, 0);
  std::vector<std::uint32_t> written(8, 0);
  std::uint64_t failures = 0;
  bool kept_up = false;
  for (int step = 0; step < 3000; ++step) {
    // Requests finish and join (Algorithm 1 of vAttention).
    for (std::uint32_t s = 0; s < 8; ++s) {
      if (lens[s] != 0 && (lens[s] >= 128 || rng() % 40 == 0)) {
        REQUIRE(slot_holds(c, s, written[s], tag[s]));
        c.free_reqid(s);
        lens[s] = 0;
      }
    }
    bool joined = false;
    if (rng() % 3 == 0) {
      if (auto s = c.alloc_reqid()) {
        joined = true;
        lens[*s] = 1 + rng() % 40;
        tag[*s] = std::uint8_t(rng());
        written[*s] = 0;
      }
    }
    const auto sync_before = c.stats().sync_steps;
    if (!c.step(lens)) {
      ++failures;
      continue;
    }
    // After a step whose forward pass gave the mapper time (kept_up), a decode-only step
    // needs no mapping on the calling thread.
    if (kept_up && !joined) REQUIRE(c.stats().sync_steps == sync_before);
    kept_up = step % 2 == 0;
    if (kept_up) c.wait_idle();  // a long forward pass; odd steps race the mapper
    for (std::uint32_t s = 0; s < 8; ++s) {
      if (lens[s] == 0) continue;
      REQUIRE(c.backed_groups(s) >= c.groups_for(lens[s]));
      write_slot(c, s, written[s], lens[s], tag[s]);  // the step's new tokens
      written[s] = lens[s];
    }
    // "model.forward()" happens here; the next step has one more token per request.
    for (std::uint32_t s = 0; s < 8; ++s)
      if (lens[s] != 0 && lens[s] < 128) ++lens[s];
    if (step % 500 == 0) c.check_invariants();  // runs beside the mapper
  }
  c.wait_idle();
  c.check_invariants();
  const auto st = c.stats();
  CHECK(st.steps == 3000 - failures);
  CHECK(st.background_groups > 0);
  CHECK(failures == 0);
  CHECK(host.live_mappings() == pool.stats().mapped);
}

TEST_CASE("VirtualKVCache: seeded random alloc/free/step sequence with faults keeps every invariant") {
  HostMemory host({.chunk_bytes = kChunk});
  FaultyMemory faulty(host);
  ChunkPool pool(faulty, {.max_chunks = 60});
  VirtualKVCache c(pool, small(false, 6));
  std::mt19937 rng(99);
  std::vector<std::uint32_t> lens(6, 0);
  int ok = 0, failed = 0;
  for (int op = 0; op < 5000; ++op) {
    const int kind = int(rng() % 10);
    if (kind == 0) {
      if (auto s = c.alloc_reqid()) lens[*s] = 1 + rng() % 64;
    } else if (kind == 1) {
      const std::uint32_t s = rng() % 6;
      if (c.active(s)) {
        c.free_reqid(s);
        lens[s] = 0;
      }
    } else {
      std::vector<std::uint32_t> next = lens;
      for (auto& l : next)
        if (l != 0) l = std::min<std::uint32_t>(128, l + (kind == 2 ? 1 + rng() % 40 : 1));
      if (rng() % 10 == 0) faulty.fail_at(1 + rng() % 12);
      std::vector<std::uint32_t> groups(6);
      for (std::uint32_t s = 0; s < 6; ++s) groups[s] = c.backed_groups(s);
      const auto before = pool.stats();
      if (c.step(next)) {
        ++ok;
        lens = next;
        for (std::uint32_t s = 0; s < 6; ++s)
          if (lens[s] != 0) REQUIRE(c.backed_groups(s) >= c.groups_for(lens[s]));
      } else {
        ++failed;
        for (std::uint32_t s = 0; s < 6; ++s)
          if (lens[s] != 0) REQUIRE(c.backed_groups(s) == groups[s]);  // active slots untouched
        REQUIRE(pool.stats().mapped <= before.mapped);
      }
      faulty.fail_at(0);
    }
    c.check_invariants();
    pool.check_invariants();
    REQUIRE(host.live_chunks() == pool.stats().created);
  }
  CHECK(ok > 1000);
  CHECK(failed > 100);
}

TEST_CASE("VirtualKVCache: vAttention's sizing example and Table 10 tokens per 2 MiB page") {
  HostMemory host({.chunk_bytes = 2 << 20});
  ChunkPool pool(host, {.max_chunks = 4});
  auto model = [](std::uint32_t n, std::uint32_t h, std::uint32_t l, TensorLayout layout) {
    VirtualKVCacheOptions o;
    o.num_layers = n;
    o.max_batch = 1;
    o.max_context = l;
    o.kv_heads = h;
    o.head_dim = 128;
    o.dtype_bytes = 2;
    o.page_group_bytes = 2 << 20;
    o.layout = layout;
    o.background_mapper = false;
    return o;
  };
  // §5.1.3: Yi-34B, TP-2 (N = 60, H = 4, D = 128, P = 2), L = 200K: S = L*H*D*P per
  // buffer per request, 2N = 120 buffers.
  {
    VirtualKVCache c(pool, model(60, 4, 200000, TensorLayout::kPerLayer));
    CHECK(c.num_tensors() == 120);
    CHECK(c.token_bytes() == 4 * 128 * 2);
    CHECK(c.slot_bytes() >= std::uint64_t{200000} * 4 * 128 * 2);              // S = 204.8 MB ...
    CHECK(c.slot_bytes() - std::uint64_t{200000} * 4 * 128 * 2 < (2u << 20));  // ... in whole 2 MiB groups
  }
  // Table 10: tokens held by one 2 MiB page without / with tensor slicing.
  struct Row {
    std::uint32_t n, h, without, with;
  };
  for (const Row r : {Row{32, 4, 2048, 64},     // Yi-6B TP-1
                      Row{32, 2, 4096, 128},    // Yi-6B TP-2
                      Row{32, 8, 1024, 32},     // Llama-3-8B TP-1
                      Row{32, 4, 2048, 64}}) {  // Llama-3-8B TP-2
    VirtualKVCache per(pool, model(r.n, r.h, 8192, TensorLayout::kPerLayer));
    VirtualKVCache sliced(pool, model(r.n, r.h, 8192, TensorLayout::kSliced));
    CHECK(per.groups_for(r.without) == 1);
    CHECK(per.groups_for(r.without + 1) == 2);
    CHECK(sliced.groups_for(r.with) == 1);
    CHECK(sliced.groups_for(r.with + 1) == 2);
  }
  // Yi-34B TP-1 (N = 60, H = 8): 1024 tokens per page per layer; sliced, a 2 MiB page
  // holds 2 MiB / (60 * 8 * 128 * 2 B) = 17.07 tokens (the paper's table prints 18).
  VirtualKVCache yi(pool, model(60, 8, 8192, TensorLayout::kSliced));
  CHECK(yi.groups_for(17) == 1);
  CHECK(yi.groups_for(18) == 2);
}
