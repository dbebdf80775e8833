#include "common/small_file.h"

#include <cerrno>
#include <cstdio>
#include <memory>

#include "absl/strings/str_cat.h"

namespace dptrain {

absl::StatusOr<std::string> ReadSmallFile(const std::string& path, size_t max_bytes) {
  std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (file == nullptr) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot read '", path, "'"));
  }
  std::string bytes(max_bytes + 1, '\0');
  const size_t n = std::fread(bytes.data(), 1, bytes.size(), file.get());
  if (std::ferror(file.get())) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot read '", path, "'"));
  }
  if (n > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", path, "' is longer than the ", max_bytes, " bytes expected"));
  }
  bytes.resize(n);
  return bytes;
}

}  // namespace dptrain
