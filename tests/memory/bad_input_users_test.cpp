// Bad input against the pool's users - VirtualKVCache, ActivationAllocator, ElasticMemory,
// HostOffloadBuffer - mixed into seeded random operation sequences (bad_input.hpp): every
// bad call raises a kvmm::Error naming the argument (or reports failure by value), leaves
// the invariants and the observable state unchanged, and the object still serves after.
#include "bad_input.hpp"

#include "kvmm/memory/activation_allocator.hpp"
#include "kvmm/memory/arena_page_pool.hpp"
#include "kvmm/memory/elastic_memory.hpp"
#include "kvmm/memory/host_memory.hpp"
#include "kvmm/memory/host_offload.hpp"
#include "kvmm/memory/virtual_kv_cache.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

using namespace kvmm;
using kvmm::test::BadCase;

namespace {
constexpr std::uint64_t kChunk = 4096;
constexpr std::uint64_t kMax64 = std::numeric_limits<std::uint64_t>::max();
std::byte* ptr(std::uint64_t a) { return reinterpret_cast<std::byte*>(static_cast<std::uintptr_t>(a)); }

// 2 layers, 256 bytes per token per tensor: 16 tokens per 4 KiB page group, 8 per slot.
VirtualKVCacheOptions cache_options() {
  VirtualKVCacheOptions o;
  o.num_layers = 2;
  o.max_batch = 4;
  o.max_context = 128;
  o.kv_heads = 2;
  o.head_dim = 64;
  o.dtype_bytes = 2;
  o.page_group_bytes = kChunk;
  o.background_mapper = false;
  return o;
}
}  // namespace

TEST_CASE("bad input: VirtualKVCache") {
  HostMemory host({.chunk_bytes = kChunk});
  ChunkPool pool(host, {.max_chunks = 64});
  auto bad = [&](auto&& edit, const char* expect) {
    auto o = cache_options();
    edit(o);
    CHECK_THROWS_WITH(VirtualKVCache(pool, o), Catch::Contains(expect));
  };
  bad([](auto& o) { o.num_layers = 0; }, "num_layers = 0");
  bad([](auto& o) { o.max_batch = 0; }, "max_batch = 0");
  bad([](auto& o) { o.max_batch = ~0u; }, "max_batch = 4294967295");
  bad([](auto& o) { o.max_context = 0; }, "max_context = 0");
  bad([](auto& o) { o.kv_heads = 0; }, "kv_heads = 0");
  bad([](auto& o) { o.dtype_bytes = 0; }, "dtype_bytes = 0");
  bad([](auto& o) { o.page_group_bytes = kChunk + 1; }, "page_group_bytes = 4097");
  bad([](auto& o) { o.eager_tokens = 129; }, "eager_tokens = 129");
  bad([](auto& o) { o.prefetch_tokens = 0; }, "prefetch_tokens = 0");
  bad([](auto& o) { o.layout = TensorLayout(7); }, "layout = 7");
  bad([](auto& o) { o.num_layers = 1u << 31; }, "num_layers = 2147483648");
  bad([](auto& o) { o.kv_heads = o.head_dim = 1u << 31, o.dtype_bytes = 4; }, "kv_heads * head_dim * dtype_bytes");
  bad([](auto& o) { o.max_context = ~0u, o.kv_heads = 1u << 20, o.head_dim = 1u << 20; }, "max_context * token bytes");
  bad([](auto& o) { o.max_context = 1u << 30, o.head_dim = 1u << 10; }, "max_context = 1073741824");
  bad([](auto& o) { o.max_batch = 1u << 30, o.max_context = 1u << 20, o.head_dim = 1u << 10; },
      "max_batch * slot bytes");
  bad([](auto& o) { o.max_batch = 1u << 24, o.max_context = 1u << 16; }, "more than 2^32-2");
  CHECK((host.live_ranges() == 0 && pool.stats().created == 0));

  VirtualKVCache c(pool, cache_options());
  std::vector<std::uint32_t> lens(4, 0);
  std::vector<std::uint8_t> tag(4, 0);
  auto write = [&](std::uint32_t s, std::uint32_t from, std::uint32_t to) {
    for (std::uint32_t l = 0; l < 2; ++l)
      for (const TensorView& v : {c.k(l), c.v(l)})
        for (std::uint32_t t = from; t < to; ++t)
          ptr(v.base + s * v.slot_stride + t * v.token_stride)[7] = std::byte{tag[s]};
  };
  auto holds = [&](std::uint32_t s) {
    for (std::uint32_t l = 0; l < 2; ++l)
      for (const TensorView& v : {c.k(l), c.v(l)})
        for (std::uint32_t t = 0; t < lens[s]; ++t)
          if (ptr(v.base + s * v.slot_stride + t * v.token_stride)[7] != std::byte{tag[s]}) return false;
    return true;
  };
  auto valid = [&](std::mt19937& rng) {
    const std::uint32_t s = rng() % 4;
    switch (rng() % 4) {
      case 0:  // at most 3 active, so the bad cases always find an inactive slot
        if (!c.active(0) + !c.active(1) + !c.active(2) + !c.active(3) > 1)
          if (auto n = c.alloc_reqid()) lens[*n] = 0, tag[*n] = std::uint8_t(rng());
        break;
      case 1:
        if (c.active(s)) {
          REQUIRE(holds(s));
          c.free_reqid(s);
          lens[s] = 0;
        }
        break;
      default: {
        std::vector<std::uint32_t> next = lens;
        for (std::uint32_t k = 0; k < 4; ++k)
          if (c.active(k)) next[k] = std::min<std::uint32_t>(128, next[k] + 1 + rng() % 24);
        if (c.step(next)) {
          for (std::uint32_t k = 0; k < 4; ++k)
            if (c.active(k)) write(k, lens[k], next[k]);
          lens = next;
        }
      }
    }
  };
  auto inactive = [&] {
    for (std::uint32_t s = 0; s < 4; ++s)
      if (!c.active(s)) return s;
    return 4u;
  };
  const std::vector<BadCase> cases = {
      {"step with too few lengths", "seq_lens.size() = 3", [&] { return c.step(std::vector<std::uint32_t>(3, 0)); }},
      {"step past max_context", "seq_lens[",
       [&] {
         auto l = lens;
         l[0] = 129;
         return c.step(l);
       }},
      {"step on an inactive slot", "slot is not active",
       [&] {
         auto l = lens;
         l[inactive()] = 1;
         return c.step(l);
       }},
      {"free a slot past max_batch", "slot = 4", [&] { return c.free_reqid(4), true; }},
      {"free an inactive slot", "not active", [&] { return c.free_reqid(inactive()), true; }},
      {"active() past max_batch", "slot = 5", [&] { return c.active(5); }},
      {"backed_groups() past max_batch", "slot = 6", [&] { return c.backed_groups(6) == 0; }},
      {"k() past the layers", "layer = 2", [&] { return c.k(2).base != 0; }},
      {"v() past the layers", "layer = 3", [&] { return c.v(3).base != 0; }},
      {"groups_for past max_context", "tokens = 129", [&] { return c.groups_for(129) == 0; }},
      {"step short of memory", "",
       [&] {
         // Every active slot to the full context needs more than 64 chunks with 2+ active.
         auto l = lens;
         std::uint32_t n = 0;
         for (std::uint32_t s = 0; s < 4; ++s)
           if (c.active(s)) l[s] = 128, ++n;
         return n < 3 || !c.step(l);
       }},
  };
  struct Snap {  // (stats() counts calls, failed ones included: not state)
    std::vector<std::uint32_t> backed;
    std::vector<bool> active;
    std::uint64_t mapped;
    bool operator==(const Snap&) const = default;
  };
  std::function<Snap()> snapshot = [&] {
    Snap s{{}, {}, pool.stats().mapped};
    for (std::uint32_t k = 0; k < 4; ++k) s.backed.push_back(c.backed_groups(k)), s.active.push_back(c.active(k));
    return s;
  };
  auto check = [&] {
    c.check_invariants();
    pool.check_invariants();
    REQUIRE(host.live_mappings() == pool.stats().mapped);
  };
  kvmm::test::run_bad_inputs<Snap>(1404, 3000, cases, snapshot, check, valid);
  // Serves end to end: every slot freed, one request grown to the full context.
  for (std::uint32_t s = 0; s < 4; ++s)
    if (c.active(s)) c.free_reqid(s), lens[s] = 0;
  const auto s = c.alloc_reqid();
  REQUIRE(s);
  lens[*s] = 128;
  tag[*s] = 0x77;
  REQUIRE(c.step(lens));
  write(*s, 0, 128);
  CHECK(holds(*s));
  check();
}

TEST_CASE("bad input: ActivationAllocator") {
  HostMemory host({.chunk_bytes = kChunk});
  ChunkPool pool(host, {.max_chunks = 24});
  CHECK_THROWS_WITH(ActivationAllocator(pool, 0), Catch::Contains("max_bytes = 0"));
  CHECK_THROWS_WITH(ActivationAllocator(pool, kMax64), Catch::Contains("max_bytes = 18446744073709551615"));
  CHECK_THROWS_WITH(ActivationAllocator(pool, (std::uint64_t{1} << 32) * kChunk),
                    Catch::Contains("max_bytes = 17592186044416"));
  CHECK(host.live_ranges() == 0);
  ActivationAllocator act(pool, 32 * kChunk);
  std::vector<std::pair<std::uint64_t, std::uint8_t>> live;
  auto valid = [&](std::mt19937& rng) {
    const int kind = int(rng() % 5);
    if (kind < 2) {
      if (auto a = act.allocate(1 + rng() % (5 * kChunk))) {
        live.push_back({*a, std::uint8_t(rng())});
        ptr(*a)[0] = std::byte{live.back().second};
      }
    } else if (kind < 4 && !live.empty()) {
      const std::size_t k = rng() % live.size();
      REQUIRE(ptr(live[k].first)[0] == std::byte{live[k].second});
      act.free(live[k].first);
      live[k] = live.back();
      live.pop_back();
    } else {
      act.gc(rng() % 4);
    }
  };
  auto freed = [&] {  // an address inside the range that is no live allocation's start
    for (std::uint64_t a = act.base(); a < act.base() + 32 * kChunk; a += kChunk)
      if (std::none_of(live.begin(), live.end(), [&](auto& l) { return l.first == a; })) return a;
    return act.base() + 32 * kChunk;
  };
  const std::vector<BadCase> cases = {
      {"allocate 0 bytes", "bytes = 0", [&] { return act.allocate(0).has_value(); }},
      {"allocate 2^64-1 bytes", "", [&] { return !act.allocate(kMax64); }},
      {"allocate 2^64-chunk+2 bytes", "", [&] { return !act.allocate(kMax64 - kChunk + 2); }},
      {"allocate past the range", "", [&] { return !act.allocate(33 * kChunk); }},
      {"free below the range", "not an activation allocation", [&] { return act.free(act.base() - kChunk), true; }},
      {"free unaligned", "not an activation allocation", [&] { return act.free(act.base() + 1), true; }},
      {"free past the range", "not an activation allocation",
       [&] { return act.free(act.base() + (std::uint64_t{1} << 32) * kChunk), true; }},
      {"free what is not allocated", "not a live activation allocation", [&] { return act.free(freed()), true; }},
  };
  struct Snap {
    std::uint32_t mapped, live;
    std::size_t allocations;
    std::uint32_t owned;
    bool operator==(const Snap&) const = default;
  };
  std::function<Snap()> snapshot = [&] {
    return Snap{act.mapped_chunks(), act.live_chunks(), act.num_allocations(), pool.owned(ChunkOwner::kActivation)};
  };
  auto check = [&] {
    act.check_invariants();
    pool.check_invariants();
  };
  kvmm::test::run_bad_inputs<Snap>(1405, 3000, cases, snapshot, check, valid);
  for (auto [a, t] : live) act.free(a);
  act.gc(32);
  const auto a = act.allocate(24 * kChunk);  // every chunk the pool has
  REQUIRE(a);
  std::memset(ptr(*a), 0x24, 24 * kChunk);
  act.free(*a);
  check();
}

TEST_CASE("bad input: ElasticMemory") {
  HostMemory host({.chunk_bytes = kChunk});
  ChunkPool pool(host, {.max_chunks = 32});
  pool.set_quota(ChunkOwner::kKVArena, 16);
  pool.set_quota(ChunkOwner::kActivation, 16);
  ActivationAllocator act(pool, 32 * kChunk);
  CHECK_THROWS_WITH(ElasticMemory(pool, act, ChunkOwner::kActivation), Catch::Contains("kv_owner = activation"));
  CHECK_THROWS_WITH(ElasticMemory(pool, act, ChunkOwner::kFree), Catch::Contains("kv_owner = free"));
  CHECK_THROWS_WITH(ElasticMemory(pool, act, ChunkOwner(6)), Catch::Contains("kv_owner = ?"));
  const KVLayout layout = KVLayout::plan({LayerGroup::full_attention("full", 1, 1, 64, 2, 16)});  // 4 KiB pages
  KVArena arena(pool, layout, {.num_large_pages = 32, .backing = ArenaBacking::kElastic});
  ArenaPagePool pages(arena);
  ElasticMemory elastic(pool, act, ChunkOwner::kKVArena);
  std::vector<LargePageId> kv;
  std::vector<std::uint64_t> acts;
  auto valid = [&](std::mt19937& rng) {
    switch (rng() % 6) {
      case 0:
        if (auto p = pages.allocate(0)) kv.push_back(*p);
        break;
      case 1:
        if (!kv.empty()) pages.free(kv.back()), kv.pop_back();
        break;
      case 2:
        if (auto a = act.allocate(kChunk * (1 + rng() % 2))) acts.push_back(*a);
        break;
      case 3:
        if (!acts.empty()) act.free(acts.back()), acts.pop_back();
        break;
      default:
        elastic.balloon(std::int64_t(rng() % 7) - 3);
    }
  };
  const std::int64_t i64min = std::numeric_limits<std::int64_t>::min(),
                     i64max = std::numeric_limits<std::int64_t>::max();
  const std::vector<BadCase> cases = {
      {"balloon 2^32", "amount = 4294967296", [&] { return elastic.balloon(std::int64_t{1} << 32); }},
      {"balloon -2^32", "amount = -4294967296", [&] { return elastic.balloon(-(std::int64_t{1} << 32)); }},
      {"balloon INT64_MIN", "amount = -9223372036854775808", [&] { return elastic.balloon(i64min); }},
      {"balloon INT64_MAX", "amount = 9223372036854775807", [&] { return elastic.balloon(i64max); }},
      {"inflate past the activation side", "", [&] { return !elastic.inflate(33); }},
      {"inflate 2^32-1", "", [&] { return !elastic.inflate(~0u); }},
      {"deflate past the KV side", "", [&] { return !elastic.deflate(33); }},
      {"balloon -(2^32-1)", "", [&] { return !elastic.balloon(-std::int64_t{~0u}); }},
  };
  struct Snap {
    std::uint32_t kvq, actq, kvf, actf, mapped, act_mapped;
    bool operator==(const Snap&) const = default;
  };
  std::function<Snap()> snapshot = [&] {
    return Snap{elastic.kv_quota(),        elastic.activation_quota(), elastic.kv_free(),
                elastic.activation_free(), pool.stats().mapped,        act.mapped_chunks()};
  };
  auto check = [&] {
    elastic.check_invariants();
    pages.check_invariants();
    REQUIRE(elastic.kv_quota() + elastic.activation_quota() == 32);
  };
  kvmm::test::run_bad_inputs<Snap>(1406, 3000, cases, snapshot, check, valid);
  // Serves end to end: hand every chunk to KV and back to activations.
  for (const LargePageId p : kv) pages.free(p);
  for (std::uint64_t a : acts) act.free(a);
  REQUIRE(elastic.inflate(elastic.activation_quota()));
  for (int i = 0; i < 32; ++i) REQUIRE(pages.allocate(0));
  for (std::uint32_t p = 0; p < 32; ++p) pages.free(LargePageId{p});
  REQUIRE(elastic.deflate(32));
  REQUIRE(act.allocate(32 * kChunk));
  check();
}

TEST_CASE("bad input: HostOffloadBuffer") {
  CHECK_THROWS_WITH(HostOffloadBuffer(0, 4), Catch::Contains("page_bytes = 0"));
  CHECK_THROWS_WITH(HostOffloadBuffer(64, 0), Catch::Contains("capacity_pages = 0"));
  CHECK_THROWS_WITH(HostOffloadBuffer(64, 4, 0), Catch::Contains("initial_logical_pages = 0"));
  CHECK_THROWS_WITH(HostOffloadBuffer(64, 4, 5), Catch::Contains("initial_logical_pages = 5"));
  CHECK_THROWS_WITH(HostOffloadBuffer(kMax64 / 2, 4), Catch::Contains("page_bytes * capacity_pages"));
  HostOffloadBuffer buf(64, 16, 8);
  std::vector<std::vector<PageId>> held(6);
  std::vector<OffloadCopy> plan;
  const RequestId anchor = 100;  // holds two pages throughout
  REQUIRE(buf.offload(anchor, std::vector<PageId>{40, 41}, 64, plan));
  auto distinct = [](std::mt19937& rng, std::size_t n) {
    std::vector<PageId> p;
    while (p.size() < n) {
      const PageId x = rng() % 500;
      if (std::find(p.begin(), p.end(), x) == p.end()) p.push_back(x);
    }
    return p;
  };
  auto valid = [&](std::mt19937& rng) {
    const RequestId r = rng() % 6;
    const int kind = int(rng() % 4);
    plan.clear();
    if (kind == 0 && held[r].empty()) {
      auto p = distinct(rng, 1 + rng() % 4);
      if (buf.offload(r, p, 64, plan)) held[r] = p;
    } else if (kind == 1 && !held[r].empty()) {
      buf.fetch(r, distinct(rng, held[r].size()), 64, plan);
      held[r].clear();
    } else if (kind == 2) {
      buf.drop(r);
      held[r].clear();
    } else {
      buf.on_slo_events(rng() % 2, rng() % 3 == 0);
    }
  };
  const std::vector<BadCase> cases = {
      {"offload for no request", "request = 4294967295",
       [&] { return buf.offload(kNoRequest, std::vector<PageId>{1}, 64, plan); }},
      {"offload with the wrong page size", "device_page_bytes = 65",
       [&] { return buf.offload(7, std::vector<PageId>{1}, 65, plan); }},
      {"offload twice", "already has 2 pages", [&] { return buf.offload(anchor, std::vector<PageId>{1}, 64, plan); }},
      {"offload the null page", "device_pages[1] = 4294967295",
       [&] {
         return buf.offload(7, std::vector<PageId>{3, kNullPage}, 64, plan);
       }},
      {"offload a page twice", "device_pages[2] = 3",
       [&] {
         return buf.offload(7, std::vector<PageId>{3, 8, 3}, 64, plan);
       }},
      {"offload past the logical buffer", "",
       [&] {
         std::vector<PageId> p(buf.free_logical_pages() + 1);
         for (std::size_t i = 0; i < p.size(); ++i) p[i] = PageId(i);
         return !buf.offload(7, p, 64, plan);
       }},
      {"fetch the wrong count", "device_pages.size() = 17",
       [&] { return buf.fetch(anchor, std::vector<PageId>(17, 1), 64, plan), true; }},
      {"fetch with the wrong page size", "device_page_bytes = 32", [&] { return buf.fetch(0, {}, 32, plan), true; }},
      {"fetch into a page twice", "device_pages[1] = 5: listed twice",
       [&] {
         return buf.fetch(anchor, std::vector<PageId>{5, 5}, 64, plan), true;
       }},
      {"fetch the null page", "device_pages[0] = 4294967295",
       [&] {
         return buf.fetch(anchor, std::vector<PageId>{kNullPage, 5}, 64, plan), true;
       }},
      {"alpha 1", "alpha = 1", [&] { return buf.on_slo_events(true, false, 1.0), true; }},
      {"alpha NaN", "alpha = nan", [&] { return buf.on_slo_events(true, false, std::nan("")), true; }},
  };
  struct Snap {
    std::uint32_t used, logical;
    std::vector<std::uint32_t> pages;
    std::size_t plan;
    bool operator==(const Snap&) const = default;
  };
  std::function<Snap()> snapshot = [&] {
    Snap s{buf.used_pages(), buf.logical_pages(), {}, plan.size()};
    for (RequestId r = 0; r < 10; ++r) s.pages.push_back(buf.pages_of(r));
    s.pages.push_back(buf.pages_of(anchor));
    return s;
  };
  kvmm::test::run_bad_inputs<Snap>(
      1407, 3000, cases, snapshot, [&] { buf.check_invariants(); }, valid);
  // Serves end to end: bytes out and back.
  for (RequestId r = 0; r < 6; ++r) buf.drop(r);
  buf.drop(anchor);
  while (buf.logical_pages() < 16) buf.on_slo_events(true, false);
  std::vector<std::byte> device(64 * 8);
  for (std::size_t i = 0; i < device.size(); ++i) device[i] = std::byte(i * 3);
  const auto before = device;
  plan.clear();
  REQUIRE(buf.offload(2, std::vector<PageId>{5, 1, 7}, 64, plan));
  buf.copy_to_host(plan, device.data());
  std::fill(device.begin(), device.end(), std::byte{0});
  plan.clear();
  buf.fetch(2, std::vector<PageId>{5, 1, 7}, 64, plan);
  buf.copy_to_device(plan, device.data());
  for (PageId p : {5u, 1u, 7u})
    CHECK(std::equal(device.begin() + p * 64, device.begin() + p * 64 + 64, before.begin() + p * 64));
  buf.check_invariants();
}
