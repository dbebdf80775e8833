#include "worker/data/cifar_reader.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/data/test_files.h"

namespace dptrain {
namespace {

using testing_files::ExpectError;
using testing_files::FreshDir;
using testing_files::WriteFile;
using Bytes = std::vector<uint8_t>;

constexpr int kPixels = 3072;

uint8_t Pixel(int record, int k) { return static_cast<uint8_t>((record * 7 + k * 13) % 256); }

// Records first..first+labels.size()-1; each is `prefix` (CIFAR-100's coarse label) if any,
// the label, then the pixels.
Bytes Records(int first, const Bytes& labels, bool cifar100) {
  Bytes b;
  for (size_t r = 0; r < labels.size(); ++r) {
    if (cifar100) b.push_back(static_cast<uint8_t>(19 - r % 20));  // Coarse label: ignored.
    b.push_back(labels[r]);
    for (int k = 0; k < kPixels; ++k) b.push_back(Pixel(first + static_cast<int>(r), k));
  }
  return b;
}

// A CIFAR-10 directory: batch i holds records 2i, 2i+1 (labels i, 9 - i); test: 3 records.
std::string Cifar10Dir(const std::string& name) {
  const std::string dir = FreshDir(name);
  for (int i = 0; i < 5; ++i) {
    WriteFile(absl::StrCat(dir, "/data_batch_", i + 1, ".bin"),
              Records(2 * i, {static_cast<uint8_t>(i), static_cast<uint8_t>(9 - i)}, false));
  }
  WriteFile(dir + "/test_batch.bin", Records(100, {4, 5, 6}, false));
  return dir;
}

// Value k of image i as the trainer reads it (the set holds bytes).
float Value(const Dataset& d, int64_t i, int64_t k) {
  std::vector<float> image(d.image_size());
  d.CopyImages(i, 1, image.data());
  return image[k];
}

TEST(CifarReaderTest, LoadsCifar10TrainingBatchesInOrder) {
  const std::string dir = Cifar10Dir("cifar10");
  absl::StatusOr<Dataset> data = LoadCifar(dir, true);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->size, 10);
  EXPECT_EQ(data->channels, 3);
  EXPECT_EQ(data->rows, 32);
  EXPECT_EQ(data->cols, 32);
  EXPECT_EQ(data->num_classes, 10);
  EXPECT_EQ(data->image_size(), kPixels);
  ASSERT_TRUE(data->byte_storage);
  ASSERT_EQ(data->bytes.size(), 10u * kPixels);
  EXPECT_EQ(data->labels, (std::vector<nn::Label>{0, 9, 1, 8, 2, 7, 3, 6, 4, 5}));
  for (int r : {0, 3, 9}) {
    // Red plane first, then green (offset 1024), then blue (2048), as stored.
    for (int k : {0, 1, 1023, 1024, 2048, 3071}) {
      EXPECT_FLOAT_EQ(Value(*data, r, k), Pixel(r, k) / 255.0f) << r << " " << k;
    }
  }
}

TEST(CifarReaderTest, LoadsCifar10TestBatch) {
  absl::StatusOr<Dataset> data = LoadCifar(Cifar10Dir("cifar10_test"), false);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->size, 3);
  EXPECT_EQ(data->labels, (std::vector<nn::Label>{4, 5, 6}));
  EXPECT_FLOAT_EQ(Value(*data, 2, 5), Pixel(102, 5) / 255.0f);
}

TEST(CifarReaderTest, LoadsCifar100FineLabels) {
  const std::string dir = FreshDir("cifar100");
  WriteFile(dir + "/train.bin", Records(0, {0, 99, 42}, true));
  WriteFile(dir + "/test.bin", Records(50, {7}, true));
  absl::StatusOr<Dataset> train = LoadCifar(dir, true);
  ASSERT_TRUE(train.ok()) << train.status();
  EXPECT_EQ(train->size, 3);
  EXPECT_EQ(train->num_classes, 100);
  EXPECT_EQ(train->channels, 3);
  EXPECT_EQ(train->labels, (std::vector<nn::Label>{0, 99, 42}));
  EXPECT_FLOAT_EQ(Value(*train, 1, 3071), Pixel(1, 3071) / 255.0f);
  absl::StatusOr<Dataset> test = LoadCifar(dir, false);
  ASSERT_TRUE(test.ok()) << test.status();
  EXPECT_EQ(test->labels, (std::vector<nn::Label>{7}));
  EXPECT_EQ(test->num_classes, 100);
}

TEST(CifarReaderTest, MissingFilesAreNamed) {
  const std::string empty = FreshDir("cifar_empty");
  ExpectError(LoadCifar(empty, true), absl::StatusCode::kNotFound, "no CIFAR files");
  const std::string dir = FreshDir("cifar_partial");
  WriteFile(dir + "/data_batch_1.bin", Records(0, {1}, false));
  WriteFile(dir + "/data_batch_3.bin", Records(0, {1}, false));
  ExpectError(LoadCifar(dir, true), absl::StatusCode::kNotFound,
              absl::StrCat(dir, "/data_batch_2.bin, ", dir, "/data_batch_4.bin, ", dir,
                           "/data_batch_5.bin not found"));
  ExpectError(LoadCifar(dir, false), absl::StatusCode::kNotFound, dir + "/test_batch.bin");
  const std::string c100 = FreshDir("cifar100_partial");
  WriteFile(c100 + "/train.bin", Records(0, {1}, true));
  ExpectError(LoadCifar(c100, false), absl::StatusCode::kNotFound, c100 + "/test.bin");
}

TEST(CifarReaderTest, BothVariantsInOneDirectoryIsAnError) {
  const std::string dir = Cifar10Dir("cifar_both");
  WriteFile(dir + "/train.bin", Records(0, {1}, true));
  ExpectError(LoadCifar(dir, true), absl::StatusCode::kInvalidArgument, "holds both CIFAR-10");
}

TEST(CifarReaderTest, PartialRecordIsDataLoss) {
  const std::string dir = Cifar10Dir("cifar_partial_record");
  Bytes b = Records(0, {1, 2}, false);
  b.resize(b.size() + 5, 0);
  const std::string path = WriteFile(dir + "/data_batch_4.bin", b);
  ExpectError(LoadCifar(dir, true), absl::StatusCode::kDataLoss,
              path +
                  ": size 6151 bytes is not a whole number of 3073-byte records (2 records "
                  "and 5 bytes)");
  const std::string c100 = FreshDir("cifar100_partial_record");
  Bytes short_record = Records(0, {1}, true);
  short_record.pop_back();
  const std::string train = WriteFile(c100 + "/train.bin", short_record);
  ExpectError(LoadCifar(c100, true), absl::StatusCode::kDataLoss,
              train + ": size 3073 bytes is not a whole number of 3074-byte records (0 records");
}

TEST(CifarReaderTest, EmptyFileIsDataLoss) {
  const std::string dir = Cifar10Dir("cifar_empty_file");
  const std::string path = WriteFile(dir + "/data_batch_2.bin", "");
  ExpectError(LoadCifar(dir, true), absl::StatusCode::kDataLoss, path + ": empty file");
}

TEST(CifarReaderTest, LabelOutOfRangeNamesFileAndRecord) {
  const std::string dir = Cifar10Dir("cifar_bad_label");
  const std::string path = WriteFile(dir + "/data_batch_5.bin", Records(0, {3, 10}, false));
  ExpectError(LoadCifar(dir, true), absl::StatusCode::kInvalidArgument,
              path + ": record 1 has label 10, not in [0, 10)");
  const std::string c100 = FreshDir("cifar100_bad_label");
  const std::string train = WriteFile(c100 + "/train.bin", Records(0, {0, 1, 100}, true));
  ExpectError(LoadCifar(c100, true), absl::StatusCode::kInvalidArgument,
              train + ": record 2 has label 100, not in [0, 100)");
}

TEST(CifarReaderTest, DirectoryInPlaceOfABatch) {
  const std::string dir = FreshDir("cifar_dir_batch");
  testing_files::MakeDirs(dir + "/train.bin");
  WriteFile(dir + "/test.bin", Records(0, {1}, true));
  const absl::StatusOr<Dataset> result = LoadCifar(dir, true);
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.status().message().find(dir + "/train.bin"), std::string::npos)
      << result.status();
}

}  // namespace
}  // namespace dptrain
