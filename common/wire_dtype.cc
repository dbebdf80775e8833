#include "common/wire_dtype.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace dptrain {

absl::StatusOr<DType> ParseWireDtype(absl::string_view name) {
  if (name == "fp32") return DType::kFp32;
  if (name == "bf16") return DType::kBf16;
  if (name == "fp16") return DType::kFp16;
  return absl::InvalidArgumentError(
      absl::StrCat("wire dtype must be fp32, bf16 or fp16, got '", name, "'"));
}

namespace {

uint32_t Bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}

float FromBits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
}

}  // namespace

uint16_t FloatToBf16Bits(float x) {
  const uint32_t u = Bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN.
  // Round to nearest even on the 16 bits dropped (an overflow carries into inf, as it should).
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

float Bf16BitsToFloat(uint16_t bits) { return FromBits(static_cast<uint32_t>(bits) << 16); }

uint16_t FloatToFp16Bits(float x) {
  const uint32_t u = Bits(x);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;   // NaN.
  if (a >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 rounds to inf (and inf itself).
  if (a < 0x38800000u) {                        // Below fp16's smallest normal 2^-14.
    // Subnormal: value / 2^-24, rounded to nearest even (0x33000000 = 2^-25 rounds to 0).
    if (a <= 0x33000000u) return sign;
    const int exponent = static_cast<int>(a >> 23);         // Biased, 102..112.
    const uint32_t mantissa = (a & 0x7fffffu) | 0x800000u;  // With the hidden bit.
    const int shift = 126 - exponent;                       // 14..24.
    uint32_t q = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rest > half || (rest == half && (q & 1u))) ++q;
    return sign | static_cast<uint16_t>(q);
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits.
  const uint32_t v = a - (112u << 23);
  return sign | static_cast<uint16_t>((v + 0xfffu + ((v >> 13) & 1u)) >> 13);
}

float Fp16BitsToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0x1f) return FromBits(sign | 0x7f800000u | (mantissa << 13));  // inf, NaN.
  if (exponent == 0) {  // Zero or subnormal: mantissa x 2^-24.
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return sign ? -magnitude : magnitude;
  }
  return FromBits(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

void Narrow(DType type, absl::Span<const float> in, absl::Span<uint16_t> out) {
  if (type == DType::kBf16) {
    for (size_t i = 0; i < in.size(); ++i) out[i] = FloatToBf16Bits(in[i]);
  } else {
    for (size_t i = 0; i < in.size(); ++i) out[i] = FloatToFp16Bits(in[i]);
  }
}

absl::Status Widen(DType type, absl::string_view bytes, std::vector<float>& out) {
  if (type != DType::kBf16 && type != DType::kFp16) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot widen ", DTypeName(type), " values: not a 16-bit type"));
  }
  if (bytes.size() % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(bytes.size(), " bytes of ", DTypeName(type), " values: not a whole number"));
  }
  out.resize(bytes.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) {
    uint16_t bits;
    std::memcpy(&bits, bytes.data() + 2 * i, sizeof(bits));
    out[i] = type == DType::kBf16 ? Bf16BitsToFloat(bits) : Fp16BitsToFloat(bits);
  }
  return absl::OkStatus();
}

}  // namespace dptrain
