// The tensor-core primitives on the device (tc_probe.cu): one warp runs mma.m16n8k16 (bf16
// and fp16) on fragments the caller laid out, and stages a tile of four 8x8 b16 matrices
// through cp.async into shared memory, then reads it back with every ldmatrix form.
#pragma once

#include <cstdint>

namespace kvmm::test {

struct TcProbeIn {
  std::uint32_t a[32][4];  // A fragments per lane (bf16 pairs), then fp16 in a16
  std::uint32_t b[32][2];
  std::uint32_t a16[32][4];
  std::uint32_t b16[32][2];
  float c[32][4];
  std::uint16_t tile[4][8][8];  // four 8x8 matrices, rows of 16 bytes
};

struct TcProbeOut {
  float d_bf16[32][4];
  float d_f16[32][4];
  std::uint32_t x1[32][1], x2[32][2], x4[32][4];
  std::uint32_t x1t[32][1], x2t[32][2], x4t[32][4];
};

// Runs the probe on the current device; false (with `error` set) on a CUDA error.
bool run_tc_probe(const TcProbeIn& in, TcProbeOut& out, const char** error);

}  // namespace kvmm::test
