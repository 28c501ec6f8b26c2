// Traffic accounting for the host emulation (simt_host.hpp): while a TrafficLog is
// active, every memory wrapper of memory.cuh / tensor_core.cuh appends one record per
// lane (CTA, thread, per-thread sequence number, address, bytes, space, kind, call
// site). Lanes of a warp run the same code between collectives, so the k-th record of
// every lane of a warp is one warp-wide instruction: analyse() groups the log by
// (CTA, warp, k) and derives, per named address region, bytes requested and unique,
// 32-byte sectors per warp request, each CTA's contiguous byte runs (the read pattern a
// DRAM row sees of one CTA), and shared-memory wavefronts per warp access
// (32 banks of 4 bytes; 4-byte accesses form one phase of 32 lanes, 8-byte two of 16,
// 16-byte four of 8; each 8x8 ldmatrix matrix is one phase of 8 rows of 16 bytes; a
// phase costs the largest number of distinct words one bank serves). A predicated-off
// lane logs 0 bytes, so groups stay aligned; a group whose lanes came from different
// call sites is counted as misaligned (code written inside a macro argument, such as
// REQUIRE(launch(...)), has a single source line: launch outside it). Cost: one vector push per lane access; the
// analysis sorts the log. It has no clock and no cache: requested bytes bound L2 traffic
// from above, unique bytes DRAM traffic from below. The bank model is NVIDIA's documented
// rule, not measured hardware.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace kvmm::simt {

enum class Space : std::uint8_t { kGlobal, kShared };
enum class Kind : std::uint8_t { kLoad, kStore, kLdmatrix };

struct Access {
  std::uint32_t cta;
  std::uint32_t thread;
  std::uint32_t seq;
  std::uintptr_t addr;
  std::uint32_t bytes;  // per lane; 0 = predicated off (ldmatrix: 16 per row address)
  Space space;
  Kind kind;
  std::uint32_t line;  // call site
};

struct Region {
  std::string name;
  const void* lo;
  std::size_t bytes;
};

struct GlobalStats {
  long long requests = 0;  // warp-wide instructions touching the region
  long long bytes_requested = 0;
  long long unique_bytes = 0;
  long long sectors = 0;  // 32-byte sectors, summed over requests
  long long unique_sectors = 0;
  // Sectors counted per half-warp for requests of 16 bytes per lane (the others as
  // `sectors`): a sector two half-warps both touch counts twice. The H200's L1TEX counters
  // for the tensor-core decode's 16-byte cp.async (2026-11-28: 24.0 sectors per K/V
  // request, exactly 16 + 8) match this rule, not `sectors` (16): a hypothesis the
  // `decode_paged_tc_sect` bench row tests on a device.
  long long half_warp_sectors = 0;
  // Each CTA's bytes of the region merged into maximal contiguous runs: their number summed
  // over CTAs, the shortest and the longest (KVOrder's test: a CTA of one kv head reads
  // head_dim x 2-byte runs of token-major pages, whole page tiles of head-major ones).
  long long cta_runs = 0;
  long long cta_run_min = 0, cta_run_max = 0;
  double sectors_per_request() const { return requests ? double(sectors) / double(requests) : 0.0; }
  double half_warp_sectors_per_request() const { return requests ? double(half_warp_sectors) / double(requests) : 0.0; }
};

struct SharedStats {
  long long requests = 0;
  long long wavefronts = 0;
  long long ideal = 0;  // one wavefront per phase with an active lane
};

struct TrafficReport {
  std::map<std::string, GlobalStats> global;  // by region name ("other": outside every region)
  SharedStats shared;                         // loads, stores and ldmatrix together
  SharedStats ldmatrix;                       // ldmatrix alone
  long long misaligned = 0;                   // warp groups whose lanes came from different sites
};

class TrafficLog {
 public:
  // The log that the wrappers append to, or nullptr (the default: no logging).
  static TrafficLog*& active() {
    static TrafficLog* log = nullptr;
    return log;
  }
  TrafficLog() { active() = this; }
  TrafficLog(const TrafficLog&) = delete;
  TrafficLog& operator=(const TrafficLog&) = delete;
  ~TrafficLog() { active() = nullptr; }

  void note(std::uint32_t cta, std::uint32_t thread, const void* addr, std::uint32_t bytes, Space space, Kind kind,
            std::uint32_t line) {
    if (thread >= seq_.size()) {
      seq_.resize(thread + 1, 0);
      cta_.resize(thread + 1, ~0u);
    }
    if (cta_[thread] != cta) {
      cta_[thread] = cta;
      seq_[thread] = 0;
    }
    log_.push_back(
        Access{cta, thread, seq_[thread]++, reinterpret_cast<std::uintptr_t>(addr), bytes, space, kind, line});
  }
  const std::vector<Access>& records() const { return log_; }
  void clear() {
    log_.clear();
    seq_.clear();
    cta_.clear();
  }

  TrafficReport analyse(const std::vector<Region>& regions) const {
    TrafficReport rep;
    auto region_of = [&](std::uintptr_t a) -> std::string {
      for (const Region& r : regions) {
        const auto lo = reinterpret_cast<std::uintptr_t>(r.lo);
        if (a >= lo && a < lo + r.bytes) return r.name;
      }
      return "other";
    };
    std::map<std::tuple<std::uint32_t, std::uint32_t, std::uint32_t>, std::vector<const Access*>> groups;
    for (const Access& a : log_) groups[{a.cta, a.thread / 32, a.seq}].push_back(&a);
    std::map<std::string, std::vector<std::pair<std::uintptr_t, std::uintptr_t>>> spans;
    std::map<std::pair<std::string, std::uint32_t>, std::vector<std::pair<std::uintptr_t, std::uintptr_t>>> cta_spans;
    for (const auto& [key, lanes] : groups) {
      const Access& first = *lanes.front();
      bool same = true;
      for (const Access* a : lanes) same = same && a->line == first.line && a->space == first.space;
      if (!same) {
        ++rep.misaligned;
        continue;
      }
      if (first.space == Space::kGlobal) {
        std::map<std::string, std::vector<std::uintptr_t>> sectors, halves[2];
        bool wide = true;  // every active lane accesses 16 bytes
        for (const Access* a : lanes) {
          if (a->bytes == 0) continue;
          const std::string name = region_of(a->addr);
          GlobalStats& s = rep.global[name];
          s.bytes_requested += a->bytes;
          spans[name].emplace_back(a->addr, a->addr + a->bytes);
          cta_spans[{name, a->cta}].emplace_back(a->addr, a->addr + a->bytes);
          wide = wide && a->bytes == 16;
          for (std::uintptr_t sec = a->addr / 32; sec <= (a->addr + a->bytes - 1) / 32; ++sec) {
            sectors[name].push_back(sec);
            halves[(a->thread % 32) / 16][name].push_back(sec);
          }
        }
        auto unique_count = [](std::vector<std::uintptr_t>& v) {
          std::sort(v.begin(), v.end());
          return static_cast<long long>(std::unique(v.begin(), v.end()) - v.begin());
        };
        for (auto& [name, v] : sectors) {
          GlobalStats& s = rep.global[name];
          ++s.requests;
          const long long n = unique_count(v);
          s.sectors += n;
          s.half_warp_sectors += wide ? unique_count(halves[0][name]) + unique_count(halves[1][name]) : n;
        }
      } else {
        const auto [wave, ideal] = wavefronts(lanes);
        rep.shared.requests += ideal > 0;
        rep.shared.wavefronts += wave;
        rep.shared.ideal += ideal;
        if (first.kind == Kind::kLdmatrix) {
          rep.ldmatrix.requests += ideal > 0;
          rep.ldmatrix.wavefronts += wave;
          rep.ldmatrix.ideal += ideal;
        }
      }
    }
    for (auto& [name, v] : spans) {
      std::sort(v.begin(), v.end());
      GlobalStats& s = rep.global[name];
      std::uintptr_t end = 0, sec_end = 0;
      for (const auto& [lo, hi] : v) {
        const std::uintptr_t from = std::max(lo, end);
        if (hi > from) s.unique_bytes += static_cast<long long>(hi - from);
        end = std::max(end, hi);
        const std::uintptr_t s_lo = std::max(lo / 32, sec_end), s_hi = (hi + 31) / 32;
        if (s_hi > s_lo) s.unique_sectors += static_cast<long long>(s_hi - s_lo);
        sec_end = std::max(sec_end, s_hi);
      }
    }
    for (auto& [key, v] : cta_spans) {
      std::sort(v.begin(), v.end());
      GlobalStats& s = rep.global[key.first];
      auto run_done = [&s](std::uintptr_t lo, std::uintptr_t hi) {
        const auto n = static_cast<long long>(hi - lo);
        s.cta_run_min = s.cta_runs == 0 ? n : std::min(s.cta_run_min, n);
        s.cta_run_max = std::max(s.cta_run_max, n);
        ++s.cta_runs;
      };
      std::uintptr_t lo = v.front().first, hi = v.front().second;
      for (const auto& [a, b] : v) {
        if (a > hi) {
          run_done(lo, hi);
          lo = a;
        }
        hi = std::max(hi, b);
      }
      run_done(lo, hi);
    }
    return rep;
  }

  // Wavefronts of one warp-wide shared access, and its ideal count.
  static std::pair<long long, long long> wavefronts(const std::vector<const Access*>& lanes) {
    std::map<unsigned, std::vector<std::uintptr_t>> phases;  // phase -> 4-byte words
    for (const Access* a : lanes) {
      if (a->bytes == 0) continue;
      const unsigned lane = a->thread % 32;
      unsigned phase;
      if (a->kind == Kind::kLdmatrix)
        phase = lane / 8;  // matrix m: the row addresses of lanes 8m..8m+7
      else
        phase = a->bytes <= 4 ? 0 : a->bytes == 8 ? lane / 16 : lane / 8;
      for (std::uintptr_t w = a->addr / 4; w <= (a->addr + a->bytes - 1) / 4; ++w) phases[phase].push_back(w);
    }
    long long wave = 0;
    for (auto& [p, words] : phases) {
      std::sort(words.begin(), words.end());
      words.erase(std::unique(words.begin(), words.end()), words.end());
      unsigned per_bank[32] = {};
      unsigned most = 0;
      for (std::uintptr_t w : words) most = std::max(most, ++per_bank[w % 32]);
      wave += most;
    }
    return {wave, static_cast<long long>(phases.size())};
  }

 private:
  std::vector<Access> log_;
  std::vector<std::uint32_t> seq_;
  std::vector<std::uint32_t> cta_;
};

// Called by the wrappers: appends when a log is active.
inline void note_access(const void* addr, std::uint32_t bytes, Space space, Kind kind, std::uint32_t line) {
  TrafficLog* log = TrafficLog::active();
  if (log == nullptr) return;
  const std::uint32_t cta = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
  log->note(cta, threadIdx.x, addr, bytes, space, kind, line);
}

}  // namespace kvmm::simt
