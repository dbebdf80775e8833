#include "server/model_limits.h"

#include <limits>

#include "absl/strings/str_cat.h"

namespace dptrain {

absl::Status ValidateModel(const ModelDescription& model, const ModelLimits& limits) {
  if (model.num_shards < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_shards must be >= 1, got ", model.num_shards));
  }
  if (model.max_chunk_elements < 1 || model.max_chunk_elements > limits.max_chunk_elements) {
    return absl::InvalidArgumentError(absl::StrCat("max_chunk_elements must be in [1, ",
                                                   limits.max_chunk_elements, "], got ",
                                                   model.max_chunk_elements));
  }
  if (model.tensors.empty()) return absl::InvalidArgumentError("tensors: the model is empty");
  // Every tensor has at least one chunk, so this also bounds the loop below.
  if (static_cast<int64_t>(model.tensors.size()) > limits.max_chunks) {
    return absl::InvalidArgumentError(absl::StrCat("tensors: ", model.tensors.size(),
                                                   " tensors, more than the ", limits.max_chunks,
                                                   " chunks allowed"));
  }
  constexpr int64_t kElementBytes = sizeof(float);
  int64_t total_bytes = 0, total_chunks = 0;
  for (size_t i = 0; i < model.tensors.size(); ++i) {
    const int64_t n = model.tensors[i].num_elements;
    const std::string field = absl::StrCat("tensors[", i, "].num_elements");
    if (n < 1) {
      return absl::InvalidArgumentError(absl::StrCat(field, " must be >= 1, got ", n));
    }
    if (n > std::numeric_limits<int64_t>::max() / kElementBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " = ", n, ": its fp32 byte size overflows int64"));
    }
    const int64_t bytes = n * kElementBytes;
    if (bytes > limits.max_model_bytes - total_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " = ", n, " brings the model past the limit of ",
                       limits.max_model_bytes, " bytes (ps_server --max_model_bytes)"));
    }
    total_bytes += bytes;
    const int64_t chunks =
        n / model.max_chunk_elements + (n % model.max_chunk_elements != 0 ? 1 : 0);
    if (chunks > limits.max_chunks - total_chunks) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, " = ", n, " in chunks of max_chunk_elements = ", model.max_chunk_elements,
          " brings the model past the limit of ", limits.max_chunks,
          " chunks (ps_server --max_chunks)"));
    }
    total_chunks += chunks;
  }
  return absl::OkStatus();
}

}  // namespace dptrain
