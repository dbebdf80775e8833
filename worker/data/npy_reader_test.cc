#include "worker/data/npy_reader.h"

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "worker/data/held_memory.h"
#include "worker/data/test_files.h"

namespace dptrain {
namespace {

using testing_files::ExpectError;
using testing_files::FreshDir;
using testing_files::WriteFile;

// A .npy file as np.save writes it: magic, version, header length, the dict padded with
// spaces and a newline to a multiple of 64 bytes, then `data`.
std::string Npy(const std::string& descr, const std::vector<int64_t>& shape,
                const std::string& data, int major = 1, const std::string& fortran = "False") {
  std::string shape_text = "(" + absl::StrJoin(shape, ", ") + (shape.size() == 1 ? ",)" : ")");
  std::string header = absl::StrCat("{'descr': '", descr, "', 'fortran_order': ", fortran,
                                    ", 'shape': ", shape_text, ", }");
  const size_t preamble = major == 1 ? 10 : 12;
  while ((preamble + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string out = "\x93NUMPY";
  out += static_cast<char>(major);
  out += '\0';
  const uint32_t len = static_cast<uint32_t>(header.size());
  for (size_t i = 0; i < (major == 1 ? 2u : 4u); ++i) out += static_cast<char>(len >> (8 * i));
  return out + header + data;
}

template <typename T>
std::string Raw(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

std::string Bytes(const std::vector<uint8_t>& values) { return Raw(values); }

std::string Pair(const std::string& dir, const std::string& images, const std::string& labels,
                 const std::string& split = "train") {
  WriteFile(dir + "/" + split + "_images.npy", images);
  WriteFile(dir + "/" + split + "_labels.npy", labels);
  return dir;
}

// Two 2x3 one-channel uint8 images.
const std::vector<uint8_t> kPixels = {0, 51, 102, 153, 204, 255, 255, 0, 0, 0, 0, 1};

// Every image of `data` as floats, whatever its store (Dataset::CopyImages).
std::vector<float> Floats(const Dataset& data) {
  std::vector<float> out(static_cast<size_t>(data.size * data.image_size()));
  data.CopyImages(0, data.size, out.data());
  return out;
}

TEST(NpyReaderTest, LoadsUint8ImagesWithInt64Labels) {
  const std::string dir = Pair(FreshDir("npy_u8"), Npy("|u1", {2, 2, 3}, Bytes(kPixels)),
                               Npy("<i8", {2}, Raw<int64_t>({3, 1})));
  absl::StatusOr<Dataset> data = LoadNpy(dir, true);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->size, 2);
  EXPECT_EQ(data->channels, 1);
  EXPECT_EQ(data->rows, 2);
  EXPECT_EQ(data->cols, 3);
  EXPECT_EQ(data->num_classes, 4);
  EXPECT_EQ(data->labels, (std::vector<nn::Label>{3, 1}));
  // Held as the file's bytes (a quarter of the memory), read as byte / 255 (ToTensor's).
  EXPECT_TRUE(data->byte_storage);
  EXPECT_TRUE(data->consistent());
  EXPECT_EQ(data->bytes.size(), 12u);
  EXPECT_TRUE(data->images.empty());
  const std::vector<float> images = Floats(*data);
  EXPECT_EQ(images[1], 51.0f / 255.0f);
  EXPECT_EQ(images[5], 1.0f);
  EXPECT_EQ(images[6 + 5], 1.0f / 255.0f);
}

TEST(NpyReaderTest, Float32ChannelsFirstIsTakenAsIs) {
  std::vector<float> values(2 * 3 * 2 * 2);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.5f - 3.0f;
  const std::string dir = Pair(FreshDir("npy_f4"), Npy("<f4", {2, 3, 2, 2}, Raw(values)),
                               Npy("<i4", {2}, Raw<int32_t>({0, 2})), "test");
  absl::StatusOr<Dataset> data = LoadNpy(dir, false);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->channels, 3);
  EXPECT_EQ(data->rows, 2);
  EXPECT_EQ(data->cols, 2);
  EXPECT_EQ(data->images, values);
  EXPECT_EQ(data->num_classes, 3);
}

TEST(NpyReaderTest, ChannelsLastIsTransposedToChannelsFirst) {
  // One 2x2 RGB image, HWC: pixel p has (10p, 10p+1, 10p+2).
  std::vector<uint8_t> hwc;
  for (int p = 0; p < 4; ++p) {
    for (int c = 0; c < 3; ++c) hwc.push_back(static_cast<uint8_t>(10 * p + c));
  }
  const std::string dir =
      Pair(FreshDir("npy_nhwc"), Npy("<u1", {1, 2, 2, 3}, Bytes(hwc)), Npy("|u1", {1}, Bytes({7})));
  absl::StatusOr<Dataset> data = LoadNpy(dir, true);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->channels, 3);
  EXPECT_EQ(data->rows, 2);
  EXPECT_EQ(data->cols, 2);
  const std::vector<float> image = Floats(*data);
  for (int c = 0; c < 3; ++c) {
    for (int p = 0; p < 4; ++p) {
      EXPECT_EQ(image[c * 4 + p], (10 * p + c) / 255.0f) << c << " " << p;
    }
  }
}

TEST(NpyReaderTest, Float32ChannelsLastIsTransposedToo) {
  // One 2x2 image of 3 channels, HWC: pixel p has (p, p + 0.25, p + 0.5).
  std::vector<float> hwc;
  for (int p = 0; p < 4; ++p) {
    for (int c = 0; c < 3; ++c) hwc.push_back(p + 0.25f * c);
  }
  const std::string dir = Pair(FreshDir("npy_nhwc_f4"), Npy("<f4", {1, 2, 2, 3}, Raw(hwc)),
                               Npy("|u1", {1}, Bytes({0})));
  absl::StatusOr<Dataset> data = LoadNpy(dir, true);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_FALSE(data->byte_storage);
  for (int c = 0; c < 3; ++c) {
    for (int p = 0; p < 4; ++p) EXPECT_EQ(data->image(0)[c * 4 + p], p + 0.25f * c);
  }
}

TEST(NpyReaderTest, LayoutRule) {
  struct Case {
    std::vector<int64_t> shape;
    int channels, rows, cols;
  };
  // Channels last iff the last axis is 1, 3 or 4 and the second is not.
  for (const Case& c :
       {Case{{1, 3, 5, 6}, 3, 5, 6}, Case{{1, 5, 6, 3}, 3, 5, 6}, Case{{1, 1, 5, 6}, 1, 5, 6},
        Case{{1, 5, 6, 1}, 1, 5, 6}, Case{{1, 5, 6, 4}, 4, 5, 6}, Case{{1, 3, 5, 3}, 3, 5, 3},
        Case{{1, 4, 5, 3}, 4, 5, 3}, Case{{1, 2, 5, 6}, 2, 5, 6}}) {
    int64_t n = 1;
    for (int64_t d : c.shape) n *= d;
    const std::string dir = Pair(FreshDir("npy_layout"), Npy("|u1", c.shape, std::string(n, 'x')),
                                 Npy("|u1", {1}, Bytes({0})));
    absl::StatusOr<Dataset> data = LoadNpy(dir, true);
    ASSERT_TRUE(data.ok()) << data.status();
    EXPECT_EQ(data->channels, c.channels) << absl::StrJoin(c.shape, ",");
    EXPECT_EQ(data->rows, c.rows) << absl::StrJoin(c.shape, ",");
    EXPECT_EQ(data->cols, c.cols) << absl::StrJoin(c.shape, ",");
  }
}

// Every image of `data` through ReadImage (any store, a source's reads included).
std::vector<float> ReadAll(const Dataset& data, const std::vector<int64_t>& order) {
  std::vector<float> out(static_cast<size_t>(data.size * data.image_size()));
  std::vector<uint8_t> scratch;
  for (int64_t i : order) {
    const absl::Status s = data.ReadImage(i, out.data() + i * data.image_size(), scratch);
    EXPECT_TRUE(s.ok()) << s;
  }
  return out;
}

// uint8 arrays read from the file as training goes (--data_loading=stream): the same values as
// held, channels first or last, in the planned order or any other; float32 arrays refuse it.
TEST(NpyReaderTest, Uint8ImagesStreamFromTheFile) {
  std::vector<uint8_t> pixels(5 * 2 * 3 * 3);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(i * 7 + 3);
  for (bool channels_last : {false, true}) {
    const std::vector<int64_t> shape =
        channels_last ? std::vector<int64_t>{5, 2, 3, 3} : std::vector<int64_t>{5, 3, 2, 3};
    const std::string dir = Pair(FreshDir("npy_stream"), Npy("|u1", shape, Bytes(pixels)),
                                 Npy("<i8", {5}, Raw<int64_t>({0, 1, 2, 1, 0})));
    absl::StatusOr<Dataset> held = LoadNpy(dir, true);
    NpyOptions stream;
    stream.loading = DataLoading::kStream;
    absl::StatusOr<Dataset> streamed = LoadNpy(dir, true, stream);
    ASSERT_TRUE(held.ok() && streamed.ok()) << streamed.status();
    ASSERT_NE(streamed->source, nullptr);
    EXPECT_TRUE(streamed->consistent());
    EXPECT_TRUE(streamed->bytes.empty());
    EXPECT_EQ(streamed->labels, held->labels);
    EXPECT_EQ(streamed->num_classes, 3);
    EXPECT_EQ(streamed->channels, 3);
    const std::vector<int64_t> order = {3, 0, 4, 1, 2};
    streamed->source->Plan(order);
    EXPECT_EQ(ReadAll(*streamed, order), Floats(*held));
    EXPECT_EQ(ReadAll(*streamed, {0, 1, 2, 3, 4}), Floats(*held));
    std::vector<float> out(streamed->image_size());
    std::vector<uint8_t> scratch;
    EXPECT_EQ(streamed->ReadImage(5, out.data(), scratch).code(),
              absl::StatusCode::kInvalidArgument);
    // auto: streamed above its limit, held at or below it.
    NpyOptions automatic;
    automatic.loading = DataLoading::kAuto;
    automatic.stream_above_bytes = static_cast<int64_t>(pixels.size());
    absl::StatusOr<Dataset> at_limit = LoadNpy(dir, true, automatic);
    ASSERT_TRUE(at_limit.ok());
    EXPECT_EQ(at_limit->source, nullptr);
    automatic.stream_above_bytes -= 1;
    absl::StatusOr<Dataset> above = LoadNpy(dir, true, automatic);
    ASSERT_TRUE(above.ok());
    EXPECT_NE(above->source, nullptr);
  }
  const std::string floats =
      Pair(FreshDir("npy_stream_f4"), Npy("<f4", {2, 2, 3}, Raw(std::vector<float>(12, 0.5f))),
           Npy("<i8", {2}, Raw<int64_t>({0, 1})));
  NpyOptions stream;
  stream.loading = DataLoading::kStream;
  ExpectError(LoadNpy(floats, true, stream), absl::StatusCode::kInvalidArgument,
              "train_images.npy: float images are held in memory");
  stream.loading = DataLoading::kAuto;
  stream.stream_above_bytes = 1;
  absl::StatusOr<Dataset> held = LoadNpy(floats, true, stream);
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_EQ(held->source, nullptr) << "auto holds float32 arrays";
}

// A streamed file that loses its data after the load: the read that reaches the missing bytes
// fails, naming the file.
TEST(NpyReaderTest, AStreamedFileCutShortAfterTheLoadFailsTheReadNamingIt) {
  std::vector<uint8_t> pixels(4 * 6, 9);
  const std::string dir = Pair(FreshDir("npy_stream_cut"), Npy("|u1", {4, 2, 3}, Bytes(pixels)),
                               Npy("<i8", {4}, Raw<int64_t>({0, 1, 0, 1})));
  NpyOptions stream;
  stream.loading = DataLoading::kStream;
  absl::StatusOr<Dataset> streamed = LoadNpy(dir, true, stream);
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  const std::string images = dir + "/train_images.npy";
  const std::string whole = testing_files::ReadFile(images);
  WriteFile(images, whole.substr(0, whole.size() - 10));  // Images 2 and 3 lose 10 bytes.
  std::vector<float> out(6);
  std::vector<uint8_t> scratch;
  EXPECT_TRUE(streamed->ReadImage(1, out.data(), scratch).ok());
  const absl::Status s = streamed->ReadImage(3, out.data(), scratch);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find(images + ": truncated image"), absl::string_view::npos) << s;
}

TEST(NpyReaderTest, FormatVersions2And3) {
  for (int major : {2, 3}) {
    const std::string dir = Pair(FreshDir("npy_v2"), Npy("|u1", {2, 2, 3}, Bytes(kPixels), major),
                                 Npy("<u1", {2}, Bytes({0, 5}), major));
    absl::StatusOr<Dataset> data = LoadNpy(dir, true);
    ASSERT_TRUE(data.ok()) << major << ": " << data.status();
    EXPECT_EQ(data->num_classes, 6);
  }
}

TEST(NpyReaderTest, NumClassesCoversBothSplitsUnlessGiven) {
  const std::string dir = FreshDir("npy_classes");
  Pair(dir, Npy("|u1", {2, 2, 3}, Bytes(kPixels)), Npy("<i8", {2}, Raw<int64_t>({0, 7})));
  Pair(dir, Npy("|u1", {2, 2, 3}, Bytes(kPixels)), Npy("<i8", {2}, Raw<int64_t>({1, 2})), "test");
  EXPECT_EQ(LoadNpy(dir, true)->num_classes, 8);
  EXPECT_EQ(LoadNpy(dir, false)->num_classes, 8);
  EXPECT_EQ(LoadNpy(dir, false, {10})->num_classes, 10);
  ExpectError(LoadNpy(dir, true, {7}), absl::StatusCode::kInvalidArgument,
              dir + "/train_labels.npy: label 7 at index 1 is not below 7");
  EXPECT_EQ(LoadNpy(dir, true, {300})->num_classes, 300);  // Past a byte: labels are int32.
  ExpectError(LoadNpy(dir, true, {(1 << 20) + 1}), absl::StatusCode::kInvalidArgument,
              "num_classes 1048577 is not in [1, 1048576]");
}

TEST(NpyReaderTest, BadLabels) {
  const std::string images = Npy("|u1", {2, 2, 3}, Bytes(kPixels));
  struct Case {
    std::string labels, fragment;
  };
  for (const Case& c : {
           Case{Npy("<i8", {2}, Raw<int64_t>({0, -1})), "label -1 at index 1 is negative"},
           Case{Npy("<i4", {2}, Raw<int32_t>({-5, 0})), "label -5 at index 0 is negative"},
           Case{Npy("<i8", {2}, Raw<int64_t>({1 << 20, 0})),
                "label 1048576 at index 0 is not below 1048576 (the most classes a data set may "
                "have)"},
           Case{Npy("<i8", {3}, Raw<int64_t>({0, 1, 2})), "has 3 labels but"},
           Case{Npy("<i8", {2, 1}, Raw<int64_t>({0, 1})), "labels of shape (2, 1); expected (N,)"},
           Case{Npy("<f2", {2}, Raw<uint16_t>({0, 1})),
                "target values of dtype '<f2' are unsupported (float32 or float64)"},
           Case{Npy(">i8", {2}, Raw<int64_t>({0, 1})), "big-endian dtype '>i8' is unsupported"},
       }) {
    const std::string dir = Pair(FreshDir("npy_bad_labels"), images, c.labels);
    ExpectError(LoadNpy(dir, true), absl::StatusCode::kInvalidArgument,
                dir + "/train_labels.npy: " + c.fragment);
  }
}

// A float labels file holds regression targets: (N,) one per sample, (N, T) T per sample,
// float64 rounded to float32; no classes. Both splits must agree (the worker checks T).
TEST(NpyReaderTest, FloatLabelsAreRegressionTargets) {
  const std::string features = Npy("<f4", {2, 3}, Raw(std::vector<float>{1, 2, 3, 4, 5, 6}));
  const std::string dir = FreshDir("npy_targets");
  WriteFile(dir + "/train_features.npy", features);
  WriteFile(dir + "/train_labels.npy", Npy("<f8", {2}, Raw(std::vector<double>{0.25, -1e3})));
  WriteFile(dir + "/test_features.npy", features);
  WriteFile(dir + "/test_labels.npy", Npy("<f4", {2, 2}, Raw(std::vector<float>{1, 2, 3, 4})));
  absl::StatusOr<Dataset> train = LoadNpy(dir, true);
  ASSERT_TRUE(train.ok()) << train.status();
  EXPECT_TRUE(train->regression());
  EXPECT_EQ(train->targets_per_sample, 1);
  EXPECT_EQ(train->targets, (std::vector<float>{0.25f, -1000.0f}));
  EXPECT_TRUE(train->labels.empty());
  EXPECT_EQ(train->num_classes, 0);
  absl::StatusOr<Dataset> test = LoadNpy(dir, false);
  ASSERT_TRUE(test.ok()) << test.status();
  EXPECT_EQ(test->targets_per_sample, 2);
  EXPECT_EQ(test->targets, (std::vector<float>{1, 2, 3, 4}));
  test->KeepFirst(1);
  EXPECT_EQ(test->targets, (std::vector<float>{1, 2}));
  EXPECT_EQ(test->targets_from(0).values, test->targets.data());

  // float64 just beyond float32's largest value rounds to it, as NumPy's astype(np.float32)
  // does; from half a unit beyond it (2^128 - 2^103) it is infinite, and refused.
  const double largest = std::numeric_limits<float>::max();
  WriteFile(dir + "/train_labels.npy",
            Npy("<f8", {2}, Raw(std::vector<double>{largest + 0x1p100, -largest - 0x1p100})));
  absl::StatusOr<Dataset> edge = LoadNpy(dir, true);
  ASSERT_TRUE(edge.ok()) << edge.status();
  EXPECT_EQ(edge->targets, (std::vector<float>{std::numeric_limits<float>::max(),
                                               -std::numeric_limits<float>::max()}));
  WriteFile(dir + "/train_labels.npy",
            Npy("<f8", {2}, Raw(std::vector<double>{0, 0x1p128 - 0x1p103})));
  ExpectError(LoadNpy(dir, true), absl::StatusCode::kInvalidArgument,
              "target value 3.40282357e+38 at sample 1 is not finite in float32");
  WriteFile(dir + "/train_labels.npy", Npy("<f8", {2}, Raw(std::vector<double>{0.25, -1e3})));

  // Class labels in one split, targets in the other: refused by the split holding labels.
  WriteFile(dir + "/test_labels.npy", Npy("<i8", {2}, Raw<int64_t>({0, 1})));
  ExpectError(LoadNpy(dir, false), absl::StatusCode::kInvalidArgument,
              dir +
                  "/train_labels.npy: float labels (regression targets) where the other split "
                  "has class labels (integers): save both the same");
  ExpectError(LoadNpy(dir, true, {5}), absl::StatusCode::kInvalidArgument,
              dir +
                  "/train_labels.npy: float labels are regression targets; num_classes (5) "
                  "applies to class labels (integers)");
  struct Case {
    std::string labels, fragment;
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const Case& c : {
           Case{Npy("<f8", {2}, Raw(std::vector<double>{0, nan})),
                "target value nan at sample 1 is not finite in float32"},
           Case{Npy("<f8", {2}, Raw(std::vector<double>{1e39, 0})),
                "target value 1e+39 at sample 0 is not finite in float32"},
           Case{Npy("<f4", {2, 2}, Raw(std::vector<float>{0, 1, 2, -INFINITY})),
                "target value -inf at sample 1, index 1 is not finite"},
           Case{Npy("<f4", {3}, Raw(std::vector<float>{0, 1, 2})),
                "has 3 samples' targets but " + dir + "/train_features.npy has 2 samples"},
           Case{Npy("<f4", {2, 1, 1}, Raw(std::vector<float>{0, 1})),
                "target values of shape (2, 1, 1); expected (N,) or (N, T) with T in [1, "
                "1048576] (regression targets)"},
           Case{Npy("<f4", {2, 0}, ""), "target values of shape (2, 0); expected"},
       }) {
    SCOPED_TRACE(c.fragment);
    WriteFile(dir + "/train_labels.npy", c.labels);
    ExpectError(LoadNpy(dir, true), absl::StatusCode::kInvalidArgument, c.fragment);
  }
  WriteFile(dir + "/train_labels.npy", Npy("<f4", {2, 2}, Raw(std::vector<float>{0, 1, 2})));
  ExpectError(LoadNpy(dir, true), absl::StatusCode::kDataLoss,
              "truncated data: shape (2, 2) of '<f4' needs 16 bytes, the file holds 12");
}

// Integer arrays of shape (N, L) are ids (token ids for a text model): held as floats, exactly,
// whatever their integer dtype; not pixels (no / 255).
TEST(NpyReaderTest, IntegerArraysOfRankTwoAreIds) {
  const std::string labels = Npy("<i8", {2}, Raw<int64_t>({0, 1}));
  const std::vector<float> expected = {0, 7, 65535, 3, 16777215, 1};
  for (const std::string& images :
       {Npy("<i8", {2, 3}, Raw<int64_t>({0, 7, 65535, 3, 16777215, 1})),
        Npy("<i4", {2, 3}, Raw<int32_t>({0, 7, 65535, 3, 16777215, 1})),
        Npy("<u8", {2, 3}, Raw<uint64_t>({0, 7, 65535, 3, 16777215, 1}))}) {
    const std::string dir = Pair(FreshDir("npy_ids"), images, labels);
    absl::StatusOr<Dataset> data = LoadNpy(dir, true);
    ASSERT_TRUE(data.ok()) << data.status();
    EXPECT_TRUE(data->ids);
    EXPECT_EQ(data->size, 2);
    EXPECT_EQ(data->channels, 3);
    EXPECT_EQ(data->rows, 1);
    EXPECT_EQ(data->cols, 1);
    EXPECT_FALSE(data->byte_storage);
    EXPECT_TRUE(data->consistent());
    EXPECT_EQ(Floats(*data), expected);
  }
  const std::string u16 =
      Pair(FreshDir("npy_ids_u16"), Npy("<u2", {1, 2}, Raw<uint16_t>({65535, 2})),
           Npy("<i8", {1}, Raw<int64_t>({0})));
  absl::StatusOr<Dataset> data = LoadNpy(u16, true);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(Floats(*data), (std::vector<float>{65535, 2}));
  const std::string u8 = Pair(FreshDir("npy_ids_u8"), Npy("|u1", {1, 2}, Bytes({255, 2})),
                              Npy("<i8", {1}, Raw<int64_t>({0})));
  data = LoadNpy(u8, true);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_TRUE(data->ids);
  EXPECT_EQ(Floats(*data), (std::vector<float>{255, 2}));  // Ids, not pixels.
}

// Float arrays of rank 2 are feature vectors (tabular data): F x 1 x 1 per sample, float64 (as
// NumPy saves by default) rounded to float32; SPLIT_features.npy must hold them.
TEST(NpyReaderTest, FloatArraysOfRankTwoAreFeatures) {
  const std::string labels = Npy("<i8", {2}, Raw<int64_t>({0, 1}));
  const std::vector<double> values = {0.5, -2.25, 1e-3, 3.0, 0.1, -7.0};
  for (const std::string& name : {"train_images.npy", "train_features.npy"}) {
    for (const std::string& file :
         {Npy("<f4", {2, 3}, Raw(std::vector<float>(values.begin(), values.end()))),
          Npy("<f8", {2, 3}, Raw(values))}) {
      SCOPED_TRACE(name);
      const std::string dir = FreshDir("npy_features");
      WriteFile(dir + "/" + name, file);
      WriteFile(dir + "/train_labels.npy", labels);
      absl::StatusOr<Dataset> data = LoadNpy(dir, true);
      ASSERT_TRUE(data.ok()) << data.status();
      EXPECT_FALSE(data->ids);
      EXPECT_TRUE(data->features());
      EXPECT_STREQ(data->kind(), "feature vectors");
      EXPECT_EQ(data->channels, 3);
      EXPECT_EQ(data->rows, 1);
      EXPECT_EQ(data->cols, 1);
      EXPECT_FALSE(data->byte_storage);
      EXPECT_EQ(Floats(*data), std::vector<float>(values.begin(), values.end()));
    }
  }
  const std::string both = FreshDir("npy_features_both");
  WriteFile(both + "/train_images.npy", Npy("<f4", {2, 1}, Raw(std::vector<float>{1, 2})));
  WriteFile(both + "/train_features.npy", Npy("<f4", {2, 1}, Raw(std::vector<float>{1, 2})));
  WriteFile(both + "/train_labels.npy", labels);
  ExpectError(LoadNpy(both, true), absl::StatusCode::kInvalidArgument,
              both + ": both train_images.npy and train_features.npy; keep one");
  for (const std::string& file : {Npy("<i8", {2, 2}, Raw<int64_t>({4, 5, 6, 7})),
                                  Npy("<f4", {2, 1, 2}, Raw(std::vector<float>{1, 2, 3, 4}))}) {
    const std::string dir = FreshDir("npy_features_wrong");
    WriteFile(dir + "/train_features.npy", file);
    WriteFile(dir + "/train_labels.npy", labels);
    ExpectError(LoadNpy(dir, true), absl::StatusCode::kInvalidArgument,
                dir + "/train_features.npy: holds ");
    ExpectError(LoadNpy(dir, true), absl::StatusCode::kInvalidArgument,
                "; a features file holds floats of shape (N, F) (integers: save them as float32)");
  }
  NpyOptions stream;
  stream.loading = DataLoading::kStream;
  const std::string dir =
      Pair(FreshDir("npy_features_stream"), Npy("<f8", {2, 3}, Raw(values)), labels);
  ExpectError(LoadNpy(dir, true, stream), absl::StatusCode::kInvalidArgument,
              dir + "/train_images.npy: float images are held in memory");
}

// Token ids may be named SPLIT_ids.npy; such a file must hold ids, and only one of the two
// names may be there.
TEST(NpyReaderTest, IdsFilesByTheirOwnName) {
  const std::string labels = Npy("<i8", {2}, Raw<int64_t>({0, 1}));
  const std::string dir = FreshDir("npy_ids_named");
  WriteFile(dir + "/train_ids.npy", Npy("<i8", {2, 2}, Raw<int64_t>({4, 5, 6, 7})));
  WriteFile(dir + "/train_labels.npy", labels);
  absl::StatusOr<Dataset> data = LoadNpy(dir, true);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_TRUE(data->ids);
  EXPECT_EQ(Floats(*data), (std::vector<float>{4, 5, 6, 7}));
  WriteFile(dir + "/train_images.npy", Npy("|u1", {2, 1, 1}, Bytes({1, 2})));
  ExpectError(LoadNpy(dir, true), absl::StatusCode::kInvalidArgument,
              dir + ": both train_images.npy and train_ids.npy; keep one");
  const std::string images = FreshDir("npy_ids_images");
  WriteFile(images + "/train_ids.npy", Npy("|u1", {2, 1, 1}, Bytes({1, 2})));
  WriteFile(images + "/train_labels.npy", labels);
  ExpectError(LoadNpy(images, true), absl::StatusCode::kInvalidArgument,
              images + "/train_ids.npy: holds images; an ids file holds integers of shape (N, L)");
}

TEST(NpyReaderTest, BadIds) {
  const std::string labels = Npy("<i8", {2}, Raw<int64_t>({0, 1}));
  struct Case {
    std::string images;
    absl::StatusCode code;
    std::string fragment;
  };
  for (const Case& c : {
           Case{Npy("<i8", {2, 2}, Raw<int64_t>({0, 1, 2, -3})), absl::StatusCode::kInvalidArgument,
                "id -3 at sample 1, position 1 is outside [0, 2^24)"},
           Case{Npy("<i2", {2, 2}, Raw<int16_t>({0, -1, 2, 3})), absl::StatusCode::kInvalidArgument,
                "id -1 at sample 0, position 1 is outside [0, 2^24)"},
           Case{Npy("<i8", {2, 2}, Raw<int64_t>({0, 16777216, 2, 3})),
                absl::StatusCode::kInvalidArgument,
                "id 16777216 at sample 0, position 1 is outside [0, 2^24)"},
           Case{Npy("<u8", {2, 2}, Raw<uint64_t>({0, 1, ~uint64_t{0}, 3})),
                absl::StatusCode::kInvalidArgument,
                "id 18446744073709551615 at sample 1, position 0 is outside [0, 2^24)"},
           Case{Npy("<i8", {2, 0}, ""), absl::StatusCode::kInvalidArgument,
                "ids of shape (2, 0): no samples, or absurd dimensions"},
           Case{Npy("<i8", {2, 2}, Raw<int64_t>({0, 1, 2})), absl::StatusCode::kDataLoss,
                "truncated data: shape (2, 2) of '<i8' needs 32 bytes, the file holds 24"},
           Case{Npy("<i4", {2, 2, 2}, std::string(32, '\0')), absl::StatusCode::kInvalidArgument,
                "images of dtype '<i4' are unsupported (uint8, float32 or float64 only; integer "
                "ids are (N, L))"},
       }) {
    const std::string dir = Pair(FreshDir("npy_bad_ids"), c.images, labels);
    ExpectError(LoadNpy(dir, true), c.code, dir + "/train_images.npy: " + c.fragment);
  }
  NpyOptions stream;
  stream.loading = DataLoading::kStream;
  const std::string dir =
      Pair(FreshDir("npy_ids_stream"), Npy("<i8", {2, 2}, Raw<int64_t>({0, 1, 2, 3})), labels);
  ExpectError(LoadNpy(dir, true, stream), absl::StatusCode::kInvalidArgument,
              dir + "/train_images.npy: integer ids are held in memory");
}

TEST(NpyReaderTest, BadImages) {
  const std::string labels = Npy("<i8", {2}, Raw<int64_t>({0, 1}));
  struct Case {
    std::string images;
    absl::StatusCode code;
    std::string fragment;
  };
  const std::string twelve(12, '\0');
  for (const Case& c : {
           Case{Npy("|u1", {2, 2, 3}, twelve, 1, "True"), absl::StatusCode::kInvalidArgument,
                "fortran_order True is unsupported"},
           Case{Npy(">f4", {2, 2, 3}, twelve + twelve + twelve + twelve),
                absl::StatusCode::kInvalidArgument, "big-endian dtype '>f4' is unsupported"},
           Case{Npy("<f2", {2, 2, 3}, std::string(48, '\0')), absl::StatusCode::kInvalidArgument,
                "images of dtype '<f2' are unsupported"},
           Case{
               Npy("<f4", {2, 2, 3}, Raw(std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7, NAN, 9, 0, 0})),
               absl::StatusCode::kInvalidArgument,
               "value nan at sample 1, index 2 (of the sample as stored) is not finite"},
           Case{Npy("<f8", {2, 2, 3},
                    Raw(std::vector<double>{0, 1, 2, 3, 4, 5, 6, 1e300, 8, 9, 0, 0})),
                absl::StatusCode::kInvalidArgument,
                "value 1e+300 at sample 1, index 1 (of the sample as stored) is not finite in "
                "float32"},
           Case{Npy("<U3", {2, 2, 3}, twelve), absl::StatusCode::kInvalidArgument,
                "unsupported dtype '<U3'"},
           Case{Npy("|u1", {12}, twelve), absl::StatusCode::kInvalidArgument,
                "images of shape (12,); expected (N, H, W)"},
           Case{Npy("|u1", {2, 6, 0}, ""), absl::StatusCode::kInvalidArgument,
                "images of shape (2, 6, 0): no images, or absurd dimensions"},
           Case{Npy("|u1", {2, 2, 3}, twelve.substr(1)), absl::StatusCode::kDataLoss,
                "truncated data: shape (2, 2, 3) of '|u1' needs 12 bytes, the file holds 11"},
           Case{Npy("|u1", {2, 2, 3}, twelve + "x"), absl::StatusCode::kDataLoss,
                "trailing data: 1 bytes after the 12"},
           Case{Npy("|u1", {1 << 20, 1 << 20, 1 << 20}, twelve), absl::StatusCode::kInvalidArgument,
                "images of shape (1048576, 1048576, 1048576): no images, or absurd dimensions"},
           Case{Npy("|u1", {int64_t{1} << 40, 1 << 16, 1 << 15}, twelve),
                absl::StatusCode::kDataLoss,
                "truncated data: shape (1099511627776, 65536, 32768) of '|u1' needs more than "
                "2^63 bytes, the file holds 12"},
           Case{Npy("|u1", {20000000, 1000, 100}, twelve), absl::StatusCode::kDataLoss,
                "truncated data: shape (20000000, 1000, 100) of '|u1' needs 2000000000000 bytes, "
                "the file holds 12"},
           Case{"\x93NUMPZ\x01\x00", absl::StatusCode::kInvalidArgument, "not a .npy file"},
           Case{"\x93NUM", absl::StatusCode::kInvalidArgument, "not a .npy file"},
           Case{"", absl::StatusCode::kInvalidArgument, "not a .npy file"},
           Case{"\x93NUMPY\x01", absl::StatusCode::kDataLoss, "truncated header"},
           Case{std::string("\x93NUMPY\x02\x00\x10", 9), absl::StatusCode::kDataLoss,
                "truncated header at byte 8: expected 4 bytes, got 1"},
           Case{"\x93NUMPY\x04\x00" + twelve, absl::StatusCode::kInvalidArgument,
                "unsupported .npy format version 4.0"},
           Case{std::string("\x93NUMPY\x02\x00\xff\xff\xff\xff", 12) + "{}",
                absl::StatusCode::kDataLoss, "header length 4294967295 exceeds"},
           Case{std::string("\x93NUMPY\x01\x00\x10\x00", 10) + "{'descr': '|u1'",
                absl::StatusCode::kDataLoss, "header length 16 exceeds the file's remaining 15"},
       }) {
    const std::string dir = Pair(FreshDir("npy_bad_images"), c.images, labels);
    ExpectError(LoadNpy(dir, true), c.code, dir + "/train_images.npy: " + c.fragment);
  }
}

TEST(NpyReaderTest, MalformedHeaders) {
  const std::string labels = Npy("<i8", {1}, Raw<int64_t>({0}));
  auto file = [](const std::string& header) {
    std::string out = "\x93NUMPY\x01";
    out += '\0';
    out += static_cast<char>(header.size());
    out += '\0';
    return out + header + "x";
  };
  struct Case {
    std::string header, fragment;
  };
  for (const Case& c : {
           Case{"[1, 2]", "the header is not a dict"},
           Case{"{'descr': '|u1', 'shape': (1, 1, 1)}",
                "the header lacks one of 'descr', 'fortran_order', 'shape'"},
           Case{"{'descr': '|u1', 'fortran_order': Maybe, 'shape': (1,1,1)}",
                "'fortran_order' is not True or False"},
           Case{"{'descr': '|u1', 'fortran_order': False, 'shape': [1,1,1]}",
                "'shape' is not a tuple"},
           Case{"{'descr': '|u1', 'fortran_order': False, 'shape': (1,-1,1)}",
                "'shape' holds something other than non-negative integers"},
           Case{"{'descr': '|u1', 'fortran_order': False, 'shape': (1,1,1), 'x': 1}",
                "unexpected key 'x'"},
           Case{"{'descr': [('a', '<i4')], 'fortran_order': False, 'shape': (1,)}",
                "structured dtypes"},
           Case{"{'descr': '|u1' 'fortran_order': False}", "expected ',' or '}'"},
           Case{"{'descr: '|u1'}", "expected ':'"},
           Case{"{'descr': '|u1', 'fortran_order': False, 'shape': (99999999999999999999,)}",
                "absurd dimension"},
       }) {
    const std::string dir = Pair(FreshDir("npy_bad_header"), file(c.header), labels);
    ExpectError(LoadNpy(dir, true), absl::StatusCode::kInvalidArgument,
                dir + "/train_images.npy: " + c.fragment);
  }
  // Python 2's long integers and double quotes are read.
  const std::string dir =
      Pair(FreshDir("npy_py2_header"),
           file("{\"descr\": \"|u1\", \"fortran_order\": False, \"shape\": (1L, 1L, 1L)}"), labels);
  EXPECT_TRUE(LoadNpy(dir, true).ok()) << LoadNpy(dir, true).status();
}

// Images held in memory but more than the machine has: one line, ResourceExhausted (it was
// std::bad_alloc and an abort). The file is sparse: its length is what counts, not its blocks.
TEST(NpyReaderTest, MoreThanTheMachinesMemoryIsRefused) {
  const int64_t n = MachineMemoryBytes() / 64 + 1;  // n 8x8 one-channel images.
  const std::string dir = testing_files::FreshDir("npy_huge");
  const std::string images = WriteFile(dir + "/train_images.npy", Npy("|u1", {n, 1, 8, 8}, ""));
  ASSERT_EQ(truncate(images.c_str(), static_cast<off_t>(testing_files::ReadFile(images).size() +
                                                        static_cast<uint64_t>(n) * 64)),
            0);
  WriteFile(dir + "/train_labels.npy", Npy("<i8", {2}, Raw(std::vector<int64_t>{0, 1})));
  NpyOptions load;
  load.loading = DataLoading::kLoad;
  testing_files::ExpectError(LoadNpy(dir, true, load), absl::StatusCode::kResourceExhausted,
                             images + ": its " + std::to_string(n * 64 >> 20) +
                                 " MiB of samples are more than this machine's ");
}

TEST(NpyReaderTest, MissingFilesAreNotFound) {
  const std::string dir = FreshDir("npy_missing");
  ExpectError(LoadNpy(dir, true), absl::StatusCode::kNotFound, dir + "/train_images.npy");
  WriteFile(dir + "/test_images.npy", Npy("|u1", {2, 2, 3}, Bytes(kPixels)));
  ExpectError(LoadNpy(dir, false), absl::StatusCode::kNotFound, dir + "/test_labels.npy");
}

TEST(NpyReaderTest, LoadNpyPairNamesBothFilesOnMismatch) {
  const std::string dir = FreshDir("npy_pair");
  const std::string images = WriteFile(dir + "/a.npy", Npy("|u1", {2, 2, 3}, Bytes(kPixels)));
  const std::string labels = WriteFile(dir + "/b.npy", Npy("|u1", {1}, Bytes({0})));
  ExpectError(LoadNpyPair(images, labels), absl::StatusCode::kInvalidArgument,
              labels + ": has 1 labels but " + images + " has 2 images");
}

}  // namespace
}  // namespace dptrain
