// Reading and writing the safetensors format (https://github.com/huggingface/safetensors), the
// checkpoint format of Hugging Face and PyTorch tooling, so that weights move between dptrain and
// PyTorch by state_dict name.
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
#ifndef DPTRAIN_WORKER_NN_SAFETENSORS_H_
#define DPTRAIN_WORKER_NN_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/nn/model.h"

namespace dptrain {
namespace nn {

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

// Writes atomically: a temporary file beside `path`, then rename over it.
absl::Status SaveSafetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                             const std::map<std::string, std::string>& metadata = {});

// Reads and parses `path`; the messages of errors start with the path.
absl::StatusOr<SafetensorsContents> LoadSafetensors(const std::string& path);

// Writes every parameter of `model` under its params() (PyTorch state_dict) name, then every
// buffer (batch norm running statistics) under its buffers() name, with metadata
// {"format": "pt", "model": model.name()}. Takes a non-const Model because weights() is non-const.
absl::Status SaveModel(Model& model, const std::string& path);

// Sets every parameter and buffer of `model` from the tensor of the same name in `contents`
// (buffers are required too, as by PyTorch's strict load_state_dict). Tensors that
// the model does not have are ignored (a fixture may hold inputs or gradients beside the
// weights). Fails, naming the tensor, on a missing name or a shape mismatch, and if the metadata
// names another model; `model` is unchanged on failure.
absl::Status SetModelWeights(const SafetensorsContents& contents, Model& model);

// LoadSafetensors(path), then SetModelWeights; messages start with the path.
absl::Status LoadModel(const std::string& path, Model& model);

}  // namespace nn
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_NN_SAFETENSORS_H_
