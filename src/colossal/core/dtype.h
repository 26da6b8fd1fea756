// DType: the element types a Tensor can hold, their sizes and names, the C++ type behind each, and
// dispatch helpers that turn a runtime dtype into a template argument for kernels.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "colossal/core/error.h"
#include "colossal/core/half.h"

namespace colossal::core {

enum class DType : uint8_t { f32, f64, f16, bf16, i32, i64, u8, boolean };

constexpr size_t element_size(DType dtype) {
  switch (dtype) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::f16: return 2;
    case DType::bf16: return 2;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::u8: return 1;
    case DType::boolean: return 1;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::u8: return "u8";
    case DType::boolean: return "bool";
  }
  return "?";
}

/// Parses "f32", "float32", "bf16", ... ; throws naming the valid spellings.
DType parse_dtype(std::string_view name);

constexpr bool is_floating(DType d) { return d == DType::f32 || d == DType::f64 || d == DType::f16 || d == DType::bf16; }
constexpr bool is_integral(DType d) { return d == DType::i32 || d == DType::i64 || d == DType::u8; }
/// f16 and bf16: stored in 16 bits, computed in f32.
constexpr bool is_reduced_float(DType d) { return d == DType::f16 || d == DType::bf16; }

template <DType D> struct CppTypeOf;
template <> struct CppTypeOf<DType::f32> { using type = float; };
template <> struct CppTypeOf<DType::f64> { using type = double; };
template <> struct CppTypeOf<DType::f16> { using type = Half; };
template <> struct CppTypeOf<DType::bf16> { using type = BFloat16; };
template <> struct CppTypeOf<DType::i32> { using type = int32_t; };
template <> struct CppTypeOf<DType::i64> { using type = int64_t; };
template <> struct CppTypeOf<DType::u8> { using type = uint8_t; };
template <> struct CppTypeOf<DType::boolean> { using type = bool; };

template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<double>() { return DType::f64; }
template <> constexpr DType dtype_of<Half>() { return DType::f16; }
template <> constexpr DType dtype_of<BFloat16>() { return DType::bf16; }
template <> constexpr DType dtype_of<int32_t>() { return DType::i32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::i64; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::u8; }
template <> constexpr DType dtype_of<bool>() { return DType::boolean; }

/// The type kernels accumulate in: float for f16/bf16/f32, double for f64, the type itself otherwise.
template <class T>
using acc_t = std::conditional_t<std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>, float, T>;

/// dispatch_all(dtype, [&]<class T>() { ... }) calls the lambda with T = the dtype's C++ type.
template <class F>
decltype(auto) dispatch_all(DType dtype, F&& f) {
  switch (dtype) {
    case DType::f32: return f.template operator()<float>();
    case DType::f64: return f.template operator()<double>();
    case DType::f16: return f.template operator()<Half>();
    case DType::bf16: return f.template operator()<BFloat16>();
    case DType::i32: return f.template operator()<int32_t>();
    case DType::i64: return f.template operator()<int64_t>();
    case DType::u8: return f.template operator()<uint8_t>();
    case DType::boolean: return f.template operator()<bool>();
  }
  COLOSSAL_FAIL("unknown dtype {}", static_cast<int>(dtype));
}

/// Like dispatch_all, but only floating dtypes; others raise an error naming `op` and the dtype.
template <class F>
decltype(auto) dispatch_floating(DType dtype, std::string_view op, F&& f) {
  switch (dtype) {
    case DType::f32: return f.template operator()<float>();
    case DType::f64: return f.template operator()<double>();
    case DType::f16: return f.template operator()<Half>();
    case DType::bf16: return f.template operator()<BFloat16>();
    default: break;
  }
  COLOSSAL_FAIL("{}: expected a floating dtype (f32, f64, f16, bf16), got {}", op, dtype_name(dtype));
}

/// Floating and integer dtypes (not bool): arithmetic.
template <class F>
decltype(auto) dispatch_arithmetic(DType dtype, std::string_view op, F&& f) {
  switch (dtype) {
    case DType::f32: return f.template operator()<float>();
    case DType::f64: return f.template operator()<double>();
    case DType::f16: return f.template operator()<Half>();
    case DType::bf16: return f.template operator()<BFloat16>();
    case DType::i32: return f.template operator()<int32_t>();
    case DType::i64: return f.template operator()<int64_t>();
    case DType::u8: return f.template operator()<uint8_t>();
    default: break;
  }
  COLOSSAL_FAIL("{}: expected a numeric dtype, got {}", op, dtype_name(dtype));
}

/// i32 or i64 index tensors.
template <class F>
decltype(auto) dispatch_index(DType dtype, std::string_view op, F&& f) {
  switch (dtype) {
    case DType::i32: return f.template operator()<int32_t>();
    case DType::i64: return f.template operator()<int64_t>();
    default: break;
  }
  COLOSSAL_FAIL("{}: expected an index dtype (i32 or i64), got {}", op, dtype_name(dtype));
}

/// The dtype that binary arithmetic between a and b produces (floating wins, wider wins).
DType promote_types(DType a, DType b);

}  // namespace colossal::core

template <>
struct fmt::formatter<colossal::core::DType> : fmt::formatter<std::string_view> {
  auto format(colossal::core::DType d, format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(colossal::core::dtype_name(d), ctx);
  }
};
