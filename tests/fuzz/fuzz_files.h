// Files for the fuzz targets that read through a path (the data readers): a directory of their
// own, made once and removed at exit, and whole-file writes.
#ifndef DPTRAIN_TESTS_FUZZ_FUZZ_FILES_H_
#define DPTRAIN_TESTS_FUZZ_FUZZ_FILES_H_

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_check.h"

namespace fuzz_files {

// A fresh directory under $TEST_TMPDIR (or $TMPDIR, /tmp) named after `stem`, whose files
// `names` (and itself) are removed when the process exits. Call once, from
// LLVMFuzzerInitialize.
inline const std::string& MakeDir(const char* stem, std::vector<std::string> names) {
  static std::string dir;
  static std::vector<std::string> files;
  const char* tmp = std::getenv("TEST_TMPDIR");
  if (tmp == nullptr) tmp = std::getenv("TMPDIR");
  dir = std::string(tmp != nullptr ? tmp : "/tmp") + "/" + stem + ".XXXXXX";
  FUZZ_CHECK(mkdtemp(dir.data()) != nullptr);
  files = std::move(names);
  std::atexit([] {
    for (const std::string& f : files) std::remove((dir + "/" + f).c_str());
    rmdir(dir.c_str());
  });
  return dir;
}

inline void Write(const std::string& path, const std::string& bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  FUZZ_CHECK(f != nullptr);
  FUZZ_CHECK(std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size());
  FUZZ_CHECK(std::fclose(f) == 0);
}

}  // namespace fuzz_files

#endif  // DPTRAIN_TESTS_FUZZ_FUZZ_FILES_H_
