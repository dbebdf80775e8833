// 16-bit gradients on the wire (--wire_dtype=bf16|fp16): workers narrow what they push, the
// shards widen it back and sum and keep fp32, as mixed-precision all-reduces do. Half the
// bytes; the price is the rounding of each pushed value (bf16: 8 significant bits, range of
// fp32; fp16: 11 bits, values past 65504 become inf and the push is skipped as an overflow).
// Round to nearest, ties to even, as the GPU's conversions; NaN stays NaN.
#ifndef DPTRAIN_COMMON_WIRE_DTYPE_H_
#define DPTRAIN_COMMON_WIRE_DTYPE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/dtype.h"

namespace dptrain {

// "fp32", "bf16" or "fp16"; InvalidArgument naming the value otherwise.
absl::StatusOr<DType> ParseWireDtype(absl::string_view name);

uint16_t FloatToBf16Bits(float x);
uint16_t FloatToFp16Bits(float x);
float Bf16BitsToFloat(uint16_t bits);
float Fp16BitsToFloat(uint16_t bits);

// out[i] = in[i] rounded to `type` (kBf16 or kFp16); out.size() == in.size().
void Narrow(DType type, absl::Span<const float> in, absl::Span<uint16_t> out);

// The fp32 values of `bytes` holding 16-bit `type` elements (kBf16 or kFp16), into `out`
// (resized). InvalidArgument for an odd byte count or another type.
absl::Status Widen(DType type, absl::string_view bytes, std::vector<float>& out);

}  // namespace dptrain

#endif  // DPTRAIN_COMMON_WIRE_DTYPE_H_
