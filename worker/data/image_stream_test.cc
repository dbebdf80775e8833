#include "worker/data/image_stream.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/data/image_folder.h"
#include "worker/data/test_files.h"
#include "worker/data/test_images.h"

namespace dptrain {
namespace {

using testing_files::FreshDir;
using testing_files::WriteFile;
using testing_images::EncodeJpeg;
using testing_images::EncodePng8;
using Pixels = std::vector<uint8_t>;

constexpr int kImages = 40;

Pixels Noise(int n, int seed) {
  std::mt19937 rng(seed);
  Pixels p(n);
  for (uint8_t& v : p) v = static_cast<uint8_t>(rng());
  return p;
}

// kImages images in 3 classes, of several sizes, gray and RGB, PNG and JPEG.
std::string Folder(const std::string& name) {
  const std::string dir = FreshDir(name);
  for (int i = 0; i < kImages; ++i) {
    const int w = 5 + i % 4, h = 4 + i % 3, channels = i % 5 == 0 ? 1 : 3;
    const std::string file = absl::StrCat(dir, "/train/c", i % 3, "/img", 100 + i);
    if (i % 2 == 0) {
      WriteFile(file + ".png", EncodePng8(w, h, channels, Noise(w * h * channels, i)));
    } else {
      WriteFile(file + ".jpg", EncodeJpeg(w, h, channels, Noise(w * h * channels, i)));
    }
  }
  return dir;
}

ImageFolderOptions Options(DataLoading decode, int threads) {
  ImageFolderOptions o;
  o.threads = threads;
  o.loading = decode;
  o.size.mode = ImageSize::Mode::kExact;
  o.size.rows = 6;
  o.size.cols = 5;
  return o;
}

// Image i of `d` as ReadImage gives it.
std::vector<float> Image(const Dataset& d, int64_t i) {
  std::vector<float> out(d.image_size());
  std::vector<uint8_t> scratch;
  const absl::Status s = d.ReadImage(i, out.data(), scratch);
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

TEST(ImageStreamTest, StreamedImagesAreTheLoadedOnesInAnyOrder) {
  const std::string dir = Folder("stream_equal");
  absl::StatusOr<Dataset> loaded = LoadImageFolder(dir, true, Options(DataLoading::kLoad, 2));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->source, nullptr);
  for (int threads : {1, 3}) {
    absl::StatusOr<Dataset> streamed =
        LoadImageFolder(dir, true, Options(DataLoading::kStream, threads));
    ASSERT_TRUE(streamed.ok()) << streamed.status();
    ASSERT_NE(streamed->source, nullptr);
    EXPECT_TRUE(streamed->consistent());
    EXPECT_TRUE(streamed->bytes.empty());
    EXPECT_EQ(streamed->channels, loaded->channels);
    EXPECT_EQ(streamed->rows, 6);
    EXPECT_EQ(streamed->cols, 5);
    EXPECT_EQ(streamed->labels, loaded->labels);
    auto* stream = static_cast<ImageStream*>(streamed->source.get());

    // Two epochs in shuffled orders, planned as the trainer plans them; then a plan replaced
    // half-way (its first images kept), a plan with repeats, and reads outside any plan.
    std::vector<int64_t> order(kImages);
    std::iota(order.begin(), order.end(), 0);
    std::mt19937 rng(threads);
    std::vector<int64_t> plan;
    for (int epoch = 0; epoch < 2; ++epoch) {
      std::shuffle(order.begin(), order.end(), rng);
      plan.insert(plan.end(), order.begin(), order.end());
    }
    stream->Plan(plan);
    for (size_t k = 0; k < plan.size() / 2; ++k) {
      EXPECT_EQ(Image(*streamed, plan[k]), Image(*loaded, plan[k])) << "read " << k;
    }
    std::vector<int64_t> rest(plan.begin() + plan.size() / 2, plan.end());
    std::reverse(rest.begin() + 5, rest.end());
    stream->Plan(rest);
    for (int64_t i : rest) EXPECT_EQ(Image(*streamed, i), Image(*loaded, i));
    stream->Plan(std::vector<int64_t>{3, 3, 7, 3});
    for (int64_t i : {3, 3, 7, 3}) EXPECT_EQ(Image(*streamed, i), Image(*loaded, i));
    EXPECT_EQ(stream->unplanned_reads(), 0);
    EXPECT_EQ(stream->planned_reads(), static_cast<int64_t>(plan.size() + 4));
    for (int64_t i : {39, 0, 17}) EXPECT_EQ(Image(*streamed, i), Image(*loaded, i));
    EXPECT_EQ(stream->unplanned_reads(), 3);
  }
}

TEST(ImageStreamTest, AWindowSmallerThanThePlanStillReadsItAll) {
  const std::string dir = Folder("stream_window");
  absl::StatusOr<Dataset> loaded = LoadImageFolder(dir, true, Options(DataLoading::kLoad, 1));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  std::vector<std::string> paths;
  for (int i = 0; i < kImages; ++i) {
    paths.push_back(absl::StrCat(dir, "/train/c", i % 3, "/img", 100 + i, i % 2 ? ".jpg" : ".png"));
  }
  ImageStream::Options options;
  options.threads = 2;
  options.size = Options(DataLoading::kLoad, 1).size;
  options.window_bytes = 1;  // The smallest window: 2 images per thread.
  absl::StatusOr<std::shared_ptr<ImageStream>> stream =
      ImageStream::Create(paths, loaded->channels, 6, 5, options);
  ASSERT_TRUE(stream.ok()) << stream.status();
  // paths are in class order in the loaded set: image i is at the position listing gives it.
  std::vector<int64_t> plan;
  for (int i = kImages - 1; i >= 0; --i) plan.push_back(i);
  (*stream)->Plan(plan);
  const int64_t n = loaded->image_size();
  std::vector<uint8_t> bytes(n);
  int64_t checked = 0;
  for (int64_t i : plan) {
    ASSERT_TRUE((*stream)->Read(i, bytes.data()).ok());
    // The loaded set orders by class then name: find image i's place there.
    const int cls = static_cast<int>(i % 3);
    int64_t place = 0;
    for (int c = 0; c < cls; ++c) place += (kImages - c + 2) / 3;
    place += i / 3;
    ASSERT_TRUE(std::equal(bytes.begin(), bytes.end(), loaded->bytes.begin() + place * n));
    ++checked;
  }
  EXPECT_EQ(checked, kImages);
  EXPECT_EQ((*stream)->planned_reads(), kImages);
}

TEST(ImageStreamTest, AFileThatNoLongerDecodesIsAnErrorOfItsReadNamingIt) {
  const std::string dir = Folder("stream_bad");
  absl::StatusOr<Dataset> streamed = LoadImageFolder(dir, true, Options(DataLoading::kStream, 2));
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  const std::string broken = dir + "/train/c0/img103.jpg";  // Image 1 of the set.
  WriteFile(broken, "no longer a JPEG");
  const std::string resized = dir + "/train/c0/img100.png";  // Image 0, now a color 9x9.
  WriteFile(resized, EncodePng8(9, 9, 3, Noise(243, 1)));
  std::vector<float> out(streamed->image_size());
  std::vector<uint8_t> scratch;
  streamed->source->Plan(std::vector<int64_t>{2, 1, 0});
  EXPECT_TRUE(streamed->ReadImage(2, out.data(), scratch).ok());
  absl::Status s = streamed->ReadImage(1, out.data(), scratch);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find(broken), absl::string_view::npos) << s;
  // Image 0 was gray (1 of the 5 gray ones: the set is RGB) and 6x5 after the resize, as is
  // the new one: still read. Without a size to bring it to, its size is the error.
  EXPECT_TRUE(streamed->ReadImage(0, out.data(), scratch).ok());
  ImageFolderOptions keep = Options(DataLoading::kStream, 1);
  keep.size = ImageSize();
  const std::string same = FreshDir("stream_same_size");
  for (int i = 0; i < 3; ++i) {
    WriteFile(absl::StrCat(same, "/train/a/", i, ".png"), EncodePng8(4, 4, 1, Noise(16, i)));
  }
  absl::StatusOr<Dataset> gray = LoadImageFolder(same, true, keep);
  ASSERT_TRUE(gray.ok()) << gray.status();
  EXPECT_EQ(gray->channels, 1);
  WriteFile(same + "/train/a/1.png", EncodePng8(4, 4, 3, Noise(48, 1)));  // Now color.
  WriteFile(same + "/train/a/2.png", EncodePng8(5, 4, 1, Noise(20, 1)));  // Now 4x5.
  out.resize(gray->image_size());
  s = gray->ReadImage(1, out.data(), scratch);  // Unplanned: decoded on this thread.
  EXPECT_NE(s.message().find("1.png: image is 3x4x4"), absl::string_view::npos) << s;
  s = gray->ReadImage(2, out.data(), scratch);
  EXPECT_NE(s.message().find("2.png: image is 1x4x5"), absl::string_view::npos) << s;
  EXPECT_TRUE(gray->ReadImage(0, out.data(), scratch).ok());
}

TEST(ImageStreamTest, LoadingAStreamReadsHeadersAndReportsTheirErrors) {
  const std::string dir = Folder("stream_probe_errors");
  ImageFolderOptions keep = Options(DataLoading::kStream, 2);
  keep.size = ImageSize();
  absl::StatusOr<Dataset> sizes = LoadImageFolder(dir, true, keep);
  ASSERT_FALSE(sizes.ok());
  EXPECT_NE(sizes.status().message().find("all images of a set must have one size"),
            absl::string_view::npos)
      << sizes.status();
  WriteFile(dir + "/train/c1/img104.png", "not a PNG");
  absl::StatusOr<Dataset> bad = LoadImageFolder(dir, true, Options(DataLoading::kStream, 2));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("img104.png: not a PNG or JPEG image"),
            absl::string_view::npos)
      << bad.status();
}

TEST(ImageStreamTest, AutoStreamsOnlyASetLargerThanItsLimit) {
  const std::string dir = Folder("stream_auto");
  ImageFolderOptions o = Options(DataLoading::kAuto, 2);
  o.stream_above_bytes = int64_t{kImages} * 3 * 6 * 5;  // The set's bytes exactly: held.
  absl::StatusOr<Dataset> held = LoadImageFolder(dir, true, o);
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_EQ(held->source, nullptr);
  EXPECT_TRUE(held->consistent());
  o.stream_above_bytes -= 1;
  absl::StatusOr<Dataset> streamed = LoadImageFolder(dir, true, o);
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  EXPECT_NE(streamed->source, nullptr);
  // A set beyond what a load may hold streams under auto whatever its memory limit; a load
  // of it is refused, saying to stream.
  o.stream_above_bytes = int64_t{1} << 40;
  o.max_load_values = int64_t{kImages} * 3 * 6 * 5 - 1;
  absl::StatusOr<Dataset> big = LoadImageFolder(dir, true, o);
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_NE(big->source, nullptr);
  o.loading = DataLoading::kLoad;
  absl::StatusOr<Dataset> refused = LoadImageFolder(dir, true, o);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("--data_loading=stream"), absl::string_view::npos)
      << refused.status();
}

// Readers on several threads (the trainer reads on one; ImageSource promises thread safety):
// two readers of the same planned image both get it, one from the plan, one decoding it, and
// a plan replaced while a reader waits leaves that reader its own image.
TEST(ImageStreamTest, ConcurrentReadersAndPlansEachGetTheirImage) {
  const std::string dir = Folder("stream_concurrent");
  absl::StatusOr<Dataset> loaded = LoadImageFolder(dir, true, Options(DataLoading::kLoad, 1));
  absl::StatusOr<Dataset> streamed = LoadImageFolder(dir, true, Options(DataLoading::kStream, 2));
  ASSERT_TRUE(loaded.ok() && streamed.ok());
  for (int round = 0; round < 20; ++round) {
    std::vector<int64_t> plan(kImages);
    std::iota(plan.begin(), plan.end(), 0);
    std::mt19937 rng(round);
    std::shuffle(plan.begin(), plan.end(), rng);
    streamed->source->Plan(plan);
    std::vector<std::vector<float>> got(4);
    std::vector<std::thread> readers;
    for (int t = 0; t < 4; ++t) {
      readers.emplace_back([&, t] {
        got[t] = Image(*streamed, plan[t < 2 ? 0 : 1]);  // Two readers per image.
        if (t == 3) streamed->source->Plan(std::vector<int64_t>{plan[5], plan[6]});
      });
    }
    for (std::thread& r : readers) r.join();
    for (int t = 0; t < 4; ++t) EXPECT_EQ(got[t], Image(*loaded, plan[t < 2 ? 0 : 1]));
  }
}

TEST(ImageStreamTest, APlannedIndexOutsideTheSetIsAnErrorOfItsRead) {
  absl::StatusOr<std::shared_ptr<ImageStream>> s = ImageStream::Create({"a.png"}, 3, 4, 4, {});
  ASSERT_TRUE(s.ok());
  (*s)->Plan(std::vector<int64_t>{7, -1});
  uint8_t out[48];
  const absl::Status seven = (*s)->Read(7, out);
  EXPECT_EQ(seven.code(), absl::StatusCode::kInvalidArgument) << seven;
  EXPECT_NE(seven.message().find("index 7 outside [0, 1)"), absl::string_view::npos) << seven;
  EXPECT_EQ((*s)->Read(-1, out).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*s)->planned_reads(), 2);
}

// Fails by hanging (the test times out) or crashing (ASan in the fuzz build does not run
// this; the gcc build catches a join on a stuck thread as a timeout).
TEST(ImageStreamTest, DestroyingAStreamWhileItDecodesAheadDoesNotHang) {
  const std::string dir = Folder("stream_destroy");
  for (int round = 0; round < 5; ++round) {
    absl::StatusOr<Dataset> streamed = LoadImageFolder(dir, true, Options(DataLoading::kStream, 3));
    ASSERT_TRUE(streamed.ok()) << streamed.status();
    std::vector<int64_t> plan(kImages);
    std::iota(plan.begin(), plan.end(), 0);
    streamed->source->Plan(plan);
    if (round % 2 == 1) Image(*streamed, 0);
  }  // Each stream (the last copy of its Dataset) stops its threads here.
}

TEST(ImageStreamTest, CreateRefusesNoImagesAndBadShapes) {
  EXPECT_FALSE(ImageStream::Create({}, 3, 4, 4, {}).ok());
  EXPECT_FALSE(ImageStream::Create({"a.png"}, 2, 4, 4, {}).ok());
  EXPECT_FALSE(ImageStream::Create({"a.png"}, 3, 0, 4, {}).ok());
  absl::StatusOr<std::shared_ptr<ImageStream>> s = ImageStream::Create({"a.png"}, 3, 4, 4, {});
  ASSERT_TRUE(s.ok());
  uint8_t out[48];
  EXPECT_EQ((*s)->Read(1, out).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*s)->Read(-1, out).code(), absl::StatusCode::kInvalidArgument);
  const absl::Status missing = (*s)->Read(0, out);
  EXPECT_NE(missing.message().find("a.png"), absl::string_view::npos) << missing;
}

}  // namespace
}  // namespace dptrain
