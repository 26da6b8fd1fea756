// DType metadata (sizes, names, parsing, promotion, dispatch errors), the f16/bf16 conversions
// bit for bit (rounding to nearest even, overflow, inf/nan, subnormals), and cast_raw between
// every pair of dtypes, including truncation to integers and the nonzero rule for bool.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "colossal/core/dtype.h"
#include "colossal/core/half.h"
#include "colossal/core/tensor.h"
#include "colossal/core/view.h"
#include "gradcheck.h"  // EXPECT_ERROR_CONTAINS

namespace colossal::core {
namespace {

constexpr DType kAllDtypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16,
                                DType::i32, DType::i64, DType::u8,  DType::boolean};

float from_bits(uint32_t bits) {
  return detail::bits_float(bits);
}
uint16_t half_bits(float f) {
  return Half(f).bits;
}
uint16_t bf16_bits(float f) {
  return BFloat16(f).bits;
}
float half_value(uint16_t bits) {
  return static_cast<float>(Half::from_bits(bits));
}
float bf16_value(uint16_t bits) {
  return static_cast<float>(BFloat16::from_bits(bits));
}

TEST(DTypeInfo, SizesAndNames) {
  EXPECT_EQ(element_size(DType::f32), 4u);
  EXPECT_EQ(element_size(DType::f64), 8u);
  EXPECT_EQ(element_size(DType::f16), 2u);
  EXPECT_EQ(element_size(DType::bf16), 2u);
  EXPECT_EQ(element_size(DType::i32), 4u);
  EXPECT_EQ(element_size(DType::i64), 8u);
  EXPECT_EQ(element_size(DType::u8), 1u);
  EXPECT_EQ(element_size(DType::boolean), 1u);
  EXPECT_EQ(dtype_name(DType::f32), "f32");
  EXPECT_EQ(dtype_name(DType::f64), "f64");
  EXPECT_EQ(dtype_name(DType::f16), "f16");
  EXPECT_EQ(dtype_name(DType::bf16), "bf16");
  EXPECT_EQ(dtype_name(DType::i32), "i32");
  EXPECT_EQ(dtype_name(DType::i64), "i64");
  EXPECT_EQ(dtype_name(DType::u8), "u8");
  EXPECT_EQ(dtype_name(DType::boolean), "bool");
  EXPECT_EQ(fmt::format("{}", DType::bf16), "bf16");
}

TEST(DTypeInfo, SizesMatchTheCppTypes) {
  for (DType d : kAllDtypes) {
    dispatch_all(d, [&]<class T>() {
      EXPECT_EQ(sizeof(T), element_size(d)) << dtype_name(d);
      EXPECT_EQ(dtype_of<T>(), d);
    });
  }
}

TEST(DTypeInfo, ParseAcceptsNamesAndAliases) {
  for (DType d : kAllDtypes) EXPECT_EQ(parse_dtype(dtype_name(d)), d);
  EXPECT_EQ(parse_dtype("float32"), DType::f32);
  EXPECT_EQ(parse_dtype("float64"), DType::f64);
  EXPECT_EQ(parse_dtype("fp16"), DType::f16);
  EXPECT_EQ(parse_dtype("float16"), DType::f16);
  EXPECT_EQ(parse_dtype("bfloat16"), DType::bf16);
  EXPECT_EQ(parse_dtype("int32"), DType::i32);
  EXPECT_EQ(parse_dtype("int64"), DType::i64);
  EXPECT_EQ(parse_dtype("uint8"), DType::u8);
  EXPECT_ERROR_CONTAINS(parse_dtype("float8"),
                        "unknown dtype 'float8'; valid: f32, f64, f16, bf16, i32, i64, u8, bool");
  EXPECT_ERROR_CONTAINS(parse_dtype("F32"), "unknown dtype 'F32'");  // case matters
}

TEST(DTypeInfo, Categories) {
  for (DType d : {DType::f32, DType::f64, DType::f16, DType::bf16}) EXPECT_TRUE(is_floating(d)) << dtype_name(d);
  for (DType d : {DType::i32, DType::i64, DType::u8, DType::boolean}) EXPECT_FALSE(is_floating(d)) << dtype_name(d);
  for (DType d : {DType::i32, DType::i64, DType::u8}) EXPECT_TRUE(is_integral(d)) << dtype_name(d);
  EXPECT_FALSE(is_integral(DType::boolean));
  EXPECT_FALSE(is_integral(DType::f32));
  EXPECT_TRUE(is_reduced_float(DType::f16));
  EXPECT_TRUE(is_reduced_float(DType::bf16));
  EXPECT_FALSE(is_reduced_float(DType::f32));
}

TEST(DTypeInfo, Promotion) {
  EXPECT_EQ(promote_types(DType::f32, DType::f32), DType::f32);
  EXPECT_EQ(promote_types(DType::i32, DType::f16), DType::f16);
  EXPECT_EQ(promote_types(DType::f16, DType::bf16), DType::f32);
  EXPECT_EQ(promote_types(DType::bf16, DType::f16), DType::f32);
  EXPECT_EQ(promote_types(DType::boolean, DType::u8), DType::u8);
  EXPECT_EQ(promote_types(DType::u8, DType::i32), DType::i32);
  EXPECT_EQ(promote_types(DType::i64, DType::f32), DType::f32);
  EXPECT_EQ(promote_types(DType::f64, DType::i64), DType::f64);
  EXPECT_EQ(promote_types(DType::bf16, DType::f64), DType::f64);
}

TEST(DTypeInfo, DispatchErrorsNameTheOpAndDtype) {
  auto nothing = []<class T>() {};
  EXPECT_ERROR_CONTAINS(dispatch_floating(DType::i32, "softmax", nothing),
                        "softmax: expected a floating dtype (f32, f64, f16, bf16), got i32");
  EXPECT_ERROR_CONTAINS(dispatch_arithmetic(DType::boolean, "add", nothing), "add: expected a numeric dtype, got bool");
  EXPECT_ERROR_CONTAINS(dispatch_index(DType::f32, "gather", nothing),
                        "gather: expected an index dtype (i32 or i64), got f32");
}

// ---- f16: IEEE binary16, 1 sign, 5 exponent (bias 15), 10 mantissa bits.

TEST(Half, ExactValues) {
  EXPECT_EQ(half_bits(1.0f), 0x3c00);
  EXPECT_EQ(half_bits(-2.5f), 0xc100);  // -1.25 * 2^1: exponent 16, mantissa 0.25 * 1024 = 0x100
  EXPECT_EQ(half_bits(0.0f), 0x0000);
  EXPECT_EQ(half_bits(-0.0f), 0x8000);
  EXPECT_EQ(half_bits(65504.0f), 0x7bff);  // the largest finite half
  EXPECT_EQ(half_value(0x7bff), 65504.0f);
  EXPECT_EQ(half_value(0xc100), -2.5f);
  EXPECT_EQ(half_value(0x3555), 0.333251953125f);
  EXPECT_TRUE(std::signbit(half_value(0x8000)));
}

TEST(Half, RoundsToNearestEven) {
  // 1/3 = 1.0101...b * 2^-2; the first dropped bit is 0, so it rounds down to 1365 * 2^-12.
  EXPECT_EQ(half_bits(1.0f / 3.0f), 0x3555);
  EXPECT_EQ(half_value(half_bits(1.0f / 3.0f)), 0.333251953125f);
  // Near 1 the spacing is 2^-10. Exact ties go to the even mantissa; anything past a tie goes up.
  EXPECT_EQ(half_bits(1.0f + 0x1p-11f), 0x3c00);             // tie between mantissa 0 and 1 -> 0
  EXPECT_EQ(half_bits(1.0f + 3 * 0x1p-11f), 0x3c02);         // tie between 1 and 2 -> 2
  EXPECT_EQ(half_bits(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);  // just past the tie -> up
  EXPECT_EQ(half_bits(1.0f + 0x1p-11f - 0x1p-20f), 0x3c00);  // just before the tie -> down
  // Rounding can carry into the exponent: 2 - 2^-12 is past the tie below 2.
  EXPECT_EQ(half_bits(2.0f - 0x1p-12f), 0x4000);
}

TEST(Half, OverflowInfAndNan) {
  // The tie between 65504 and 65536 (= 2^16, not representable) is 65520: below it rounds down.
  EXPECT_EQ(half_bits(65519.0f), 0x7bff);
  EXPECT_EQ(half_bits(65520.0f), 0x7c00);
  EXPECT_EQ(half_bits(-1e6f), 0xfc00);
  EXPECT_EQ(half_bits(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(half_bits(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_TRUE(std::isinf(half_value(0x7c00)));
  EXPECT_EQ(half_value(0xfc00), -std::numeric_limits<float>::infinity());
  for (float nan : {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                    from_bits(0x7f800001u) /* signalling, payload only in the low bits */}) {
    const uint16_t h = half_bits(nan);
    EXPECT_EQ(h & 0x7c00, 0x7c00);
    EXPECT_NE(h & 0x03ff, 0) << "a nan must not turn into inf";
    EXPECT_TRUE(std::isnan(half_value(h)));
  }
  EXPECT_TRUE(std::isnan(half_value(0x7e00)));
}

TEST(Half, Subnormals) {
  // Subnormal halves are multiples of 2^-24 below 2^-14.
  EXPECT_EQ(half_bits(0x1p-24f), 0x0001);
  EXPECT_EQ(half_value(0x0001), 0x1p-24f);
  EXPECT_EQ(half_bits(-0x1p-24f), 0x8001);
  EXPECT_EQ(half_bits(1023 * 0x1p-24f), 0x03ff);  // the largest subnormal
  EXPECT_EQ(half_value(0x03ff), 1023 * 0x1p-24f);
  EXPECT_EQ(half_bits(0x1p-14f), 0x0400);  // the smallest normal
  EXPECT_EQ(half_bits(0x1p-25f), 0x0000);  // tie between 0 and 2^-24 -> 0 (even)
  EXPECT_EQ(half_bits(0x1.8p-25f), 0x0001);
  EXPECT_EQ(half_bits(0x1.8p-24f), 0x0002);          // tie between 1 and 2 -> 2
  EXPECT_EQ(half_bits(1023.5f * 0x1p-24f), 0x0400);  // tie rounds up into the normals
  EXPECT_EQ(half_bits(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(half_bits(-std::numeric_limits<float>::denorm_min()), 0x8000);
}

TEST(Half, EveryHalfRoundTripsThroughFloat) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const auto h = static_cast<uint16_t>(bits);
    const float f = half_value(h);
    if ((h & 0x7c00) == 0x7c00 && (h & 0x03ff) != 0) {
      EXPECT_TRUE(std::isnan(f)) << std::hex << bits;
    } else {
      ASSERT_EQ(half_bits(f), h) << std::hex << bits;
    }
  }
}

// ---- bf16: the upper 16 bits of a float, rounded to nearest even.

TEST(BFloat16, ExactValuesAndRounding) {
  EXPECT_EQ(bf16_bits(1.0f), 0x3f80);
  EXPECT_EQ(bf16_bits(-2.5f), 0xc020);
  EXPECT_EQ(bf16_value(0xc020), -2.5f);
  // 1/3 as a float is 0x3eaaaaab; the dropped half 0xaaab is past the tie, so it rounds up.
  EXPECT_EQ(bf16_bits(1.0f / 3.0f), 0x3eab);
  EXPECT_EQ(bf16_value(0x3eab), 0.333984375f);
  EXPECT_EQ(bf16_bits(from_bits(0x3f808000u)), 0x3f80);  // tie, even below
  EXPECT_EQ(bf16_bits(from_bits(0x3f818000u)), 0x3f82);  // tie, even above
  EXPECT_EQ(bf16_bits(from_bits(0x3f808001u)), 0x3f81);
  EXPECT_EQ(bf16_bits(from_bits(0x3f807fffu)), 0x3f80);
  EXPECT_EQ(bf16_bits(-0.0f), 0x8000);
}

TEST(BFloat16, OverflowInfNanSubnormals) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(bf16_bits(inf), 0x7f80);
  EXPECT_EQ(bf16_bits(-inf), 0xff80);
  // The largest float is past the tie below 2^128, so it rounds to inf.
  EXPECT_EQ(bf16_bits(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(bf16_value(0x7f7f), from_bits(0x7f7f0000u));  // the largest finite bf16
  for (float nan : {std::numeric_limits<float>::quiet_NaN(), from_bits(0x7f800001u), from_bits(0xff800001u)}) {
    const uint16_t b = bf16_bits(nan);
    EXPECT_TRUE(std::isnan(bf16_value(b))) << std::hex << b << " must not have turned into inf";
  }
  // bf16 shares float's exponent range, so float subnormals map onto bf16 subnormals.
  EXPECT_EQ(bf16_bits(from_bits(0x00010000u)), 0x0001);
  EXPECT_EQ(bf16_bits(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(bf16_bits(from_bits(0x00008000u)), 0x0000);  // tie -> even
  EXPECT_EQ(bf16_bits(from_bits(0x00018000u)), 0x0002);  // tie -> even
}

TEST(BFloat16, EveryBf16RoundTripsThroughFloat) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const auto b = static_cast<uint16_t>(bits);
    const float f = bf16_value(b);
    if ((b & 0x7f80) == 0x7f80 && (b & 0x007f) != 0) {
      EXPECT_TRUE(std::isnan(f)) << std::hex << bits;
    } else {
      ASSERT_EQ(bf16_bits(f), b) << std::hex << bits;
    }
  }
}

// ---- cast_raw between tensors.

TEST(Cast, RoundTripsBetweenEveryPairOfDtypes) {
  // Values exact in every dtype of the pair: up to 255 fits u8, and 255 needs 8 significant bits,
  // which bf16 has. Pairs with bool keep to 0 and 1.
  const std::vector<double> wide = {0, 1, 2, 7, 100, 255};
  const std::vector<double> binary = {0, 1, 1, 0};
  for (DType from : kAllDtypes) {
    for (DType to : kAllDtypes) {
      const bool has_bool = from == DType::boolean || to == DType::boolean;
      const std::vector<double>& values = has_bool ? binary : wide;
      Tensor x = from_vector<double>(values, {static_cast<int64_t>(values.size())}, from);
      Tensor y = cast_raw(x, to);
      EXPECT_EQ(y.dtype(), to);
      EXPECT_EQ(y.shape(), x.shape());
      EXPECT_EQ(y.to_vector<double>(), values) << dtype_name(from) << " -> " << dtype_name(to);
      Tensor back = cast_raw(y, from);
      EXPECT_EQ(back.dtype(), from);
      EXPECT_EQ(back.to_vector<double>(), values) << dtype_name(from) << " -> " << dtype_name(to) << " -> back";
    }
  }
}

TEST(Cast, SameDtypeIsANoOpOnlyWhenContiguous) {
  Tensor x = from_vector<float>({1, 2, 3, 4}, {2, 2});
  EXPECT_TRUE(cast_raw(x, DType::f32).is_same(x));
  Tensor t = transpose_raw(x, 0, 1);
  Tensor c = cast_raw(t, DType::f32);
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_FALSE(c.storage().is_same(x.storage()));
  EXPECT_EQ(c.to_vector<float>(), (std::vector<float>{1, 3, 2, 4}));
  Tensor d = cast_raw(t, DType::i64);
  EXPECT_EQ(d.strides(), (Shape{2, 1}));
  EXPECT_EQ(d.to_vector<int64_t>(), (std::vector<int64_t>{1, 3, 2, 4}));
}

TEST(Cast, FloatToIntTruncatesTowardZero) {
  Tensor f = from_vector<float>({2.7f, -2.7f, 0.5f, -0.5f, 1e9f, -0.0f}, {6});
  EXPECT_EQ(cast_raw(f, DType::i32).to_vector<int32_t>(), (std::vector<int32_t>{2, -2, 0, 0, 1000000000, 0}));
  // -123456789012.75 is exact in f64 (spacing 2^-16 at that magnitude) but not in f32.
  Tensor d = from_vector<double>({3.99, -3.99, -123456789012.75}, {3});
  EXPECT_EQ(cast_raw(d, DType::i64).to_vector<int64_t>(), (std::vector<int64_t>{3, -3, -123456789012}));
  EXPECT_EQ(cast_raw(from_vector<double>({200.9, 0.99}, {2}), DType::u8).to_vector<uint8_t>(),
            (std::vector<uint8_t>{200, 0}));
  EXPECT_EQ(cast_raw(from_vector<float>({-1.5f, 2.5f}, {2}, DType::f16), DType::i32).to_vector<int32_t>(),
            (std::vector<int32_t>{-1, 2}));
  EXPECT_EQ(cast_raw(from_vector<float>({-1.5f, 2.5f}, {2}, DType::bf16), DType::i64).to_vector<int64_t>(),
            (std::vector<int64_t>{-1, 2}));
}

TEST(Cast, IntToNarrowerIntWraps) {
  // Integer narrowing is modular, as static_cast between integer types is.
  EXPECT_EQ(cast_raw(from_vector<int32_t>({300, -1, 256}, {3}), DType::u8).to_vector<uint8_t>(),
            (std::vector<uint8_t>{44, 255, 0}));
  EXPECT_EQ(cast_raw(from_vector<int64_t>({(int64_t{1} << 32) + 5}, {1}), DType::i32).to_vector<int32_t>(),
            (std::vector<int32_t>{5}));
}

TEST(Cast, IntToFloatRoundsToNearest) {
  // 2^24 + 1 and 2^53 + 1 are ties between two floats (doubles); the even one wins.
  EXPECT_EQ(cast_raw(from_vector<int32_t>({16777217}, {1}), DType::f32).to_vector<float>(),
            (std::vector<float>{16777216.0f}));
  EXPECT_EQ(cast_raw(from_vector<int64_t>({(int64_t{1} << 53) + 1}, {1}), DType::f64).to_vector<double>(),
            (std::vector<double>{9007199254740992.0}));
  // 2049 is a tie in f16 (spacing 2 above 2048): 2048 is even.
  EXPECT_EQ(cast_raw(from_vector<int32_t>({2049, 2051, 65504, 70000}, {4}), DType::f16).to_vector<float>(),
            (std::vector<float>{2048, 2052, 65504, std::numeric_limits<float>::infinity()}));
}

TEST(Cast, BoolIsNonzero) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(
      cast_raw(from_vector<float>({0.0f, -0.0f, 0.5f, -3.0f, inf, nan, 1e-45f}, {7}), DType::boolean).to_vector<bool>(),
      (std::vector<bool>{false, false, true, true, true, true, true}));
  EXPECT_EQ(cast_raw(from_vector<int64_t>({0, 5, -1, int64_t{1} << 40}, {4}), DType::boolean).to_vector<bool>(),
            (std::vector<bool>{false, true, true, true}));
  EXPECT_EQ(cast_raw(from_vector<uint8_t>({0, 128}, {2}), DType::boolean).to_vector<bool>(),
            (std::vector<bool>{false, true}));
  // Tiny doubles are nonzero too, although they underflow to 0 as floats.
  EXPECT_EQ(cast_raw(from_vector<double>({1e-300, -1e-50, 0.0}, {3}), DType::boolean).to_vector<bool>(),
            (std::vector<bool>{true, true, false}));
  EXPECT_EQ(cast_raw(from_vector<float>({0.0f, 1e-10f}, {2}, DType::f16), DType::boolean).to_vector<bool>(),
            (std::vector<bool>{false, false}))
      << "1e-10 underflows to 0 in f16 on the way in";
  EXPECT_EQ(cast_raw(from_vector<float>({1e-10f, -0.0f}, {2}, DType::bf16), DType::boolean).to_vector<bool>(),
            (std::vector<bool>{true, false}));
  // And back: true is 1.
  EXPECT_EQ(cast_raw(from_vector<bool>({true, false}, {2}), DType::f16).to_vector<float>(), (std::vector<float>{1, 0}));
  EXPECT_EQ(cast_raw(from_vector<bool>({true, false}, {2}), DType::i32).to_vector<int32_t>(),
            (std::vector<int32_t>{1, 0}));
}

TEST(Cast, ReducedFloatsThroughTensors) {
  Tensor third = from_vector<float>({1.0f / 3.0f, 65504.0f, 70000.0f}, {3});
  EXPECT_EQ(cast_raw(cast_raw(third, DType::f16), DType::f32).to_vector<float>(),
            (std::vector<float>{0.333251953125f, 65504.0f, std::numeric_limits<float>::infinity()}));
  EXPECT_EQ(cast_raw(cast_raw(third, DType::bf16), DType::f64).to_vector<double>(),
            (std::vector<double>{0.333984375, 65536.0, 70144.0}));
  // f16 -> bf16 goes through f32: 1/3 in f16 (1365 * 2^-12) rounds again to bf16's 8 bits.
  EXPECT_EQ(cast_raw(cast_raw(third, DType::f16), DType::bf16).to_vector<double>()[0], 0.333984375);
}

}  // namespace
}  // namespace colossal::core
