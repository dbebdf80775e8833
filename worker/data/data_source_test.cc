#include "worker/data/data_source.h"

#include <zlib.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/data/test_files.h"
#include "worker/data/test_images.h"

namespace dptrain {
namespace {

using testing_files::ExpectError;
using testing_files::FreshDir;
using testing_files::WriteFile;
using Bytes = std::vector<uint8_t>;

void PutU32(std::string& b, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) b += static_cast<char>(v >> shift);
}

// IDX images (count x 2 x 2, pixel value = label) and labels.
void WriteIdx(const std::string& dir, const std::string& prefix, const Bytes& labels, bool gz) {
  std::string images, label_file;
  PutU32(images, 0x803);
  PutU32(images, labels.size());
  PutU32(images, 2);
  PutU32(images, 2);
  for (uint8_t l : labels) images += std::string(4, static_cast<char>(l));
  PutU32(label_file, 0x801);
  PutU32(label_file, labels.size());
  label_file.append(labels.begin(), labels.end());
  auto write = [&](const std::string& name, const std::string& bytes) {
    const std::string path = absl::StrCat(dir, "/", prefix, name, gz ? ".gz" : "");
    if (!gz) {
      WriteFile(path, bytes);
      return;
    }
    gzFile f = gzopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(gzwrite(f, bytes.data(), bytes.size()), static_cast<int>(bytes.size()));
    ASSERT_EQ(gzclose(f), Z_OK);
  };
  write("-images-idx3-ubyte", images);
  write("-labels-idx1-ubyte", label_file);
}

std::string Npy(const std::string& descr, const std::vector<int64_t>& shape,
                const std::string& data) {
  return testing_files::NpyFile(descr, shape, data);
}

TEST(DataSourceTest, DetectsAndLoadsEachFormat) {
  const std::string idx = FreshDir("source_idx");
  WriteIdx(idx, "train", {1, 2, 3}, false);
  WriteIdx(idx, "t10k", {4}, false);
  const std::string idx_gz = FreshDir("source_idx_gz");
  WriteIdx(idx_gz, "train", {5, 6}, true);
  WriteIdx(idx_gz, "t10k", {7}, true);
  WriteIdx(idx_gz, "train", {9}, false);  // The .gz files win.

  const std::string cifar = FreshDir("source_cifar");
  std::string record = std::string(1, '\3') + std::string(1, '\x2a') + std::string(3072, '\x7f');
  WriteFile(cifar + "/train.bin", record + record);
  WriteFile(cifar + "/test.bin", record);

  const std::string npy = FreshDir("source_npy");
  WriteFile(npy + "/train_images.npy", Npy("|u1", {3, 2, 2}, std::string(12, '\0')));
  WriteFile(npy + "/train_labels.npy", Npy("|u1", {3}, std::string("\0\1\2", 3)));
  WriteFile(npy + "/test_images.npy", Npy("|u1", {1, 2, 2}, std::string(4, '\0')));
  WriteFile(npy + "/test_labels.npy", Npy("|u1", {1}, std::string(1, '\0')));

  const std::string folder = FreshDir("source_folder");
  const std::string png = testing_images::EncodePng8(2, 2, 3, Bytes(12, 100));
  WriteFile(folder + "/train/a/1.png", png);
  WriteFile(folder + "/train/b/1.png", png);
  WriteFile(folder + "/test/b/1.png", png);

  struct Case {
    std::string dir, format;
    int64_t train_size, test_size;
    int channels, num_classes;
  };
  for (const Case& c : {Case{idx, "idx", 3, 1, 1, 10}, Case{idx_gz, "idx", 2, 1, 1, 10},
                        Case{cifar, "cifar", 2, 1, 3, 100}, Case{npy, "npy", 3, 1, 1, 3},
                        Case{folder, "imagefolder", 2, 1, 3, 2}}) {
    EXPECT_EQ(DetectDataFormat(c.dir).value_or("?"), c.format) << c.dir;
    for (const std::string& format : {std::string(), c.format}) {
      absl::StatusOr<Dataset> train = LoadDataset(c.dir, format, true);
      ASSERT_TRUE(train.ok()) << c.format << ": " << train.status();
      EXPECT_EQ(train->size, c.train_size) << c.format;
      EXPECT_EQ(train->channels, c.channels) << c.format;
      EXPECT_EQ(train->num_classes, c.num_classes) << c.format;
      EXPECT_TRUE(train->consistent()) << c.format;
      absl::StatusOr<Dataset> test = LoadDataset(c.dir, format, false);
      ASSERT_TRUE(test.ok()) << c.format << ": " << test.status();
      EXPECT_EQ(test->size, c.test_size) << c.format;
      EXPECT_EQ(test->num_classes, c.num_classes) << c.format;
    }
  }
  EXPECT_EQ(LoadDataset(idx_gz, "idx", true)->labels, (std::vector<nn::Label>{5, 6}));
  EXPECT_EQ(LoadDataset(cifar, "", true)->labels, (std::vector<nn::Label>{42, 42}));
  // An image size is for image folders; a CIFAR set (detected) refuses it.
  LoadOptions sized;
  sized.image_size = *ParseImageSize("16");
  ExpectError(LoadDataset(cifar, "", true, sized), absl::StatusCode::kInvalidArgument,
              ": an image size (16) applies to image folders only; this data set is cifar");
}

TEST(DataSourceTest, NothingToDetect) {
  const std::string empty = FreshDir("source_empty");
  WriteFile(empty + "/train/readme.txt", "train/ without class folders");
  absl::StatusOr<Dataset> result = LoadDataset(empty, "", true);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(result.status().message(),
            empty +
                ": no data set found; looked for train-images-idx3-ubyte[.gz] (idx), "
                "data_batch_1.bin or train.bin (cifar), train_images.npy, train_ids.npy or "
                "train_features.npy (npy), train/<class>/ folders (imagefolder)");
  result = LoadDataset(empty + "/none", "", false);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(result.status().message(), empty + "/none: no such directory");
}

TEST(DataSourceTest, SeveralFormatsOrAnUnknownOneAreErrors) {
  const std::string dir = FreshDir("source_several");
  WriteFile(dir + "/train_images.npy", "x");
  WriteFile(dir + "/data_batch_1.bin", "x");
  absl::StatusOr<Dataset> result = LoadDataset(dir, "", true);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(result.status().message(),
            dir + ": holds the files of several formats (cifar, npy); name one with the format");
  result = LoadDataset(dir, "tfrecord", true);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(result.status().message(),
            "unknown data format 'tfrecord' (known: idx, cifar, npy, imagefolder, or empty to "
            "detect)");
  // A named format reads its own files, with its own errors.
  result = LoadDataset(dir, "npy", true);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(result.status().message().find(dir + "/train_images.npy"), std::string::npos);
  result = LoadDataset(dir, "idx", true);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(result.status().message().find(dir + "/train-images-idx3-ubyte.gz"), std::string::npos);
}

// Whether each format's test split is there: "" or the files it would need.
TEST(DataSourceTest, TestSplitFiles) {
  const std::string dir = FreshDir("test_split_npy");
  WriteFile(dir + "/train_features.npy", "x");
  EXPECT_EQ(*TestSplitFiles(dir, ""),
            "test_images.npy (or test_ids.npy, test_features.npy) and test_labels.npy");
  WriteFile(dir + "/test_labels.npy", "x");  // Part of a split is a split (to be read whole).
  EXPECT_EQ(*TestSplitFiles(dir, ""), "");
  WriteFile(dir + "/test_features.npy", "x");
  EXPECT_EQ(*TestSplitFiles(dir, ""), "");
  EXPECT_EQ(*TestSplitFiles(dir, "cifar"), "test_batch.bin");
  WriteFile(dir + "/train.bin", "x");  // CIFAR-100's.
  EXPECT_EQ(*TestSplitFiles(dir, "cifar"), "test.bin");
  WriteFile(dir + "/test.bin", "x");
  EXPECT_EQ(*TestSplitFiles(dir, "cifar"), "");
  EXPECT_EQ(*TestSplitFiles(dir, "idx"),
            "t10k-images-idx3-ubyte[.gz] and t10k-labels-idx1-ubyte[.gz]");
  EXPECT_EQ(*TestSplitFiles(dir, "imagefolder"), "test/<class>/");
  EXPECT_EQ(TestSplitFiles(dir, "csv").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TestSplitFiles(dir + "/none", "").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace dptrain
