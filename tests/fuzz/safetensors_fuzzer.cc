// Fuzzes ParseSafetensors (common/safetensors), what --load_model does with a file.
// Input: the file's bytes. Checks: a file that parses holds tensors whose sizes match their
// shapes, and it round-trips: SerializeSafetensors of what was read parses back to the
// same names, shapes, data and metadata (the writer refuses only an empty tensor name,
// which the reader accepts); errors are InvalidArgument only.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/safetensors.h"
#include "tests/fuzz/fuzz_check.h"

namespace nn = dptrain;  // The format lives in common/safetensors.h.

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<nn::SafetensorsContents> parsed = nn::ParseSafetensors(bytes);
  if (!parsed.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(parsed.status()));
    return 0;
  }
  std::vector<nn::NamedTensor> tensors;
  bool empty_name = false;
  for (const nn::LoadedTensor& t : parsed->tensors) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    FUZZ_CHECK(static_cast<int64_t>(t.data.size()) == n);
    empty_name |= t.name.empty();
    tensors.push_back({t.name, t.shape, t.data.data()});
  }
  absl::StatusOr<std::string> written = nn::SerializeSafetensors(tensors, parsed->metadata);
  if (!written.ok()) {
    FUZZ_CHECK(empty_name);
    return 0;
  }
  absl::StatusOr<nn::SafetensorsContents> again = nn::ParseSafetensors(*written);
  FUZZ_CHECK(again.ok());
  FUZZ_CHECK(again->metadata == parsed->metadata);
  FUZZ_CHECK(again->tensors.size() == parsed->tensors.size());
  for (size_t i = 0; i < again->tensors.size(); ++i) {
    const nn::LoadedTensor &a = again->tensors[i], &b = parsed->tensors[i];
    FUZZ_CHECK(a.name == b.name && a.shape == b.shape && a.data.size() == b.data.size());
    FUZZ_CHECK(a.data.empty() ||
               std::memcmp(a.data.data(), b.data.data(), a.data.size() * sizeof(float)) == 0);
  }
  return 0;
}
