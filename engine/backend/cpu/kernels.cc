// Run-time ISA detection and the choice of kernel table; compiled with baseline flags so that it
// is safe to run on any x86-64 (or non-x86) CPU.
#include "engine/backend/cpu/kernels.h"

#include <cstddef>
#include <cstdint>
#include <string_view>

#if defined(__x86_64__)
#include <cpuid.h>
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
  }
  return "?";
}

#if defined(__x86_64__)
namespace {
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
  }
  return false;
}

bool CpuHasAvx512Bf16() {
#if defined(__x86_64__)
  return __builtin_cpu_supports("avx512bf16");
#else
  return false;
#endif
}

Isa BestIsa() {
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
      return internal::kAvx512KernelTable;
#else
      return internal::kScalarKernelTable;
#endif
  }
  return internal::kScalarKernelTable;
}

}  // namespace modserve::backend::cpu
