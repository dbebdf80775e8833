#include "worker/data/image_folder.h"

#include <png.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "worker/data/test_files.h"
#include "worker/data/test_images.h"

namespace dptrain {
namespace {

using testing_files::ExpectError;
using testing_files::FreshDir;
using testing_files::MakeDirs;
using testing_files::WriteFile;
using testing_images::EncodeJpeg;
using testing_images::EncodePng;
using testing_images::EncodePng8;
using Pixels = std::vector<uint8_t>;

// A 4x3 (width x height) RGB image whose pixel p has (seed + p, 2 * p, 255 - p).
Pixels Rgb(int seed) {
  Pixels rgb;
  for (int p = 0; p < 12; ++p) {
    rgb.insert(rgb.end(), {static_cast<uint8_t>(seed + p), static_cast<uint8_t>(2 * p),
                           static_cast<uint8_t>(255 - p)});
  }
  return rgb;
}

Pixels Gray(int seed) {
  Pixels gray;
  for (int p = 0; p < 12; ++p) gray.push_back(static_cast<uint8_t>(seed + 3 * p));
  return gray;
}

// Value p of channel c of image i, read as the trainer reads it (the set holds bytes).
float At(const Dataset& d, int64_t i, int c, int p) {
  std::vector<float> image(d.image_size());
  d.CopyImages(i, 1, image.data());
  return image[c * d.rows * d.cols + p];
}

// train/cat: a.jpg (gray, constant 90), b.png (RGB); train/dog: x.PNG (RGBA), y.jpeg (RGB,
// constant); test/dog: z.png (gray). Plus things to skip.
std::string MixedDir(const std::string& name) {
  const std::string dir = FreshDir(name);
  WriteFile(dir + "/train/cat/a.jpg", EncodeJpeg(4, 3, 1, Pixels(12, 90)));
  WriteFile(dir + "/train/cat/b.png", EncodePng8(4, 3, 3, Rgb(10)));
  Pixels rgba;
  const Pixels rgb = Rgb(20);
  for (int p = 0; p < 12; ++p) {
    rgba.insert(rgba.end(), {rgb[3 * p], rgb[3 * p + 1], rgb[3 * p + 2], static_cast<uint8_t>(p)});
  }
  WriteFile(dir + "/train/dog/x.PNG", EncodePng(4, 3, PNG_COLOR_TYPE_RGB_ALPHA, 8, rgba));
  Pixels constant;
  for (int p = 0; p < 12; ++p) constant.insert(constant.end(), {30, 160, 220});
  WriteFile(dir + "/train/dog/y.jpeg", EncodeJpeg(4, 3, 3, constant));
  WriteFile(dir + "/train/dog/notes.txt", "not an image");
  MakeDirs(dir + "/train/dog/nested.png");  // A folder, skipped.
  WriteFile(dir + "/train/.cache/c.png", "hidden class folder, skipped");
  WriteFile(dir + "/train/README", "a file beside the class folders, skipped");
  WriteFile(dir + "/test/dog/z.png", EncodePng8(4, 3, 1, Gray(5)));
  return dir;
}

TEST(ImageFolderTest, LoadsMixedImagesAsRgbInClassAndNameOrder) {
  const std::string dir = MixedDir("folder_mixed");
  absl::StatusOr<Dataset> data = LoadImageFolder(dir, true);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->size, 4);
  EXPECT_EQ(data->channels, 3);
  EXPECT_EQ(data->rows, 3);
  EXPECT_EQ(data->cols, 4);
  EXPECT_EQ(data->num_classes, 2);
  EXPECT_EQ(data->labels, (std::vector<nn::Label>{0, 0, 1, 1}));
  ASSERT_TRUE(data->byte_storage);
  ASSERT_EQ(data->bytes.size(), 4u * 36);
  for (int p = 0; p < 12; ++p) {
    for (int c = 0; c < 3; ++c) {
      EXPECT_NEAR(At(*data, 0, c, p), 90 / 255.0f, 1.5f / 255) << "gray JPEG, replicated";
      EXPECT_FLOAT_EQ(At(*data, 1, c, p), Rgb(10)[3 * p + c] / 255.0f) << "RGB PNG";
      EXPECT_FLOAT_EQ(At(*data, 2, c, p), Rgb(20)[3 * p + c] / 255.0f) << "RGBA PNG";
    }
    EXPECT_NEAR(At(*data, 3, 0, p), 30 / 255.0f, 3.5f / 255) << "RGB JPEG";
    EXPECT_NEAR(At(*data, 3, 1, p), 160 / 255.0f, 3.5f / 255) << "RGB JPEG";
    EXPECT_NEAR(At(*data, 3, 2, p), 220 / 255.0f, 3.5f / 255) << "RGB JPEG";
  }
}

TEST(ImageFolderTest, TestSetWithASubsetOfClassesKeepsTrainingLabels) {
  absl::StatusOr<Dataset> data = LoadImageFolder(MixedDir("folder_test_split"), false);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->size, 1);
  EXPECT_EQ(data->labels, (std::vector<nn::Label>{1}));
  EXPECT_EQ(data->num_classes, 2);
  EXPECT_EQ(data->channels, 1) << "every test image is gray";
  for (int p = 0; p < 12; ++p) EXPECT_FLOAT_EQ(At(*data, 0, 0, p), Gray(5)[p] / 255.0f);
  // As RGB (the worker's test split of a training set in colour), held and streamed: the gray
  // image in each channel.
  ImageFolderOptions color;
  color.color = true;
  for (DataLoading loading : {DataLoading::kLoad, DataLoading::kStream}) {
    color.loading = loading;
    absl::StatusOr<Dataset> rgb = LoadImageFolder(MixedDir("folder_test_color"), false, color);
    ASSERT_TRUE(rgb.ok()) << rgb.status();
    EXPECT_EQ(rgb->channels, 3);
    std::vector<float> image(rgb->image_size());
    std::vector<uint8_t> scratch;
    ASSERT_TRUE(rgb->ReadImage(0, image.data(), scratch).ok());
    for (int c = 0; c < 3; ++c) {
      for (int p = 0; p < 12; ++p) EXPECT_FLOAT_EQ(image[c * 12 + p], Gray(5)[p] / 255.0f);
    }
  }
}

// Many images across classes: the result is the same for 1, 3 and 8 threads.
TEST(ImageFolderTest, ResultDoesNotDependOnThreadCount) {
  const std::string dir = FreshDir("folder_threads");
  for (int i = 0; i < 60; ++i) {
    const std::string path = absl::StrCat(dir, "/train/class", i % 5, "/img", i, ".png");
    WriteFile(path, EncodePng8(4, 3, 1, Gray(i)));
  }
  absl::StatusOr<Dataset> one = LoadImageFolder(dir, true, {1});
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->size, 60);
  EXPECT_EQ(one->channels, 1);
  EXPECT_EQ(one->num_classes, 5);
  // Sorted by name: class0 holds img0, img10, img15, img20, ... , img5, img55.
  for (int p = 0; p < 12; ++p) EXPECT_FLOAT_EQ(At(*one, 1, 0, p), Gray(10)[p] / 255.0f);
  for (int threads : {3, 8, 0}) {
    absl::StatusOr<Dataset> many = LoadImageFolder(dir, true, {threads});
    ASSERT_TRUE(many.ok()) << many.status();
    EXPECT_EQ(many->bytes, one->bytes) << threads;
    EXPECT_EQ(many->labels, one->labels) << threads;
  }
}

TEST(ImageFolderTest, FirstBadImageInOrderIsReportedWhateverTheThreads) {
  const std::string dir = FreshDir("folder_bad_images");
  for (int i = 0; i < 30; ++i) {
    WriteFile(absl::StrCat(dir, "/train/c", i % 3, "/", i + 10, ".png"),
              EncodePng8(4, 3, 3, Rgb(i)));
  }
  const std::string png = EncodePng8(4, 3, 3, Rgb(0));
  const std::string first = WriteFile(dir + "/train/c1/13.png", png.substr(0, png.size() / 2));
  WriteFile(dir + "/train/c2/14.png", "garbage");
  for (int threads : {1, 4}) {
    ExpectError(LoadImageFolder(dir, true, {threads}), absl::StatusCode::kInvalidArgument,
                first + ": cannot decode PNG");
  }
}

TEST(ImageFolderTest, ImagesOfAnotherSizeNameTheFirstThatDiffers) {
  const std::string dir = FreshDir("folder_sizes");
  WriteFile(dir + "/train/a/1.png", EncodePng8(4, 3, 1, Gray(0)));
  WriteFile(dir + "/train/a/2.png", EncodePng8(4, 3, 1, Gray(0)));
  const std::string odd = WriteFile(dir + "/train/b/1.png", EncodePng8(3, 4, 1, Gray(0)));
  WriteFile(dir + "/train/b/2.png", EncodePng8(2, 2, 1, {1, 2, 3, 4}));
  ExpectError(LoadImageFolder(dir, true), absl::StatusCode::kInvalidArgument,
              odd + ": image is 4x3 (height x width) but " + dir + "/train/a/1.png is 3x4");
}

// With a size, images of any sizes load, each brought to it as image_resize.h says (here
// Resize(2) + CenterCrop(2) and Resize((3, 5))), before the bytes become floats.
TEST(ImageFolderTest, ImagesOfManySizesAreBroughtToTheGivenSize) {
  const std::string dir = FreshDir("folder_resize");
  WriteFile(dir + "/train/a/1.png", EncodePng8(4, 3, 3, Rgb(0)));
  WriteFile(dir + "/train/b/1.png", EncodePng8(3, 4, 1, Gray(7)));
  WriteFile(dir + "/train/b/2.png", EncodePng8(2, 2, 1, {1, 2, 3, 4}));
  for (const char* text : {"2", "3x5"}) {
    SCOPED_TRACE(text);
    ImageFolderOptions options;
    options.size = *ParseImageSize(text);
    absl::StatusOr<Dataset> d = LoadImageFolder(dir, true, options);
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ(d->size, 3);
    EXPECT_EQ(d->channels, 3);
    EXPECT_EQ(d->rows, options.size.rows);
    EXPECT_EQ(d->cols, options.size.cols);
    DecodedImage first;
    first.width = 4;
    first.height = 3;
    first.channels = 3;
    first.pixels = Rgb(0);
    const DecodedImage fitted = FitImage(first, options.size);
    const int plane = d->rows * d->cols;
    for (int p = 0; p < plane; ++p) {
      for (int c = 0; c < 3; ++c) {
        EXPECT_EQ(At(*d, 0, c, p), fitted.pixels[p * 3 + c] / 255.0f) << p << " " << c;
      }
    }
  }
  ExpectError(LoadImageFolder(dir, true), absl::StatusCode::kInvalidArgument,
              "(--image_size=S or HxW)");
}

// Images in folders under a class folder belong to the class, in torchvision's make_dataset
// order (sorted(os.walk(...)): folders by path, "sub b" before "sub/deeper" as ' ' < '/');
// '.'-folders are skipped there too.
TEST(ImageFolderTest, ImagesInSubfoldersInTorchvisionsOrder) {
  const std::string dir = FreshDir("folder_nested");
  WriteFile(dir + "/train/a/sub/deeper/d.png", EncodePng8(4, 3, 1, Gray(4)));
  WriteFile(dir + "/train/a/sub b/c.png", EncodePng8(4, 3, 1, Gray(3)));
  WriteFile(dir + "/train/a/sub/b.png", EncodePng8(4, 3, 1, Gray(2)));
  WriteFile(dir + "/train/a/z.png", EncodePng8(4, 3, 1, Gray(1)));
  WriteFile(dir + "/train/a/.ipynb_checkpoints/z.png", EncodePng8(4, 3, 1, Gray(9)));
  WriteFile(dir + "/train/b/only/y.png", EncodePng8(4, 3, 1, Gray(5)));
  absl::StatusOr<Dataset> data = LoadImageFolder(dir, true);
  ASSERT_TRUE(data.ok()) << data.status();
  ASSERT_EQ(data->size, 5);
  ASSERT_EQ(data->channels, 1);
  for (int64_t i = 0; i < 5; ++i) {
    EXPECT_EQ(data->bytes[i * data->image_size()], i + 1) << i;
    EXPECT_EQ(data->labels[i], i < 4 ? 0 : 1) << i;
  }
}

TEST(ImageFolderTest, LayoutErrors) {
  const std::string none = FreshDir("folder_none");
  ExpectError(LoadImageFolder(none, true), absl::StatusCode::kNotFound,
              none + "/train: no such directory");

  const std::string no_classes = FreshDir("folder_no_classes");
  WriteFile(no_classes + "/train/img.png", EncodePng8(4, 3, 1, Gray(0)));
  ExpectError(LoadImageFolder(no_classes, true), absl::StatusCode::kInvalidArgument,
              no_classes + "/train: no class folders");

  const std::string empty_class = FreshDir("folder_empty_class");
  WriteFile(empty_class + "/train/a/img.png", EncodePng8(4, 3, 1, Gray(0)));
  WriteFile(empty_class + "/train/b/img.gif", "GIF89a");
  ExpectError(LoadImageFolder(empty_class, true), absl::StatusCode::kInvalidArgument,
              empty_class + "/train/b: no .png, .jpg or .jpeg files (in it or in its subfolders)");

  const std::string dir = MixedDir("folder_layout");
  ExpectError(LoadImageFolder(FreshDir("folder_no_test_dir_yet"), false),
              absl::StatusCode::kNotFound, "/train: no such directory");
  WriteFile(dir + "/test/bird/b.png", EncodePng8(4, 3, 1, Gray(0)));
  ExpectError(LoadImageFolder(dir, false), absl::StatusCode::kInvalidArgument,
              dir + "/test/bird: class 'bird' is not among the 2 classes of " + dir + "/train");

  const std::string no_test = FreshDir("folder_no_test");
  WriteFile(no_test + "/train/a/img.png", EncodePng8(4, 3, 1, Gray(0)));
  ExpectError(LoadImageFolder(no_test, false), absl::StatusCode::kNotFound,
              no_test + "/test: no such directory");
}

// Labels are int32: a folder per class of ImageNet's 1,000 (here 300: past a byte) keeps
// each class's label.
TEST(ImageFolderTest, MoreThan256Classes) {
  const std::string dir = FreshDir("folder_300");
  for (int i = 0; i < 300; ++i) {
    const std::string png = EncodePng8(4, 3, 1, Gray(i));
    WriteFile(absl::StrFormat("%s/train/c%03d/img.png", dir, i), png);
    if (i % 100 == 99) WriteFile(absl::StrFormat("%s/test/c%03d/img.png", dir, i), png);
  }
  auto train = LoadImageFolder(dir, true);
  ASSERT_TRUE(train.ok()) << train.status();
  EXPECT_EQ(train->num_classes, 300);
  ASSERT_EQ(train->size, 300);
  for (int i = 0; i < 300; ++i) EXPECT_EQ(train->labels[i], i);
  auto test = LoadImageFolder(dir, false);
  ASSERT_TRUE(test.ok()) << test.status();
  EXPECT_EQ(test->num_classes, 300);
  EXPECT_EQ(test->labels, (std::vector<nn::Label>{99, 199, 299}));
}

}  // namespace
}  // namespace dptrain
