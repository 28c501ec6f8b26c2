// The online softmax of one query head over a stream of keys, written once for the CUDA
// kernels (float, logits scaled to base 2, exp2f) and the CPU references (double, natural
// logits, std::exp). The state is {m, l}: the largest logit absorbed so far (-inf: none)
// and the sum of exp(logit - m); the caller keeps acc = sum of exp(logit - m) * v.
// softmax_absorb moves the state to a new maximum and returns the factor for acc;
// softmax_weight gives a state's weight when partial states (teams, split-KV pieces) are
// merged against their common maximum. O(1), host and device (no CUDA headers needed).
#pragma once

#include "kvmm/kernels/mask.hpp"  // KVMM_HOST_DEVICE

namespace kvmm::kernels {

template <typename F>
struct SoftmaxState {
  F m;
  F l;
};

// Moves `s` to the maximum `m_new` (>= s.m, finite) and adds `p_sum`, the sum of
// exp(logit - m_new) over the logits absorbed now; returns exp(old m - m_new), the factor
// by which the caller scales its accumulator (0 when nothing had been absorbed).
template <typename F, typename Exp>
KVMM_HOST_DEVICE F softmax_absorb(SoftmaxState<F>& s, F m_new, F p_sum, Exp exp_fn) {
  const F corr = exp_fn(s.m - m_new);
  s.l = s.l * corr + p_sum;
  s.m = m_new;
  return corr;
}

// Weight of state `s` in a merge against `big_m`, the largest m of the states merged:
// exp(s.m - big_m), 0 for an empty state. The merged l is the sum of l x weight and the
// merged accumulator the sum of acc x weight.
template <typename F, typename Exp>
KVMM_HOST_DEVICE F softmax_weight(const SoftmaxState<F>& s, F big_m, Exp exp_fn) {
  return exp_fn(s.m - big_m);
}

}  // namespace kvmm::kernels
