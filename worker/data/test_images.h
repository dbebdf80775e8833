// Test helpers: PNG and JPEG encoders (libpng, libjpeg) for fixture images.
#ifndef DPTRAIN_WORKER_DATA_TEST_IMAGES_H_
#define DPTRAIN_WORKER_DATA_TEST_IMAGES_H_

#include <cstdint>
#include <string>
#include <vector>

namespace dptrain {
namespace testing_images {

// A PNG of `color_type` (PNG_COLOR_TYPE_*) and `bit_depth` whose rows are `rows` exactly as
// PNG stores them unfiltered: packed samples, 16-bit ones big-endian. `palette` (RGB triples)
// and `trns` (alpha per palette entry) are for palette images.
std::string EncodePng(int width, int height, int color_type, int bit_depth,
                      const std::vector<uint8_t>& rows, const std::vector<uint8_t>& palette = {},
                      const std::vector<uint8_t>& trns = {});

// An 8-bit gray (channels 1) or RGB (channels 3) PNG of interleaved pixels.
std::string EncodePng8(int width, int height, int channels, const std::vector<uint8_t>& pixels);

// A baseline JPEG of interleaved gray (components 1), RGB (3) or CMYK (4) pixels.
std::string EncodeJpeg(int width, int height, int components, const std::vector<uint8_t>& pixels,
                       int quality = 95);

}  // namespace testing_images
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_DATA_TEST_IMAGES_H_
