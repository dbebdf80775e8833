#include "common/wire_dtype.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace dptrain {
namespace {

using ToBits = uint16_t (*)(float);
using FromBits16 = float (*)(uint16_t);

bool IsNan16(DType t, uint16_t b) {
  return t == DType::kBf16 ? ((b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0)
                           : ((b & 0x7c00) == 0x7c00 && (b & 0x3ff) != 0);
}

// Every 16-bit value survives the trip through fp32 bit for bit (NaNs stay NaNs).
void CheckRoundTrip(DType t, ToBits to, FromBits16 from) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const uint16_t bits = static_cast<uint16_t>(b);
    const float x = from(bits);
    if (IsNan16(t, bits)) {
      EXPECT_TRUE(std::isnan(x)) << std::hex << b;
      EXPECT_TRUE(IsNan16(t, to(x))) << std::hex << b;
    } else {
      ASSERT_EQ(to(x), bits) << DTypeName(t) << " " << std::hex << b << " = " << x;
    }
  }
}

TEST(WireDtypeTest, EverySixteenBitValueRoundTrips) {
  CheckRoundTrip(DType::kBf16, FloatToBf16Bits, Bf16BitsToFloat);
  CheckRoundTrip(DType::kFp16, FloatToFp16Bits, Fp16BitsToFloat);
}

// The result is the nearest representable value (in double), ties to the even pattern;
// beyond the largest finite value (plus half a step) it is inf.
void CheckNearest(DType t, ToBits to, FromBits16 from, float x) {
  const uint16_t got = to(x);
  const double want = x;
  const double v = from(got);
  if (std::isinf(v)) {
    const double max = t == DType::kBf16 ? 3.3895313892515355e38 : 65504.0;
    const double half_step = t == DType::kBf16 ? std::ldexp(1.0, 127 - 8) : 16.0;
    EXPECT_GE(std::abs(want), max + half_step) << x;
    return;
  }
  // The neighbours of the result, by bit pattern, must not be nearer.
  for (int d : {-1, 1}) {
    const uint16_t n = static_cast<uint16_t>(got + d);
    if (((got & 0x7fff) == 0 && d == -1) || IsNan16(t, n)) continue;
    const double other = from(n);
    if (std::isinf(other) || std::signbit(other) != std::signbit(v)) continue;
    const double e_got = std::abs(v - want), e_other = std::abs(other - want);
    EXPECT_LE(e_got, e_other) << DTypeName(t) << " x=" << x << " got " << v << " other " << other;
    if (e_got == e_other) EXPECT_EQ(got & 1, 0) << "tie not to even: x=" << x;
  }
}

TEST(WireDtypeTest, NarrowingRoundsToNearestEven) {
  std::mt19937 gen(7);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    uint32_t u = bits(gen);
    float x;
    std::memcpy(&x, &u, sizeof(x));
    if (std::isnan(x)) continue;
    CheckNearest(DType::kBf16, FloatToBf16Bits, Bf16BitsToFloat, x);
    // fp16's range: scale into it (and just past it) so that most draws are meaningful.
    int exponent = 0;
    const float y = std::ldexp(std::frexp(x, &exponent), static_cast<int>(bits(gen) % 44) - 27);
    CheckNearest(DType::kFp16, FloatToFp16Bits, Fp16BitsToFloat, y);
  }
  // Edges: ties, the subnormal boundary, the overflow threshold, signed zeros.
  for (float x : {1.0f + std::ldexp(1.0f, -8), 1.0f + 3 * std::ldexp(1.0f, -8), 65504.0f, 65519.99f,
                  65520.0f, std::ldexp(1.0f, -24), std::ldexp(1.0f, -25), std::ldexp(1.5f, -25),
                  std::ldexp(1.0f, -14), -0.0f, 0.0f, 1e-30f, -1e30f}) {
    CheckNearest(DType::kBf16, FloatToBf16Bits, Bf16BitsToFloat, x);
    CheckNearest(DType::kFp16, FloatToFp16Bits, Fp16BitsToFloat, x);
  }
  EXPECT_EQ(FloatToFp16Bits(65520.0f), 0x7c00) << "65520 is a tie: to inf (even)";
  EXPECT_EQ(FloatToFp16Bits(std::ldexp(1.0f, -25)), 0) << "2^-25 is a tie: to zero";
  EXPECT_EQ(FloatToFp16Bits(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_EQ(FloatToBf16Bits(std::numeric_limits<float>::max()), 0x7f80) << "rounds up to inf";
  EXPECT_TRUE(std::isnan(Bf16BitsToFloat(FloatToBf16Bits(std::nanf("")))));
  EXPECT_TRUE(std::isnan(Fp16BitsToFloat(FloatToFp16Bits(std::nanf("")))));
}

TEST(WireDtypeTest, NarrowThenWidenAndErrors) {
  const std::vector<float> in = {0.1f, -2.5f, 1e-3f, 300.0f};
  for (DType t : {DType::kBf16, DType::kFp16}) {
    std::vector<uint16_t> narrow(in.size());
    Narrow(t, in, absl::MakeSpan(narrow));
    std::vector<float> wide;
    ASSERT_TRUE(
        Widen(t, absl::string_view(reinterpret_cast<const char*>(narrow.data()), narrow.size() * 2),
              wide)
            .ok());
    ASSERT_EQ(wide.size(), in.size());
    const double bound = t == DType::kBf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
    for (size_t i = 0; i < in.size(); ++i) {
      EXPECT_LE(std::abs(wide[i] - in[i]), bound * std::abs(in[i])) << DTypeName(t) << " " << i;
    }
    EXPECT_EQ(Widen(t, "abc", wide).code(), absl::StatusCode::kInvalidArgument);
  }
  std::vector<float> wide;
  EXPECT_EQ(Widen(DType::kFp32, "abcd", wide).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseWireDtype("bf16").value(), DType::kBf16);
  EXPECT_EQ(ParseWireDtype("fp8").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dptrain
