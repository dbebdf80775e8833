// Test helpers: fixture files under the test's temporary directory (testing::TempDir()).
#ifndef DPTRAIN_WORKER_DATA_TEST_FILES_H_
#define DPTRAIN_WORKER_DATA_TEST_FILES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/data/dataset.h"

namespace dptrain {
namespace testing_files {

// A fresh, empty directory testing::TempDir()/name (removed first if it exists).
std::string FreshDir(const std::string& name);

// Writes `bytes` to `path`, creating missing parent directories; returns path. Fails the
// test (ADD_FAILURE) on an error.
std::string WriteFile(const std::string& path, absl::string_view bytes);
std::string WriteFile(const std::string& path, const std::vector<uint8_t>& bytes);

// The bytes of `path` ("" if it cannot be read).
std::string ReadFile(const std::string& path);

// Creates `path` and its missing parents.
void MakeDirs(const std::string& path);

// A .npy file (format 1.0, C order) of dtype `descr` (e.g. "<f4") and `shape` holding `data`.
std::string NpyFile(const std::string& descr, const std::vector<int64_t>& shape,
                    absl::string_view data);

// `values`' bytes (the data of a .npy file of their type).
template <typename T>
std::string RawBytes(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

// `result` failed with `code` and one line of message holding `fragment`.
void ExpectError(const absl::StatusOr<Dataset>& result, absl::StatusCode code,
                 const std::string& fragment);

}  // namespace testing_files
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_DATA_TEST_FILES_H_
