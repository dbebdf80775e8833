// Fuzzes the image decoders (worker/data/image_decode: libpng and libjpeg behind setjmp error
// handlers) with the bytes of an image file, as an ImageFolder's files arrive, and what the
// worker does with a decoded image: brought to a size (image_resize.h) and laid out as planes
// (ToPlanes), as LoadImageFolder and ImageStream do.
// Checks: errors are InvalidArgument, one line, starting with the name; a decoded image holds
// width x height x channels bytes, channels 1 or 3, within the size limits; and ProbeImage (what
// a streamed set reads at load to fix its shape) agrees with DecodeImage: it accepts whatever
// the decode accepts, with the same width, height and channels, and whatever it refuses the
// decode refuses too (a mismatch would fail a streamed set's read in the middle of training).
#include <cstdint>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_check.h"
#include "worker/data/image_decode.h"
#include "worker/data/image_resize.h"

namespace {

void CheckError(const absl::Status& s) {
  FUZZ_CHECK(absl::IsInvalidArgument(s));
  const std::string message(s.message());
  FUZZ_CHECK(message.rfind("fuzz.img: ", 0) == 0);
  FUZZ_CHECK(message.find('\n') == std::string::npos);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  const absl::StatusOr<dptrain::ImageInfo> probe = dptrain::ProbeImage(bytes, "fuzz.img");
  const absl::StatusOr<dptrain::DecodedImage> image = dptrain::DecodeImage(bytes, "fuzz.img");
  if (!probe.ok()) {
    CheckError(probe.status());
    FUZZ_CHECK(!image.ok());
  }
  if (!image.ok()) {
    CheckError(image.status());
    return 0;
  }
  FUZZ_CHECK(probe.ok());
  FUZZ_CHECK(probe->width == image->width && probe->height == image->height &&
             probe->channels == image->channels);
  FUZZ_CHECK(image->channels == 1 || image->channels == 3);
  FUZZ_CHECK(image->width >= 1 && image->height >= 1 && image->width <= dptrain::kMaxDecodedSide &&
             image->height <= dptrain::kMaxDecodedSide);
  const int64_t pixels = int64_t{image->width} * image->height;
  FUZZ_CHECK(pixels <= dptrain::kMaxDecodedPixels);
  FUZZ_CHECK(static_cast<int64_t>(image->pixels.size()) == pixels * image->channels);

  // As a set brought to --image_size=5x7 and to --image_size=6 holds it, in 3 planes.
  for (const char* text : {"5x7", "6"}) {
    const absl::StatusOr<dptrain::ImageSize> fit = dptrain::ParseImageSize(text);
    FUZZ_CHECK(fit.ok());
    const dptrain::DecodedImage out = dptrain::FitImage(*image, *fit);
    FUZZ_CHECK(out.height == fit->rows && out.width == fit->cols &&
               out.channels == image->channels);
    FUZZ_CHECK(static_cast<int64_t>(out.pixels.size()) ==
               int64_t{out.width} * out.height * out.channels);
    std::vector<uint8_t> planes(static_cast<size_t>(3 * out.width * out.height));
    dptrain::ToPlanes(out, 3, planes.data());
  }
  return 0;
}
