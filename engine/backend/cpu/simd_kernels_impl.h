// ISA-generic kernel bodies, written once against a vector-traits class S and instantiated by each
// kernels_<isa>.cc. Deliberately no include guard and no includes: every ISA translation unit
// includes this INSIDE its own anonymous namespace, after defining S, so the instantiations get
// internal linkage and the linker can never fold an AVX-512 copy into code that runs elsewhere
// (the classic one-definition-rule trap of per-file -m flags). For the same reason this file uses
// no std:: templates and calls no inline functions from other headers.
//
// S provides: V (vector of kLanes floats), kLanes, kMr (micro-kernel rows), kSmallNx (x rows per
// small-n tile), Zero(), Set1(float), Load(const float*|const f16_t*|const bf16_t*) -> V,
// Fma(a, b, c) = a * b + c, Add, Sub, Mul, Div, Min, Max, Round (to nearest integer), Ldexp(p,
// n) = p * 2^n for integral n in [-126, 127], Store(float*, V), ReduceAdd(V), ReduceMax(V),
// ToF32(float|f16_t|bf16_t), FmaScalar(float a, b, c): a lane's Fma on one float (fused where
// Fma is), for the scalar tails of vector loops, which must round as the lanes do. (A plain
// `sum += a * b` there is fused or not as the compiler's vectoriser happens to treat each copy
// of the loop, which made a value's share depend on the length of the run it came in.) Optional:
// Transpose(V[kLanes]), a kLanes x kLanes transpose in registers (PackPanels; AVX2 and AVX-512 have
// it), LoadBf16Pairs (the BF16 decode kernel, GemmSmallN; AVX2 has it).

inline int64_t Min64(int64_t a, int64_t b) { return a < b ? a : b; }

// Converts count elements to f32 (exact for every input dtype).
template <class S, class W>
void ConvertRow(const W* src, int64_t count, float* dst) {
  int64_t i = 0;
  for (; i + S::kLanes <= count; i += S::kLanes) S::Store(dst + i, S::Load(src + i));
  for (; i < count; ++i) dst[i] = S::ToF32(src[i]);
}

template <class S>
void ToF32F16(const f16_t* src, int64_t count, float* dst) {
  ConvertRow<S>(src, count, dst);
}
template <class S>
void ToF32Bf16(const bf16_t* src, int64_t count, float* dst) {
  ConvertRow<S>(src, count, dst);
}

// ---- small n (decode): out[i, r0 + j] for NX x rows and NW weight rows over the whole k --------
// A tile's epilogue: each accumulator summed, the k past k_vec added one by one, and the bias.
template <class S, class W, int NX, int NW>
void SmallNTileStore(const typename S::V (&acc)[NX][NW], const float* x, int64_t k, int64_t k_vec,
                     const W* w, const float* bias, float* out, int64_t ldo, int64_t r0) {
  for (int i = 0; i < NX; ++i) {
    for (int j = 0; j < NW; ++j) {
      float sum = S::ReduceAdd(acc[i][j]);
      for (int64_t kk = k_vec; kk < k; ++kk) {
        sum = S::FmaScalar(x[i * k + kk], S::ToF32(w[j * k + kk]), sum);
      }
      if (bias != nullptr) sum += bias[r0 + j];
      out[i * ldo + r0 + j] = sum;
    }
  }
}

// NX * NW independent accumulators hide the FMA latency even at n = 1; each weight vector is
// converted once and used for all NX x rows, and the NW rows are 4 parallel DRAM streams.
template <class S, class W, int NX, int NW>
void SmallNTile(const float* x, int64_t k, const W* w, const float* bias, float* out, int64_t ldo,
                int64_t r0) {
  using V = typename S::V;
  V acc[NX][NW];
#pragma GCC unroll 16
  for (int i = 0; i < NX; ++i) {
#pragma GCC unroll 16
    for (int j = 0; j < NW; ++j) acc[i][j] = S::Zero();
  }
  const int64_t k_vec = k - k % S::kLanes;
  // Address of the next group's rows, which start right after this group's (rows are
  // contiguous). Integer arithmetic: on the last group it points past the matrix.
  const __UINTPTR_TYPE__ next =
      reinterpret_cast<__UINTPTR_TYPE__>(w) + static_cast<__UINTPTR_TYPE__>(NW * k * sizeof(W));
  const __UINTPTR_TYPE__ row_bytes = static_cast<__UINTPTR_TYPE__>(k * sizeof(W));
  for (int64_t kk = 0; kk < k_vec; kk += S::kLanes) {
    // Software prefetch of the next group, one line per row per 64 bytes consumed: each row is
    // its own stream of only k * sizeof(W) bytes (4 KiB for TinyLlama's BF16 rows), too short
    // for the hardware prefetcher to ramp up before the stream ends. Worth ~15-25% of decode
    // bandwidth on the 2-core VM (docs/PERFORMANCE.md). Prefetches never fault, so reaching past
    // the end of the matrix on the last group is harmless. Into L2 (prefetcht1), not L1: the next
    // group starts NW rows (16-90 KiB) ahead, and lines fetched into L1 that early pushed out the
    // x rows and the rows in use; on Zen 4 the L2 target made the BF16 decode Gemm 10-25% faster
    // from 1 to 16 x rows, and batch-4 decode end to end 1.4x.
    if (((kk * static_cast<int64_t>(sizeof(W))) & 63) == 0) {
#pragma GCC unroll 16
      for (int j = 0; j < NW; ++j) {
        __builtin_prefetch(reinterpret_cast<const void*>(next + j * row_bytes + kk * sizeof(W)), 0,
                           2);
      }
    }
    V wv[NW];
#pragma GCC unroll 16
    for (int j = 0; j < NW; ++j) wv[j] = S::Load(w + j * k + kk);
#pragma GCC unroll 16
    for (int i = 0; i < NX; ++i) {
      const V xv = S::Load(x + i * k + kk);
#pragma GCC unroll 16
      for (int j = 0; j < NW; ++j) acc[i][j] = S::Fma(xv, wv[j], acc[i][j]);
    }
  }
  SmallNTileStore<S, W, NX, NW>(acc, x, k, k_vec, w, bias, out, ldo, r0);
}

// NW weight rows starting at row r0, for every x row; the weight rows stay in L1/L2 across the
// x tiles, so DRAM sees them once.
template <class S, class W, int NW>
void SmallNRows(const float* x, int64_t n, int64_t k, const W* w, const float* bias, float* out,
                int64_t ldo, int64_t r0) {
  constexpr int kNx = S::kSmallNx;
  int64_t i = 0;
  for (; i + kNx <= n; i += kNx) {
    SmallNTile<S, W, kNx, NW>(x + i * k, k, w, bias, out + i * ldo, ldo, r0);
  }
  const int64_t rest = n - i;
  const float* xi = x + i * k;
  float* oi = out + i * ldo;
  // kSmallNx <= 4, so at most 3 rows remain.
  if (rest == 3) SmallNTile<S, W, 3, NW>(xi, k, w, bias, oi, ldo, r0);
  if (rest == 2) SmallNTile<S, W, 2, NW>(xi, k, w, bias, oi, ldo, r0);
  if (rest == 1) SmallNTile<S, W, 1, NW>(xi, k, w, bias, oi, ldo, r0);
}

// ---- small n, BF16 weights, where S loads bf16 in even/odd pairs ------------------------------
// S::LoadBf16Pairs(p, &even, &odd) reads 2 * kLanes bf16 with one load and returns elements
// 0, 2, 4, ... and 1, 3, 5, ... as f32 vectors: one shift and one mask, since a bf16 is the top
// half of an f32. That is one integer op per kLanes weights instead of the two (zero-extend,
// shift) of widening kLanes at a time, which on Zen 3 share the vector pipes with the FMAs: the
// decode Gemm with 2-32 x rows is bound by those ops, not by DRAM. x is de-interleaved to match,
// once per Gemm, by the table's prepare_x_bf16 (DeinterleaveRows).
template <class S>
void DeinterleaveRows(const float* x, int64_t n, int64_t k, float* xd) {
  constexpr int64_t kL = S::kLanes, kRun = 2 * kL;
  const int64_t k_vec = k - k % kRun;
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = x + i * k;
    float* di = xd + i * k;
    for (int64_t b = 0; b < k_vec; b += kRun) {
      for (int64_t t = 0; t < kL; ++t) {
        di[b + t] = xi[b + 2 * t];
        di[b + kL + t] = xi[b + 2 * t + 1];
      }
    }
    for (int64_t kk = k_vec; kk < k; ++kk) di[kk] = xi[kk];
  }
}

// SmallNTile for BF16 weights against de-interleaved x rows xd.
template <class S, int NX, int NW>
void SmallNTileBf16Pairs(const float* xd, int64_t k, const bf16_t* w, const float* bias,
                         float* out, int64_t ldo, int64_t r0) {
  using V = typename S::V;
  constexpr int64_t kRun = 2 * S::kLanes;
  V acc[NX][NW];
#pragma GCC unroll 16
  for (int i = 0; i < NX; ++i) {
#pragma GCC unroll 16
    for (int j = 0; j < NW; ++j) acc[i][j] = S::Zero();
  }
  const int64_t k_vec = k - k % kRun;
  // Software prefetch of the next group's rows into L2, as in SmallNTile.
  const __UINTPTR_TYPE__ next = reinterpret_cast<__UINTPTR_TYPE__>(w) +
                                static_cast<__UINTPTR_TYPE__>(NW * k * sizeof(bf16_t));
  const __UINTPTR_TYPE__ row_bytes = static_cast<__UINTPTR_TYPE__>(k * sizeof(bf16_t));
  for (int64_t kk = 0; kk < k_vec; kk += kRun) {
    if (((kk * static_cast<int64_t>(sizeof(bf16_t))) & 63) == 0) {
#pragma GCC unroll 16
      for (int j = 0; j < NW; ++j) {
        __builtin_prefetch(
            reinterpret_cast<const void*>(next + j * row_bytes + kk * sizeof(bf16_t)), 0, 2);
      }
    }
    V xe[NX], xo[NX];
#pragma GCC unroll 16
    for (int i = 0; i < NX; ++i) {
      xe[i] = S::Load(xd + i * k + kk);
      xo[i] = S::Load(xd + i * k + kk + S::kLanes);
    }
    // Each weight row's even half meets every x row before its odd half is made, so only two
    // weight vectors are live at a time beside the NX * NW accumulators.
#pragma GCC unroll 16
    for (int j = 0; j < NW; ++j) {
      V we, wo;
      S::LoadBf16Pairs(w + j * k + kk, &we, &wo);
#pragma GCC unroll 16
      for (int i = 0; i < NX; ++i) acc[i][j] = S::Fma(xe[i], we, acc[i][j]);
#pragma GCC unroll 16
      for (int i = 0; i < NX; ++i) acc[i][j] = S::Fma(xo[i], wo, acc[i][j]);
    }
  }
  SmallNTileStore<S, bf16_t, NX, NW>(acc, xd, k, k_vec, w, bias, out, ldo, r0);
}

template <class S, int NW>
void SmallNRowsBf16Pairs(const float* xd, int64_t n, int64_t k, const bf16_t* w, const float* bias,
                         float* out, int64_t ldo, int64_t r0) {
  constexpr int kNx = S::kSmallNx;
  static_assert(kNx == 2, "x tiles of 2 rows and a 1-row rest");
  int64_t i = 0;
  for (; i + kNx <= n; i += kNx) {
    SmallNTileBf16Pairs<S, kNx, NW>(xd + i * k, k, w, bias, out + i * ldo, ldo, r0);
  }
  if (i < n) SmallNTileBf16Pairs<S, 1, NW>(xd + i * k, k, w, bias, out + i * ldo, ldo, r0);
}

template <class S>
inline constexpr bool kHasBf16Pairs =
    requires(const bf16_t* p, typename S::V* v) { S::LoadBf16Pairs(p, v, v); };

template <class W>
inline constexpr bool kIsBf16 = false;
template <>
inline constexpr bool kIsBf16<bf16_t> = true;

template <class S, class W>
void GemmSmallN(const float* x, int64_t n, int64_t k, const W* w, const float* bias, float* out,
                int64_t ldo, int64_t row_begin, int64_t row_end) {
  if constexpr (kIsBf16<W> && kHasBf16Pairs<S>) {
    // x is the de-interleaved x (prepare_x_bf16).
    int64_t r = row_begin;
    for (; r + 4 <= row_end; r += 4) {
      SmallNRowsBf16Pairs<S, 4>(x, n, k, w + r * k, bias, out, ldo, r);
    }
    for (; r < row_end; ++r) SmallNRowsBf16Pairs<S, 1>(x, n, k, w + r * k, bias, out, ldo, r);
    return;
  }
  int64_t r = row_begin;
  if constexpr (S::kLanes >= 16) {
    // Batch-1 decode with 32 vector registers: 8 weight rows in flight keep more DRAM streams
    // open at once than 4 (8 accumulators + 8 weight vectors + x fit without spilling).
    if (n == 1) {
      for (; r + 8 <= row_end; r += 8) SmallNRows<S, W, 8>(x, n, k, w + r * k, bias, out, ldo, r);
    }
  }
  for (; r + 4 <= row_end; r += 4) SmallNRows<S, W, 4>(x, n, k, w + r * k, bias, out, ldo, r);
  for (; r < row_end; ++r) SmallNRows<S, W, 1>(x, n, k, w + r * k, bias, out, ldo, r);
}

// ---- large n (prefill): packed w panels and an kMr x (2 * kLanes) register-blocked kernel -------
// kKc: a [kKc, 2 * kLanes] f32 panel is 32 KiB for AVX-512, so it stays in L1 while kMr x rows
// stream past it; the kNcPanels panels of one block (128 KiB) sit in L2 and are reused by all x
// rows of the call, which amortises the conversion and transposition of w.
inline constexpr int64_t kKc = 256;
inline constexpr int64_t kNcPanels = 4;

// Panel p of `packed` is [kc, NR] f32: packed[p][kk][jj] = w[p * NR + jj, kk], zero past nc.
// Where S has a kLanes x kLanes transpose, whole groups of kLanes weight rows are converted kLanes
// k at a time and transposed in registers: the packing is a fixed cost of every prefill Gemm call
// (each task packs its w block for its x rows), and kLanes scalar stores per element row made it
// 2x (AVX2) to 4x (AVX-512) slower.
template <class S, class W>
void PackPanels(const W* w, int64_t ldw, int64_t nc, int64_t kc, float* packed) {
  constexpr int64_t kNr = 2 * S::kLanes;
  constexpr int kL = S::kLanes;
  const int64_t panels = (nc + kNr - 1) / kNr;
  int64_t j0 = 0;
  if constexpr (requires(typename S::V* r) { S::Transpose(r); }) {
    if (kc % kL == 0) {
      for (; j0 + kL <= nc; j0 += kL) {
        float* dst = packed + (j0 / kNr) * kc * kNr + j0 % kNr;
        for (int64_t kk = 0; kk < kc; kk += kL) {
          typename S::V r[kL];
#pragma GCC unroll 16
          for (int i = 0; i < kL; ++i) r[i] = S::Load(w + (j0 + i) * ldw + kk);
          S::Transpose(r);
#pragma GCC unroll 16
          for (int i = 0; i < kL; ++i) S::Store(dst + (kk + i) * kNr, r[i]);
        }
      }
    }
  }
  alignas(64) float row[kKc];
  for (int64_t j = j0; j < panels * kNr; ++j) {
    float* dst = packed + (j / kNr) * kc * kNr + j % kNr;
    if (j < nc) {
      ConvertRow<S>(w + j * ldw, kc, row);
      for (int64_t kk = 0; kk < kc; ++kk) dst[kk * kNr] = row[kk];
    } else {
      for (int64_t kk = 0; kk < kc; ++kk) dst[kk * kNr] = 0.0f;
    }
  }
}

// c[r, 0..nr) (+)= sum_kk a[r][kk] * b[kk, :] for r < mr. a holds kMr row pointers (rows past mr
// repeat a valid row so the loop body has no branches; their results are dropped). On the first
// k slice c is initialised with the bias (or zero) instead of being read.
template <class S>
void MicroKernel(const float* const* a, const float* b, int64_t kc, float* c, int64_t ldc, int mr,
                 int nr, bool first, const float* bias) {
  using V = typename S::V;
  constexpr int kMr = S::kMr;
  constexpr int kL = S::kLanes;
  V acc[kMr][2];
#pragma GCC unroll 16
  for (int r = 0; r < kMr; ++r) acc[r][0] = acc[r][1] = S::Zero();
  for (int64_t kk = 0; kk < kc; ++kk) {
    const V b0 = S::Load(b + kk * 2 * kL);
    const V b1 = S::Load(b + kk * 2 * kL + kL);
#pragma GCC unroll 16
    for (int r = 0; r < kMr; ++r) {
      const V av = S::Set1(a[r][kk]);
      acc[r][0] = S::Fma(av, b0, acc[r][0]);
      acc[r][1] = S::Fma(av, b1, acc[r][1]);
    }
  }
  if (nr == 2 * kL) {
    for (int r = 0; r < mr; ++r) {
      float* cr = c + r * ldc;
      V c0 = S::Zero(), c1 = S::Zero();
      if (!first) {
        c0 = S::Load(cr);
        c1 = S::Load(cr + kL);
      } else if (bias != nullptr) {
        c0 = S::Load(bias);
        c1 = S::Load(bias + kL);
      }
      S::Store(cr, S::Add(c0, acc[r][0]));
      S::Store(cr + kL, S::Add(c1, acc[r][1]));
    }
    return;
  }
  alignas(64) float tmp[2 * kL];
  for (int r = 0; r < mr; ++r) {
    float* cr = c + r * ldc;
    S::Store(tmp, acc[r][0]);
    S::Store(tmp + kL, acc[r][1]);
    for (int j = 0; j < nr; ++j) {
      const float base = !first ? cr[j] : (bias != nullptr ? bias[j] : 0.0f);
      cr[j] = base + tmp[j];
    }
  }
}

template <class S, class W>
void GemmLargeN(const float* x, int64_t x_begin, int64_t x_end, int64_t k, const W* w,
                const float* bias, float* out, int64_t ldo, int64_t row_begin, int64_t row_end) {
  constexpr int64_t kNr = 2 * S::kLanes;
  constexpr int kMr = S::kMr;
  alignas(64) float packed[kKc * kNr * kNcPanels];
  for (int64_t jb = row_begin; jb < row_end; jb += kNr * kNcPanels) {
    const int64_t nc = Min64(kNr * kNcPanels, row_end - jb);
    const int64_t panels = (nc + kNr - 1) / kNr;
    for (int64_t k0 = 0; k0 < k; k0 += kKc) {
      const int64_t kc = Min64(kKc, k - k0);
      PackPanels<S>(w + jb * k + k0, k, nc, kc, packed);
      for (int64_t i0 = x_begin; i0 < x_end; i0 += kMr) {
        const int mr = static_cast<int>(Min64(kMr, x_end - i0));
        const float* a[kMr];
        for (int r = 0; r < kMr; ++r) a[r] = x + (i0 + (r < mr ? r : mr - 1)) * k + k0;
        for (int64_t p = 0; p < panels; ++p) {
          const int nr = static_cast<int>(Min64(kNr, nc - p * kNr));
          MicroKernel<S>(a, packed + p * kc * kNr, kc, out + i0 * ldo + jb + p * kNr, ldo, mr, nr,
                         k0 == 0, bias != nullptr ? bias + jb + p * kNr : nullptr);
        }
      }
    }
  }
}

// ---- attention tiles ------------------------------------------------------------------------
// Keys and values are read straight from the KV pages in their storage type K (f32, f16 or
// bf16), converted in registers: no f32 copy of the tile is written and read back.

template <int N>
struct Heads {};

// The q heads of a group in blocks: f(Heads<kMax>{}, g) for each whole block of kMax heads from
// head g, then f(Heads<r>{}, g) once for the r < kMax heads left, so every block's kernel has its
// head count at compile time and loads each key or value vector once for the whole block.
template <int kMax, class F>
[[gnu::always_inline]] inline void ForHeadBlocks(int64_t num_q, F&& f) {
  static_assert(kMax == 2 || kMax == 4);
  int64_t g = 0;
  for (; g + kMax <= num_q; g += kMax) f(Heads<kMax>{}, g);
  switch (num_q - g) {
    case 3:
      if constexpr (kMax > 3) f(Heads<3>{}, g);
      break;
    case 2:
      if constexpr (kMax > 2) f(Heads<2>{}, g);
      break;
    case 1:
      f(Heads<1>{}, g);
      break;
    default:
      break;
  }
}

// Scores of HB heads for a block of S::kLanes keys, one vector per head whose lane t is key t's
// score. Each key's dot product is first summed along head_dim lane-wise (an FMA per vector of
// head_dim), then the kLanes per-key vectors are folded into one by a tree of pairwise shuffles
// and adds (S::FoldLanes): a block costs log2(kLanes) levels of folding per head instead of a
// horizontal sum per key. Every key's lanes are added in the same order wherever it sits in the
// block, and keys at or past `valid` are not read (their lanes are zero), so a key's score does
// not depend on its neighbours or on where its run starts.
template <class S, class K, int HB, int N>
[[gnu::always_inline]] inline void AttnScoresTree(const float* q, int64_t head_dim, int64_t d_vec,
                                                  const K* keys, int64_t valid,
                                                  typename S::V* out) {
  using V = typename S::V;
  if constexpr (N == 1) {
#pragma GCC unroll 8
    for (int h = 0; h < HB; ++h) out[h] = S::Zero();
    if (valid <= 0) return;
    for (int64_t d = 0; d < d_vec; d += S::kLanes) {
      const V kv = S::Load(keys + d);
#pragma GCC unroll 8
      for (int h = 0; h < HB; ++h) out[h] = S::Fma(S::Load(q + h * head_dim + d), kv, out[h]);
    }
  } else {
    V lo[HB], hi[HB];
    AttnScoresTree<S, K, HB, N / 2>(q, head_dim, d_vec, keys, valid, lo);
    AttnScoresTree<S, K, HB, N / 2>(q, head_dim, d_vec, keys + N / 2 * head_dim, valid - N / 2, hi);
#pragma GCC unroll 8
    for (int h = 0; h < HB; ++h) out[h] = S::template FoldLanes<N>(lo[h], hi[h]);
  }
}

template <class S, class K, int HB>
void AttnScoresHeadsRun(const float* q, int64_t num_keys, int64_t head_dim, const K* keys,
                        float scale, float* scores, int64_t ld_scores, AttnPrefetch* prefetch,
                        int64_t per_step) {
  using V = typename S::V;
  constexpr int kL = S::kLanes;
  const int64_t d_vec = head_dim - head_dim % kL;
  const V vscale = S::Set1(scale);
  for (int64_t t0 = 0; t0 < num_keys; t0 += kL) {
    if (per_step > 0) prefetch->Issue(per_step);
    const int64_t valid = Min64(kL, num_keys - t0);
    const K* kb = keys + t0 * head_dim;
    V s[HB];
    AttnScoresTree<S, K, HB, kL>(q, head_dim, d_vec, kb, valid, s);
    if (valid == kL && d_vec == head_dim) {
#pragma GCC unroll 8
      for (int h = 0; h < HB; ++h) S::Store(scores + h * ld_scores + t0, S::Mul(s[h], vscale));
      continue;
    }
    // A partial block, or a head_dim that is not a whole number of vectors: the leftover
    // elements of each key are added to its folded sum before the scale.
    for (int h = 0; h < HB; ++h) {
      alignas(64) float lane[kL];
      S::Store(lane, s[h]);
      for (int64_t t = 0; t < valid; ++t) {
        float sum = lane[t];
        for (int64_t d = d_vec; d < head_dim; ++d) {
          sum = S::FmaScalar(q[h * head_dim + d], S::ToF32(kb[t * head_dim + d]), sum);
        }
        scores[h * ld_scores + t0 + t] = sum * scale;
      }
    }
  }
}

// The runs of a call (AttnScores): run r's run_len[r] keys from runs[r] + offset, scores from
// column sum(run_len[0..r)).
template <class K>
struct KeyRuns {
  const K* const* runs;
  const int64_t* run_len;
  int64_t num_runs;
  int64_t offset;
};

template <class S, class K, int HB>
void AttnScoresHeads(const float* q, const KeyRuns<K>& kr, int64_t head_dim, float scale,
                     float* scores_all, int64_t ld_scores, AttnPrefetch* prefetch,
                     int64_t per_step) {
  for (int64_t r = 0, base = 0; r < kr.num_runs; base += kr.run_len[r++]) {
    AttnScoresHeadsRun<S, K, HB>(q, kr.run_len[r], head_dim, kr.runs[r] + kr.offset, scale,
                                 scores_all + base, ld_scores, prefetch, per_step);
  }
}

// AttnScoresTree for a head_dim of D vectors known at compile time, with the HB heads' q held in
// registers across the keys (HB * D <= 16 of AVX-512's 32): the loads left are the keys' own.
// Same sums in the same order as AttnScoresTree.
template <class S, class K, int HB, int D, int N>
[[gnu::always_inline]] inline void AttnScoresTreeQ(const typename S::V (&qr)[HB][D], const K* keys,
                                                   int64_t valid, typename S::V* out) {
  using V = typename S::V;
  if constexpr (N == 1) {
    if (valid <= 0) {
#pragma GCC unroll 8
      for (int h = 0; h < HB; ++h) out[h] = S::Zero();
      return;
    }
    V kv[D];
#pragma GCC unroll 16
    for (int d = 0; d < D; ++d) kv[d] = S::Load(keys + d * S::kLanes);
#pragma GCC unroll 8
    for (int h = 0; h < HB; ++h) {
      V a = S::Fma(qr[h][0], kv[0], S::Zero());
#pragma GCC unroll 16
      for (int d = 1; d < D; ++d) a = S::Fma(qr[h][d], kv[d], a);
      out[h] = a;
    }
  } else {
    V lo[HB], hi[HB];
    AttnScoresTreeQ<S, K, HB, D, N / 2>(qr, keys, valid, lo);
    AttnScoresTreeQ<S, K, HB, D, N / 2>(qr, keys + N / 2 * D * S::kLanes, valid - N / 2, hi);
#pragma GCC unroll 8
    for (int h = 0; h < HB; ++h) out[h] = S::template FoldLanes<N>(lo[h], hi[h]);
  }
}

// The HB heads' q stay in registers across every run of the call; each run's keys go in blocks
// of kLanes from its first key, as they would in a call of their own.
template <class S, class K, int HB, int D>
void AttnScoresHeadsQ(const float* q, const KeyRuns<K>& kr, float scale, float* scores_all,
                      int64_t ld_scores, AttnPrefetch* prefetch, int64_t per_step) {
  using V = typename S::V;
  constexpr int kL = S::kLanes;
  V qr[HB][D];
#pragma GCC unroll 8
  for (int h = 0; h < HB; ++h) {
#pragma GCC unroll 16
    for (int d = 0; d < D; ++d) qr[h][d] = S::Load(q + (h * D + d) * kL);
  }
  const V vscale = S::Set1(scale);
  for (int64_t r = 0, base = 0; r < kr.num_runs; base += kr.run_len[r++]) {
    const K* keys = kr.runs[r] + kr.offset;
    const int64_t num_keys = kr.run_len[r];
    float* scores = scores_all + base;
    for (int64_t t0 = 0; t0 < num_keys; t0 += kL) {
      if (per_step > 0) prefetch->Issue(per_step);
      const int64_t valid = Min64(kL, num_keys - t0);
      V s[HB];
      AttnScoresTreeQ<S, K, HB, D, kL>(qr, keys + t0 * D * kL, valid, s);
#pragma GCC unroll 8
      for (int h = 0; h < HB; ++h) {
        if (valid == kL) {
          S::Store(scores + h * ld_scores + t0, S::Mul(s[h], vscale));
        } else {
          alignas(64) float lane[kL];
          S::Store(lane, S::Mul(s[h], vscale));
          for (int64_t t = 0; t < valid; ++t) scores[h * ld_scores + t0 + t] = lane[t];
        }
      }
    }
  }
}

// Heads in blocks of 16 / D, whose q fill 16 registers.
template <class S, class K, int D>
void AttnScoresQ(const float* q, int64_t num_q, const KeyRuns<K>& kr, float scale, float* scores,
                 int64_t ld_scores, AttnPrefetch* prefetch, int64_t per_step) {
  constexpr int64_t hd = D * S::kLanes;
  ForHeadBlocks<16 / D>(num_q, [&]<int HB>(Heads<HB>, int64_t g) {
    AttnScoresHeadsQ<S, K, HB, D>(q + g * hd, kr, scale, scores + g * ld_scores, ld_scores,
                                  prefetch, per_step);
  });
}

// Blocks of up to 4 heads: each key vector is loaded and converted once per block. With 16-lane
// vectors and a head_dim of 64 or 128, AttnScoresQ (q in registers). The prefetches are spread
// over the blocks of kLanes keys of every head block.
template <class S, class K>
void AttnScores(const float* q, int64_t num_q, const K* const* runs, const int64_t* run_len,
                int64_t num_runs, int64_t offset, int64_t head_dim, float scale, float* scores,
                int64_t ld_scores, AttnPrefetch* prefetch) {
  const KeyRuns<K> kr{.runs = runs, .run_len = run_len, .num_runs = num_runs, .offset = offset};
  int64_t key_blocks = 0;
  for (int64_t r = 0; r < num_runs; ++r) key_blocks += (run_len[r] + S::kLanes - 1) / S::kLanes;
  auto per_step = [&](int64_t max_heads) {
    return prefetch != nullptr ? prefetch->PerStep((num_q + max_heads - 1) / max_heads * key_blocks)
                               : 0;
  };
  if constexpr (S::kLanes == 16) {
    if (head_dim == 64) {
      AttnScoresQ<S, K, 4>(q, num_q, kr, scale, scores, ld_scores, prefetch, per_step(4));
      if (prefetch != nullptr) prefetch->IssueRest();
      return;
    }
    if (head_dim == 128) {
      AttnScoresQ<S, K, 8>(q, num_q, kr, scale, scores, ld_scores, prefetch, per_step(2));
      if (prefetch != nullptr) prefetch->IssueRest();
      return;
    }
  }
  const int64_t step = per_step(4);
  ForHeadBlocks<4>(num_q, [&]<int HB>(Heads<HB>, int64_t g) {
    AttnScoresHeads<S, K, HB>(q + g * head_dim, kr, head_dim, scale, scores + g * ld_scores,
                              ld_scores, prefetch, step);
  });
  if (prefetch != nullptr) prefetch->IssueRest();
}

#include "engine/backend/cpu/vec_exp_impl.h"

// One key tile of the online softmax of HB heads, head h's scores at s + h * ld_s:
// m' = max(m, max_t s[t]); s[t] = e^(s[t] - m'); l = l * e^(m - m') + sum_t s[t]; m = m';
// rescale = e^(m - m'), 0 on the first tile (m = -inf). The heads' passes are interleaved, so
// their chains of dependent operations (the reductions, the scalar exp) overlap instead of
// following one another; each head's operations and their order are those of a call of its own.
template <class S, int HB>
[[gnu::always_inline]] inline void AttnSoftmaxHeadsBlock(float* s, int64_t ld_s, int64_t n,
                                                         float* m, float* l, float* rescale) {
  using V = typename S::V;
  const int64_t n_vec = n - n % S::kLanes;
  float tile_max[HB];
  if (n_vec > 0) {
    V vmax[HB];
#pragma GCC unroll 4
    for (int h = 0; h < HB; ++h) vmax[h] = S::Load(s + h * ld_s);
    for (int64_t t = S::kLanes; t < n_vec; t += S::kLanes) {
#pragma GCC unroll 4
      for (int h = 0; h < HB; ++h) vmax[h] = S::Max(vmax[h], S::Load(s + h * ld_s + t));
    }
#pragma GCC unroll 4
    for (int h = 0; h < HB; ++h) tile_max[h] = S::ReduceMax(vmax[h]);
  } else {
#pragma GCC unroll 4
    for (int h = 0; h < HB; ++h) tile_max[h] = -__builtin_inff();
  }
  V vm[HB], vsum[HB];
#pragma GCC unroll 4
  for (int h = 0; h < HB; ++h) {
    const float* sh = s + h * ld_s;
    for (int64_t t = n_vec; t < n; ++t) tile_max[h] = sh[t] > tile_max[h] ? sh[t] : tile_max[h];
    const float m_new = m[h] > tile_max[h] ? m[h] : tile_max[h];
    rescale[h] = __builtin_expf(m[h] - m_new);
    m[h] = m_new;
    vm[h] = S::Set1(m_new);
    vsum[h] = S::Zero();
  }
  for (int64_t t = 0; t < n_vec; t += S::kLanes) {
#pragma GCC unroll 4
    for (int h = 0; h < HB; ++h) {
      const V e = VecExp<S>(S::Sub(S::Load(s + h * ld_s + t), vm[h]));
      S::Store(s + h * ld_s + t, e);
      vsum[h] = S::Add(vsum[h], e);
    }
  }
#pragma GCC unroll 4
  for (int h = 0; h < HB; ++h) {
    float* sh = s + h * ld_s;
    float sum = S::ReduceAdd(vsum[h]);
    for (int64_t t = n_vec; t < n; ++t) {
      sh[t] = __builtin_expf(sh[t] - m[h]);
      sum += sh[t];
    }
    l[h] = l[h] * rescale[h] + sum;
  }
}

template <class S>
void AttnSoftmaxHeads(float* s, int64_t ld_s, int64_t num_heads, int64_t n, float* m, float* l,
                      float* rescale) {
  ForHeadBlocks<4>(num_heads, [&]<int HB>(Heads<HB>, int64_t g) {
    AttnSoftmaxHeadsBlock<S, HB>(s + g * ld_s, ld_s, n, m + g, l + g, rescale + g);
  });
}

// ---- SwiGLU and SiLU ---------------------------------------------------------------------------
// out[i] = f(in[0][i], ..., in[N - 1][i]) a vector at a time; out may alias any input. The last
// n % kLanes elements go through the same f from a zero-padded copy, so an element's bits do not
// depend on where a call or a chunk of it begins (the ops stay row-invariant).
template <class S, int N, class F>
[[gnu::always_inline]] inline void MapVectors(const float* const (&in)[N], float* out, int64_t n,
                                              F&& f) {
  using V = typename S::V;
  constexpr int64_t kL = S::kLanes;
  int64_t i = 0;
  for (; i + kL <= n; i += kL) {
    V v[N];
#pragma GCC unroll 4
    for (int a = 0; a < N; ++a) v[a] = S::Load(in[a] + i);
    S::Store(out + i, f(v));
  }
  if (i == n) return;
  alignas(64) float pad[N][kL] = {}, res[kL];
  V v[N];
  for (int a = 0; a < N; ++a) {
    for (int64_t t = 0; t < n - i; ++t) pad[a][t] = in[a][i + t];
    v[a] = S::Load(pad[a]);
  }
  S::Store(res, f(v));
  for (int64_t t = 0; t < n - i; ++t) out[i + t] = res[t];
}

// silu(g) = g * sigmoid(g) = g / (1 + e^-g), with VecExp (within 2 ulp of exp).
template <class S>
typename S::V Silu(typename S::V g) {
  return S::Div(g, S::Add(S::Set1(1.0f), VecExp<S>(S::Sub(S::Zero(), g))));
}

template <class S>
void SwiGluKernel(const float* gate, const float* up, float* out, int64_t n) {
  MapVectors<S, 2>({gate, up}, out, n,
                   [](const typename S::V* v) { return S::Mul(Silu<S>(v[0]), v[1]); });
}

template <class S>
void SiluKernel(float* x, int64_t n) {
  MapVectors<S, 1>({x}, x, n, [](const typename S::V* v) { return Silu<S>(v[0]); });
}

// AttnAccumulate's prefetch steps: one per this many keys of a run.
constexpr int64_t kAttnPrefetchKeys = 4;

// HB heads x DC vectors of head_dim (from d0) of AttnAccumulate, all in registers across the
// keys of every run: each value vector is loaded once for the HB heads, each probability once for
// DC vectors, and acc is read and written once per call however many pages the keys span.
template <class S, class K, int HB, int DC>
void AttnAccumulateBlock(const float* probs, int64_t ld_probs, const K* const* runs,
                         const int64_t* run_len, int64_t num_runs, int64_t offset, int64_t head_dim,
                         int64_t d0, const float* rescale, float* acc, AttnPrefetch* prefetch,
                         int64_t per_step) {
  using V = typename S::V;
  V a[HB][DC];
#pragma GCC unroll 8
  for (int h = 0; h < HB; ++h) {
    const V rv = S::Set1(rescale[h]);
#pragma GCC unroll 8
    for (int c = 0; c < DC; ++c) {
      a[h][c] = S::Mul(S::Load(acc + h * head_dim + d0 + c * S::kLanes), rv);
    }
  }
  // The cursor in locals (registers) for the loop, and back at the end.
  AttnPrefetch pf;
  if (per_step > 0) pf = *prefetch;
  const float* p = probs;
  for (int64_t r = 0; r < num_runs; ++r) {
    const K* values = runs[r] + offset + d0;
    for (int64_t t0 = 0; t0 < run_len[r]; t0 += kAttnPrefetchKeys) {
      if (per_step > 0) pf.Issue(per_step);
      const int64_t t_end = Min64(t0 + kAttnPrefetchKeys, run_len[r]);
      for (int64_t t = t0; t < t_end; ++t) {
        V v[DC];
#pragma GCC unroll 8
        for (int c = 0; c < DC; ++c) v[c] = S::Load(values + t * head_dim + c * S::kLanes);
#pragma GCC unroll 8
        for (int h = 0; h < HB; ++h) {
          const V pv = S::Set1(p[h * ld_probs + t]);
#pragma GCC unroll 8
          for (int c = 0; c < DC; ++c) a[h][c] = S::Fma(pv, v[c], a[h][c]);
        }
      }
    }
    p += run_len[r];
  }
  if (per_step > 0) *prefetch = pf;
#pragma GCC unroll 8
  for (int h = 0; h < HB; ++h) {
#pragma GCC unroll 8
    for (int c = 0; c < DC; ++c) S::Store(acc + h * head_dim + d0 + c * S::kLanes, a[h][c]);
  }
}

template <class S, class K, int HB>
void AttnAccumulateHeads(const float* probs, int64_t ld_probs, const K* const* runs,
                         const int64_t* run_len, int64_t num_runs, int64_t offset, int64_t head_dim,
                         int64_t d_vec, const float* rescale, float* acc, AttnPrefetch* prefetch,
                         int64_t per_step) {
  int64_t d = 0;
  // Four vectors of head_dim per pass where 4 * HB accumulators fit the register file (AVX-512's
  // 32; AVX2's 16 hold two): each value row is then read in one pass, both its cache lines.
  if constexpr (S::kLanes >= 16) {
    for (; d + 4 * S::kLanes <= d_vec; d += 4 * S::kLanes) {
      AttnAccumulateBlock<S, K, HB, 4>(probs, ld_probs, runs, run_len, num_runs, offset, head_dim,
                                       d, rescale, acc, prefetch, per_step);
    }
  }
  for (; d + 2 * S::kLanes <= d_vec; d += 2 * S::kLanes) {
    AttnAccumulateBlock<S, K, HB, 2>(probs, ld_probs, runs, run_len, num_runs, offset, head_dim, d,
                                     rescale, acc, prefetch, per_step);
  }
  for (; d < d_vec; d += S::kLanes) {
    AttnAccumulateBlock<S, K, HB, 1>(probs, ld_probs, runs, run_len, num_runs, offset, head_dim, d,
                                     rescale, acc, prefetch, per_step);
  }
}

// The passes AttnAccumulateHeads makes over the keys for d_vec elements of head_dim.
template <class S>
int64_t AttnAccumulatePasses(int64_t d_vec) {
  constexpr int64_t kL = S::kLanes;
  const int64_t wide = kL >= 16 ? d_vec / (4 * kL) : 0;
  const int64_t left = d_vec - wide * 4 * kL;
  return wide + left / (2 * kL) + left % (2 * kL) / kL;
}

template <class S, class K>
void AttnAccumulate(const float* probs, int64_t ld_probs, int64_t num_q, const K* const* runs,
                    const int64_t* run_len, int64_t num_runs, int64_t offset, int64_t head_dim,
                    const float* rescale, float* acc, AttnPrefetch* prefetch) {
  const int64_t d_vec = head_dim - head_dim % S::kLanes;
  // The prefetches are spread over the steps (kAttnPrefetchKeys keys of a run) of every pass of
  // every head block.
  int64_t per_step = 0;
  if (prefetch != nullptr) {
    int64_t steps = 0;
    for (int64_t r = 0; r < num_runs; ++r) {
      steps += (run_len[r] + kAttnPrefetchKeys - 1) / kAttnPrefetchKeys;
    }
    per_step = prefetch->PerStep((num_q + 3) / 4 * AttnAccumulatePasses<S>(d_vec) * steps);
  }
  // The group's heads in blocks of up to 4, so each value vector is loaded once per block.
  ForHeadBlocks<4>(num_q, [&]<int HB>(Heads<HB>, int64_t g) {
    AttnAccumulateHeads<S, K, HB>(probs + g * ld_probs, ld_probs, runs, run_len, num_runs, offset,
                                  head_dim, d_vec, rescale + g, acc + g * head_dim, prefetch,
                                  per_step);
  });
  if (prefetch != nullptr) prefetch->IssueRest();
  if (d_vec == head_dim) return;
  for (int64_t g = 0; g < num_q; ++g) {
    const float* pg = probs + g * ld_probs;
    float* ag = acc + g * head_dim;
    for (int64_t d = d_vec; d < head_dim; ++d) {
      float a = ag[d] * rescale[g];
      int64_t t0 = 0;
      for (int64_t r = 0; r < num_runs; ++r) {
        const K* values = runs[r] + offset;
        for (int64_t t = 0; t < run_len[r]; ++t) {
          a = S::FmaScalar(pg[t0 + t], S::ToF32(values[t * head_dim + d]), a);
        }
        t0 += run_len[r];
      }
      ag[d] = a;
    }
  }
}

// constexpr so each ISA's table is constant-initialised: no code of that ISA runs at start-up.
// S::kFloatSmallNMax where the traits set it (a measured crossover), else kGemmSmallNMax.
template <class S>
constexpr int64_t FloatSmallNMax() {
  if constexpr (requires { S::kFloatSmallNMax; }) {
    return S::kFloatSmallNMax;
  } else {
    return kGemmSmallNMax;
  }
}

template <class S>
constexpr void (*PrepareXBf16())(const float*, int64_t, int64_t, float*) {
  if constexpr (kHasBf16Pairs<S>) {
    return &DeinterleaveRows<S>;
  } else {
    return nullptr;
  }
}

template <class S>
constexpr KernelTable MakeKernelTable(Isa isa) {
  return KernelTable{
      .isa = isa,
      .float_small_n_max = FloatSmallNMax<S>(),
      .gemm_small_f32 = &GemmSmallN<S, float>,
      .gemm_small_f16 = &GemmSmallN<S, f16_t>,
      .gemm_small_bf16 = &GemmSmallN<S, bf16_t>,
      .prepare_x_bf16 = PrepareXBf16<S>(),
      .gemm_large_f32 = &GemmLargeN<S, float>,
      .gemm_large_f16 = &GemmLargeN<S, f16_t>,
      .gemm_large_bf16 = &GemmLargeN<S, bf16_t>,
      .to_f32_f16 = &ToF32F16<S>,
      .to_f32_bf16 = &ToF32Bf16<S>,
      .attn_scores = &AttnScores<S, float>,
      .attn_scores_f16 = &AttnScores<S, f16_t>,
      .attn_scores_bf16 = &AttnScores<S, bf16_t>,
      .attn_softmax = &AttnSoftmaxHeads<S>,
      .attn_accumulate = &AttnAccumulate<S, float>,
      .attn_accumulate_f16 = &AttnAccumulate<S, f16_t>,
      .attn_accumulate_bf16 = &AttnAccumulate<S, bf16_t>,
      .swiglu = &SwiGluKernel<S>,
      .silu = &SiluKernel<S>,
  };
}
