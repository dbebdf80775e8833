// Reading a small file whole (keys, certificates, tokens), with one-line errors.
#ifndef DPTRAIN_COMMON_SMALL_FILE_H_
#define DPTRAIN_COMMON_SMALL_FILE_H_

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"

namespace dptrain {

// The bytes of `path`. Errors name the path: the errno's code (NotFound, PermissionDenied,
// ...) when it cannot be opened or read, InvalidArgument when it is longer than `max_bytes`.
absl::StatusOr<std::string> ReadSmallFile(const std::string& path, size_t max_bytes);

}  // namespace dptrain

#endif  // DPTRAIN_COMMON_SMALL_FILE_H_
