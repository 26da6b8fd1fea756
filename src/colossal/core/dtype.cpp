// Parsing and promotion of dtypes.
#include "colossal/core/dtype.h"

#include <array>
#include <utility>

namespace colossal::core {

DType parse_dtype(std::string_view name) {
  static constexpr std::array<std::pair<std::string_view, DType>, 16> kNames{{
      {"f32", DType::f32}, {"float32", DType::f32}, {"f64", DType::f64}, {"float64", DType::f64},
      {"f16", DType::f16}, {"float16", DType::f16}, {"fp16", DType::f16}, {"bf16", DType::bf16},
      {"bfloat16", DType::bf16}, {"i32", DType::i32}, {"int32", DType::i32}, {"i64", DType::i64},
      {"int64", DType::i64}, {"u8", DType::u8}, {"uint8", DType::u8}, {"bool", DType::boolean},
  }};
  for (const auto& [spelling, dtype] : kNames) {
    if (spelling == name) return dtype;
  }
  COLOSSAL_FAIL("unknown dtype '{}'; valid: f32, f64, f16, bf16, i32, i64, u8, bool", name);
}

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  auto rank = [](DType d) {
    switch (d) {
      case DType::boolean: return 0;
      case DType::u8: return 1;
      case DType::i32: return 2;
      case DType::i64: return 3;
      case DType::f16: return 4;
      case DType::bf16: return 4;
      case DType::f32: return 5;
      case DType::f64: return 6;
    }
    return 0;
  };
  // f16 with bf16 has no lossless common 16-bit type: use f32, as PyTorch does.
  if (is_reduced_float(a) && is_reduced_float(b)) return DType::f32;
  return rank(a) >= rank(b) ? a : b;
}

}  // namespace colossal::core
