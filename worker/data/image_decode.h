// Decoding of one PNG or JPEG file's bytes into 8-bit pixels, for ImageFolder data sets
// (worker/data/image_folder.h). PNG through libpng, JPEG through libjpeg(-turbo).
//
// The result is gray (1 channel) or RGB (3 channels), interleaved (HWC), row-major:
//   PNG  gray and gray+alpha give gray; RGB, RGBA and palette give RGB. Alpha (and a tRNS
//        transparency) is dropped, not composited, as PIL's Image.convert("RGB") does (the
//        loader of torchvision's ImageFolder); 16-bit samples keep their high byte, as PIL's
//        RGB, RGBA and LA modes do (16-bit gray, which PIL opens as mode I and saturates at
//        255 in convert("RGB"), also keeps its high byte here);
//        1, 2 and 4-bit samples are expanded to 8 bits; no gamma correction is applied.
//   JPEG 1-component (grayscale) gives gray; YCbCr and RGB give RGB; CMYK and YCCK are
//        unsupported. A premature end of the data (a truncated file) is an error, while
//        libjpeg's other warnings (e.g. extraneous bytes before a marker) are not.
// The format is told by the bytes (the PNG signature, JPEG's FF D8 FF), not by the name.
//
// Thread-safe: decodes share nothing, so files may be decoded in parallel.
#ifndef DPTRAIN_WORKER_DATA_IMAGE_DECODE_H_
#define DPTRAIN_WORKER_DATA_IMAGE_DECODE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dptrain {

struct DecodedImage {
  int width = 0;
  int height = 0;
  int channels = 0;             // 1 (gray) or 3 (RGB).
  std::vector<uint8_t> pixels;  // height * width * channels bytes, HWC.
};

// Images are at most this many pixels on a side and kMaxDecodedPixels pixels in all, so that
// a corrupt or hostile header cannot make a decode allocate gigabytes.
inline constexpr int kMaxDecodedSide = 16384;
inline constexpr int64_t kMaxDecodedPixels = int64_t{1} << 26;

// What a decode of an image will give, from its header alone.
struct ImageInfo {
  int width = 0;
  int height = 0;
  int channels = 0;  // 1 (gray) or 3 (RGB), as DecodeImage gives.
};

// Image files larger than this are refused (InvalidArgument naming the file).
inline constexpr int64_t kMaxImageFileBytes = int64_t{1} << 30;

// Decodes `bytes`; `name` (e.g. the file's path) starts every error message. Errors are
// InvalidArgument, one line ("NAME: cannot decode PNG: why" and the like): neither PNG nor
// JPEG, corrupt or truncated data, an unsupported JPEG color space, an image beyond the
// limits above.
absl::StatusOr<DecodedImage> DecodeImage(absl::string_view bytes, absl::string_view name);

// The size and channels DecodeImage(bytes, name) gives, from the header alone (no pixel is
// decoded), with DecodeImage's errors for a header it would refuse.
absl::StatusOr<ImageInfo> ProbeImage(absl::string_view bytes, absl::string_view name);

// DecodeImage and ProbeImage of the file at `path` (the error of a failed read, or of a file
// beyond kMaxImageFileBytes, names it). ProbeImageFile reads the file's first 4 KiB, then 64 KiB,
// and the whole file only when they do not hold the header.
absl::StatusOr<DecodedImage> DecodeImageFile(const std::string& path);
absl::StatusOr<ImageInfo> ProbeImageFile(const std::string& path);

// `image`'s pixels as `channels` planes (CHW) into out (channels x height x width bytes):
// channels is image.channels, or 3 for a gray image (replicated, as PIL's convert("RGB")).
void ToPlanes(const DecodedImage& image, int channels, uint8_t* out);

}  // namespace dptrain

#endif  // DPTRAIN_WORKER_DATA_IMAGE_DECODE_H_
