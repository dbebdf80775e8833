#include "worker/nn/tensor.h"

#include "absl/strings/str_cat.h"

namespace dptrain {
namespace nn {

std::string Dims::ToString() const { return absl::StrCat("[", c, ", ", h, ", ", w, "]"); }

int64_t TensorSpec::size() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace nn
}  // namespace dptrain
