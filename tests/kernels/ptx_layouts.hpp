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

// wgmma .m64nNk16 accumulator D (PTX ISA 9.7.15.5.1, "Register Fragments and Shared
// Memory Matrix Layouts", D fragment): thread t of the warpgroup (t = 0..127), register
// i = 0..N/2-1: row = 16 * warp + groupID + 8 * ((i % 4) / 2), col = 8 * (i / 4) +
// threadID_in_group * 2 + (i % 2), warp = t / 32, groupID and threadID_in_group of t % 32.
inline RC ptx_wgmma_d(unsigned t, unsigned i) {
  const unsigned w = t / 32, lane = t % 32, g = lane >> 2, tig = lane % 4;
  return RC{16 * w + g + 8 * ((i % 4) / 2), 8 * (i / 4) + tig * 2 + (i % 2)};
}
// The shared-memory matrix descriptor's fields (PTX ISA 9.7.15.5.1.2, "Matrix Descriptor
// Format"): bits 0-13 start address >> 4, 16-29 leading dimension byte offset >> 4,
// 32-45 stride dimension byte offset >> 4, 49-51 base offset, 62-63 swizzle mode
// (0 interleave/none, 1 128-byte, 2 64-byte, 3 32-byte).
struct DescFields {
  unsigned start, lbo, sbo, base_offset, swizzle;
};
inline DescFields ptx_desc(unsigned long long d) {
  return DescFields{static_cast<unsigned>(d & 0x3fff) << 4, static_cast<unsigned>((d >> 16) & 0x3fff) << 4,
                    static_cast<unsigned>((d >> 32) & 0x3fff) << 4, static_cast<unsigned>((d >> 49) & 7),
                    static_cast<unsigned>(d >> 62)};
}
// K-major canonical layouts of a wgmma operand (rows = M or N, k = 0..15 of one k-step),
// byte offset from the descriptor's start. No swizzle: "core matrices" of 8 rows x 16
// bytes stored contiguously (row r of a core matrix at 16 r); the core matrix holding
// (row, k) is (row / 8, k / 8), SBO apart along rows and LBO apart along k.
inline unsigned ptx_kmajor_none(unsigned row, unsigned k, unsigned lbo, unsigned sbo) {
  const unsigned core = (row / 8) * sbo + (k / 8) * lbo;
  return core + (row % 8) * 16 + (k % 8) * 2;
}
// 128-byte swizzle: each row of 64 two-byte elements is 128 bytes, 8 rows form a
// 1024-byte atom (atoms SBO apart); within an atom the 16-byte chunk c of row r is
// stored at chunk c XOR r. Offsets from a 1024-byte aligned base.
inline unsigned ptx_kmajor_sw128(unsigned row, unsigned k, unsigned sbo) {
  const unsigned r = row % 8, chunk = (k * 2) / 16;
  return (row / 8) * sbo + r * 128 + ((chunk ^ r) * 16) + (k * 2) % 16;
}

// wgmma .m64nNk16 A from registers (PTX ISA 9.7.15.5.1.1, "Matrix Fragments for
// wgmma.m64nNk16", multiplicand A in registers: four .f16x2 registers a0..a7; figure
// "WGMMA .m64nNk16 register fragment layout for matrix A"): warp w of the warpgroup holds
// rows 16 w .. 16 w + 15, each warp's 16 x 16 piece laid out as mma.m16n8k16's A above.
inline RC ptx_wgmma_a(unsigned t, unsigned i) {
  const RC e = ptx_a(t % 32, i);
  return RC{16 * (t / 32) + e.row, e.col};
}
// MN-major canonical layout under the 128-byte swizzle (the transposed operand, wgmma's
// imm-trans = 1; PTX ISA 9.7.15.5.1.2, "Shared Memory Matrix Layout": "MN-major" 128B
// swizzle): element (mn, k) with MN contiguous: each K row holds 64 two-byte MN elements
// (128 bytes), 8 K rows form a 1024-byte atom, atoms SBO apart along K ("stride dimension
// byte offset") and 64-element panels LBO apart along MN ("leading dimension byte
// offset"); within an atom the 16-byte chunk c of row r is stored at chunk c XOR r.
inline unsigned ptx_mnmajor_sw128(unsigned mn, unsigned k, unsigned lbo, unsigned sbo) {
  const unsigned r = k % 8, chunk = ((mn % 64) * 2) / 16;
  return (mn / 64) * lbo + (k / 8) * sbo + r * 128 + ((chunk ^ r) * 16) + ((mn % 64) * 2) % 16;
}

}  // namespace kvmm::test::ptx
