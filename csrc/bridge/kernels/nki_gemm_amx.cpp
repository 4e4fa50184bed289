// The Tensor Engine's bfloat16 tile GEMM (nki_host.h) on the host's AMX
// tiles, written for the NKI tile shapes: at most 128 x 128 x 512, one call per
// instruction or per chain of instructions into one PSUM tile. Compiled for AMX alone by the target
// pragma below; x86-64 only, run only where amx_gemm_ready() says so.
//
// The sum each output element gets: tile zero, then TDPBF16PS over k in
// ascending pairs (the instruction's own order: products of bfloat16 are exact
// in float32, each pair is added to the float32 accumulator in turn, subnormal
// inputs and results are taken as zero). Padding up to whole tiles adds +0,
// which leaves every sum that starts at +0 as it is.
#if defined(__x86_64__)

#include <ATen/Parallel.h>

#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "nki_host.h"

namespace torchneuron::nki_host {
namespace {

// Linux keeps the 8 KiB tile state out of a thread's context until the
// process asks for it (arch/x86/include/uapi/asm/prctl.h).
constexpr int kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;

bool host_has_amx_bf16() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool tile = d & (1u << 24), bf16 = d & (1u << 22);
  if (!tile || !bf16 || !__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return false;  // OSXSAVE
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (lo & (3u << 17)) == (3u << 17);  // XTILECFG and XTILEDATA enabled by the OS
}

// The 64-byte operand of LDTILECFG (palette 1): tiles 0-3 accumulate a 32 x 32
// block of float32 sums, 4-5 hold 16 rows of A (32 bfloat16 of k each), 6-7
// 16 k-pairs of B (16 columns each, pairs interleaved).
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

constexpr int64_t kBlock = 32;  // output block: 2 x 2 tiles of 16 x 16
// The smallest chain (multiply-adds) split between two threads of the intra-op
// pool: two full tile GEMMs. A single tile GEMM does not pay for the wake-up.
constexpr int64_t kParallelMacs = int64_t{1} << 24;

int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

} // namespace

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16,avx512f,avx512bw")
#pragma GCC optimize("O3")

namespace {

// 16 pairs (row[j], row[j + stride]) for j < 16, the first in the low half.
__m512i pair16(const uint16_t* row, int64_t stride) {
  const __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row)));
  const __m512i hi = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + stride)));
  return _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
}

// r[i][j] becomes r[j][i] (16 x 16 of 32 bits): pairs of rows interleaved,
// then pairs of pairs, then 128-bit lanes gathered across rows.
void transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  // Now r[4i + c] holds, in 128-bit lane L, element 4L + c of rows 4i .. 4i + 3.
  for (int c = 0; c < 4; ++c) {
    const __m512i v0 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x44), v1 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xEE);
    const __m512i w0 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x44), w1 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xEE);
    t[c] = _mm512_shuffle_i32x4(v0, w0, 0x88);
    t[4 + c] = _mm512_shuffle_i32x4(v0, w0, 0xDD);
    t[8 + c] = _mm512_shuffle_i32x4(v1, w1, 0x88);
    t[12 + c] = _mm512_shuffle_i32x4(v1, w1, 0xDD);
  }
  for (int i = 0; i < 16; ++i) r[i] = t[i];
}

} // namespace

bool amx_gemm_ready() {
  static const bool ready = host_has_amx_bf16() && syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  return ready;
}

// The layouts, in 1 KiB tiles whose 16 rows of 64 bytes are contiguous (so
// they never share cache sets), each element a pair of rows k and k + 1:
//   stationary: [m / 16][k / 32][m % 16][k % 32 / 2], the rows of A (M x K)
//   moving:     [n / 16][k / 2][n % 16], B in the instruction's pair layout
void amx_stage(Matrix<const uint16_t> x, bool stationary, StagedOperand& into) {
  const int64_t K = x.rows, cols = x.cols, P = K / 2;
  const int64_t kpairs = round_up(K, 32) / 2, ksteps = kpairs / 16, padded_cols = round_up(cols, kBlock);
  into.rows = K, into.cols = cols, into.stationary = stationary;
  into.pairs.resize(kpairs * padded_cols);
  if (K != 2 * kpairs || cols != padded_cols) std::fill(into.pairs.begin(), into.pairs.end(), 0u);
  const uint16_t* src = x.data;
  const int64_t ld = x.row_stride;
  if (!stationary) {  // pairs of rows, cut into 16-column strips
    for (int64_t p = 0; p < P; ++p) {
      const uint16_t* r = src + 2 * p * ld;
      uint32_t* to = into.pairs.data() + p * 16;
      int64_t n0 = 0;
      for (; n0 + 16 <= cols; n0 += 16, to += kpairs * 16) _mm512_storeu_si512(to, pair16(r + n0, ld));
      for (int64_t n = n0; n < cols; ++n) to[n - n0] = r[n] | uint32_t(r[n + ld]) << 16;
    }
    return;
  }
  for (int64_t p0 = 0; p0 < P; p0 += 16)  // pairs of rows, transposed in 16 x 16 squares
    for (int64_t m0 = 0; m0 < cols; m0 += 16) {
      uint32_t* tile = into.pairs.data() + ((m0 / 16) * ksteps + p0 / 16) * 256;
      if (p0 + 16 <= P && m0 + 16 <= cols) {  // a whole square, in registers
        __m512i r[16];
        for (int i = 0; i < 16; ++i) r[i] = pair16(src + 2 * (p0 + i) * ld + m0, ld);
        transpose16(r);
        for (int i = 0; i < 16; ++i) _mm512_storeu_si512(tile + 16 * i, r[i]);
      } else {
        for (int64_t p = p0; p < std::min(p0 + 16, P); ++p)
          for (int64_t m = m0; m < std::min(m0 + 16, cols); ++m)
            tile[(m - m0) * 16 + p - p0] = src[2 * p * ld + m] | uint32_t(src[(2 * p + 1) * ld + m]) << 16;
      }
    }
}

namespace {

// Output columns [n_begin, n_end) (multiples of kBlock) of amx_gemm_chain.
void amx_chain_columns(const GemmPair* pairs, int64_t n_pairs, Matrix<float> out, bool accumulate,
                       int64_t n_begin, int64_t n_end) {
  const int64_t M = pairs[0].stationary->cols, N = pairs[0].moving->cols;
  const int64_t Mp = round_up(M, kBlock);
  static const TileConfig config;
  _tile_loadconfig(&config);  // per thread: the tile configuration is thread state
  constexpr int64_t kTileBytes = 1024, kRowBytes = 64, ldc = kBlock * 4;
  // A product's sums are added to `out` while the matrix unit computes the
  // next one (two sum buffers): reading a tile store back at once would wait
  // for it to reach the cache.
  alignas(64) float sums[2][kBlock * kBlock];
  const auto add_block = [&](int64_t m0, int64_t n0, const float* r, bool add) {
    const int64_t rows = std::min(kBlock, M - m0), cols = std::min(kBlock, N - n0);
    for (int64_t i = 0; i < rows; ++i, r += kBlock) {
      float* o = out.data + (m0 + i) * out.row_stride + n0;
      if (add)  // the PSUM adder: one add per element
        for (int64_t j = 0; j < cols; ++j) o[j] += r[j];
      else
        std::memcpy(o, r, cols * sizeof(float));
    }
  };
  int64_t pending_m = -1, pending_n = -1, count = 0;
  bool pending_add = false;
  // n outer, then the pairs, then m: the output's column strip (M x 32) stays
  // in L1 while every product is added to it in turn, and a pair's B strip
  // across m.
  for (int64_t n0 = n_begin; n0 < n_end; n0 += kBlock)
    for (int64_t p = 0; p < n_pairs; ++p) {
      const int64_t ksteps = round_up(pairs[p].stationary->rows, 32) / 32;
      for (int64_t m0 = 0; m0 < Mp; m0 += kBlock, ++count) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        const char* a = reinterpret_cast<const char*>(pairs[p].stationary->pairs.data()) + (m0 / 16) * ksteps * kTileBytes;
        const char* b = reinterpret_cast<const char*>(pairs[p].moving->pairs.data()) + (n0 / 16) * ksteps * kTileBytes;
        for (int64_t ks = 0; ks < ksteps; ++ks) {
          _tile_loadd(4, a + ks * kTileBytes, kRowBytes);
          _tile_loadd(5, a + (ksteps + ks) * kTileBytes, kRowBytes);
          _tile_loadd(6, b + ks * kTileBytes, kRowBytes);
          _tile_loadd(7, b + (ksteps + ks) * kTileBytes, kRowBytes);
          _tile_dpbf16ps(0, 4, 6);
          _tile_dpbf16ps(1, 4, 7);
          _tile_dpbf16ps(2, 5, 6);
          _tile_dpbf16ps(3, 5, 7);
        }
        char* c = reinterpret_cast<char*>(sums[count % 2]);
        _tile_stored(0, c, ldc);
        _tile_stored(1, c + 64, ldc);
        _tile_stored(2, c + 16 * ldc, ldc);
        _tile_stored(3, c + 16 * ldc + 64, ldc);
        if (pending_m >= 0) add_block(pending_m, pending_n, sums[(count + 1) % 2], pending_add);
        pending_m = m0, pending_n = n0, pending_add = accumulate || p > 0;
      }
    }
  if (pending_m >= 0) add_block(pending_m, pending_n, sums[(count + 1) % 2], pending_add);
  _tile_release();
}

} // namespace

void amx_gemm_chain(const GemmPair* pairs, int64_t n_pairs, Matrix<float> out, bool accumulate) {
  const int64_t blocks = round_up(pairs[0].moving->cols, kBlock) / kBlock;
  int64_t macs = 0;
  for (int64_t p = 0; p < n_pairs; ++p) macs += pairs[p].stationary->rows;
  macs *= pairs[0].stationary->cols * pairs[0].moving->cols;
  // Threads own disjoint output columns, so every element's sum is the one a
  // single thread computes. Work too small to pay for waking the intra-op
  // pool stays on the calling thread.
  const int64_t grain = macs >= kParallelMacs ? (blocks + 1) / 2 : blocks;
  at::parallel_for(0, blocks, grain, [&](int64_t b, int64_t e) {
    amx_chain_columns(pairs, n_pairs, out, accumulate, b * kBlock, e * kBlock);
  });
}

#pragma GCC pop_options

} // namespace torchneuron::nki_host

#endif
