// Half (IEEE fp16) and BFloat16 storage types with round-to-nearest-even conversion from float.
// Arithmetic on them goes through float; kernels use acc_t<T> to pick the accumulation type.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define COLOSSAL_HOST_DEVICE __host__ __device__
#else
#define COLOSSAL_HOST_DEVICE
#endif

namespace colossal::core {

namespace detail {
COLOSSAL_HOST_DEVICE inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
COLOSSAL_HOST_DEVICE inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Note [Hardware conversions]
// On the GPU (sm_80 and later) the conversions are single cvt instructions, which round to nearest
// even exactly as the integer code below; they differ only in a NaN's payload (the hardware writes
// the canonical NaN). The integer code took ~6 instructions per bf16 store and a branchy dozen per
// f16 one, enough to make elementwise kernels with some arithmetic compute-bound on an H100.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define COLOSSAL_CVT_INSTRUCTIONS 1
#endif

COLOSSAL_HOST_DEVICE inline uint16_t float_to_half_bits(float f) {
#if defined(COLOSSAL_CVT_INSTRUCTIONS)
  uint16_t h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
#else
  const uint32_t x = float_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or nan; keep nan quiet and non-zero
    return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u | ((abs >> 13) & 0x3ffu) : 0u));
  }
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (abs < 0x38800000u) {  // result is subnormal or zero: scale by 2^24 and round
    // Adding 0.5 (as float) lets the FPU do round-to-nearest-even at the right bit.
    const float scaled = bits_float(abs) + 0.5f;
    return static_cast<uint16_t>(sign | (float_bits(scaled) - 0x3f000000u));
  }
  const uint32_t mant_odd = (abs >> 13) & 1u;
  uint32_t rounded = abs + 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) and round
  return static_cast<uint16_t>(sign | (rounded >> 13));
#endif
}

COLOSSAL_HOST_DEVICE inline float half_bits_to_float(uint16_t h) {
#if defined(COLOSSAL_CVT_INSTRUCTIONS)
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
#else
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    // Subnormal or zero: value = mant * 2^-24, exact in float.
    const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  if (exp == 31) return bits_float(sign | 0x7f800000u | (mant << 13));
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
#endif
}

COLOSSAL_HOST_DEVICE inline uint16_t float_to_bf16_bits(float f) {
#if defined(COLOSSAL_CVT_INSTRUCTIONS)
  uint16_t b;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b) : "f"(f));
  return b;
#else
  const uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet nan
  const uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + rounding) >> 16);
#endif
}

COLOSSAL_HOST_DEVICE inline float bf16_bits_to_float(uint16_t b) {
  return bits_float(static_cast<uint32_t>(b) << 16);
}
}  // namespace detail

/// IEEE 754 binary16.
struct Half {
  uint16_t bits = 0;
  Half() = default;
  COLOSSAL_HOST_DEVICE Half(float f) : bits(detail::float_to_half_bits(f)) {}  // NOLINT: implicit like float
  COLOSSAL_HOST_DEVICE operator float() const { return detail::half_bits_to_float(bits); }
  static Half from_bits(uint16_t b) {
    Half h;
    h.bits = b;
    return h;
  }
};

/// bfloat16: the upper half of a float, rounded to nearest even.
struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  COLOSSAL_HOST_DEVICE BFloat16(float f) : bits(detail::float_to_bf16_bits(f)) {}  // NOLINT
  COLOSSAL_HOST_DEVICE operator float() const { return detail::bf16_bits_to_float(bits); }
  static BFloat16 from_bits(uint16_t b) {
    BFloat16 h;
    h.bits = b;
    return h;
  }
};

}  // namespace colossal::core
