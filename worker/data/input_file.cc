#include "worker/data/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace dptrain {

absl::StatusOr<InputFile> InputFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat(path, ": cannot open"));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int error = errno;
    ::close(fd);
    return absl::ErrnoToStatus(error, absl::StrCat(path, ": cannot stat"));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(
        path, S_ISDIR(st.st_mode) ? ": is a directory, not a file" : ": is not a regular file"));
  }
  return InputFile(path, fd, static_cast<int64_t>(st.st_size));
}

InputFile::InputFile(InputFile&& other) noexcept
    : path_(std::move(other.path_)),
      fd_(std::exchange(other.fd_, -1)),
      size_(other.size_),
      offset_(other.offset_) {}

InputFile& InputFile::operator=(InputFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    size_ = other.size_;
    offset_ = other.offset_;
  }
  return *this;
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status InputFile::ReadExactly(void* buf, int64_t n, const char* what) {
  const int64_t start = offset_;
  auto* out = static_cast<uint8_t*>(buf);
  int64_t got = 0;
  while (got < n) {
    const size_t want = static_cast<size_t>(std::min<int64_t>(n - got, int64_t{1} << 30));
    const ssize_t r = ::read(fd_, out + got, want);
    if (r < 0) {
      if (errno == EINTR) continue;
      const int error = errno;
      offset_ += got;
      return absl::DataLossError(
          absl::StrCat(path_, ": read error in ", what, ": ", std::strerror(error)));
    }
    if (r == 0) break;
    got += r;
  }
  offset_ += got;
  if (got < n) {
    return absl::DataLossError(absl::StrCat(path_, ": truncated ", what, " at byte ", start,
                                            ": expected ", n, " bytes, got ", got));
  }
  return absl::OkStatus();
}

absl::Status InputFile::ReadAt(int64_t at, void* buf, int64_t n, const char* what) const {
  auto* out = static_cast<uint8_t*>(buf);
  int64_t got = 0;
  while (got < n) {
    const size_t want = static_cast<size_t>(std::min<int64_t>(n - got, int64_t{1} << 30));
    const ssize_t r = ::pread(fd_, out + got, want, static_cast<off_t>(at + got));
    if (r < 0) {
      if (errno == EINTR) continue;
      return absl::DataLossError(
          absl::StrCat(path_, ": read error in ", what, ": ", std::strerror(errno)));
    }
    if (r == 0) break;
    got += r;
  }
  if (got < n) {
    return absl::DataLossError(absl::StrCat(path_, ": truncated ", what, " at byte ", at,
                                            ": expected ", n, " bytes, got ", got));
  }
  return absl::OkStatus();
}

void InputFile::WillNeed(int64_t at, int64_t n) const {
  posix_fadvise(fd_, static_cast<off_t>(at), static_cast<off_t>(n), POSIX_FADV_WILLNEED);
}

bool IsRegularFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string JoinPath(const std::string& dir, const std::string& name) {
  if (dir.empty()) return absl::StrCat(".", "/", name);
  if (dir.back() == '/') return absl::StrCat(dir, name);
  return absl::StrCat(dir, "/", name);
}

}  // namespace dptrain
