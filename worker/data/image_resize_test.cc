// The resampler against Pillow itself: every case of testdata/resize/cases.txt (written by
// tools/make_resize_fixtures.py with PIL and torchvision's Resize/CenterCrop logic) must come
// out byte for byte; and the size flag's parsing.
#include "worker/data/image_resize.h"

#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "worker/data/test_files.h"

namespace dptrain {
namespace {

const char kDir[] = "worker/data/testdata/resize/";

DecodedImage Load(const std::string& file) {
  absl::StatusOr<DecodedImage> image = DecodeImage(testing_files::ReadFile(kDir + file), file);
  EXPECT_TRUE(image.ok()) << image.status();
  return image.ok() ? *image : DecodedImage();
}

TEST(ImageResizeTest, EqualsPillowThroughTorchvisionsTransforms) {
  std::ifstream cases(std::string(kDir) + "cases.txt");
  ASSERT_TRUE(cases.good());
  std::string line;
  int count = 0;
  while (std::getline(cases, line)) {
    if (line.empty()) continue;
    std::istringstream fields(line);
    std::string in_file, size_text, out_file;
    fields >> in_file >> size_text >> out_file;
    SCOPED_TRACE(line);
    absl::StatusOr<ImageSize> size = ParseImageSize(size_text);
    ASSERT_TRUE(size.ok()) << size.status();
    const DecodedImage in = Load(in_file), expected = Load(out_file);
    const DecodedImage out = FitImage(in, *size);
    ASSERT_EQ(out.height, expected.height);
    ASSERT_EQ(out.width, expected.width);
    ASSERT_EQ(out.channels, expected.channels);
    int differ = 0;
    for (size_t i = 0; i < out.pixels.size(); ++i) differ += out.pixels[i] != expected.pixels[i];
    EXPECT_EQ(differ, 0) << "of " << out.pixels.size() << " bytes";
    ++count;
  }
  EXPECT_GE(count, 20);
}

TEST(ImageResizeTest, CenterCropRoundsHalvesToEven) {
  DecodedImage image;
  image.width = 8;
  image.height = 1;
  image.channels = 1;
  image.pixels = {0, 1, 2, 3, 4, 5, 6, 7};
  // Margins 1, 3, 5: offsets round(0.5) = 0, round(1.5) = 2, round(2.5) = 2.
  EXPECT_EQ(CenterCrop(image, 1, 7).pixels.front(), 0);
  EXPECT_EQ(CenterCrop(image, 1, 5).pixels.front(), 2);
  EXPECT_EQ(CenterCrop(image, 1, 3).pixels.front(), 2);
  EXPECT_EQ(CenterCrop(image, 1, 4).pixels.front(), 2);
}

TEST(ImageResizeTest, SameSizeIsTheImageItself) {
  const DecodedImage in = Load("in_land.png");
  EXPECT_EQ(ResizeBilinear(in, in.height, in.width).pixels, in.pixels);
  EXPECT_EQ(FitImage(in, ImageSize{}).pixels, in.pixels);
}

TEST(ImageResizeTest, ParsesSizes) {
  absl::StatusOr<ImageSize> s = ParseImageSize("224");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->mode, ImageSize::Mode::kShorterSideThenCenterCrop);
  EXPECT_EQ(s->rows, 224);
  EXPECT_EQ(s->ToString(), "224");
  s = ParseImageSize("32x48");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->mode, ImageSize::Mode::kExact);
  EXPECT_EQ(s->rows, 32);
  EXPECT_EQ(s->cols, 48);
  EXPECT_EQ(s->ToString(), "32x48");
  EXPECT_TRUE(ParseImageSize("")->keep());
  for (const char* bad : {"0", "x", "32x", "32x48x3", "-4", "abc", "5000", "32X48"}) {
    absl::StatusOr<ImageSize> b = ParseImageSize(bad);
    ASSERT_FALSE(b.ok()) << bad;
    EXPECT_TRUE(absl::StrContains(b.status().message(), bad)) << b.status();
  }
}

}  // namespace
}  // namespace dptrain
