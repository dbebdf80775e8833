#include "common/file_system.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "absl/strings/str_cat.h"

namespace dptrain {
namespace {

absl::Status Errno(int e, absl::string_view what, const std::string& path) {
  return absl::ErrnoToStatus(e, absl::StrCat(what, " '", path, "'"));
}

}  // namespace

absl::Status PosixFileSystem::WriteFile(const std::string& path, absl::string_view data) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno(errno, "cannot create", path);
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int e = n < 0 ? errno : EIO;
      close(fd);
      return Errno(e, "cannot write", path);
    }
    done += static_cast<size_t>(n);
  }
  if (fsync(fd) != 0) {
    const int e = errno;
    close(fd);
    return Errno(e, "cannot sync", path);
  }
  if (close(fd) != 0) return Errno(errno, "cannot close", path);
  return absl::OkStatus();
}

absl::StatusOr<std::string> PosixFileSystem::ReadFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Errno(errno, "cannot open", path);
  std::string out;
  char buffer[1 << 16];
  while (true) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      close(fd);
      return Errno(e, "cannot read", path);
    }
    if (n == 0) break;
    out.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  return out;
}

absl::Status PosixFileSystem::Rename(const std::string& from, const std::string& to) {
  if (rename(from.c_str(), to.c_str()) != 0) return Errno(errno, "cannot rename", from);
  return absl::OkStatus();
}

absl::Status PosixFileSystem::SyncDir(const std::string& dir) {
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Errno(errno, "cannot open directory", dir);
  const bool ok = fsync(fd) == 0;
  const int e = errno;
  close(fd);
  if (!ok) return Errno(e, "cannot sync directory", dir);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> PosixFileSystem::ListDir(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return Errno(errno, "cannot list directory", dir);
  std::vector<std::string> names;
  while (const dirent* entry = readdir(d)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  closedir(d);
  return names;
}

absl::Status PosixFileSystem::Remove(const std::string& path) {
  if (unlink(path.c_str()) != 0) return Errno(errno, "cannot remove", path);
  return absl::OkStatus();
}

absl::Status PosixFileSystem::CreateDir(const std::string& dir) {
  for (size_t slash = dir.find('/', 1);; slash = dir.find('/', slash + 1)) {
    const std::string prefix = dir.substr(0, slash);
    if (!prefix.empty() && mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      return Errno(errno, "cannot create directory", prefix);
    }
    if (slash == std::string::npos) break;
  }
  struct stat st;
  if (stat(dir.c_str(), &st) != 0) return Errno(errno, "cannot create directory", dir);
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat("'", dir, "' is not a directory"));
  }
  return absl::OkStatus();
}

}  // namespace dptrain
