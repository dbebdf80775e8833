// Bringing decoded images to one size, as torchvision's transforms do for an ImageFolder
// (whose images rarely share a size):
//
//   ImageSize{S, S, kShorterSideThenCenterCrop}  Resize(S) then CenterCrop(S): the shorter
//                                              side scaled to S (the longer one to
//                                              int(S * longer / shorter)), then the centre
//                                              S x S (torchvision's evaluation recipe);
//   ImageSize{H, W, kExact}                      Resize((H, W)): scaled to H x W, the aspect
//                                              ratio not kept.
//
// The scaling is Pillow's BILINEAR resampling, which torchvision's Resize uses on PIL images,
// bit for bit: a triangle filter widened by the scale factor when shrinking (antialiased),
// fixed-point weights, a horizontal pass then a vertical one, each rounded to bytes
// (tools/make_resize_fixtures.py writes the PIL-made fixtures the tests compare with).
// CenterCrop rounds its offsets as torchvision does (Python's round, halves to even).
#ifndef DPTRAIN_WORKER_DATA_IMAGE_RESIZE_H_
#define DPTRAIN_WORKER_DATA_IMAGE_RESIZE_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/data/image_decode.h"

namespace dptrain {

struct ImageSize {
  enum class Mode { kKeep, kShorterSideThenCenterCrop, kExact };
  int rows = 0;
  int cols = 0;
  Mode mode = Mode::kKeep;

  bool keep() const { return mode == Mode::kKeep; }
  // "S" or "HxW"; "" for kKeep.
  std::string ToString() const;
};

// Parses "" (keep), "S" (Resize(S) + CenterCrop(S)) or "HxW" (Resize((H, W))), each side in
// [1, kMaxImageSide]. InvalidArgument naming the text otherwise.
inline constexpr int kMaxImageSide = 4096;
absl::StatusOr<ImageSize> ParseImageSize(absl::string_view text);

// `image` (HWC bytes, any channels) scaled to out_rows x out_cols with Pillow's BILINEAR
// resampling; the image itself when the size is already that. out_rows, out_cols >= 1.
DecodedImage ResizeBilinear(const DecodedImage& image, int out_rows, int out_cols);

// The centre rows x cols of `image` (offsets round((height - rows) / 2), halves to even, as
// torchvision's center_crop); rows <= height and cols <= width.
DecodedImage CenterCrop(const DecodedImage& image, int rows, int cols);

// `image` brought to `size` (the image itself for kKeep).
DecodedImage FitImage(const DecodedImage& image, const ImageSize& size);

}  // namespace dptrain

#endif  // DPTRAIN_WORKER_DATA_IMAGE_RESIZE_H_
