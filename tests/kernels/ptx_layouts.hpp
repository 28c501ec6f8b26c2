// The PTX ISA's fragment layouts, forward ((lane, element) -> (row, col)), transcribed
// from PTX ISA 9.7.14.5.8 ("Matrix Fragments for mma.m16n8k16 with floating point
// type") and 9.7.14.5.15 (ldmatrix), independently of the emulator's inverse maps in
// kernels/simt_warp.hpp. Used by tests/kernels (emulator) and tests/gpu (hardware).
#pragma once

namespace kvmm::test::ptx {

// groupID = lane >> 2, threadID_in_group = lane % 4.
struct RC {
  unsigned row, col;
};
// A (16x16, .f16/.bf16, a0..a7 in four .b32, low half first):
// row = groupID for a0,a1,a4,a5, groupID + 8 for a2,a3,a6,a7;
// col = threadID_in_group * 2 + (i & 1) for a0..a3, + 8 for a4..a7.
inline RC ptx_a(unsigned lane, unsigned i) {
  const unsigned g = lane >> 2, t = lane % 4;
  const bool low_rows = i == 0 || i == 1 || i == 4 || i == 5;
  return RC{low_rows ? g : g + 8, t * 2 + (i & 1) + (i >= 4 ? 8 : 0)};
}
// B (16x8, b0..b3 in two .b32): row = threadID_in_group * 2 + (i & 1) for b0,b1, + 8 for
// b2,b3; col = groupID.
inline RC ptx_b(unsigned lane, unsigned i) {
  const unsigned g = lane >> 2, t = lane % 4;
  return RC{t * 2 + (i & 1) + (i >= 2 ? 8 : 0), g};
}
// C/D (16x8 fp32, c0..c3): row = groupID for c0,c1, groupID + 8 for c2,c3;
// col = threadID_in_group * 2 + (i & 1).
inline RC ptx_c(unsigned lane, unsigned i) {
  const unsigned g = lane >> 2, t = lane % 4;
  return RC{i < 2 ? g : g + 8, t * 2 + (i & 1)};
}
// ldmatrix .m8n8 .b16: destination register m holds matrix m; within a matrix thread
// lane holds the two elements of row lane/4 at columns 2*(lane%4) and 2*(lane%4)+1
// (the same layout as an 8x8 piece of A); with .trans, column lane/4 of rows 2*(lane%4)
// and 2*(lane%4)+1. The row addresses of matrix m come from threads 8m .. 8m+7.
inline RC ptx_ldmatrix(unsigned lane, unsigned j, bool trans) {
  const unsigned r = lane / 4, c = (lane % 4) * 2 + j;
  return trans ? RC{c, r} : RC{r, c};
}

}  // namespace kvmm::test::ptx
