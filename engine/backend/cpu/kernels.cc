// Run-time ISA detection, the choice of kernel table, and the weight repacking some tables read;
// compiled with baseline flags so that it is safe to run on any x86-64 (or non-x86) CPU.
#include "engine/backend/cpu/kernels.h"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

#include "engine/common/logging.h"
#include "engine/common/quant.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>
#endif

namespace modserve::backend::cpu {

std::string_view IsaName(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAvx512Vnni:
      return "avx512vnni";
    case Isa::kAmx:
      return "amx";
  }
  return "?";
}

#if defined(__x86_64__)
namespace {
constexpr unsigned kCpuidAmxBf16 = 1u << 22;  // leaf 7, subleaf 0, EDX
constexpr unsigned kCpuidAmxTile = 1u << 24;
constexpr unsigned kCpuidAmxInt8 = 1u << 25;
constexpr unsigned kCpuidOsxsave = 1u << 27;  // leaf 1, ECX
constexpr uint64_t kXcr0TileState = (uint64_t{1} << 17) | (uint64_t{1} << 18);  // XTILECFG, DATA
constexpr int kArchReqXcompPerm = 0x1023;
constexpr int kXfeatureXtiledata = 18;

uint64_t Xcr0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

sigjmp_buf probe_jump;
void OnProbeSigill(int) { siglongjmp(probe_jump, 1); }

// Runs f() with SIGILL caught (a hypervisor that advertises AMX but does not run it); true when
// it was raised. The handler is the previous one again afterwards.
template <class F>
bool RaisesSigill(F f) {
  struct sigaction action = {}, previous = {};
  action.sa_handler = OnProbeSigill;
  sigemptyset(&action.sa_mask);
  sigaction(SIGILL, &action, &previous);
  const bool faulted = sigsetjmp(probe_jump, 1) != 0;
  if (!faulted) f();
  sigaction(SIGILL, &previous, nullptr);
  return faulted;
}

// A 40 x 70 x 50 Gemm with all three terms of x (every padding path: rows, columns and k past a
// tile) on the unit against a double-precision sum. Returns "" or what went wrong. An illegal
// instruction (a hypervisor that advertises AMX but does not run it) is caught and reported instead
// of killing the process.
std::string SelfTest() {
  constexpr int64_t n = 40, k = 70, m = 50;
  std::vector<float> x(n * k), out(n * m, 0.0f), bias(m);
  std::vector<bf16_t> w(m * k);
  uint32_t state = 12345;
  auto next = [&] {
    state = state * 1664525u + 1013904223u;
    return static_cast<float>(static_cast<int32_t>(state >> 8) - (1 << 23)) / (1 << 23);
  };
  for (float& v : x) v = next();
  for (bf16_t& v : w) v = F32ToBf16(next());
  for (float& v : bias) v = next();
  std::vector<uint16_t> packed(AmxPackedXBytes(n, k) / 2);
  std::vector<float> scratch(kAmxScratchFloats);

  if (RaisesSigill([&] {
        internal::AmxPackX(x.data(), n, k, 0, AmxPackedRows(n), packed.data(), 3);
        internal::AmxGemmBf16(packed.data(), n, k, 0, n, w.data(), bias.data(), out.data(), m, 0, m,
                              scratch.data(), 3);
      })) {
    return "a tile instruction raised SIGILL (AMX advertised but not usable here)";
  }

  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < m; ++j) {
      double want = bias[j], magnitude = std::fabs(bias[j]);
      for (int64_t kk = 0; kk < k; ++kk) {
        const double p = static_cast<double>(x[i * k + kk]) * Bf16ToF32(w[j * k + kk]);
        want += p;
        magnitude += std::fabs(p);
      }
      const double got = out[i * m + j];
      if (!(std::fabs(got - want) <= 1e-5 * magnitude + 1e-30)) {
        return "the self-test Gemm on the unit gave " + std::to_string(got) + " for " +
               std::to_string(want) + " at [" + std::to_string(i) + ", " + std::to_string(j) +
               "]";
      }
    }
  }
  return "";
}

std::string Probe() {
  if (const char* off = std::getenv("MODSERVE_DISABLE_AMX"); off != nullptr && off[0] == '1') {
    return "disabled by MODSERVE_DISABLE_AMX=1";
  }
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || (ecx & kCpuidOsxsave) == 0) {
    return "the OS does not enable XSAVE";
  }
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) || (edx & kCpuidAmxTile) == 0 ||
      (edx & kCpuidAmxBf16) == 0) {
    return "the CPU has no AMX-BF16";
  }
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
      !__builtin_cpu_supports("avx512vl")) {
    return "the CPU has AMX but not AVX-512 F/BW/VL";
  }
  if ((Xcr0() & kXcr0TileState) != kXcr0TileState) return "the OS does not enable the tile state";
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) {
    return "the kernel refused the tile permission (arch_prctl ARCH_REQ_XCOMP_PERM: " +
           std::string(std::strerror(errno)) + ")";
  }
  return SelfTest();
}

// The AVX-512 table, with the vdpbf16ps Gemm where the CPU has AVX512_BF16.
const KernelTable& Avx512KernelTable() {
  static const KernelTable table = [] {
    KernelTable t = internal::kAvx512KernelTable;
    if (CpuHasAvx512Bf16()) {
      t.pack_x_dpbf16 = &internal::DpBf16PackX;
      t.gemm_dpbf16 = &internal::DpBf16Gemm;
      t.repack_dpbf16 = &internal::DpBf16RepackW;
      t.gemm_dpbf16_panels = &internal::DpBf16PanelGemm;
      t.gemm_bf16_panels = &internal::Bf16PanelFmaGemm;
    }
    return t;
  }();
  return table;
}

// The VNNI table: AVX-512's with the quantized-weight Gemms of kernels_avx512vnni.cc (on AMD family
// 1Ah, the K-quant copies' Gemms of kFarPrefetchQuantGemms). Built here, in baseline code, for the
// same reason as the AMX table below.
const KernelTable& Avx512VnniKernelTable() {
  static const KernelTable table = [] {
    KernelTable t = Avx512KernelTable();
    const KernelTable& q = internal::kAvx512VnniQuantGemms;
    t.isa = Isa::kAvx512Vnni;
    t.gemm_q8_0 = q.gemm_q8_0;
    t.gemm_q4_0 = q.gemm_q4_0;
    t.gemm_q4_1 = q.gemm_q4_1;
    t.gemm_q4_k = q.gemm_q4_k;
    t.gemm_q6_k = q.gemm_q6_k;
    t.gemm_q5_k = q.gemm_q5_k;
    t.gemm_q5_0 = q.gemm_q5_0;
    t.gemm_q5_1 = q.gemm_q5_1;
    t.gemm_q4_k_x16 = q.gemm_q4_k_x16;
    t.gemm_q5_k_x16 = q.gemm_q5_k_x16;
    t.gemm_q6_k_x16 = q.gemm_q6_k_x16;
    t.gemm_q8_0_x16 = q.gemm_q8_0_x16;
    t.gemm_q4_0_x16 = q.gemm_q4_0_x16;
    t.gemm_q4_1_x16 = q.gemm_q4_1_x16;
    t.gemm_q5_0_x16 = q.gemm_q5_0_x16;
    t.gemm_q5_1_x16 = q.gemm_q5_1_x16;
    if (CpuIsAmdFamily1Ah()) {
      const KernelTable& far = internal::kFarPrefetchQuantGemms;
      t.gemm_q4_k_x16 = far.gemm_q4_k_x16;
      t.gemm_q5_k_x16 = far.gemm_q5_k_x16;
      t.gemm_q6_k_x16 = far.gemm_q6_k_x16;
    }
    return t;
  }();
  return table;
}

// The AMX-INT8 Q4_0 Gemm on the unit against the VNNI table's, which it must match bit for bit:
// 48 x rows (a whole step and a half step) by 32 weight rows over k = 288 (a 256-element chunk and
// a block past it), random levels and activations. Returns "" or what went wrong; a SIGILL is
// caught as in SelfTest.
std::string Int8SelfTest() {
  constexpr int64_t n = 48, k = 288, m = 32, nb = k / 32;
  uint32_t state = 54321;
  auto next = [&] {
    state = state * 1664525u + 1013904223u;
    return state >> 8;
  };
  std::vector<quant::BlockQ4_0> w(m * nb);
  for (quant::BlockQ4_0& blk : w) {
    blk.d = F32ToF16(static_cast<float>(next() % 1000 + 1) / 65536.0f);
    for (uint8_t& q : blk.qs) q = static_cast<uint8_t>(next());
  }
  std::vector<float> x(n * k), got(n * m, 0.0f), want(n * m, 0.0f);
  for (float& v : x) v = static_cast<float>(static_cast<int32_t>(next() % 20001) - 10000) / 1000;
  const size_t bytes = (QuantizedActs::Bytes(n, k) + 63) / 64 * 64;
  std::unique_ptr<void, decltype(&std::free)> scratch(std::aligned_alloc(64, bytes), &std::free);
  if (scratch == nullptr) return "no memory for the self-test";
  const KernelTable& vnni = Avx512VnniKernelTable();
  const QuantizedActs acts = QuantizedActs::In(scratch.get(), n, k, ActLayoutFor(DType::kQ4_0, n));
  vnni.quantize_acts(x.data(), 0, n, acts);
  vnni.gemm_q4_0(acts, 0, n, w.data(), nullptr, want.data(), m, 0, m);

  if (RaisesSigill([&] {
        internal::kAmxInt8QuantGemms.gemm_q4_0(acts, 0, n, w.data(), nullptr, got.data(), m, 0, m);
      })) {
    return "an AMX-INT8 instruction raised SIGILL";
  }
  if (std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) != 0) {
    return "the AMX-INT8 self-test Gemm differs from the VNNI kernels' bits";
  }
  return "";
}

// AMX-INT8 beside the AMX-BF16 that CpuHasIsa(Isa::kAmx) asks for (the same tile state and
// permission), with AVX512_VNNI (its kernels' file) and a self-test that passes. Run only after
// the AMX probe succeeded.
std::string Int8Probe() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) || (edx & kCpuidAmxInt8) == 0) {
    return "the CPU has no AMX-INT8";
  }
  if (!CpuHasIsa(Isa::kAvx512Vnni)) return "the CPU has no AVX512_VNNI";
  return Int8SelfTest();
}

// The AMX table: the VNNI table (AVX-512's where the CPU has no VNNI) plus the tile Gemm, with
// the Q6_K and Q8_0 interleaved-copy Gemms whose one-row tiles prefetch for Xeons (same bits).
// Built here, in baseline code, so that asking for it on a CPU without AVX-512 runs nothing it
// cannot.
const KernelTable& AmxKernelTable() {
  static const KernelTable table = [] {
    KernelTable t = CpuHasIsa(Isa::kAvx512Vnni) ? Avx512VnniKernelTable() : Avx512KernelTable();
    t.isa = Isa::kAmx;
    // F32 and F16 weights: the AVX-512 kernels from 17 rows on, as before AVX-512's own
    // crossover moved to 48 (measured on Zen 4, which has no AMX). BF16: the tile Gemm from 9
    // rows on (KernelTable::SmallNMax, kAmxSmallNMax, measured on a Xeon).
    t.float_small_n_max = kGemmSmallNMax;
    t.pack_x_bf16 = &internal::AmxPackX;
    t.gemm_amx_bf16 = &internal::AmxGemmBf16;
    t.attn_block_bf16 = &internal::AmxAttnBlockBf16;
    if (CpuHasIsa(Isa::kAvx512Vnni)) {
      const KernelTable& q = internal::kAmxHostQuantGemms;
      t.gemm_q6_k_x16 = q.gemm_q6_k_x16;
      t.gemm_q8_0_x16 = q.gemm_q8_0_x16;
      if (AmxInt8UnavailableReason().empty()) {
        const KernelTable& i8 = internal::kAmxInt8QuantGemms;
        // Q4_0 and Q4_1 stay in the file's layout here, where the tiles read them.
        t.gemm_q4_0 = i8.gemm_q4_0;
        t.gemm_q4_1 = i8.gemm_q4_1;
        t.gemm_q4_0_x16 = nullptr;
        t.gemm_q4_1_x16 = nullptr;
        t.gemm_q4_k_x16 = i8.gemm_q4_k_x16;
        t.gemm_q5_k_x16 = i8.gemm_q5_k_x16;
        t.gemm_q8_0_x16 = i8.gemm_q8_0_x16;
      }
    }
    return t;
  }();
  return table;
}

// F16C is CPUID leaf 1, ECX bit 29 (clang's __builtin_cpu_supports does not know "f16c").
bool HasF16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
}
}  // namespace
#endif

// __builtin_cpu_supports also checks, via XGETBV, that the OS saves the ymm/zmm state.
bool CpuHasIsa(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return true;
    case Isa::kAvx2:
#if defined(__x86_64__)
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && HasF16c();
#else
      return false;
#endif
    case Isa::kAvx512:
#if defined(__x86_64__)
      return CpuHasIsa(Isa::kAvx2) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
#else
      return false;
#endif
    case Isa::kAvx512Vnni:
#if defined(__x86_64__)
      return CpuHasIsa(Isa::kAvx512) && __builtin_cpu_supports("avx512vnni");
#else
      return false;
#endif
    case Isa::kAmx:
      return CpuHasIsa(Isa::kAvx512) && AmxUnavailableReason().empty();
  }
  return false;
}

std::string_view AmxUnavailableReason() {
#if defined(__x86_64__)
  static const std::string reason = Probe();
  return reason;
#else
  return "AMX exists only on x86-64";
#endif
}

std::string_view AmxInt8UnavailableReason() {
#if defined(__x86_64__)
  if (!CpuHasIsa(Isa::kAmx)) return "AMX is not usable";
  static const std::string reason = Int8Probe();
  return reason;
#else
  return "AMX exists only on x86-64";
#endif
}

std::optional<Isa> IsaFromName(std::string_view name) {
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Vnni, Isa::kAmx}) {
    if (name == IsaName(isa)) return isa;
  }
  return std::nullopt;
}

bool CpuHasAvx512Bf16() {
#if defined(__x86_64__)
  return __builtin_cpu_supports("avx512bf16");
#else
  return false;
#endif
}

bool CpuIsAmdFamily1Ah() {
#if defined(__x86_64__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(0, &eax, &ebx, &ecx, &edx)) return false;
  // "AuthenticAMD" in ebx, edx, ecx.
  const bool amd = ebx == 0x68747541u && edx == 0x69746e65u && ecx == 0x444d4163u;
  if (!amd || !__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
  const unsigned base = (eax >> 8) & 0xf, extended = (eax >> 20) & 0xff;
  return (base == 0xf ? base + extended : base) == 0x1a;
#else
  return false;
#endif
}

Isa BestIsa() {
  if (CpuHasIsa(Isa::kAmx)) return Isa::kAmx;
  if (CpuHasIsa(Isa::kAvx512Vnni)) return Isa::kAvx512Vnni;
  if (CpuHasIsa(Isa::kAvx512)) return Isa::kAvx512;
  if (CpuHasIsa(Isa::kAvx2)) return Isa::kAvx2;
  return Isa::kScalar;
}

namespace {
constexpr size_t AlignUp(size_t v) { return (v + 63) / 64 * 64; }
}  // namespace

size_t QuantizedActs::Bytes(int64_t n, int64_t k) {
  const size_t rows = static_cast<size_t>(n), blocks = static_cast<size_t>(k / 32);
  return AlignUp(rows * k) + 2 * AlignUp(rows * blocks * sizeof(float)) +
         AlignUp(rows * 2 * blocks * sizeof(int16_t));
}

QuantizedActs QuantizedActs::In(void* scratch, int64_t n, int64_t k, ActLayout layout) {
  const size_t rows = static_cast<size_t>(n), blocks = static_cast<size_t>(k / 32);
  char* p = static_cast<char*>(scratch);
  QuantizedActs a;
  a.n = n;
  a.k = k;
  a.layout = layout;
  a.q = reinterpret_cast<int8_t*>(p);
  p += AlignUp(rows * k);
  a.d = reinterpret_cast<float*>(p);
  p += AlignUp(rows * blocks * sizeof(float));
  a.ds = reinterpret_cast<float*>(p);
  p += AlignUp(rows * blocks * sizeof(float));
  a.sum16 = reinterpret_cast<int16_t*>(p);
  return a;
}

namespace {

// Q4_K's (B = BlockQ4_K) and Q5_K's (BlockQ5_K: the same fields, plus qh) interleaved units.
template <class B, int64_t kUnitBytes>
void RepackKX16(const void* src, int64_t k, int64_t group_begin, int64_t group_end, void* dst) {
  const int64_t nsb = k / 256;
  const auto* in = static_cast<const B*>(src);
  auto* out = static_cast<uint8_t*>(dst);
  for (int64_t g = group_begin; g < group_end; ++g) {
    for (int64_t c = 0; c < nsb; ++c) {
      uint8_t* unit = out + (g * nsb + c) * kUnitBytes;
      for (int r = 0; r < kQ4KX16Rows; ++r) {
        const B& b = in[(g * kQ4KX16Rows + r) * nsb + c];
        // Q5_K's fifth bits between the scales and the levels (kernels.h).
        constexpr int64_t kLevels = kUnitBytes == kQ5KX16UnitBytes ? 768 : 256;
        if constexpr (kUnitBytes == kQ5KX16UnitBytes) {
          for (int j = 0; j < 8; ++j) std::memcpy(unit + 256 + 64 * j + 4 * r, b.qh + 4 * j, 4);
        }
        for (int p = 0; p < 4; ++p) {
          for (int j = 0; j < 8; ++j) {
            std::memcpy(unit + kLevels + (8 * p + j) * 64 + 4 * r, b.qs + 32 * p + 4 * j, 4);
          }
        }
        std::memcpy(unit + 2 * r, &b.d.bits, 2);
        std::memcpy(unit + 32 + 2 * r, &b.dmin.bits, 2);
        uint8_t sc[8], mn[8];
        for (int s = 0; s < 8; ++s) quant::Q4KScaleMin(b.scales, s, &sc[s], &mn[s]);
        for (int s = 0; s < 8; ++s) {
          unit[64 + 16 * s + r] = static_cast<uint8_t>((sc[s] & 15) | (mn[s] & 15) << 4);
        }
        for (int q = 0; q < 4; ++q) {
          unit[192 + 16 * q + r] = static_cast<uint8_t>((sc[q] >> 4) | (sc[q + 4] >> 4) << 2 |
                                                         (mn[q] >> 4) << 4 | (mn[q + 4] >> 4) << 6);
        }
      }
    }
  }
}

}  // namespace

void RepackQ4_KX16(const void* src, int64_t k, int64_t group_begin, int64_t group_end, void* dst) {
  RepackKX16<quant::BlockQ4_K, kQ4KX16UnitBytes>(src, k, group_begin, group_end, dst);
}

void RepackQ5_KX16(const void* src, int64_t k, int64_t group_begin, int64_t group_end, void* dst) {
  RepackKX16<quant::BlockQ5_K, kQ5KX16UnitBytes>(src, k, group_begin, group_end, dst);
}

void RepackQ6_KX16(const void* src, int64_t k, int64_t group_begin, int64_t group_end, void* dst) {
  const int64_t nsb = k / 256;
  const auto* in = static_cast<const quant::BlockQ6_K*>(src);
  auto* out = static_cast<uint8_t*>(dst);
  for (int64_t g = group_begin; g < group_end; ++g) {
    for (int64_t c = 0; c < nsb; ++c) {
      uint8_t* unit = out + (g * nsb + c) * kQ6KX16UnitBytes;
      const bool d_first = Q6KX16DFirst(unit);
      uint8_t* body = unit + (d_first ? 32 : 0);
      uint8_t* d = d_first ? unit : unit + kQ6KX16BodyBytes;
      for (int r = 0; r < kQ4KX16Rows; ++r) {
        const quant::BlockQ6_K& b = in[(g * kQ4KX16Rows + r) * nsb + c];
        std::memcpy(d + 2 * r, &b.d.bits, 2);
        for (int h = 0; h < 2; ++h) {
          uint8_t* half = body + h * kQ6KX16HalfBytes;
          for (int s = 0; s < 8; ++s) half[16 * s + r] = static_cast<uint8_t>(b.scales[8 * h + s]);
          for (int j = 0; j < 8; ++j) {
            std::memcpy(half + 128 + 128 * j + 4 * r, b.qh + 32 * h + 4 * j, 4);
            std::memcpy(half + 192 + 128 * j + 4 * r, b.ql + 64 * h + 4 * j, 4);
            std::memcpy(half + 1152 + 64 * j + 4 * r, b.ql + 64 * h + 32 + 4 * j, 4);
          }
        }
      }
    }
  }
}

void RepackQ8_0X16(const void* src, int64_t k, int64_t group_begin, int64_t group_end,
                   void* dst) {
  const int64_t nu = k / kQ8_0X16UnitElems, nb = k / 32;
  const auto* in = static_cast<const quant::BlockQ8_0*>(src);
  auto* out = static_cast<uint8_t*>(dst);
  for (int64_t g = group_begin; g < group_end; ++g) {
    for (int64_t c = 0; c < nu; ++c) {
      uint8_t* unit = out + (g * nu + c) * kQ8_0X16UnitBytes;
      for (int r = 0; r < kQ4KX16Rows; ++r) {
        for (int h = 0; h < 2; ++h) {
          const quant::BlockQ8_0& b = in[(g * kQ4KX16Rows + r) * nb + 2 * c + h];
          std::memcpy(unit + 32 * h + 2 * r, &b.d.bits, 2);
          for (int j = 0; j < 8; ++j) {
            for (int t = 0; t < 4; ++t) {
              unit[64 + (8 * h + j) * 64 + 4 * r + t] =
                  static_cast<uint8_t>(static_cast<uint8_t>(b.qs[4 * j + t]) ^ 0x80);
            }
          }
        }
      }
    }
  }
}

namespace {

// Q4_0 .. Q5_1 (kT, B its block) in the interleaved layout of RepackQ4X16 (kernels.h).
template <DType kT, class B>
void RepackQ4X16As(const void* src, int64_t k, int64_t group_begin, int64_t group_end, void* dst) {
  constexpr bool kHasMin = Q4X16HasMin(kT), kQ5 = Q4X16HasFifthBits(kT);
  constexpr int64_t kHead = Q4X16HeadBytes(kT), kPart = Q4X16PartBytes(kT);
  constexpr int64_t kUnit = Q4X16UnitBytes(kT);
  static_assert(kUnit == 32 * static_cast<int64_t>(sizeof(B)));
  const int64_t nu = k / kQ4X16UnitElems, nb = k / 32;
  const auto* in = static_cast<const B*>(src);
  auto* out = static_cast<uint8_t*>(dst);
  for (int64_t g = group_begin; g < group_end; ++g) {
    for (int64_t c = 0; c < nu; ++c) {
      uint8_t* unit = out + (g * nu + c) * kUnit;
      for (int r = 0; r < kQ4KX16Rows; ++r) {
        for (int h = 0; h < 2; ++h) {
          const B& b = in[(g * kQ4KX16Rows + r) * nb + 2 * c + h];
          std::memcpy(unit + 32 * h + 2 * r, &b.d.bits, 2);
          if constexpr (kHasMin) std::memcpy(unit + 64 + 32 * h + 2 * r, &b.m.bits, 2);
          uint8_t* part = unit + kHead + kPart * h;
          if constexpr (kQ5) {
            uint32_t qh;
            std::memcpy(&qh, b.qh, 4);
            for (int t = 0; t < 4; ++t) {
              uint8_t byte = 0;
              for (int j = 0; j < 4; ++j) {
                byte |= static_cast<uint8_t>(((qh >> (4 * j + t)) & 1) << j);
                byte |= static_cast<uint8_t>(((qh >> (16 + 4 * j + t)) & 1) << (4 + j));
              }
              part[4 * r + t] = byte;
            }
            part += 64;
          }
          for (int j = 0; j < 4; ++j) std::memcpy(part + 64 * j + 4 * r, b.qs + 4 * j, 4);
        }
      }
    }
  }
}

}  // namespace

void RepackQ4X16(DType t, const void* src, int64_t k, int64_t group_begin, int64_t group_end,
                 void* dst) {
  switch (t) {
    case DType::kQ4_0:
      return RepackQ4X16As<DType::kQ4_0, quant::BlockQ4_0>(src, k, group_begin, group_end, dst);
    case DType::kQ4_1:
      return RepackQ4X16As<DType::kQ4_1, quant::BlockQ4_1>(src, k, group_begin, group_end, dst);
    case DType::kQ5_0:
      return RepackQ4X16As<DType::kQ5_0, quant::BlockQ5_0>(src, k, group_begin, group_end, dst);
    case DType::kQ5_1:
      return RepackQ4X16As<DType::kQ5_1, quant::BlockQ5_1>(src, k, group_begin, group_end, dst);
    default:
      MODSERVE_CHECK(false) << "RepackQ4X16 of " << DTypeName(t);
  }
}

const KernelTable& KernelsFor(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return internal::kScalarKernelTable;
    case Isa::kAvx2:
#if defined(__x86_64__)
      return internal::kAvx2KernelTable;
#else
      return internal::kScalarKernelTable;
#endif
    case Isa::kAvx512:
#if defined(__x86_64__)
      return Avx512KernelTable();
#else
      return internal::kScalarKernelTable;
#endif
    case Isa::kAvx512Vnni:
#if defined(__x86_64__)
      return Avx512VnniKernelTable();
#else
      return internal::kScalarKernelTable;
#endif
    case Isa::kAmx:
#if defined(__x86_64__)
      return AmxKernelTable();
#else
      return internal::kScalarKernelTable;
#endif
  }
  return internal::kScalarKernelTable;
}

}  // namespace modserve::backend::cpu
