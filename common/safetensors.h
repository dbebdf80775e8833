// Reading and writing the safetensors format (https://github.com/huggingface/safetensors), the
// checkpoint format of Hugging Face and PyTorch tooling: models move between dptrain and PyTorch
// by state_dict name (worker/nn/safetensors.h), and shard checkpoints (server/checkpoint.h) use it.
//
// File layout: an 8-byte little-endian header length N, N bytes of JSON header
//   {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value", ...}}
// (padded with spaces to a multiple of 8), then the raw little-endian tensor data; offsets are
// relative to the start of the data section and the tensors cover it back to back.
//
// Only F32 tensors are supported. The reader is strict: it rejects truncated files, headers over
// kMaxSafetensorsHeaderBytes, malformed JSON, duplicate names, unknown keys, other dtypes, and
// offsets that are out of range, overlap, leave holes or disagree with the shape.
#ifndef DPTRAIN_COMMON_SAFETENSORS_H_
#define DPTRAIN_COMMON_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dptrain {

inline constexpr int64_t kMaxSafetensorsHeaderBytes = 100 << 20;  // 100 MiB.

// A tensor to write: `data` points at product(shape) floats (one for an empty shape) that must
// stay valid during the call.
struct NamedTensor {
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;
};

struct LoadedTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;
};

struct SafetensorsContents {
  std::vector<LoadedTensor> tensors;  // In the order of their data offsets.
  std::map<std::string, std::string> metadata;

  // The tensor named `name`, or nullptr.
  const LoadedTensor* Find(absl::string_view name) const;
};

// Serialises `tensors` (names unique and non-empty, written in the order given) and `metadata`.
absl::StatusOr<std::string> SerializeSafetensors(
    const std::vector<NamedTensor>& tensors,
    const std::map<std::string, std::string>& metadata = {});

// Parses a whole safetensors file held in memory. Errors are InvalidArgument (corrupt or
// unsupported content) and name the offending tensor where there is one.
absl::StatusOr<SafetensorsContents> ParseSafetensors(absl::string_view bytes);

// Writes atomically: a temporary file beside `path`, fsync, rename over it, fsync of the
// directory (a crash leaves either the old file or the new one).
absl::Status SaveSafetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                             const std::map<std::string, std::string>& metadata = {});

// Reads and parses `path`; the messages of errors start with the path.
absl::StatusOr<SafetensorsContents> LoadSafetensors(const std::string& path);

// fsync of the directory holding `path`, so that a rename in it is durable.
absl::Status SyncDirectoryOf(const std::string& path);
// "[2,3]".
std::string ShapeString(const std::vector<int64_t>& shape);
// Elements of `shape`, or -1 when a dimension is negative or the product overflows 2^62.
int64_t NumElements(const std::vector<int64_t>& shape);
// `s` with its message prefixed by "`path`: ".
absl::Status WithPath(const std::string& path, const absl::Status& s);

}  // namespace dptrain

#endif  // DPTRAIN_COMMON_SAFETENSORS_H_
