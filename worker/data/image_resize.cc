#include "worker/data/image_resize.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace dptrain {
namespace {

// Pillow's fixed point for 8-bit images: weights are integers scaled by 2^22.
constexpr int kPrecisionBits = 32 - 8 - 2;

// The weights of one output pixel: input pixels [first, first + weights.size()).
struct Taps {
  int first = 0;
  std::vector<int32_t> weights;
};

// Pillow's precompute_coeffs + normalize_coeffs_8bpc for the BILINEAR filter (support 1).
std::vector<Taps> Coefficients(int in_size, int out_size) {
  const double scale = static_cast<double>(in_size) / out_size;
  const double filter_scale = std::max(scale, 1.0);
  const double support = filter_scale;
  std::vector<Taps> taps(out_size);
  std::vector<double> k;
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = (xx + 0.5) * scale;
    const double ss = 1.0 / filter_scale;
    const int xmin = std::max(static_cast<int>(center - support + 0.5), 0);
    const int xmax = std::min(static_cast<int>(center + support + 0.5), in_size) - xmin;
    k.assign(std::max(xmax, 0), 0.0);
    double total = 0;
    for (int x = 0; x < xmax; ++x) {
      const double t = std::abs((x + xmin - center + 0.5) * ss);
      k[x] = t < 1.0 ? 1.0 - t : 0.0;
      total += k[x];
    }
    Taps& out = taps[xx];
    out.first = xmin;
    for (double w : k) {
      if (total != 0.0) w /= total;
      const double scaled = w * (1 << kPrecisionBits);
      out.weights.push_back(static_cast<int32_t>(w < 0 ? -0.5 + scaled : 0.5 + scaled));
    }
  }
  return taps;
}

uint8_t Clip8(int64_t v) {
  if (v >= (int64_t{1} << kPrecisionBits << 8)) return 255;
  if (v <= 0) return 0;
  return static_cast<uint8_t>(v >> kPrecisionBits);
}

// One pass along rows (horizontal) or columns (vertical) of `in` (rows x cols x channels),
// reading input lines [first_line, ...) for the other axis.
DecodedImage Pass(const DecodedImage& in, const std::vector<Taps>& taps, bool horizontal,
                  int first_line, int lines) {
  DecodedImage out;
  out.channels = in.channels;
  out.width = horizontal ? static_cast<int>(taps.size()) : in.width;
  out.height = horizontal ? lines : static_cast<int>(taps.size());
  out.pixels.resize(static_cast<size_t>(out.width) * out.height * out.channels);
  const int c = in.channels;
  const int64_t row_stride = int64_t{in.width} * c;
  for (int y = 0; y < out.height; ++y) {
    for (int x = 0; x < out.width; ++x) {
      const Taps& t = taps[horizontal ? x : y];
      for (int ch = 0; ch < c; ++ch) {
        int64_t sum = int64_t{1} << (kPrecisionBits - 1);
        for (size_t i = 0; i < t.weights.size(); ++i) {
          const int at = t.first + static_cast<int>(i);
          const uint8_t v = horizontal ? in.pixels[(first_line + y) * row_stride + at * c + ch]
                                       : in.pixels[at * row_stride + int64_t{x} * c + ch];
          sum += int64_t{v} * t.weights[i];
        }
        out.pixels[(int64_t{y} * out.width + x) * c + ch] = Clip8(sum);
      }
    }
  }
  return out;
}

// Python's round(x / 2.0) for an integer x >= 0: halves go to the even neighbour.
int HalfToEven(int x) {
  const int k = x / 2;
  return x % 2 == 0 || k % 2 == 0 ? k : k + 1;
}

}  // namespace

std::string ImageSize::ToString() const {
  switch (mode) {
    case Mode::kKeep:
      return "";
    case Mode::kShorterSideThenCenterCrop:
      return absl::StrCat(rows);
    case Mode::kExact:
      break;
  }
  return absl::StrCat(rows, "x", cols);
}

absl::StatusOr<ImageSize> ParseImageSize(absl::string_view text) {
  if (text.empty()) return ImageSize{};
  const std::vector<absl::string_view> parts = absl::StrSplit(text, 'x');
  auto bad = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat("image size '", text, "': expected S (Resize(S) + CenterCrop(S)) or HxW ",
                     "(Resize((H, W))), sides in [1, ", kMaxImageSide, "]"));
  };
  if (parts.size() > 2) return bad();
  int sides[2] = {0, 0};
  for (size_t i = 0; i < parts.size(); ++i) {
    if (!absl::SimpleAtoi(parts[i], &sides[i]) || sides[i] < 1 || sides[i] > kMaxImageSide) {
      return bad();
    }
  }
  if (parts.size() == 1) {
    return ImageSize{sides[0], sides[0], ImageSize::Mode::kShorterSideThenCenterCrop};
  }
  return ImageSize{sides[0], sides[1], ImageSize::Mode::kExact};
}

DecodedImage ResizeBilinear(const DecodedImage& image, int out_rows, int out_cols) {
  const bool horizontal = out_cols != image.width, vertical = out_rows != image.height;
  if (!horizontal && !vertical) return image;
  const std::vector<Taps> across = Coefficients(image.width, out_cols);
  std::vector<Taps> down = Coefficients(image.height, out_rows);
  if (!horizontal) return Pass(image, down, /*horizontal=*/false, 0, 0);
  // Only the input rows the vertical pass reads (Pillow's ybox).
  const int first = down.front().first;
  const int last = down.back().first + static_cast<int>(down.back().weights.size());
  DecodedImage wide = Pass(image, across, /*horizontal=*/true, first, last - first);
  if (!vertical) return wide;
  for (Taps& t : down) t.first -= first;
  return Pass(wide, down, /*horizontal=*/false, 0, 0);
}

DecodedImage CenterCrop(const DecodedImage& image, int rows, int cols) {
  const int top = HalfToEven(image.height - rows), left = HalfToEven(image.width - cols);
  DecodedImage out;
  out.width = cols;
  out.height = rows;
  out.channels = image.channels;
  out.pixels.resize(static_cast<size_t>(rows) * cols * image.channels);
  const int64_t in_row = int64_t{image.width} * image.channels;
  const int64_t out_row = int64_t{cols} * image.channels;
  for (int y = 0; y < rows; ++y) {
    const uint8_t* from = image.pixels.data() + (top + y) * in_row + int64_t{left} * image.channels;
    std::copy(from, from + out_row, out.pixels.begin() + y * out_row);
  }
  return out;
}

DecodedImage FitImage(const DecodedImage& image, const ImageSize& size) {
  switch (size.mode) {
    case ImageSize::Mode::kKeep:
      return image;
    case ImageSize::Mode::kExact:
      return ResizeBilinear(image, size.rows, size.cols);
    case ImageSize::Mode::kShorterSideThenCenterCrop:
      break;
  }
  // torchvision's Resize(S): the shorter side to S, the longer to int(S * longer / shorter).
  const int s = size.rows;
  const int64_t w = image.width, h = image.height;
  int out_w, out_h;
  if (w <= h) {
    out_w = s;
    out_h = static_cast<int>(s * h / static_cast<double>(w));
  } else {
    out_h = s;
    out_w = static_cast<int>(s * w / static_cast<double>(h));
  }
  return CenterCrop(ResizeBilinear(image, out_h, out_w), s, s);
}

}  // namespace dptrain
