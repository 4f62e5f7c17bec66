// The AMX-INT8 Gemms on a software model of the tiles (amx_int8_emulated.cc, built with AVX-512):
// call only where CpuHasIsa(Isa::kAvx512Vnni).
#pragma once

#include <cstdint>

#include "engine/backend/cpu/kernels.h"

namespace modserve::backend::cpu {

// The quantized Gemms the kAmx table takes from the AMX-INT8 file.
struct EmulatedInt8Gemms {
  QuantGemmFn q4_0, q4_1, q4_k_x16, q5_k_x16, q8_0_x16;
};

// The emulated Gemms; each hands the rows its tiles leave to `vnni`'s kernel of its dtype.
EmulatedInt8Gemms EmulatedAmxInt8Gemms(const EmulatedInt8Gemms& vnni);

// Calls made into the emulated Gemms so far (every thread).
int64_t EmulatedAmxInt8Calls();

}  // namespace modserve::backend::cpu
