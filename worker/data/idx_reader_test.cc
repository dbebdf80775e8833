#include "worker/data/idx_reader.h"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace dptrain {
namespace {

using Bytes = std::vector<uint8_t>;

std::string TmpDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

void PutU32(Bytes& b, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) b.push_back(static_cast<uint8_t>(v >> shift));
}

Bytes ImagesFile(uint32_t count, uint32_t rows, uint32_t cols, const Bytes& pixels,
                 uint32_t magic = 0x00000803) {
  Bytes b;
  PutU32(b, magic);
  PutU32(b, count);
  PutU32(b, rows);
  PutU32(b, cols);
  b.insert(b.end(), pixels.begin(), pixels.end());
  return b;
}

Bytes LabelsFile(uint32_t count, const Bytes& labels, uint32_t magic = 0x00000801) {
  Bytes b;
  PutU32(b, magic);
  PutU32(b, count);
  b.insert(b.end(), labels.begin(), labels.end());
  return b;
}

// Writes `bytes` to TEST_TMPDIR/name, gzip-compressed if `gz`; returns the path.
std::string Write(const std::string& name, const Bytes& bytes, bool gz = true) {
  const std::string path = absl::StrCat(TmpDir(), "/", name);
  if (gz) {
    gzFile f = gzopen(path.c_str(), "wb");
    EXPECT_NE(f, nullptr) << path;
    if (!bytes.empty()) {
      EXPECT_EQ(gzwrite(f, bytes.data(), bytes.size()), static_cast<int>(bytes.size()));
    }
    EXPECT_EQ(gzclose(f), Z_OK);
  } else {
    FILE* f = std::fopen(path.c_str(), "wb");
    EXPECT_NE(f, nullptr) << path;
    EXPECT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), f), bytes.size());
    std::fclose(f);
  }
  return path;
}

Bytes ReadRaw(const std::string& path) {
  Bytes b;
  FILE* f = std::fopen(path.c_str(), "rb");
  for (int c; f != nullptr && (c = std::fgetc(f)) != EOF;) b.push_back(static_cast<uint8_t>(c));
  if (f != nullptr) std::fclose(f);
  return b;
}

// Two 2x3 images and their labels.
const Bytes kPixels = {0, 51, 102, 153, 204, 255, 255, 0, 0, 0, 0, 1};
const Bytes kLabels = {3, 9};

std::string GoodImages() { return Write("good-images.gz", ImagesFile(2, 2, 3, kPixels)); }
std::string GoodLabels() { return Write("good-labels.gz", LabelsFile(2, kLabels)); }

void ExpectError(const absl::StatusOr<Dataset>& result, absl::StatusCode code,
                 const std::string& path, const std::string& fragment) {
  ASSERT_FALSE(result.ok());
  const std::string message(result.status().message());
  EXPECT_EQ(result.status().code(), code) << result.status();
  EXPECT_NE(message.find(path), std::string::npos) << message;
  EXPECT_NE(message.find(fragment), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

void ExpectGood(const absl::StatusOr<Dataset>& data) {
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->size, 2);
  EXPECT_EQ(data->rows, 2);
  EXPECT_EQ(data->cols, 3);
  EXPECT_EQ(data->num_classes, 10);
  ASSERT_TRUE(data->byte_storage);
  ASSERT_TRUE(data->consistent());
  EXPECT_EQ(data->labels, std::vector<nn::Label>(kLabels.begin(), kLabels.end()));
  std::vector<float> v(12);  // As the trainer reads them.
  data->CopyImages(0, 2, v.data());
  EXPECT_FLOAT_EQ(v[0], 0.0f);
  EXPECT_FLOAT_EQ(v[1], 0.2f);
  EXPECT_FLOAT_EQ(v[5], 1.0f);
  EXPECT_FLOAT_EQ(v[6], 1.0f);
  EXPECT_FLOAT_EQ(v[11], 1.0f / 255.0f);
  EXPECT_EQ(data->label(1), 9);
}

TEST(IdxReaderTest, LoadsGzipPair) { ExpectGood(LoadIdxPair(GoodImages(), GoodLabels())); }

TEST(IdxReaderTest, LoadsUncompressedPair) {
  ExpectGood(LoadIdxPair(Write("raw-images", ImagesFile(2, 2, 3, kPixels), false),
                         Write("raw-labels", LabelsFile(2, kLabels), false)));
}

TEST(IdxReaderTest, MissingFileIsNotFound) {
  const std::string missing = TmpDir() + "/no-such-file.gz";
  ExpectError(LoadIdxPair(missing, GoodLabels()), absl::StatusCode::kNotFound, missing, "");
  ExpectError(LoadIdxPair(GoodImages(), missing), absl::StatusCode::kNotFound, missing, "");
}

TEST(IdxReaderTest, LoadFashionMnistNamesTheMissingFile) {
  const std::string dir = TmpDir() + "/empty-dir";
  mkdir(dir.c_str(), 0755);
  ExpectError(LoadFashionMnist(dir, true), absl::StatusCode::kNotFound,
              dir + "/train-images-idx3-ubyte.gz", "");
  ExpectError(LoadFashionMnist(dir + "/", false), absl::StatusCode::kNotFound,
              dir + "/t10k-images-idx3-ubyte.gz", "");
}

TEST(IdxReaderTest, BadMagic) {
  const std::string images = GoodImages(), labels = GoodLabels();
  // Each file in the other's place.
  ExpectError(LoadIdxPair(labels, images), absl::StatusCode::kInvalidArgument, labels,
              "bad magic 0x00000801");
  const std::string bad = Write("bad-magic-labels", LabelsFile(2, kLabels, 0x12345678), false);
  ExpectError(LoadIdxPair(images, bad), absl::StatusCode::kInvalidArgument, bad,
              "bad magic 0x12345678");
}

TEST(IdxReaderTest, TruncatedHeader) {
  const std::string empty = Write("empty.gz", {});
  ExpectError(LoadIdxPair(empty, GoodLabels()), absl::StatusCode::kDataLoss, empty,
              "truncated header");
  Bytes half = ImagesFile(2, 2, 3, {});
  half.resize(10);
  const std::string path = Write("half-header", half, false);
  ExpectError(LoadIdxPair(path, GoodLabels()), absl::StatusCode::kDataLoss, path,
              "truncated header");
}

TEST(IdxReaderTest, TruncatedData) {
  const Bytes short_pixels(kPixels.begin(), kPixels.end() - 1);
  const std::string images = Write("short-images.gz", ImagesFile(2, 2, 3, short_pixels));
  ExpectError(LoadIdxPair(images, GoodLabels()), absl::StatusCode::kDataLoss, images,
              "truncated data: expected 12 bytes, got 11");
  const std::string labels = Write("short-labels", LabelsFile(3, kLabels), false);
  ExpectError(LoadIdxPair(GoodImages(), labels), absl::StatusCode::kDataLoss, labels,
              "truncated data");
}

TEST(IdxReaderTest, TruncatedGzipStream) {
  Bytes pixels(64 * 64 * 10);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(i * 7919 >> 3);
  Bytes gz = ReadRaw(Write("full.gz", ImagesFile(10, 64, 64, pixels)));
  ASSERT_GT(gz.size(), 100u);
  gz.resize(gz.size() / 2);
  const std::string path = Write("cut.gz", gz, false);
  ExpectError(LoadIdxPair(path, GoodLabels()), absl::StatusCode::kDataLoss, path, "truncated");
}

TEST(IdxReaderTest, CorruptGzipStream) {
  Bytes gz = ReadRaw(GoodImages());
  ASSERT_GT(gz.size(), 20u);
  for (size_t i = 10; i < gz.size(); ++i) gz[i] ^= 0xA5;  // Keep the gzip header, ruin the rest.
  const std::string path = Write("corrupt.gz", gz, false);
  const absl::StatusOr<Dataset> result = LoadIdxPair(path, GoodLabels());
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.status().message().find(path), std::string::npos) << result.status();
}

TEST(IdxReaderTest, CorruptGzipTrailer) {
  Bytes gz = ReadRaw(GoodImages());
  gz[gz.size() - 8] ^= 0xFF;  // CRC32 of the uncompressed data.
  const std::string path = Write("bad-crc.gz", gz, false);
  ExpectError(LoadIdxPair(path, GoodLabels()), absl::StatusCode::kDataLoss, path, "");
}

TEST(IdxReaderTest, TrailingData) {
  Bytes pixels = kPixels;
  pixels.push_back(7);
  const std::string path = Write("long-images.gz", ImagesFile(2, 2, 3, pixels));
  ExpectError(LoadIdxPair(path, GoodLabels()), absl::StatusCode::kDataLoss, path, "trailing data");
}

TEST(IdxReaderTest, LabelCountMismatch) {
  const std::string labels = Write("three-labels.gz", LabelsFile(3, {1, 2, 3}));
  ExpectError(LoadIdxPair(GoodImages(), labels), absl::StatusCode::kInvalidArgument, labels,
              "has 3 labels but");
}

TEST(IdxReaderTest, LabelOutOfRange) {
  const std::string labels = Write("label-ten.gz", LabelsFile(2, {0, 10}));
  ExpectError(LoadIdxPair(GoodImages(), labels), absl::StatusCode::kInvalidArgument, labels,
              "label 10 at index 1");
}

TEST(IdxReaderTest, AbsurdDimensions) {
  struct Case {
    uint32_t count, rows, cols;
  };
  for (const Case& c : {Case{0xFFFFFFFF, 28, 28}, Case{2, 0, 3}, Case{2, 3, 0},
                        Case{1, 0x7FFFFFFF, 0x7FFFFFFF}, Case{4, 5000, 5}}) {
    const std::string path = Write("absurd.gz", ImagesFile(c.count, c.rows, c.cols, kPixels));
    ExpectError(LoadIdxPair(path, GoodLabels()), absl::StatusCode::kInvalidArgument, path,
                "absurd dimensions");
  }
  const std::string labels = Write("absurd-labels.gz", LabelsFile(0xFFFFFFFF, kLabels));
  ExpectError(LoadIdxPair(GoodImages(), labels), absl::StatusCode::kInvalidArgument, labels,
              "absurd label count");
}

// A header promising ~1.5 GiB of pixels over 12 real bytes fails as truncated, quickly and
// without allocating what the header promises.
TEST(IdxReaderTest, HugePromiseIsTruncatedNotAllocated) {
  const std::string path = Write("liar.gz", ImagesFile(2000000, 28, 28, kPixels));
  ExpectError(LoadIdxPair(path, GoodLabels()), absl::StatusCode::kDataLoss, path,
              "truncated data: expected 1568000000 bytes, got 12");
}

TEST(IdxReaderTest, DirectoryInsteadOfFile) {
  const std::string dir = TmpDir() + "/a-directory";
  mkdir(dir.c_str(), 0755);
  const absl::StatusOr<Dataset> result = LoadIdxPair(dir, GoodLabels());
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.status().message().find(dir), std::string::npos) << result.status();
}

constexpr char kFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";

void CheckFashionMnist(bool train, int64_t expected_size) {
  struct stat st;
  if (stat(kFashionMnistDir, &st) != 0) {
    GTEST_SKIP() << kFashionMnistDir << " is absent (apt-get install dataset-fashion-mnist)";
  }
  absl::StatusOr<Dataset> data = LoadFashionMnist(kFashionMnistDir, train);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->size, expected_size);
  EXPECT_EQ(data->rows, 28);
  EXPECT_EQ(data->cols, 28);
  ASSERT_TRUE(data->consistent());
  std::vector<float> values(static_cast<size_t>(expected_size * 28 * 28));
  data->CopyImages(0, expected_size, values.data());
  ASSERT_EQ(data->labels.size(), static_cast<size_t>(expected_size));
  std::vector<int64_t> histogram(10, 0);
  for (nn::Label label : data->labels) ++histogram[label];
  for (int c = 0; c < 10; ++c) EXPECT_EQ(histogram[c], expected_size / 10) << "class " << c;
  float lo = 1, hi = 0;
  double sum = 0;
  for (float p : values) {
    lo = std::min(lo, p);
    hi = std::max(hi, p);
    sum += p;
  }
  EXPECT_EQ(lo, 0.0f);
  EXPECT_EQ(hi, 1.0f);
  const double mean = sum / values.size();
  EXPECT_GT(mean, 0.2);  // Fashion-MNIST's mean pixel is about 0.286.
  EXPECT_LT(mean, 0.4);
}

TEST(IdxReaderTest, RealFashionMnistTrain) { CheckFashionMnist(true, 60000); }
TEST(IdxReaderTest, RealFashionMnistTest) { CheckFashionMnist(false, 10000); }

}  // namespace
}  // namespace dptrain
