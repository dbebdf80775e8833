#include "worker/data/test_files.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace dptrain {
namespace testing_files {

namespace fs = std::filesystem;

std::string FreshDir(const std::string& name) {
  std::string base = ::testing::TempDir();
  if (!base.empty() && base.back() != '/') base += '/';
  const std::string dir = base + name;
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(dir, ec);
  if (ec) ADD_FAILURE() << dir << ": " << ec.message();
  return dir;
}

void MakeDirs(const std::string& path) {
  std::error_code ec;
  fs::create_directories(path, ec);
  if (ec) ADD_FAILURE() << path << ": " << ec.message();
}

std::string WriteFile(const std::string& path, absl::string_view bytes) {
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty()) MakeDirs(parent.string());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) ADD_FAILURE() << "cannot write " << path;
  return path;
}

std::string WriteFile(const std::string& path, const std::vector<uint8_t>& bytes) {
  return WriteFile(path,
                   absl::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string NpyFile(const std::string& descr, const std::vector<int64_t>& shape,
                    absl::string_view data) {
  std::string dims;
  for (int64_t d : shape) absl::StrAppend(&dims, d, ",");
  std::string header =
      absl::StrCat("{'descr': '", descr, "', 'fortran_order': False, 'shape': (", dims, "), }");
  header += '\n';
  std::string out = "\x93NUMPY\x01";
  out += '\0';
  out += static_cast<char>(header.size() & 0xFF);
  out += static_cast<char>(header.size() >> 8);
  return absl::StrCat(out, header, data);
}

void ExpectError(const absl::StatusOr<Dataset>& result, absl::StatusCode code,
                 const std::string& fragment) {
  ASSERT_FALSE(result.ok());
  const std::string message(result.status().message());
  EXPECT_EQ(result.status().code(), code) << result.status();
  EXPECT_NE(message.find(fragment), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

}  // namespace testing_files
}  // namespace dptrain
