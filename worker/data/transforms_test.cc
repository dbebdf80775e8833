#include "worker/data/transforms.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "worker/data/batch.h"

namespace dptrain {
namespace {

// n images of shape, value of (i, c, y, x) = 1000 i + 100 c + 10 y + x + 1 (never 0).
std::vector<float> Batch(int n, const ImageShape& s) {
  std::vector<float> v;
  for (int i = 0; i < n; ++i) {
    for (int c = 0; c < s.channels; ++c) {
      for (int y = 0; y < s.height; ++y) {
        for (int x = 0; x < s.width; ++x) v.push_back(1000.0f * i + 100 * c + 10 * y + x + 1);
      }
    }
  }
  return v;
}

TEST(NormalizeTest, PerChannelAndValidated) {
  Dataset d;
  d.size = 2;
  d.channels = 2;
  d.rows = 1;
  d.cols = 2;
  d.images = {1, 2, 3, 4, 5, 6, 7, 8};
  d.labels = {0, 1};
  ASSERT_TRUE(Normalize(d, {1.0f, 3.0f}, {2.0f, 0.5f}).ok());
  EXPECT_EQ(d.images, (std::vector<float>{0, 0.5f, 0, 2, 2, 2.5f, 8, 10}));
  const std::vector<float> before = d.images;
  EXPECT_EQ(Normalize(d, {0.0f}, {1.0f}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Normalize(d, {0, 0}, {1, 0}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Normalize(d, {0, 0}, {1, -1}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Normalize(d, {0, 0}, {1, std::nanf("")}).code(), absl::StatusCode::kInvalidArgument);
  d.images.pop_back();
  EXPECT_EQ(Normalize(d, {0, 0}, {1, 1}).code(), absl::StatusCode::kInvalidArgument);
  d.images.push_back(10);
  EXPECT_EQ(d.images, before) << "a failed Normalize changes nothing";
}

// A set held as bytes (ImageFolder's) reads, normalised or not, bit for bit as the same set
// held as floats (byte / 255, then (v - mean) / std as Normalize computes it), through
// CopyImages and GatherBatch; Normalize records its mean and std once.
TEST(NormalizeTest, ByteStorageReadsAsTheFloatStore) {
  Dataset bytes;
  bytes.size = 3;
  bytes.channels = 2;
  bytes.rows = 2;
  bytes.cols = 3;
  bytes.byte_storage = true;
  for (int i = 0; i < 36; ++i) bytes.bytes.push_back(static_cast<uint8_t>(i * 7 % 256));
  bytes.labels = {0, 1, 2};
  Dataset floats = bytes;
  floats.byte_storage = false;
  floats.bytes.clear();
  for (uint8_t b : bytes.bytes) floats.images.push_back(static_cast<float>(b) / 255.0f);
  ASSERT_TRUE(bytes.consistent() && floats.consistent());
  for (bool normalised : {false, true}) {
    if (normalised) {
      ASSERT_TRUE(Normalize(bytes, {0.4f, 0.6f}, {0.2f, 0.3f}).ok());
      ASSERT_TRUE(Normalize(floats, {0.4f, 0.6f}, {0.2f, 0.3f}).ok());
      EXPECT_TRUE(bytes.images.empty());
    }
    std::vector<float> a(36), b(36);
    bytes.CopyImages(0, 3, a.data());
    floats.CopyImages(0, 3, b.data());
    EXPECT_EQ(a, b) << normalised;
    std::vector<float> batch_a(24), batch_b(24);
    std::vector<nn::Label> la(2), lb(2);
    ASSERT_TRUE(GatherBatch(bytes, {2, 0}, absl::MakeSpan(batch_a), absl::MakeSpan(la)).ok());
    ASSERT_TRUE(GatherBatch(floats, {2, 0}, absl::MakeSpan(batch_b), absl::MakeSpan(lb)).ok());
    EXPECT_EQ(batch_a, batch_b) << normalised;
    EXPECT_EQ(la, lb);
  }
  EXPECT_EQ(Normalize(bytes, {0.4f, 0.6f}, {0.2f, 0.3f}).code(),
            absl::StatusCode::kFailedPrecondition);
  bytes.KeepFirst(2);
  EXPECT_TRUE(bytes.consistent());
  EXPECT_EQ(bytes.bytes.size(), 24u);
}

TEST(AugmentTest, DisabledIsANoOp) {
  const ImageShape s{3, 4, 5};
  std::vector<float> v = Batch(3, s);
  const std::vector<float> before = v;
  const std::vector<int64_t> idx = {7, 8, 9};
  ASSERT_TRUE(AugmentBatch(absl::MakeSpan(v), 3, s, {}, 42, idx).ok());
  EXPECT_EQ(v, before);
}

TEST(AugmentTest, FlipMirrorsEveryRowOfEveryChannel) {
  const ImageShape s{2, 3, 4};
  AugmentOptions flip_only;
  flip_only.horizontal_flip = true;
  // Find a flipped and an unflipped sample index for this key.
  const uint64_t key = AugmentKey(1, 0);
  int64_t flipped = -1, kept = -1;
  for (int64_t i = 0; i < 64 && (flipped < 0 || kept < 0); ++i) {
    const AugmentChoice c = ChooseAugment(flip_only, key, i);
    EXPECT_EQ(c.offset_x, 0);
    EXPECT_EQ(c.offset_y, 0);
    (c.flip ? flipped : kept) = i;
  }
  ASSERT_GE(flipped, 0);
  ASSERT_GE(kept, 0);
  std::vector<float> v = Batch(2, s);
  const std::vector<float> before = v;
  const std::vector<int64_t> idx = {flipped, kept};
  ASSERT_TRUE(AugmentBatch(absl::MakeSpan(v), 2, s, flip_only, key, idx).ok());
  for (int c = 0; c < 2; ++c) {
    for (int y = 0; y < 3; ++y) {
      for (int x = 0; x < 4; ++x) {
        EXPECT_EQ(v[(c * 3 + y) * 4 + x], before[(c * 3 + y) * 4 + (3 - x)]);
      }
    }
  }
  EXPECT_TRUE(std::equal(v.begin() + 24, v.end(), before.begin() + 24)) << "sample 2 unflipped";
}

// A 1x3x3 image cropped with padding 1 at every offset, by hand.
TEST(AugmentTest, CropWithPaddingOnAHandMadeImage) {
  const ImageShape s{1, 3, 3};
  const std::vector<float> image = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  AugmentOptions crop;
  crop.crop_padding = 1;
  crop.fill = {-1.0f};
  struct Case {
    int oy, ox;
    bool flip;
    std::vector<float> expected;
  };
  const std::vector<Case> cases = {
      {1, 1, false, {1, 2, 3, 4, 5, 6, 7, 8, 9}},       // Centered: unchanged.
      {0, 0, false, {-1, -1, -1, -1, 1, 2, -1, 4, 5}},  // Window at the padded top-left.
      {2, 2, false, {5, 6, -1, 8, 9, -1, -1, -1, -1}},  // Bottom-right.
      {0, 2, false, {-1, -1, -1, 2, 3, -1, 5, 6, -1}},  // Top-right.
      {1, 0, false, {-1, 1, 2, -1, 4, 5, -1, 7, 8}},    // Shifted right by one.
      {1, 0, true, {2, 1, -1, 5, 4, -1, 8, 7, -1}},     // The same, then mirrored.
      {1, 1, true, {3, 2, 1, 6, 5, 4, 9, 8, 7}},        // Flip only.
  };
  crop.horizontal_flip = true;
  // Find, for each case, a sample index that draws it; then augment it.
  for (const Case& c : cases) {
    int64_t index = -1;
    for (int64_t i = 0; i < 10000 && index < 0; ++i) {
      const AugmentChoice a = ChooseAugment(crop, 5, i);
      if (a.offset_y == c.oy && a.offset_x == c.ox && a.flip == c.flip) index = i;
    }
    ASSERT_GE(index, 0);
    std::vector<float> v = image;
    const std::vector<int64_t> idx = {index};
    ASSERT_TRUE(AugmentBatch(absl::MakeSpan(v), 1, s, crop, 5, idx).ok());
    EXPECT_EQ(v, c.expected) << c.oy << " " << c.ox << " " << c.flip;
  }
}

TEST(AugmentTest, ZeroFillByDefaultAndAllOffsetsDrawn) {
  AugmentOptions crop;
  crop.crop_padding = 2;
  std::vector<int> seen(25, 0);
  for (int64_t i = 0; i < 2000; ++i) {
    const AugmentChoice a = ChooseAugment(crop, 9, i);
    ASSERT_GE(a.offset_y, 0);
    ASSERT_LE(a.offset_y, 4);
    ASSERT_GE(a.offset_x, 0);
    ASSERT_LE(a.offset_x, 4);
    EXPECT_FALSE(a.flip);
    ++seen[a.offset_y * 5 + a.offset_x];
  }
  for (int count : seen) EXPECT_GT(count, 40);  // ~80 each.
  int64_t corner = -1;
  for (int64_t i = 0; corner < 0; ++i) {
    const AugmentChoice a = ChooseAugment(crop, 9, i);
    if (a.offset_y == 0 && a.offset_x == 0) corner = i;
  }
  const ImageShape s{1, 3, 3};
  std::vector<float> v = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  const std::vector<int64_t> idx = {corner};
  ASSERT_TRUE(AugmentBatch(absl::MakeSpan(v), 1, s, crop, 9, idx).ok());
  EXPECT_EQ(v, (std::vector<float>{0, 0, 0, 0, 0, 0, 0, 0, 1}));
}

// The same (key, sample index) gives the same result wherever the sample sits in a batch;
// other keys (epochs) give other results.
TEST(AugmentTest, DeterministicPerKeyAndSampleIndex) {
  const ImageShape s{3, 8, 8};
  AugmentOptions o;
  o.crop_padding = 2;
  o.horizontal_flip = true;
  const std::vector<float> base = Batch(1, s);
  auto augment_one = [&](uint64_t key, int64_t index) {
    std::vector<float> v = base;
    const std::vector<int64_t> idx = {index};
    EXPECT_TRUE(AugmentBatch(absl::MakeSpan(v), 1, s, o, key, idx).ok());
    return v;
  };
  const uint64_t key = AugmentKey(123, 4);
  EXPECT_EQ(key, AugmentKey(123, 4));
  std::vector<float> batch;
  for (int i = 0; i < 4; ++i) batch.insert(batch.end(), base.begin(), base.end());
  const std::vector<int64_t> idx = {40, 11, 40, 7};
  ASSERT_TRUE(AugmentBatch(absl::MakeSpan(batch), 4, s, o, key, idx).ok());
  for (int i = 0; i < 4; ++i) {
    const std::vector<float> alone = augment_one(key, idx[i]);
    EXPECT_TRUE(std::equal(alone.begin(), alone.end(), batch.begin() + i * base.size())) << i;
  }
  int differ = 0;
  for (int64_t i = 0; i < 20; ++i) {
    differ += augment_one(AugmentKey(123, 4), i) != augment_one(AugmentKey(123, 5), i);
  }
  EXPECT_GT(differ, 10);
}

TEST(AugmentTest, BadArgumentsChangeNothing) {
  const ImageShape s{1, 3, 3};
  std::vector<float> v(18, 1.0f);
  AugmentOptions o;
  o.horizontal_flip = true;
  const std::vector<int64_t> two = {0, 1}, one = {0};
  const auto bad = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(AugmentBatch(absl::MakeSpan(v), 2, s, o, 1, one).code(), bad);
  EXPECT_EQ(AugmentBatch(absl::MakeSpan(v).first(17), 2, s, o, 1, two).code(), bad);
  EXPECT_EQ(AugmentBatch(absl::MakeSpan(v), 2, {1, 0, 3}, o, 1, two).code(), bad);
  EXPECT_EQ(AugmentBatch(absl::MakeSpan(v), -1, s, o, 1, {}).code(), bad);
  o.fill = {0.0f, 0.0f};
  EXPECT_EQ(AugmentBatch(absl::MakeSpan(v), 2, s, o, 1, two).code(), bad);
  o.fill.clear();
  o.crop_padding = -1;
  EXPECT_EQ(AugmentBatch(absl::MakeSpan(v), 2, s, o, 1, two).code(), bad);
  o.crop_padding = 5000;
  EXPECT_EQ(AugmentBatch(absl::MakeSpan(v), 2, s, o, 1, two).code(), bad);
  EXPECT_EQ(v, std::vector<float>(18, 1.0f));
  o.crop_padding = 0;
  EXPECT_TRUE(AugmentBatch(absl::MakeSpan(v), 0, s, o, 1, {}).ok());
}

}  // namespace
// torchvision's RandomResizedCrop: a box of the image scaled back to its size. The scaling
// against PyTorch's own F.interpolate(crop, size, mode="bilinear", align_corners=False) on a
// hand-made 5x6 image and box (torch 1.13, values printed to 9 digits).
TEST(AugmentTest, ResizedCropScalesTheBoxAsPyTorchInterpolates) {
  std::vector<float> image(30);
  for (int i = 0; i < 5; ++i) {
    for (int j = 0; j < 6; ++j)
      image[i * 6 + j] = static_cast<float>((i * 7 + j * 3) % 11) * 0.37f - 1.0f;
  }
  const std::vector<float> torch_out = {
      -0.25999999f, 0.295000017f, 1.03500009f,   1.7750001f,    0.479999661f,  -1.0f,
      0.776000082f, 0.51700002f,  0.443000019f,  1.18299997f,   0.701999843f,  0.0360001326f,
      2.32999992f,  0.850000024f, -0.444999814f, 0.294999987f,  1.03499997f,   1.58999991f,
      1.44199991f,  1.18300009f,  0.702000082f,  -0.186000109f, 0.146999985f,  0.701999903f,
      0.850000024f, 1.40499997f,  1.46666646f,   -0.50666678f,  -0.444999874f, 0.109999999f};
  // Find a sample whose box is (top 1, left 2, height 3, width 4) in a 5x6 image.
  AugmentOptions o;
  o.resized_crop_min_scale = 0.08;
  const ImageShape shape{1, 5, 6};
  int64_t found = -1;
  for (int64_t i = 0; i < 200000 && found < 0; ++i) {
    const CropBox b = ChooseResizedCrop(o, 5, 6, 7, i);
    if (b.top == 1 && b.left == 2 && b.height == 3 && b.width == 4) found = i;
  }
  ASSERT_GE(found, 0);
  std::vector<float> out = image;
  ASSERT_TRUE(AugmentBatch(absl::MakeSpan(out), 1, shape, o, 7, {found}).ok());
  for (int k = 0; k < 30; ++k) EXPECT_NEAR(out[k], torch_out[k], 2e-6f) << k;
}

// The boxes: inside the image, of an area share in [min_scale, 1] and a ratio in [3/4, 4/3] up
// to the rounding to whole pixels, spread over both (not all alike), a pure function of
// (key, sample), another key another box; a box of the whole image leaves it untouched.
TEST(AugmentTest, ResizedCropBoxesFollowTorchvisionsDraw) {
  AugmentOptions o;
  o.resized_crop_min_scale = 0.08;
  const int h = 224, w = 224;
  double smallest = 1, largest = 0, narrowest = 10, widest = 0;
  int differ = 0;
  for (int64_t i = 0; i < 5000; ++i) {
    const CropBox b = ChooseResizedCrop(o, h, w, 11, i);
    ASSERT_TRUE(b.top >= 0 && b.left >= 0 && b.height >= 1 && b.width >= 1 &&
                b.top + b.height <= h && b.left + b.width <= w)
        << i;
    const double share = static_cast<double>(b.height) * b.width / (h * w);
    const double ratio = static_cast<double>(b.width) / b.height;
    smallest = std::min(smallest, share), largest = std::max(largest, share);
    narrowest = std::min(narrowest, ratio), widest = std::max(widest, ratio);
    const CropBox again = ChooseResizedCrop(o, h, w, 11, i);
    EXPECT_TRUE(again.top == b.top && again.left == b.left && again.height == b.height &&
                again.width == b.width);
    const CropBox other = ChooseResizedCrop(o, h, w, 12, i);
    differ += other.top != b.top || other.height != b.height;
  }
  EXPECT_GE(smallest, 0.08 * 0.97);
  EXPECT_LT(smallest, 0.1);
  EXPECT_LE(largest, 1.0);
  EXPECT_GT(largest, 0.95);
  EXPECT_GE(narrowest, 0.75 * 0.99);
  EXPECT_LT(narrowest, 0.77);
  EXPECT_LE(widest, 4.0 / 3.0 * 1.01);
  EXPECT_GT(widest, 1.3);
  EXPECT_GT(differ, 4900);
  // A 1x40 image fits no box of ratio <= 4/3 and area >= 8 %: the fallback, a centred 1x1
  // (round(1 * 4/3) = 1) box.
  const CropBox thin = ChooseResizedCrop(o, 1, 40, 3, 0);
  EXPECT_EQ(thin.height, 1);
  EXPECT_EQ(thin.width, 1);
  EXPECT_EQ(thin.left, 19);
  // And a 40x1 one (height x width): width 1, height round(1 / (3/4)) = 1, centred.
  const CropBox tall = ChooseResizedCrop(o, 40, 1, 3, 0);
  EXPECT_EQ(tall.height, 1);
  EXPECT_EQ(tall.width, 1);
  EXPECT_EQ(tall.top, 19);
  EXPECT_EQ(tall.left, 0);
  // min scale 1 on a square image: the box may still be the whole image only at ratio 1; a
  // whole-image box changes nothing, bit for bit.
  std::vector<float> image = Batch(1, {2, 4, 4});
  o.resized_crop_min_scale = 1;
  int whole = 0;
  for (int64_t i = 0; i < 50; ++i) {
    const CropBox b = ChooseResizedCrop(o, 4, 4, 5, i);
    if (b.height != 4 || b.width != 4) continue;
    ++whole;
    std::vector<float> out = image;
    ASSERT_TRUE(AugmentBatch(absl::MakeSpan(out), 1, {2, 4, 4}, o, 5, {i}).ok());
    EXPECT_EQ(out, image);
  }
  EXPECT_GT(whole, 10);
  o.resized_crop_min_scale = 1.5;
  std::vector<float> out = image;
  EXPECT_EQ(AugmentBatch(absl::MakeSpan(out), 1, {2, 4, 4}, o, 5, {0}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out, image);
}

}  // namespace dptrain
