#include "worker/data/image_decode.h"

#include <png.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/data/test_images.h"

namespace dptrain {
namespace {

using testing_images::EncodeJpeg;
using testing_images::EncodePng;
using testing_images::EncodePng8;
using Pixels = std::vector<uint8_t>;

DecodedImage Decode(const std::string& bytes) {
  absl::StatusOr<DecodedImage> image = DecodeImage(bytes, "img");
  EXPECT_TRUE(image.ok()) << image.status();
  return image.ok() ? *std::move(image) : DecodedImage();
}

void ExpectError(const std::string& bytes, const std::string& fragment) {
  const absl::StatusOr<DecodedImage> image = DecodeImage(bytes, "dir/bad.img");
  ASSERT_FALSE(image.ok());
  EXPECT_EQ(image.status().code(), absl::StatusCode::kInvalidArgument) << image.status();
  const std::string message(image.status().message());
  EXPECT_EQ(message.rfind("dir/bad.img: ", 0), 0u) << message;
  EXPECT_NE(message.find(fragment), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

TEST(DataLoadingTest, GrayPng) {
  const Pixels gray = {0, 10, 20, 30, 40, 255};
  const DecodedImage image = Decode(EncodePng8(3, 2, 1, gray));
  EXPECT_EQ(image.width, 3);
  EXPECT_EQ(image.height, 2);
  EXPECT_EQ(image.channels, 1);
  EXPECT_EQ(image.pixels, gray);
}

TEST(DataLoadingTest, OneBitGrayIsExpandedTo8Bits) {
  // 3x1 image, bits 1 0 1 (packed MSB first).
  const DecodedImage image = Decode(EncodePng(3, 1, PNG_COLOR_TYPE_GRAY, 1, {0xA0}));
  EXPECT_EQ(image.channels, 1);
  EXPECT_EQ(image.pixels, (Pixels{255, 0, 255}));
}

TEST(DataLoadingTest, GrayAlphaPngDropsAlpha) {
  const DecodedImage image =
      Decode(EncodePng(2, 1, PNG_COLOR_TYPE_GRAY_ALPHA, 8, {77, 0, 200, 255}));
  EXPECT_EQ(image.channels, 1);
  EXPECT_EQ(image.pixels, (Pixels{77, 200}));
}

TEST(DataLoadingTest, RgbAndRgbaPngs) {
  const Pixels rgb = {1, 2, 3, 250, 128, 0};
  EXPECT_EQ(Decode(EncodePng8(2, 1, 3, rgb)).pixels, rgb);
  // Alpha is dropped, not composited: a transparent pixel keeps its colour (as PIL's
  // convert("RGB")).
  const DecodedImage image =
      Decode(EncodePng(2, 1, PNG_COLOR_TYPE_RGB_ALPHA, 8, {1, 2, 3, 0, 250, 128, 0, 99}));
  EXPECT_EQ(image.channels, 3);
  EXPECT_EQ(image.pixels, rgb);
}

TEST(DataLoadingTest, PalettePngWithTransparency) {
  const Pixels palette = {255, 0, 0, 0, 255, 0, 10, 20, 30};
  const DecodedImage image =
      Decode(EncodePng(3, 1, PNG_COLOR_TYPE_PALETTE, 8, {2, 0, 1}, palette, {0, 128, 255}));
  EXPECT_EQ(image.channels, 3);
  EXPECT_EQ(image.pixels, (Pixels{10, 20, 30, 255, 0, 0, 0, 255, 0}));
}

// 16-bit samples keep their high byte (PIL's convert("RGB") of RGB;16 / RGBA;16 images).
TEST(DataLoadingTest, SixteenBitPngsKeepTheirHighByte) {
  const std::vector<int> values = {0, 65535, 0xFF00, 0x00FF, 257 * 100 + 128, 40000};
  Pixels be;  // Big-endian samples.
  for (int v : values) {
    be.push_back(static_cast<uint8_t>(v >> 8));
    be.push_back(static_cast<uint8_t>(v));
  }
  Pixels expected;
  for (int v : values) expected.push_back(static_cast<uint8_t>(v >> 8));
  const DecodedImage rgb = Decode(EncodePng(2, 1, PNG_COLOR_TYPE_RGB, 16, be));
  EXPECT_EQ(rgb.channels, 3);
  EXPECT_EQ(rgb.pixels, expected);
  const DecodedImage gray = Decode(EncodePng(3, 2, PNG_COLOR_TYPE_GRAY, 16, be));
  EXPECT_EQ(gray.channels, 1);
  EXPECT_EQ(gray.pixels, expected);
}

TEST(DataLoadingTest, ConstantColorJpegsDecodeToTheirColor) {
  const DecodedImage gray = Decode(EncodeJpeg(16, 8, 1, Pixels(16 * 8, 200)));
  EXPECT_EQ(gray.width, 16);
  EXPECT_EQ(gray.height, 8);
  EXPECT_EQ(gray.channels, 1);
  for (uint8_t p : gray.pixels) ASSERT_NEAR(p, 200, 1);
  Pixels rgb;
  for (int i = 0; i < 16 * 16; ++i) rgb.insert(rgb.end(), {200, 40, 90});
  const DecodedImage color = Decode(EncodeJpeg(16, 16, 3, rgb));
  EXPECT_EQ(color.channels, 3);
  ASSERT_EQ(color.pixels.size(), rgb.size());
  for (size_t i = 0; i < rgb.size(); ++i) ASSERT_NEAR(color.pixels[i], rgb[i], 3) << i;
}

TEST(DataLoadingTest, JpegGradientIsClose) {
  Pixels rgb;
  for (int y = 0; y < 24; ++y) {
    for (int x = 0; x < 32; ++x) {
      rgb.insert(rgb.end(), {static_cast<uint8_t>(8 * x), static_cast<uint8_t>(10 * y), 128});
    }
  }
  const DecodedImage image = Decode(EncodeJpeg(32, 24, 3, rgb, 98));
  ASSERT_EQ(image.pixels.size(), rgb.size());
  double error = 0;
  for (size_t i = 0; i < rgb.size(); ++i) error += std::abs(image.pixels[i] - rgb[i]);
  EXPECT_LT(error / rgb.size(), 3.0);
}

TEST(DataLoadingTest, NotAnImage) {
  ExpectError("", "not a PNG or JPEG image (0 bytes)");
  ExpectError("GIF89a......", "not a PNG or JPEG image");
}

TEST(DataLoadingTest, TruncatedAndCorruptPngs) {
  Pixels rgb(8 * 8 * 3);
  for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = static_cast<uint8_t>(i * 37);
  const std::string png = EncodePng8(8, 8, 3, rgb);
  for (size_t keep : {size_t{8}, size_t{20}, png.size() / 2, png.size() - 12, png.size() - 1}) {
    ExpectError(png.substr(0, keep), "cannot decode PNG");
  }
  std::string corrupt = png;
  corrupt[40] ^= 0x55;  // Inside IDAT: its CRC no longer matches.
  ExpectError(corrupt, "cannot decode PNG");
}

// Rewrites the IHDR width and height of a PNG, with a valid CRC.
std::string WithSize(std::string png, uint32_t width, uint32_t height) {
  for (int i = 0; i < 4; ++i) {
    png[16 + i] = static_cast<char>(width >> (24 - 8 * i));
    png[20 + i] = static_cast<char>(height >> (24 - 8 * i));
  }
  const uint32_t crc =
      crc32(0, reinterpret_cast<const Bytef*>(png.data() + 12), 4 + 13);  // Type + data.
  for (int i = 0; i < 4; ++i) png[29 + i] = static_cast<char>(crc >> (24 - 8 * i));
  return png;
}

TEST(DataLoadingTest, HugeDimensionsAreRefusedBeforeAllocating) {
  const std::string png = EncodePng8(1, 1, 1, {0});
  ExpectError(WithSize(png, 100000, 1), "cannot decode PNG");
  ExpectError(WithSize(png, 16000, 16000), "image beyond the size limits");
  std::string jpeg = EncodeJpeg(8, 8, 1, Pixels(64, 0));
  const size_t sof = jpeg.find("\xFF\xC0");
  ASSERT_NE(sof, std::string::npos);
  jpeg[sof + 5] = jpeg[sof + 7] = static_cast<char>(0xEA);  // 60000+ x 60000+.
  ExpectError(jpeg, "image beyond the size limits");
}

TEST(DataLoadingTest, TruncatedAndCmykJpegs) {
  Pixels rgb(16 * 16 * 3);
  for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = static_cast<uint8_t>(i * 7);
  const std::string jpeg = EncodeJpeg(16, 16, 3, rgb);
  ExpectError(jpeg.substr(0, jpeg.size() / 2), "cannot decode JPEG");
  ExpectError(jpeg.substr(0, 3), "cannot decode JPEG");
  ExpectError(EncodeJpeg(8, 8, 4, Pixels(8 * 8 * 4, 50)), "unsupported color space");
}

// ProbeImage tells, from the header alone, the size and channels DecodeImage gives.
void ExpectProbeMatchesDecode(const std::string& bytes) {
  const absl::StatusOr<ImageInfo> info = ProbeImage(bytes, "img");
  ASSERT_TRUE(info.ok()) << info.status();
  const DecodedImage image = Decode(bytes);
  EXPECT_EQ(info->width, image.width);
  EXPECT_EQ(info->height, image.height);
  EXPECT_EQ(info->channels, image.channels);
}

TEST(DataLoadingTest, ProbeTellsWhatADecodeGives) {
  ExpectProbeMatchesDecode(EncodePng8(5, 3, 1, Pixels(15, 9)));
  ExpectProbeMatchesDecode(EncodePng8(4, 6, 3, Pixels(72, 9)));
  // Gray + alpha (gray), RGBA (RGB), palette (RGB), 16-bit gray, 1-bit gray.
  ExpectProbeMatchesDecode(EncodePng(2, 2, PNG_COLOR_TYPE_GRAY_ALPHA, 8, {1, 2, 3, 4, 5, 6, 7, 8}));
  ExpectProbeMatchesDecode(EncodePng(1, 2, PNG_COLOR_TYPE_RGB_ALPHA, 8, {1, 2, 3, 4, 5, 6, 7, 8}));
  ExpectProbeMatchesDecode(
      EncodePng(2, 1, PNG_COLOR_TYPE_PALETTE, 8, {0, 1}, {10, 20, 30, 40, 50, 60}));
  ExpectProbeMatchesDecode(EncodePng(1, 1, PNG_COLOR_TYPE_GRAY, 16, {0x12, 0x34}));
  ExpectProbeMatchesDecode(EncodePng(8, 1, PNG_COLOR_TYPE_GRAY, 1, {0xA5}));
  ExpectProbeMatchesDecode(EncodeJpeg(9, 7, 1, Pixels(63, 100)));
  ExpectProbeMatchesDecode(EncodeJpeg(7, 9, 3, Pixels(189, 100)));
}

TEST(DataLoadingTest, ProbeRefusesWhatADecodeRefusesInTheHeader) {
  const std::string png = EncodePng8(8, 8, 3, Pixels(192, 1));
  for (const std::string& bytes :
       {std::string("GIF89a......"), png.substr(0, 20), WithSize(png, 16000, 16000),
        EncodeJpeg(8, 8, 4, Pixels(8 * 8 * 4, 50))}) {
    const absl::StatusOr<ImageInfo> info = ProbeImage(bytes, "dir/bad.img");
    ASSERT_FALSE(info.ok());
    EXPECT_EQ(info.status().code(), absl::StatusCode::kInvalidArgument) << info.status();
    EXPECT_EQ(std::string(info.status().message()).rfind("dir/bad.img: ", 0), 0u);
  }
  // The header is all a probe reads: corrupt pixel data passes it (the decode refuses it).
  std::string corrupt = png;
  corrupt[png.size() - 17] ^= 0x55;  // IDAT's last data byte (before its CRC and IEND).
  EXPECT_TRUE(ProbeImage(corrupt, "img").ok());
  EXPECT_FALSE(DecodeImage(corrupt, "img").ok());
}

// A JPEG with a comment segment of `bytes` bytes before its frame header (as EXIF data can be).
std::string JpegWithCommentFirst(const std::string& jpeg, size_t bytes) {
  std::string out = jpeg.substr(0, 2);  // SOI.
  for (size_t left = bytes; left > 0;) {
    const size_t n = std::min<size_t>(left, 65533);
    out += "\xFF\xFE";
    out += static_cast<char>((n + 2) >> 8);
    out += static_cast<char>((n + 2) & 0xFF);
    out += std::string(n, 'c');
    left -= n;
  }
  return out + jpeg.substr(2);
}

TEST(DataLoadingTest, ProbeFileReadsPastAHeaderBeyondItsPrefix) {
  const std::string dir = ::testing::TempDir();
  // Headers after 10 KB (beyond the first read, 4 KiB) and after 200 KB (beyond 64 KiB).
  for (size_t before : {size_t{0}, size_t{10000}, size_t{200000}}) {
    const std::string jpeg = JpegWithCommentFirst(EncodeJpeg(6, 4, 3, Pixels(72, 200)), before);
    const std::string path = dir + "/late_header.jpg";
    FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(std::fwrite(jpeg.data(), 1, jpeg.size(), f), jpeg.size());
    std::fclose(f);
    const absl::StatusOr<ImageInfo> info = ProbeImageFile(path);
    ASSERT_TRUE(info.ok()) << before << ": " << info.status();
    EXPECT_EQ(info->width, 6);
    EXPECT_EQ(info->height, 4);
    EXPECT_EQ(info->channels, 3);
    const absl::StatusOr<DecodedImage> image = DecodeImageFile(path);
    ASSERT_TRUE(image.ok()) << image.status();
    EXPECT_EQ(image->width, 6);
  }
  const absl::StatusOr<ImageInfo> missing = ProbeImageFile(dir + "/no_such.png");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(std::string(missing.status().message()).find("no_such.png"), std::string::npos);
}

TEST(DataLoadingTest, ToPlanesReplicatesGrayToRgb) {
  DecodedImage gray{2, 1, 1, {7, 9}};
  uint8_t out[6];
  ToPlanes(gray, 3, out);
  EXPECT_EQ(std::vector<uint8_t>(out, out + 6), (std::vector<uint8_t>{7, 9, 7, 9, 7, 9}));
  DecodedImage rgb{2, 1, 3, {1, 2, 3, 4, 5, 6}};
  ToPlanes(rgb, 3, out);
  EXPECT_EQ(std::vector<uint8_t>(out, out + 6), (std::vector<uint8_t>{1, 4, 2, 5, 3, 6}));
}

}  // namespace
}  // namespace dptrain
