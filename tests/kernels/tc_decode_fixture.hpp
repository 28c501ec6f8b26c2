// The host side of an emulated tensor-core decode launch (tests/kernels/tc_decode_test.cpp,
// tc_decode_hw_test.cpp): a Scenario's paged or contiguous parameters with a split workspace,
// checked as the launchers check them, the kernels' addressing of them, and NaN-poisoned
// outputs (0xffff) for the launch to fill. Include after defining KVMM_SIMT_HOST and the
// kernel headers. Host code; O(outputs + workspace).
#pragma once

#include "../../kernels/tc_decode_common.cuh"
#include "kernels/kernel_fixture.hpp"

#include <vector>

namespace kvmm::test {

// Runs `launch(params, addr)` on scenario `s` with `splits` pieces (CSR or dense tables) and
// returns the outputs.
template <typename F>
std::vector<std::uint16_t> tc_paged_run(Scenario& s, std::uint32_t splits, bool csr, F&& launch) {
  std::vector<std::uint16_t> o(s.out_elems(), 0xffff);
  kernels::PagedAttentionParams p = s.paged_params(o.data(), splits, csr);
  std::vector<float> ws(kernels::attention_workspace_bytes(s.rows, s.q_heads, s.cfg.head_dim, splits) / 4 + 4);
  p.split.workspace = ws.data();
  kernels::check_params(p, false, true);
  const kernels::device::TcPagedAddr kv = kernels::device::tc_paged_addr(p);
  launch(p, kv);
  return o;
}

template <typename F>
std::vector<std::uint16_t> tc_contiguous_run(Scenario& s, std::uint32_t splits, F&& launch) {
  std::vector<std::uint16_t> o(s.out_elems(), 0xffff);
  kernels::ContiguousAttentionParams p = s.contiguous_params(o.data(), splits);
  std::vector<float> ws(kernels::attention_workspace_bytes(s.rows, s.q_heads, s.cfg.head_dim, splits) / 4 + 4);
  p.split.workspace = ws.data();
  kernels::check_params(p, false, true);
  const kernels::device::ContiguousAddr kv = kernels::device::contiguous_addr(p);
  launch(p, kv);
  return o;
}

}  // namespace kvmm::test
