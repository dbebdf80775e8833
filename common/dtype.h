// Element types that cross the wire. Values match proto::DType.
#ifndef DPTRAIN_COMMON_DTYPE_H_
#define DPTRAIN_COMMON_DTYPE_H_

#include <cstddef>

namespace dptrain {

enum class DType { kUnspecified = 0, kFp32 = 1, kFp16 = 2, kBf16 = 3 };

// Bytes per element; 0 for kUnspecified or an out-of-range value.
inline size_t ElementSize(DType t) {
  switch (t) {
    case DType::kFp32:
      return 4;
    case DType::kFp16:
    case DType::kBf16:
      return 2;
    default:
      return 0;
  }
}

inline const char* DTypeName(DType t) {
  switch (t) {
    case DType::kFp32:
      return "fp32";
    case DType::kFp16:
      return "fp16";
    case DType::kBf16:
      return "bf16";
    default:
      return "unspecified";
  }
}

}  // namespace dptrain

#endif  // DPTRAIN_COMMON_DTYPE_H_
