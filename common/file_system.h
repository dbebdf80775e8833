// The few file operations that durable state (shard checkpoints) needs, behind an interface
// so that tests can wrap the real one and inject failures (leveldb's Env/EnvWrapper idea):
// a write that fails, or one that leaves a truncated file behind as a crash would.
#ifndef DPTRAIN_COMMON_FILE_SYSTEM_H_
#define DPTRAIN_COMMON_FILE_SYSTEM_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dptrain {

class FileSystem {
 public:
  virtual ~FileSystem() = default;
  // Creates or replaces `path` with `data`, on stable storage (fsync) when it returns OK.
  virtual absl::Status WriteFile(const std::string& path, absl::string_view data) = 0;
  virtual absl::StatusOr<std::string> ReadFile(const std::string& path) = 0;
  // Atomically replaces `to` with `from` (both in one directory).
  virtual absl::Status Rename(const std::string& from, const std::string& to) = 0;
  // Makes the directory's entries (a rename into it) durable.
  virtual absl::Status SyncDir(const std::string& dir) = 0;
  // The names (not paths) of the entries of `dir`, unordered.
  virtual absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) = 0;
  virtual absl::Status Remove(const std::string& path) = 0;
  // Creates `dir` and its missing parents; OK if it exists.
  virtual absl::Status CreateDir(const std::string& dir) = 0;
};

// The machine's file system (POSIX calls). Errors name the path and the errno text.
class PosixFileSystem final : public FileSystem {
 public:
  absl::Status WriteFile(const std::string& path, absl::string_view data) override;
  absl::StatusOr<std::string> ReadFile(const std::string& path) override;
  absl::Status Rename(const std::string& from, const std::string& to) override;
  absl::Status SyncDir(const std::string& dir) override;
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) override;
  absl::Status Remove(const std::string& path) override;
  absl::Status CreateDir(const std::string& dir) override;
};

// Forwards every call to `target` (not owned); subclasses override what they change.
class FileSystemWrapper : public FileSystem {
 public:
  explicit FileSystemWrapper(FileSystem* target) : target_(target) {}
  absl::Status WriteFile(const std::string& path, absl::string_view data) override {
    return target_->WriteFile(path, data);
  }
  absl::StatusOr<std::string> ReadFile(const std::string& path) override {
    return target_->ReadFile(path);
  }
  absl::Status Rename(const std::string& from, const std::string& to) override {
    return target_->Rename(from, to);
  }
  absl::Status SyncDir(const std::string& dir) override { return target_->SyncDir(dir); }
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) override {
    return target_->ListDir(dir);
  }
  absl::Status Remove(const std::string& path) override { return target_->Remove(path); }
  absl::Status CreateDir(const std::string& dir) override { return target_->CreateDir(dir); }

 protected:
  FileSystem* target() const { return target_; }

 private:
  FileSystem* target_;
};

}  // namespace dptrain

#endif  // DPTRAIN_COMMON_FILE_SYSTEM_H_
