#include "worker/data/input_file.h"

#include <string>

#include "gtest/gtest.h"
#include "worker/data/test_files.h"

namespace dptrain {
namespace {

using testing_files::FreshDir;
using testing_files::WriteFile;

TEST(InputFileTest, ReadsExactlyAndReportsTruncation) {
  const std::string path = WriteFile(FreshDir("input_file") + "/f", "abcdef");
  absl::StatusOr<InputFile> file = InputFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->size(), 6);
  char buf[8] = {};
  ASSERT_TRUE(file->ReadExactly(buf, 4, "head").ok());
  EXPECT_EQ(std::string(buf, 4), "abcd");
  EXPECT_EQ(file->offset(), 4);
  const absl::Status s = file->ReadExactly(buf, 4, "tail");
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(s.message(), path + ": truncated tail at byte 4: expected 4 bytes, got 2");
}

TEST(InputFileTest, OpenErrorsNameThePath) {
  const std::string dir = FreshDir("input_file_errors");
  const absl::StatusOr<InputFile> missing = InputFile::Open(dir + "/none");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find(dir + "/none"), std::string::npos);
  const absl::StatusOr<InputFile> directory = InputFile::Open(dir);
  EXPECT_EQ(directory.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(directory.status().message(), dir + ": is a directory, not a file");
}

TEST(InputFileTest, MovedFromFileIsInert) {
  const std::string path = WriteFile(FreshDir("input_file_move") + "/f", "xy");
  absl::StatusOr<InputFile> a = InputFile::Open(path);
  ASSERT_TRUE(a.ok());
  InputFile b = *std::move(a);
  char c[2];
  EXPECT_TRUE(b.ReadExactly(c, 2, "data").ok());
  EXPECT_EQ(b.path(), path);
}

TEST(InputFileTest, PathHelpers) {
  EXPECT_EQ(JoinPath("a", "b"), "a/b");
  EXPECT_EQ(JoinPath("a/", "b"), "a/b");
  EXPECT_EQ(JoinPath("", "b"), "./b");
  const std::string dir = FreshDir("input_file_paths");
  const std::string file = WriteFile(dir + "/f", "");
  EXPECT_TRUE(IsDirectory(dir));
  EXPECT_FALSE(IsDirectory(file));
  EXPECT_TRUE(IsRegularFile(file));
  EXPECT_FALSE(IsRegularFile(dir));
  EXPECT_FALSE(IsRegularFile(dir + "/none"));
}

}  // namespace
}  // namespace dptrain
