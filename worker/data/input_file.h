// A regular file opened for reading, for the data set readers: errors are one-line statuses
// naming the file, and the size is known before anything is read, so that a reader can check
// what a header promises against what the file holds before it allocates anything.
//
// Errors: NotFound (no such file), InvalidArgument (not a regular file, e.g. a directory),
// the errno's code for other failed opens (e.g. PermissionDenied), DataLoss for read errors
// and for data that end before the size seen at open time.
//
// Thread-compatible: one InputFile per thread; distinct files may be read in parallel. ReadAt
// and WillNeed are thread-safe.
#ifndef DPTRAIN_WORKER_DATA_INPUT_FILE_H_
#define DPTRAIN_WORKER_DATA_INPUT_FILE_H_

#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dptrain {

class InputFile {
 public:
  // Opens `path`; fails unless it is a regular file.
  static absl::StatusOr<InputFile> Open(const std::string& path);

  InputFile(InputFile&& other) noexcept;
  InputFile& operator=(InputFile&& other) noexcept;
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  ~InputFile();

  const std::string& path() const { return path_; }
  // The file's size in bytes when it was opened.
  int64_t size() const { return size_; }
  // Bytes read so far.
  int64_t offset() const { return offset_; }

  // Reads exactly n bytes into buf, or fails with DataLoss "PATH: truncated WHAT at byte
  // OFFSET: expected N bytes, got M" (also for a read error).
  absl::Status ReadExactly(void* buf, int64_t n, const char* what);
  // Reads exactly n bytes at `at` into buf (pread: the offset above is left alone, and threads
  // may call it at once), with ReadExactly's errors.
  absl::Status ReadAt(int64_t at, void* buf, int64_t n, const char* what) const;
  // Tells the kernel that bytes [at, at + n) will be read soon (posix_fadvise WILLNEED: a
  // read-ahead for reads in an order the kernel cannot guess). Best effort.
  void WillNeed(int64_t at, int64_t n) const;

 private:
  InputFile(std::string path, int fd, int64_t size)
      : path_(std::move(path)), fd_(fd), size_(size) {}

  std::string path_;
  int fd_ = -1;
  int64_t size_ = 0;
  int64_t offset_ = 0;
};

// True if `path` names an existing regular file (following links).
bool IsRegularFile(const std::string& path);
// True if `path` names an existing directory (following links).
bool IsDirectory(const std::string& path);
// `dir` + "/" + `name`, without doubling a trailing slash; "." for an empty dir.
std::string JoinPath(const std::string& dir, const std::string& name);

}  // namespace dptrain

#endif  // DPTRAIN_WORKER_DATA_INPUT_FILE_H_
