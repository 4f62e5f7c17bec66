// Per-ISA CPU kernel tables (scalar, AVX2+FMA+F16C, AVX-512F/BW/VL, AVX-512 with VNNI integer dot
// products for the quantized-weight Gemm, AVX-512 with the AMX BF16 prefill Gemm) and run-time ISA
// detection.
// The kernels are single-threaded pieces of an op; threading and shape checks live in cpu_backend.
#ifndef MODSERVE_ENGINE_BACKEND_CPU_KERNELS_H_
#define MODSERVE_ENGINE_BACKEND_CPU_KERNELS_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <type_traits>

#include "engine/common/dtype.h"

namespace modserve::backend::cpu {

// kAvx512Vnni is kAvx512's table with the quantized-weight Gemms on vpdpbusd (AVX512_VNNI);
// kAmx is kAvx512Vnni's table (kAvx512's on a CPU without VNNI) plus the AMX BF16 prefill Gemm
// (gemm_amx_bf16 below), with one-row Q6_K and Q8_0 copy tiles that prefetch for Xeons and, on
// CPUs with AMX-INT8, the Q4_K and Q8_0 copy Gemms on the int8 tiles (same bits;
// kernels_avx512vnni.cc, amx_int8_impl.h).
enum class Isa : uint8_t { kScalar, kAvx2, kAvx512, kAvx512Vnni, kAmx };

std::string_view IsaName(Isa isa);
// The ISA whose IsaName() is `name` ("scalar", "avx2", "avx512", "avx512vnni", "amx").
std::optional<Isa> IsaFromName(std::string_view name);

// Whether this CPU (and OS) can run kernels of `isa`: kAvx2 needs AVX2, FMA and F16C; kAvx512
// needs AVX-512 F, BW and VL on top; kAvx512Vnni needs AVX512_VNNI on top of that; kAmx needs
// AVX-512 F, BW and VL, AMX-TILE and AMX-BF16, the tile state enabled by the OS, this process's
// tile permission granted by the kernel, no MODSERVE_DISABLE_AMX=1 in the environment, and a
// self-test of the unit that passes (the first call runs it once). kScalar is always available.
bool CpuHasIsa(Isa isa);
// Why CpuHasIsa(Isa::kAmx) is false ("" when it is true), e.g. "the CPU has no AMX-BF16".
std::string_view AmxUnavailableReason();
// Why the kAmx table's quantized Gemms do not run on the AMX-INT8 tiles ("" when they do): AMX
// unusable, no AMX-INT8 (CPUID), or a failed self-test against the VNNI kernels' bits.
std::string_view AmxInt8UnavailableReason();
// The widest ISA that CpuHasIsa() accepts.
Isa BestIsa();
// Whether the CPU reports AVX512_BF16: the AVX-512 tables then carry the vdpbf16ps Gemms
// (KernelTable::gemm_dpbf16, MatmulPrecision kMedium) and the BF16 panel copy with its Gemms
// (repack_dpbf16, gemm_dpbf16_panels, gemm_bf16_panels).
bool CpuHasAvx512Bf16();
// Whether the CPU is AMD's family 1Ah (Zen 5; CPUID leaf 1's family plus extended family): the
// VNNI table then takes kFarPrefetchQuantGemms' K-quant Gemms (internal, below).
bool CpuIsAmdFamily1Ah();

// Rows [row_begin, row_end) of out = x @ w^T + bias, i.e. out[i, r] for every i < n.
// x [n, k] f32 row-major; w [m, k] row-major (m is implied by ldo); bias null or [m] f32;
// out [n, ldo] f32. GemmSmallN streams each weight row once for all n rows (decode);
// GemmLargeN packs w tiles to f32 and runs a register-blocked micro-kernel (prefill), and
// additionally takes a row range [x_begin, x_end) of x so callers can split 2-D.
template <typename W>
using GemmSmallNFn = void (*)(const float* x, int64_t n, int64_t k, const W* w, const float* bias,
                              float* out, int64_t ldo, int64_t row_begin, int64_t row_end);
template <typename W>
using GemmLargeNFn = void (*)(const float* x, int64_t x_begin, int64_t x_end, int64_t k, const W* w,
                              const float* bias, float* out, int64_t ldo, int64_t row_begin,
                              int64_t row_end);

// Activation rows rounded to 8 bits for the integer dot products of the quantized-weight Gemm.
// Per 32-element block b of row i: x ~ d[b] * q (q in -127..127, d = max |x| / 127), ds[b] =
// d[b] * sum of the block's q; sum16 holds the sums of each 16 consecutive q (Q6_K's 16-element
// sub-blocks need them). The q of a row are stored in natural order, except for kPairInterleaved
// (the Q4_0/Q4_1/Q5_0/Q5_1 kernels): each 64 elements (blocks b, b + 1) are stored as b[0..16),
// b+1[0..16), b[16..32), b+1[16..32), matching the nibble halves of two blocks loaded side by side;
// an odd last block stays in natural order.
enum class ActLayout : uint8_t { kNatural, kPairInterleaved };
struct QuantizedActs {
  int8_t* q;       // [n, k] int8
  float* d;        // [n, k / 32] f32
  float* ds;       // [n, k / 32] f32
  int16_t* sum16;  // [n, k / 16] i16
  int64_t n = 0;   // rows of the whole Gemm call (kernels pick decode or prefill code by it)
  int64_t k = 0;   // elements per row, a multiple of 32
  ActLayout layout = ActLayout::kNatural;
  // Bytes of scratch for n rows of k (each array 64-byte aligned within it).
  static size_t Bytes(int64_t n, int64_t k);
  // Views `n` rows of k in `layout` into `scratch` (64-byte aligned, Bytes(n, k) long).
  static QuantizedActs In(void* scratch, int64_t n, int64_t k, ActLayout layout);
};

// Quantizes rows [row_begin, row_end) of x [n, k] f32 into `acts` (same rows, acts.layout).
using QuantizeActsFn = void (*)(const float* x, int64_t row_begin, int64_t row_end,
                                const QuantizedActs& acts);
// Rows [row_begin, row_end) of out = x @ w^T + bias for the x rows [x_begin, x_end), with x given
// as `acts` (quantized by the table's quantize_acts in the layout ActLayoutFor(dtype, acts.n)).
// w [m, k] in the block layout of the function's dtype; bias null or [m] f32; out [n, ldo] f32.
using QuantGemmFn = void (*)(const QuantizedActs& acts, int64_t x_begin, int64_t x_end,
                             const void* w, const float* bias, float* out, int64_t ldo,
                             int64_t row_begin, int64_t row_end);

// The layout the kernels want for a Gemm of n rows: the Q4_0/Q4_1/Q5_0/Q5_1 decode kernels read
// two blocks side by side; every prefill kernel (n > kQuantSmallNMax, below) and every kernel of
// an interleaved copy (`interleaved`: the gemm_*_x16 entries) reads natural order.
constexpr ActLayout ActLayoutFor(DType w, int64_t n, bool interleaved = false);

// Attention of a block of consecutive query rows of one sequence (a prefill chunk) for one kv
// head and one split of its keys, on the matrix unit (KernelTable::attn_block_bf16). Row r < rows
// has kv length kv_len0 + r; its q heads h < group are the block's q-rows f = r * group + h, at
// q + r * ldq + h * head_dim. Row r sees the split's keys key_begin + j for j < num_keys and
// key_begin + j < kv_len0 + r. Scores s = scale * q . k, with q and the probabilities split into
// `terms` bf16 terms (1 to 3, as the tile Gemm splits x: MatmulPrecision) and K/V exactly bf16,
// so at 3 terms every product is exact and only the f32 sums' order differs from the row
// kernels. Per q-row f the kernel writes m[f] = max s (-inf where the row sees no key),
// l[f] = sum e^(s - m) and acc[f * head_dim ..] = sum e^(s - m) v: the split's part of the
// softmax, which the caller normalises or merges with the row's other splits. Every output of
// q-row f depends on that row's q and kv length and on the keys alone, not on the other rows of
// the block or where the block begins.
struct AmxAttnBlock {
  const float* q;
  int64_t ldq, rows, group;
  int64_t head_dim;  // a multiple of 32, at most kAmxAttnMaxHeadDim
  int64_t kv_len0;
  int64_t key_begin, num_keys;  // 1 <= num_keys <= kAmxAttnKeys
  const bf16_t* const* keys;    // [num_keys]: the K vector of key key_begin + j
  const bf16_t* const* values;  // [num_keys]: its V vector
  float scale;
  int terms;
  float* m;
  float* l;
  float* acc;
  void* scratch;  // AmxAttnScratchBytes(head_dim), 64-byte aligned
};
inline constexpr int64_t kAmxAttnKeys = 256;
inline constexpr int64_t kAmxAttnMaxHeadDim = 256;
// The kernel's tiles: K as B tiles (16 keys x 32 dims each), V as B tiles (32 keys x 16 dims),
// one q tile's terms (16 q-rows x 32 dims), the probabilities' terms (16 q-rows x 32 keys), the
// scores (16 x kAmxAttnKeys f32), the output (16 x head_dim f32) and a 1 KiB gather block.
constexpr size_t AmxAttnScratchBytes(int64_t head_dim) {
  const int64_t steps = head_dim / 32;
  return static_cast<size_t>(kAmxAttnKeys / 16 * steps + kAmxAttnKeys / 32 * steps * 2 + steps * 3 +
                             kAmxAttnKeys / 32 * 3 + 1) *
             1024 +
         static_cast<size_t>(16 * (kAmxAttnKeys + head_dim)) * sizeof(float);
}

// Cache lines an attention kernel prefetches into L2 while it runs, a few at each step of its
// loop: the K or V rows of the next key tile, so that they arrive while this tile computes. The
// lines are those of num_ranges byte ranges [base[r] + offset, base[r] + offset + bytes[r]),
// in order. Issuing a whole tile's prefetches at once stalls the core as soon as the misses in
// flight reach their limit; memory and compute then take turns instead of overlapping
// (PERFORMANCE.md, "Decode attention at batch and long context").
struct AttnPrefetch {
  const char* const* base = nullptr;
  const int64_t* bytes = nullptr;
  int64_t num_ranges = 0;
  int64_t offset = 0;
  // The cursor: the next line to issue is `next`, in range `range`, which ends at `end` (-1:
  // none taken yet).
  int64_t range = -1;
  const char* next = nullptr;
  const char* end = nullptr;

  static const char* LineOf(const char* p) {
    return reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(p) & ~uintptr_t{63});
  }
  // Lines not issued yet.
  int64_t Left() const {
    int64_t n = next < end ? (end - next + 63) / 64 : 0;
    for (int64_t r = range + 1; r < num_ranges; ++r) {
      if (bytes[r] > 0) {
        const char* first = base[r] + offset;
        n += (LineOf(first + bytes[r] - 1) - LineOf(first)) / 64 + 1;
      }
    }
    return n;
  }
  // Prefetches the next `n` lines (fewer where the ranges end).
  void Issue(int64_t n) {
    for (; n > 0; --n, next += 64) {
      while (next >= end) {
        if (++range >= num_ranges) {
          range = num_ranges;
          return;
        }
        next = LineOf(base[range] + offset);
        end = base[range] + offset + bytes[range];
      }
      __builtin_prefetch(next, 0, 2);
    }
  }
  void IssueRest() { Issue(INT64_MAX); }
  // Lines per step that cover the ones left in `steps` steps.
  int64_t PerStep(int64_t steps) const { return steps > 0 ? (Left() + steps - 1) / steps : 0; }
};

struct KernelTable {
  Isa isa;
  // Float weights (F32/F16/BF16): GemmSmallN up to this many x rows, GemmLargeN above. Per ISA,
  // measured (kernel_bench crossover): GemmLargeN's packing of w only pays for itself beyond it.
  // BF16 weights in a table with gemm_amx_bf16 switch at kAmxSmallNMax instead (SmallNMax).
  int64_t float_small_n_max;

  GemmSmallNFn<float> gemm_small_f32;
  GemmSmallNFn<f16_t> gemm_small_f16;
  // Reads x as prepare_x_bf16 left it, where the table has one (x as is where it is null).
  GemmSmallNFn<bf16_t> gemm_small_bf16;
  // Writes x [n, k] in the layout gemm_small_bf16 reads into xd [n, k] (rows independent, so
  // callers may split them), once per Gemm; null when that kernel reads x as is.
  void (*prepare_x_bf16)(const float* x, int64_t n, int64_t k, float* xd);
  GemmLargeNFn<float> gemm_large_f32;
  GemmLargeNFn<f16_t> gemm_large_f16;
  GemmLargeNFn<bf16_t> gemm_large_bf16;

  // BF16 weights with n > float_small_n_max on the matrix unit; null in tables without one.
  // pack_x_bf16 writes rows [row_begin, row_end) (up to AmxPackedRows(n), multiples of 16) of
  // x [n, k] into the packed form (at most AmxPackedXBytes(n, k), any alignment), which depends
  // on n, as `terms` bf16 terms of each x (1 to 3, by MatmulPrecision: CpuBackend); gemm_amx_bf16
  // then computes rows [row_begin, row_end) of out = x @ w^T + bias for the x rows
  // [x_begin, x_end), x_begin a multiple of 32, with kAmxScratchFloats floats of scratch, from x
  // packed with the same terms (amx_gemm_impl.h).
  void (*pack_x_bf16)(const float* x, int64_t n, int64_t k, int64_t row_begin, int64_t row_end,
                      void* packed, int terms);
  void (*gemm_amx_bf16)(const void* packed_x, int64_t n, int64_t k, int64_t x_begin, int64_t x_end,
                        const bf16_t* w, const float* bias, float* out, int64_t ldo,
                        int64_t row_begin, int64_t row_end, float* scratch, int terms);
  // BF16 weights with n > float_small_n_max on AVX512_BF16's vdpbf16ps (kernels_avx512bf16.cc)
  // at MatmulPrecision kMedium, where the table has no gemm_amx_bf16; null where the CPU has no
  // AVX512_BF16. pack_x_dpbf16 writes rows [row_begin, row_end) of x [n, k] as `terms` bf16 terms
  // each (the AMX split) into the DpBf16 layout below; gemm_dpbf16 then computes rows
  // [row_begin, row_end) of out = x @ w^T + bias for the x rows [x_begin, x_end) from it. Both
  // take 1 to 3 terms, but the backend passes only 1: with two, a vdpbf16ps does as many useful
  // multiply-adds as an FMA, and on Zen 5 the kernel ran at 0.8-0.9x gemm_large_bf16's rate
  // (docs/PERFORMANCE.md, "BF16 prefill on vdpbf16ps").
  void (*pack_x_dpbf16)(const float* x, int64_t k, int64_t row_begin, int64_t row_end, void* packed,
                        int terms);
  void (*gemm_dpbf16)(const void* packed_x, int64_t k, int64_t x_begin, int64_t x_end,
                      const bf16_t* w, const float* bias, float* out, int64_t ldo,
                      int64_t row_begin, int64_t row_end, int terms);
  // The same Gemm from w prepared once in the DpBf16 panel layout (below): repack_dpbf16 writes
  // row groups [group_begin, group_end) of the [m, k] BF16 matrix w (m a multiple of
  // kDpBf16PanelRows) into the whole copy at dst; gemm_dpbf16_panels takes row_begin and row_end
  // at multiples of kDpBf16PanelRows and gives gemm_dpbf16's bits for every x row, at every row
  // count (its micro-kernel steps, without the per-call packing). Set beside gemm_dpbf16.
  void (*repack_dpbf16)(const bf16_t* w, int64_t k, int64_t group_begin, int64_t group_end,
                        void* dst);
  void (*gemm_dpbf16_panels)(const void* packed_x, int64_t k, int64_t x_begin, int64_t x_end,
                             const void* w, const float* bias, float* out, int64_t ldo,
                             int64_t row_begin, int64_t row_end, int terms);
  // The f32 FMA Gemm over the same panels, for MatmulPrecision kHighest and kHigh where the table
  // has no gemm_amx_bf16: rows [row_begin, row_end) (multiples of kDpBf16PanelRows) of out =
  // x @ w^T + bias for the x rows [x_begin, x_end) of x [n, k] (f32, unpacked). Each output sums
  // its products in k order, one f32 FMA each, per slice of kDpBf16PanelK, so every x row gets
  // the bits of a one-row call at every row count, within the f32 bound of the other FMA kernels.
  // Set beside repack_dpbf16.
  void (*gemm_bf16_panels)(const float* x, int64_t k, int64_t x_begin, int64_t x_end, const void* w,
                           const float* bias, float* out, int64_t ldo, int64_t row_begin,
                           int64_t row_end);
  // The decode kernels' range for float weights of `dtype`: float_small_n_max, or
  // kAmxSmallNMax for BF16 where the tiles take the rest.
  int64_t SmallNMax(DType dtype) const;

  QuantizeActsFn quantize_acts;
  QuantGemmFn gemm_q8_0;
  QuantGemmFn gemm_q4_0;
  QuantGemmFn gemm_q4_1;
  QuantGemmFn gemm_q4_k;
  QuantGemmFn gemm_q6_k;
  QuantGemmFn gemm_q5_k;
  QuantGemmFn gemm_q5_0;
  QuantGemmFn gemm_q5_1;
  // Q4_K weights in the interleaved layout of RepackQ4_KX16 (below), for every row count (one
  // kernel, so each x row's result is the same whatever rows share the call); row_begin and
  // row_end multiples of kQ4KX16Rows. Null in tables without one: Q4_K weights then stay as
  // GGUF stores them (CpuBackend::PrepareGemmWeight).
  QuantGemmFn gemm_q4_k_x16;
  // Q5_K weights in the interleaved layout of RepackQ5_KX16 (below), the same way.
  QuantGemmFn gemm_q5_k_x16;
  // Q6_K weights in the interleaved layout of RepackQ6_KX16 (below), the same way.
  QuantGemmFn gemm_q6_k_x16;
  // Q8_0 weights in the interleaved layout of RepackQ8_0X16 (below), the same way.
  QuantGemmFn gemm_q8_0_x16;
  // Q4_0, Q4_1, Q5_0 and Q5_1 weights in the interleaved layouts of RepackQ4X16 (below), the
  // same way.
  QuantGemmFn gemm_q4_0_x16;
  QuantGemmFn gemm_q4_1_x16;
  QuantGemmFn gemm_q5_0_x16;
  QuantGemmFn gemm_q5_1_x16;

  // dst[i] = float(src[i]) for i < count (exact conversions).
  void (*to_f32_f16)(const f16_t* src, int64_t count, float* dst);
  void (*to_f32_bf16)(const bf16_t* src, int64_t count, float* dst);

  // scores[g, t] = scale * dot(q[g, :], keys[t, :]), where the keys are the rows of num_runs runs
  // in order: run r holds run_len[r] rows [run_len[r], head_dim] from runs[r] + offset, so keys[t]
  // is row t - (run_len[0] + ... + run_len[r - 1]) of the run it falls in (as for
  // attn_accumulate). One call covers the keys of every page a tile spans (with 16-lane vectors
  // and a head_dim of 64 or 128, q stays in registers across them). A key's score does not
  // depend on the runs it is cut into.
  // q [num_q, head_dim] f32; keys in the KV storage type (converted in registers, exactly);
  // scores [num_q, ld_scores] f32. `prefetch` (may be null): lines to prefetch over the call, all
  // of them by its end.
  void (*attn_scores)(const float* q, int64_t num_q, const float* const* runs,
                      const int64_t* run_len, int64_t num_runs, int64_t offset, int64_t head_dim,
                      float scale, float* scores, int64_t ld_scores, AttnPrefetch* prefetch);
  void (*attn_scores_f16)(const float* q, int64_t num_q, const f16_t* const* runs,
                          const int64_t* run_len, int64_t num_runs, int64_t offset,
                          int64_t head_dim, float scale, float* scores, int64_t ld_scores,
                          AttnPrefetch* prefetch);
  void (*attn_scores_bf16)(const float* q, int64_t num_q, const bf16_t* const* runs,
                           const int64_t* run_len, int64_t num_runs, int64_t offset,
                           int64_t head_dim, float scale, float* scores, int64_t ld_scores,
                           AttnPrefetch* prefetch);
  // One key tile of the online softmax of num_heads heads, head h's scores s + h * ld_s [n] f32
  // in place, its state m[h], l[h]: m' = max(m, max_t s[t]); s[t] = exp(s[t] - m');
  // l = l * exp(m - m') + sum_t s[t]; m = m'; rescale[h] = exp(m - m') (0 on the first tile,
  // where m = -inf). The exp is vectorised (within 2 ulp of expf). A head's bits do not depend
  // on the other heads of the call.
  void (*attn_softmax)(float* s, int64_t ld_s, int64_t num_heads, int64_t n, float* m, float* l,
                       float* rescale);
  // acc[g, :] = acc[g, :] * rescale[g] + sum_t probs[g, t] * values[t, :], where the values
  // are the rows of num_runs runs in order: run r holds run_len[r] rows [run_len[r], head_dim]
  // from runs[r] + offset (the KV storage type, converted in registers), so values[t] is row
  // t - (run_len[0] + ... + run_len[r - 1]) of the run it falls in. One call covers the keys
  // of every page a tile spans, acc staying in registers across them.
  // probs [num_q, ld_probs] f32; acc [num_q, head_dim] f32. `prefetch` as for attn_scores.
  void (*attn_accumulate)(const float* probs, int64_t ld_probs, int64_t num_q,
                          const float* const* runs, const int64_t* run_len, int64_t num_runs,
                          int64_t offset, int64_t head_dim, const float* rescale, float* acc,
                          AttnPrefetch* prefetch);
  void (*attn_accumulate_f16)(const float* probs, int64_t ld_probs, int64_t num_q,
                              const f16_t* const* runs, const int64_t* run_len, int64_t num_runs,
                              int64_t offset, int64_t head_dim, const float* rescale, float* acc,
                              AttnPrefetch* prefetch);
  void (*attn_accumulate_bf16)(const float* probs, int64_t ld_probs, int64_t num_q,
                               const bf16_t* const* runs, const int64_t* run_len, int64_t num_runs,
                               int64_t offset, int64_t head_dim, const float* rescale, float* acc,
                               AttnPrefetch* prefetch);

  // One block of prompt rows' attention on the matrix unit, for bf16 K/V (AmxAttnBlock, above);
  // null in tables without one.
  void (*attn_block_bf16)(const AmxAttnBlock& block);

  // out[i] = silu(gate[i]) * up[i] and x[i] = silu(x[i]) for i < n, silu(g) = g / (1 + e^-g)
  // with a vectorised exp (within 2 ulp of expf); out may alias gate or up. Each element's
  // result depends on its inputs alone, not on its position in the call.
  void (*swiglu)(const float* gate, const float* up, float* out, int64_t n);
  void (*silu)(float* x, int64_t n);
};

// The one of a table's three attention kernels (f32, f16, bf16 entries) for KV stored as T.
template <typename T, typename F32, typename F16, typename Bf16>
auto ForKvType(F32 f32, F16 f16, Bf16 bf16) {
  if constexpr (std::is_same_v<T, float>) {
    return f32;
  } else if constexpr (std::is_same_v<T, f16_t>) {
    return f16;
  } else {
    static_assert(std::is_same_v<T, bf16_t>);
    return bf16;
  }
}

template <typename T>
auto AttnScoresFor(const KernelTable& k) {
  return ForKvType<T>(k.attn_scores, k.attn_scores_f16, k.attn_scores_bf16);
}

template <typename T>
auto AttnAccumulateFor(const KernelTable& k) {
  return ForKvType<T>(k.attn_accumulate, k.attn_accumulate_f16, k.attn_accumulate_bf16);
}

// The table of `isa`; calling a kernel of an ISA that CpuHasIsa() rejects is undefined (SIGILL).
const KernelTable& KernelsFor(Isa isa);

namespace internal {
#if defined(__x86_64__)
// kernels_amx.cc: the kAmx table's two kernels (see KernelTable::gemm_amx_bf16). AmxPackX needs
// AVX-512 F/BW/VL only (it uses no tile instruction).
void AmxPackX(const float* x, int64_t n, int64_t k, int64_t row_begin, int64_t row_end,
              void* packed, int terms);
void AmxGemmBf16(const void* packed_x, int64_t n, int64_t k, int64_t x_begin, int64_t x_end,
                 const bf16_t* w, const float* bias, float* out, int64_t ldo, int64_t row_begin,
                 int64_t row_end, float* scratch, int terms);
// The tile kernel's w packing (amx_gemm_impl.h's PackWBf16, in AVX-512 registers), exposed for
// the test that holds it to the plain one; AVX-512 F/BW/VL only, no tile instruction.
void AmxPackW(const bf16_t* w, int64_t k, int64_t c0, int64_t nc, int64_t ctiles, int64_t s0,
              int64_t ns, uint32_t* tiles);
// KernelTable::attn_block_bf16 of the AMX table.
void AmxAttnBlockBf16(const AmxAttnBlock& block);
// kernels_avx512bf16.cc: KernelTable::pack_x_dpbf16 and gemm_dpbf16 (AVX512_BF16 on top of
// AVX-512 F/BW/VL).
void DpBf16PackX(const float* x, int64_t k, int64_t row_begin, int64_t row_end, void* packed,
                 int terms);
void DpBf16Gemm(const void* packed_x, int64_t k, int64_t x_begin, int64_t x_end, const bf16_t* w,
                const float* bias, float* out, int64_t ldo, int64_t row_begin, int64_t row_end,
                int terms);
// KernelTable::repack_dpbf16 and gemm_dpbf16_panels.
void DpBf16RepackW(const bf16_t* w, int64_t k, int64_t group_begin, int64_t group_end, void* dst);
void DpBf16PanelGemm(const void* packed_x, int64_t k, int64_t x_begin, int64_t x_end, const void* w,
                     const float* bias, float* out, int64_t ldo, int64_t row_begin, int64_t row_end,
                     int terms);
// KernelTable::gemm_bf16_panels.
void Bf16PanelFmaGemm(const float* x, int64_t k, int64_t x_begin, int64_t x_end, const void* w,
                      const float* bias, float* out, int64_t ldo, int64_t row_begin,
                      int64_t row_end);
#endif
// Defined, constant-initialised, in kernels_<isa>.cc; use KernelsFor().
extern const KernelTable kScalarKernelTable;
extern const KernelTable kAvx2KernelTable;
extern const KernelTable kAvx512KernelTable;
// kernels_avx512vnni.cc: only the quantized-weight Gemm entries (gemm_q8_0 .. gemm_q5_1_x16) are
// set; kernels.cc copies them over kAvx512KernelTable to make the kAvx512Vnni table.
extern const KernelTable kAvx512VnniQuantGemms;
// The Q4_K, Q5_K and Q6_K interleaved-copy Gemms the VNNI table takes on AMD family 1Ah (Zen 5)
// instead of its own (the same bits; the one-row tiles prefetch into L2 as the tiles of more rows
// do, kernels_avx512vnni.cc).
extern const KernelTable kFarPrefetchQuantGemms;
// The Q6_K and Q8_0 interleaved-copy Gemms the AMX table takes instead of the VNNI table's (the
// same bits; the one-row tiles prefetch as kernels_avx512vnni.cc says).
extern const KernelTable kAmxHostQuantGemms;
// The Q4_K and Q8_0 interleaved-copy Gemms on the AMX-INT8 tiles (amx_int8_impl.h; the same bits
// again), which the AMX table takes where the CPU has AMX-INT8.
extern const KernelTable kAmxInt8QuantGemms;
}  // namespace internal

// The DpBf16 layout of packed x: row r's terms one after the other, each DpBf16PackedK(k) bf16
// (k rounded up to whole pairs, the pad zero): term t of row r at (r * terms + t) * that.
constexpr int64_t DpBf16PackedK(int64_t k) { return (k + 1) / 2 * 2; }
constexpr size_t DpBf16PackedXBytes(int64_t n, int64_t k, int terms) {
  return static_cast<size_t>(n) * static_cast<size_t>(terms) *
         static_cast<size_t>(DpBf16PackedK(k)) * 2;
}

// The DpBf16 panel layout of a BF16 weight (KernelTable::repack_dpbf16; CpuBackend's
// PrepareGemmWeight copies where the table has no AMX, for gemm_dpbf16_panels at MatmulPrecision
// kMedium and gemm_bf16_panels above it): rows in groups of kDpBf16PanelRows, group g at
// g * DpBf16PanelGroupBytes(k), which is its rows' bytes in the file (so the copy is as large as
// the tensor, and a view of whole groups starts where TensorView::rows puts it); within a group,
// k slice c of kDpBf16PanelK elements (the last may be shorter) at c * kDpBf16PanelK * 64 bytes,
// as 32-bit words [q][j] (q < the slice's whole pairs, j < 32) = w[j, e], w[j, e + 1] with
// e = c * kDpBf16PanelK + 2 q (bf16, low half first). So one 64-byte line holds one k pair of 16
// rows, as vdpbf16ps takes them, and a group's panels are one ascending stream. Where k is odd,
// the last slice ends with one 64-byte line of the 32 rows' last elements (row j's at bf16 j).
inline constexpr int64_t kDpBf16PanelRows = 32;
inline constexpr int64_t kDpBf16PanelK = 512;
constexpr int64_t DpBf16PanelGroupBytes(int64_t k) { return kDpBf16PanelRows * 2 * k; }

// Sizes of the AMX Gemm's packed x (rows padded to 32, k to 32, up to three bf16 terms per element)
// and scratch (a 256 x 128 f32 staging block and 64 KiB of packed w).
constexpr int64_t AmxPackedRows(int64_t n) { return (n + 31) / 32 * 32; }
constexpr size_t AmxPackedXBytes(int64_t n, int64_t k) {
  return static_cast<size_t>(AmxPackedRows(n)) * static_cast<size_t>((k + 31) / 32 * 32) * 3 * 2;
}
inline constexpr int64_t kAmxScratchFloats = 256 * 512 + 32 * 8 * 256;

// The tile configuration of every AMX user (the tile Gemm, the benches' tile probe): palette 1,
// tiles 0-7 of 16 rows x 64 bytes. Constant data, not a buffer filled before the load: GCC 12's
// _tile_loadconfig tells the compiler that it reads 8 bytes, so the stores that fill the rest of
// a stack buffer may be dropped as dead (an all-zero row count then faults).
struct alignas(64) AmxTileConfig {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};
static_assert(sizeof(AmxTileConfig) == 64);
inline constexpr AmxTileConfig kAmxTileConfig = {
    1, 0, {}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};

// The AMX-INT8 Gemms' tile configuration (amx_int8_impl.h): palette 1; tiles 0-3 (C) 16 rows x
// 64 bytes (16 int32), tiles 4-5 (A) 16 rows x 32 bytes (one 32-element block of 16 x rows),
// tiles 6-7 (B) 8 rows x 64 bytes (one block of 16 weight rows, 4 levels per row and tile row).
inline constexpr AmxTileConfig kAmxInt8TileConfig = {
    1, 0, {}, {64, 64, 64, 64, 32, 32, 64, 64}, {16, 16, 16, 16, 16, 16, 8, 8}};

// The default of KernelTable::float_small_n_max: the float decode kernels up to this many x rows,
// the packed prefill kernels above, where a table has measured nothing better.
inline constexpr int64_t kGemmSmallNMax = 16;
// The AMX table's for BF16 weights (KernelTable::SmallNMax): Gemms of more x rows run on the
// tiles (GemmAmxBf16Decode up to 64 rows).
// On a Xeon with AMX (2 threads, TinyLlama shape, context 128) the tiles read the weights at
// 18-19 GB/s for every row count up to 16, where the AVX-512 decode kernel ran batch 1 and 4
// faster (10.5-11.1 and 41.3-41.6 tok/s against 8.9-9.4 and 37.2-37.4) and batch 8, 12 and 16
// slower (58-60, 64-69 and 76-78 tok/s against 72-73, 99-106 and 129-139). 8 keeps the
// row-invariant range (CpuBackend::MaxRowInvariantRows) wide enough for a one-row step and its
// drafts (docs/PERFORMANCE.md has the numbers).
inline constexpr int64_t kAmxSmallNMax = 8;

// The same for BF16 weights on gemm_dpbf16 (MatmulPrecision kMedium, CpuBackend::SmallNMax). On
// Zen 5 (2 threads, TinyLlama's matrices) the vdpbf16ps Gemm, which packs w in every call, read
// the weights at 20-25 GB/s for 4 to 16 x rows (24-34 at 16 once it prefetched the next block);
// the AVX-512 decode kernel at 47-65 (4 rows), 31 (8), 15-16 (16), 8-9 (32) and 4-5 (64).
inline constexpr int64_t kDpBf16SmallNMax = 8;

inline int64_t KernelTable::SmallNMax(DType dtype) const {
  return dtype == DType::kBF16 && gemm_amx_bf16 != nullptr ? kAmxSmallNMax : float_small_n_max;
}

// Decode/prefill threshold of the quantized-weight kernels: the row kernels up to this many x
// rows, the packed 8-row panels above. Measured (kernel_bench quant-compute, AVX2 and
// AVX-512 VNNI, Zen 4): from 8 rows on the panels cost 5-40% less per x row than the row kernels
// on every type (up to 1.8x at 16 rows); at 4 rows ahead on some types, behind on others; at 2
// the per-call packing still costs more than it saves. The bits are the same either way
// (quant_kernels_avx2_impl.h), so this moves only speed. Interleaved copies (the gemm_*_x16
// entries) have one kernel for every row count; for them the threshold only picks how CpuBackend
// splits the work between threads (weight rows, or 2-D tiles).
inline constexpr int64_t kQuantSmallNMax = 4;

// The interleaved Q4_K layout (KernelTable::gemm_q4_k_x16): weight rows in groups of
// kQ4KX16Rows, and per group and 256-element super-block c one 2304-byte unit (16 blocks' worth,
// so the copy is exactly as large as the GGUF tensor), at (group * (k / 256) + c) * 2304:
//   [0, 32)       d of rows 0..15 (f16); [32, 64) dmin of rows 0..15 (f16).
//   [64, 192)     byte 16 s + r: (sc[s] & 15) | (mn[s] & 15) << 4 of row r, sub-block s < 8.
//   [192, 256)    byte 16 q + r (q < 4): the top 2 bits of row r's sc[q] (bits 0-1), sc[q + 4]
//                 (2-3), mn[q] (4-5) and mn[q + 4] (6-7).
//   [256, 2304)   levels: 64-byte vector (p, j) (p < 4, j < 8) at 256 + 64 (8 p + j) holds, for
//                 row r < 16, bytes 4 r .. 4 r + 3 = qs[32 p + 4 j .. 32 p + 4 j + 3] of row r's
//                 block: low nibbles elements 4 j .. 4 j + 3 of sub-block 2 p, high nibbles those
//                 of sub-block 2 p + 1. One vector times 4 activation bytes broadcast to every
//                 32-bit lane (vpdpbusd) adds 4 products to each of 16 rows at once.
// So 16 rows' 6-bit scales and minimums of 4 sub-blocks unpack with a few 64-byte operations.
// The kernel reads the scales before the levels, so scales first keeps a row group's units one
// strictly ascending stream for the hardware prefetcher (with the scales last, decode from DRAM
// was slower: docs/PERFORMANCE.md).
inline constexpr int64_t kQ4KX16Rows = 16;
inline constexpr int64_t kQ4KX16UnitBytes = 2304;
// Writes row groups [group_begin, group_end) of the [m, k] Q4_K matrix `src` (GGUF layout; m a
// multiple of kQ4KX16Rows, k of 256) in the interleaved layout into `dst` (the whole tensor's
// copy, m * k / 256 * 144 bytes). Groups are independent, so callers may split them.
void RepackQ4_KX16(const void* src, int64_t k, int64_t group_begin, int64_t group_end, void* dst);

// The interleaved Q5_K layout (KernelTable::gemm_q5_k_x16): Q4_K's unit for the same super-block
// of the 16 rows (the low 4 bits of each level in its level vectors), with the fifth bits between
// its scales and its levels:
//   [0, 256)      d, dmin, scales and minimums as in Q4_K's unit.
//   [256, 768)    64-byte vector j (j < 8) at 256 + 64 j holds, for row r < 16, bytes
//                 4 r .. 4 r + 3 = qh[4 j .. 4 j + 3] of row r's block: bit s of each is the
//                 fifth bit of that element of sub-block s, so vector j serves the level vectors
//                 (p, j) of every p.
//   [768, 2816)   the level vectors of Q4_K's [256, 2304).
// 2816 bytes a unit, the 16 blocks' size. The fifth bits come before the levels, as the scales
// do, so that the kernel's first reads of a unit ascend (with them last, a one-row decode read
// 19 GB/s from DRAM against 2 threads' 55, Zen 4).
inline constexpr int64_t kQ5KX16UnitBytes = 2816;
void RepackQ5_KX16(const void* src, int64_t k, int64_t group_begin, int64_t group_end, void* dst);

// The interleaved Q6_K layout (KernelTable::gemm_q6_k_x16): weight rows in groups of kQ4KX16Rows,
// and per group and super-block c one 3360-byte unit (the 16 blocks' size) at
// (group * (k / 256) + c) * 3360. 3360 is 52.5 cache lines, so where the unit lies decides the
// order of its two parts, keeping the 52 lines of vectors aligned in a 64-byte aligned copy:
// a unit whose address has bit 5 clear holds its body at [0, 3328) and the 16 rows' d (f16) at
// [3328, 3360); a unit with bit 5 set holds d at [0, 32) and its body at [32, 3360). So two
// neighbouring units share the line of their d. The body is two halves of 1664 bytes, half h < 2
// for elements 128 h .. 128 h + 127, at 1664 h:
//   [0, 128)      byte 16 s + r: scales[8 h + s] of row r (int8), s < 8.
//   [128, 1152)   for j < 8, at 128 + 128 j: 64-byte vector (h, j) holding, for row r < 16, bytes
//                 4 r .. 4 r + 3 = qh[32 h + 4 j .. + 3] of row r's block; then vector (h, 0, j)
//                 holding ql[64 h + 4 j .. + 3] of each row.
//   [1152, 1664)  vector (h, 1, j) at 1152 + 64 j: ql[64 h + 32 + 4 j .. + 3] of each row.
// Vector (h, i, j) holds the low 4 bits of elements e = 128 h + 32 i + 4 j + t (low nibbles) and
// e + 64 (high nibbles), t < 4, whose high 2 bits are bits 2 i, 2 i + 1 and 2 i + 4, 2 i + 5 of
// vector (h, j)'s byte. The kernel takes i = 0 with the high bits beside it, then i = 1 (the high
// bits again, from L1), so its first reads of a unit ascend: with the high bits in one block
// before all the low bits, two streams 16 lines apart, one-row decode read 19 GB/s from DRAM.
inline constexpr int64_t kQ6KX16UnitBytes = 3360;
// Bytes of a Q6_K unit's body (where its d lies when the body comes first), and of its halves.
inline constexpr int64_t kQ6KX16BodyBytes = 3328;
inline constexpr int64_t kQ6KX16HalfBytes = 1664;
// Writes row groups [group_begin, group_end) of the [m, k] Q6_K matrix `src` in the interleaved
// layout into `dst` (the whole tensor's copy, m * k / 256 * 210 bytes, where it will be read:
// the layout depends on the address).
void RepackQ6_KX16(const void* src, int64_t k, int64_t group_begin, int64_t group_end, void* dst);
// Whether the Q6_K unit at `unit` holds its d first (bit 5 of the address set).
inline bool Q6KX16DFirst(const void* unit) { return (reinterpret_cast<uintptr_t>(unit) & 32) != 0; }

// The interleaved Q8_0 layout (KernelTable::gemm_q8_0_x16), on the same plan: weight rows in
// groups of kQ4KX16Rows, and per group and 64-element pair of blocks c (so k a multiple of 64)
// one 1088-byte unit (the 32 GGUF blocks' size) at (group * (k / 64) + c) * 1088:
//   [0, 32)       d of block 2 c of rows 0..15 (f16); [32, 64) d of block 2 c + 1.
//   [64, 1088)    levels: 64-byte vector (h, j) (h < 2, j < 8) at 64 + 64 (8 h + j) holds, for
//                 row r < 16, bytes 4 r .. 4 r + 3 = qs[4 j .. 4 j + 3] of row r's block 2 c + h,
//                 each as the level plus 128 (0..255, so vpdpbusd takes it as the unsigned
//                 operand; the kernel takes 128 times the activation block's sum back).
inline constexpr int64_t kQ8_0X16UnitBytes = 1088;
inline constexpr int64_t kQ8_0X16UnitElems = 64;
// Writes row groups [group_begin, group_end) of the [m, k] Q8_0 matrix `src` (m a multiple of
// kQ4KX16Rows, k of 64) in the interleaved layout into `dst` (m * k / 32 * 34 bytes).
void RepackQ8_0X16(const void* src, int64_t k, int64_t group_begin, int64_t group_end, void* dst);

// The interleaved layouts of the 32-element block types Q4_0, Q4_1, Q5_0 and Q5_1
// (KernelTable::gemm_q4_0_x16 .. gemm_q5_1_x16), on Q8_0's plan: weight rows in groups of
// kQ4KX16Rows, and per group and 64-element pair of blocks c (so k a multiple of 64) one unit of
// the 32 blocks' size (Q4X16UnitBytes: 576, 640, 704, 768) at (group * (k / 64) + c) * that:
//   [0, 32)       d of block 2 c of rows 0..15 (f16); [32, 64) d of block 2 c + 1.
//   [64, 128)     Q4_1 and Q5_1 only: m of block 2 c, then of block 2 c + 1, likewise.
//   then for h < 2 (block 2 c + h), in turn:
//     Q5_0 and Q5_1 only: one 64-byte vector of fifth bits, bytes 4 r .. 4 r + 3 for row r:
//                 bit j (j < 4) of byte t is the fifth bit of element 4 j + t, bit 4 + j that of
//                 element 16 + 4 j + t (qh regrouped, so that level vector j finds its bits at
//                 the same place in every byte);
//     four 64-byte level vectors j < 4: bytes 4 r .. 4 r + 3 = qs[4 j .. 4 j + 3] of row r's
//                 block, low nibbles elements 4 j .. 4 j + 3, high nibbles 16 + 4 j .. + 3.
// One vector times 4 broadcast activation bytes (vpdpbusd) adds 4 products to each of 16 rows.
inline constexpr int64_t kQ4X16UnitElems = 64;
// Which of the four types has m (Q4_1, Q5_1) and fifth bits (Q5_0, Q5_1); a unit's bytes before
// its blocks' parts (d, and m), each block's part (fifth bits and levels), and the whole unit.
constexpr bool Q4X16HasMin(DType t) { return t == DType::kQ4_1 || t == DType::kQ5_1; }
constexpr bool Q4X16HasFifthBits(DType t) { return t == DType::kQ5_0 || t == DType::kQ5_1; }
constexpr int64_t Q4X16HeadBytes(DType t) { return Q4X16HasMin(t) ? 128 : 64; }
constexpr int64_t Q4X16PartBytes(DType t) { return Q4X16HasFifthBits(t) ? 320 : 256; }
constexpr int64_t Q4X16UnitBytes(DType t) { return Q4X16HeadBytes(t) + 2 * Q4X16PartBytes(t); }
// Writes row groups [group_begin, group_end) of the [m, k] matrix `src` of `t` (Q4_0, Q4_1, Q5_0
// or Q5_1; m a multiple of kQ4KX16Rows, k of 64) in its interleaved layout into `dst` (the whole
// tensor's copy, its size).
void RepackQ4X16(DType t, const void* src, int64_t k, int64_t group_begin, int64_t group_end,
                 void* dst);

// Float weights of at most this many rows (MoD routers and predictors) take the decode kernels
// whatever the row count: they are too thin for the prefill kernels' packing to pay, and a row's
// bits then never depend on the rows beside it.
inline constexpr int64_t kGemmSkinnyRows = 64;

constexpr ActLayout ActLayoutFor(DType w, int64_t n, bool interleaved) {
  return (w == DType::kQ4_0 || w == DType::kQ4_1 || w == DType::kQ5_0 || w == DType::kQ5_1) &&
                 n <= kQuantSmallNMax && !interleaved
             ? ActLayout::kPairInterleaved
             : ActLayout::kNatural;
}

}  // namespace modserve::backend::cpu

#endif  // MODSERVE_ENGINE_BACKEND_CPU_KERNELS_H_
