#include "worker/data/image_decode.h"

// clang-format off
#include <cstdio>  // jpeglib.h needs FILE and size_t first.
#include <jpeglib.h>
#include <jerror.h>
// clang-format on
#include <png.h>

#include <algorithm>
#include <csetjmp>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "worker/data/input_file.h"

namespace dptrain {
namespace {

// Error message buffers filled by the C libraries' callbacks before they jump back.
constexpr size_t kMessageBytes = 512;

bool SizeOk(int64_t width, int64_t height) {
  return width >= 1 && height >= 1 && width <= kMaxDecodedSide && height <= kMaxDecodedSide &&
         width * height <= kMaxDecodedPixels;
}

// Keeps channel 0 (gray) or channels 0..2 (RGB) of `from`-channel pixels, in place.
void DropAlpha(std::vector<uint8_t>& pixels, int64_t count, int from, int to) {
  if (from == to) return;
  for (int64_t p = 0; p < count; ++p) {
    for (int c = 0; c < to; ++c) pixels[p * to + c] = pixels[p * from + c];
  }
  pixels.resize(count * to);
}

// ---- PNG ----

struct PngState {
  const uint8_t* data;
  size_t size;
  size_t pos;
  char message[kMessageBytes];
};

void PngOnError(png_structp png, png_const_charp message) {
  auto* state = static_cast<PngState*>(png_get_error_ptr(png));
  std::snprintf(state->message, kMessageBytes, "%s", message);
  png_longjmp(png, 1);
}

void PngOnWarning(png_structp, png_const_charp) {}

void PngRead(png_structp png, png_bytep out, png_size_t n) {
  auto* state = static_cast<PngState*>(png_get_io_ptr(png));
  if (n > state->size - state->pos) png_error(png, "truncated file");
  std::memcpy(out, state->data + state->pos, n);
  state->pos += n;
}

// Runs libpng over state->data into *image. Everything that changes between setjmp and a
// jump lives in the caller's frame (image, rows, state) or in libpng's structs, as the C rules
// for setjmp want; no object with a destructor is created between them.
// With header_only, stops after the header: *image gets the size and the channels a decode
// gives, and no pixels.
bool RunPng(PngState* state, bool header_only, DecodedImage* image, std::vector<png_bytep>* rows) {
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, state, PngOnError, PngOnWarning);
  if (png == nullptr) {
    std::snprintf(state->message, kMessageBytes, "out of memory");
    return false;
  }
  png_infop info = png_create_info_struct(png);
  if (info == nullptr) {
    png_destroy_read_struct(&png, nullptr, nullptr);
    std::snprintf(state->message, kMessageBytes, "out of memory");
    return false;
  }
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, &info, nullptr);
    return false;
  }
  png_set_read_fn(png, state, PngRead);
  png_set_user_limits(png, kMaxDecodedSide, kMaxDecodedSide);
  png_read_info(png, info);
  const png_uint_32 width = png_get_image_width(png, info);
  const png_uint_32 height = png_get_image_height(png, info);
  const int bit_depth = png_get_bit_depth(png, info);
  const int color_type = png_get_color_type(png, info);
  if (!SizeOk(width, height)) png_error(png, "image beyond the size limits");
  if (header_only) {
    png_destroy_read_struct(&png, &info, nullptr);
    image->width = static_cast<int>(width);
    image->height = static_cast<int>(height);
    image->channels = (color_type & PNG_COLOR_MASK_COLOR) != 0 ? 3 : 1;
    return true;
  }
  if (color_type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (color_type == PNG_COLOR_TYPE_GRAY && bit_depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  // 16 bits: the high byte, as PIL does for RGB, RGBA and gray+alpha (a campaign against PIL
  // found libpng's rounding png_set_scale_16 one off in ~25% of values).
  if (bit_depth == 16) png_set_strip_16(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  const int channels = png_get_channels(png, info);  // 1 gray, 2 gray+alpha, 3 RGB, 4 RGBA.
  const size_t row_bytes = png_get_rowbytes(png, info);
  if (channels < 1 || channels > 4 || png_get_bit_depth(png, info) != 8 ||
      row_bytes != static_cast<size_t>(width) * channels) {
    png_error(png, "unexpected layout after conversion to 8 bits");
  }
  image->pixels.resize(row_bytes * height);
  rows->resize(height);
  for (png_uint_32 y = 0; y < height; ++y) (*rows)[y] = image->pixels.data() + y * row_bytes;
  png_read_image(png, rows->data());
  png_read_end(png, nullptr);
  png_destroy_read_struct(&png, &info, nullptr);
  image->width = static_cast<int>(width);
  image->height = static_cast<int>(height);
  image->channels = channels;
  return true;
}

absl::StatusOr<DecodedImage> DecodePng(absl::string_view bytes, absl::string_view name,
                                       bool header_only) {
  PngState state{reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), 0, {0}};
  DecodedImage image;
  std::vector<png_bytep> rows;
  if (!RunPng(&state, header_only, &image, &rows)) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": cannot decode PNG: ", state.message));
  }
  if (header_only) return image;
  const int channels = image.channels;
  image.channels = channels <= 2 ? 1 : 3;
  DropAlpha(image.pixels, int64_t{image.width} * image.height, channels, image.channels);
  return image;
}

// ---- JPEG ----

struct JpegError {
  jpeg_error_mgr manager;  // First: libjpeg hands back a pointer to it.
  std::jmp_buf jump;
  char message[kMessageBytes];
};

[[noreturn]] void JpegOnError(j_common_ptr cinfo) {
  auto* error = reinterpret_cast<JpegError*>(cinfo->err);
  char text[JMSG_LENGTH_MAX];
  (*cinfo->err->format_message)(cinfo, text);
  std::snprintf(error->message, kMessageBytes, "%s", text);
  std::longjmp(error->jump, 1);
}

// Warnings that mean missing data are errors; other messages are ignored.
void JpegOnMessage(j_common_ptr cinfo, int level) {
  if (level < 0 &&
      (cinfo->err->msg_code == JWRN_JPEG_EOF || cinfo->err->msg_code == JWRN_HIT_MARKER)) {
    JpegOnError(cinfo);
  }
}

// Runs libjpeg over bytes into *image; on failure, error->message says why. As RunPng: what
// changes between setjmp and a jump lives in the caller's frame or in libjpeg's structs.
bool RunJpeg(absl::string_view bytes, bool header_only, jpeg_decompress_struct* cinfo,
             JpegError* error, DecodedImage* image) {
  cinfo->err = jpeg_std_error(&error->manager);
  error->manager.error_exit = JpegOnError;
  error->manager.emit_message = JpegOnMessage;
  if (setjmp(error->jump)) {
    jpeg_destroy_decompress(cinfo);
    return false;
  }
  jpeg_create_decompress(cinfo);
  jpeg_mem_src(cinfo, reinterpret_cast<const unsigned char*>(bytes.data()),
               static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(cinfo, TRUE);
  if (!SizeOk(cinfo->image_width, cinfo->image_height)) {
    std::snprintf(error->message, kMessageBytes, "%ux%u image beyond the size limits",
                  cinfo->image_width, cinfo->image_height);
    jpeg_destroy_decompress(cinfo);
    return false;
  }
  const bool gray = cinfo->jpeg_color_space == JCS_GRAYSCALE;
  if (!gray && cinfo->jpeg_color_space != JCS_YCbCr && cinfo->jpeg_color_space != JCS_RGB) {
    std::snprintf(error->message, kMessageBytes,
                  "unsupported color space (CMYK or YCCK); save it as RGB or grayscale");
    jpeg_destroy_decompress(cinfo);
    return false;
  }
  if (header_only) {
    image->width = static_cast<int>(cinfo->image_width);
    image->height = static_cast<int>(cinfo->image_height);
    image->channels = gray ? 1 : 3;
    jpeg_destroy_decompress(cinfo);
    return true;
  }
  cinfo->out_color_space = gray ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_start_decompress(cinfo);
  const int channels = cinfo->output_components;
  const size_t row_bytes = static_cast<size_t>(cinfo->output_width) * channels;
  image->pixels.resize(row_bytes * cinfo->output_height);
  while (cinfo->output_scanline < cinfo->output_height) {
    JSAMPROW row = image->pixels.data() + cinfo->output_scanline * row_bytes;
    jpeg_read_scanlines(cinfo, &row, 1);
  }
  image->width = static_cast<int>(cinfo->output_width);
  image->height = static_cast<int>(cinfo->output_height);
  image->channels = channels;
  jpeg_finish_decompress(cinfo);
  jpeg_destroy_decompress(cinfo);
  return true;
}

absl::StatusOr<DecodedImage> DecodeJpeg(absl::string_view bytes, absl::string_view name,
                                        bool header_only) {
  jpeg_decompress_struct cinfo;
  JpegError error;
  error.message[0] = '\0';
  DecodedImage image;
  if (!RunJpeg(bytes, header_only, &cinfo, &error, &image)) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": cannot decode JPEG: ", error.message));
  }
  return image;
}

absl::StatusOr<DecodedImage> Run(absl::string_view bytes, absl::string_view name,
                                 bool header_only) {
  static constexpr unsigned char kPngSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  if (bytes.size() >= 8 && std::memcmp(bytes.data(), kPngSignature, 8) == 0) {
    return DecodePng(bytes, name, header_only);
  }
  if (bytes.size() >= 3 && static_cast<uint8_t>(bytes[0]) == 0xFF &&
      static_cast<uint8_t>(bytes[1]) == 0xD8 && static_cast<uint8_t>(bytes[2]) == 0xFF) {
    return DecodeJpeg(bytes, name, header_only);
  }
  return absl::InvalidArgumentError(
      absl::StrCat(name, ": not a PNG or JPEG image (", bytes.size(), " bytes)"));
}

absl::StatusOr<std::string> ReadFile(const std::string& path, int64_t at_most) {
  absl::StatusOr<InputFile> file = InputFile::Open(path);
  if (!file.ok()) return file.status();
  if (file->size() > kMaxImageFileBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", file->size(), " bytes is too large for an image file"));
  }
  const int64_t n = std::min(file->size(), at_most);
  std::string bytes(static_cast<size_t>(n), '\0');
  if (absl::Status s = file->ReadExactly(bytes.data(), n, "image"); !s.ok()) return s;
  return bytes;
}

}  // namespace

absl::StatusOr<DecodedImage> DecodeImage(absl::string_view bytes, absl::string_view name) {
  return Run(bytes, name, /*header_only=*/false);
}

absl::StatusOr<ImageInfo> ProbeImage(absl::string_view bytes, absl::string_view name) {
  absl::StatusOr<DecodedImage> header = Run(bytes, name, /*header_only=*/true);
  if (!header.ok()) return header.status();
  return ImageInfo{header->width, header->height, header->channels};
}

absl::StatusOr<DecodedImage> DecodeImageFile(const std::string& path) {
  absl::StatusOr<std::string> bytes = ReadFile(path, kMaxImageFileBytes);
  if (!bytes.ok()) return bytes.status();
  return DecodeImage(*bytes, path);
}

absl::StatusOr<ImageInfo> ProbeImageFile(const std::string& path) {
  // The header is nearly always within the first 4 KiB, else (JPEG's EXIF data, which may
  // come first, up to 64 KiB a segment) within 64 KiB: the whole file is read only when neither
  // holds it (a set of a million photos is then not read whole at load).
  int64_t prefix = int64_t{4} << 10;
  while (true) {
    absl::StatusOr<std::string> head = ReadFile(path, prefix);
    if (!head.ok()) return head.status();
    absl::StatusOr<ImageInfo> info = ProbeImage(*head, path);
    if (info.ok() || static_cast<int64_t>(head->size()) < prefix || prefix == kMaxImageFileBytes) {
      return info;
    }
    prefix = prefix < (int64_t{64} << 10) ? int64_t{64} << 10 : kMaxImageFileBytes;
  }
}

void ToPlanes(const DecodedImage& image, int channels, uint8_t* out) {
  const int64_t plane = int64_t{image.height} * image.width;
  for (int c = 0; c < channels; ++c) {
    const int from = image.channels == 1 ? 0 : c;
    for (int64_t p = 0; p < plane; ++p)
      out[c * plane + p] = image.pixels[p * image.channels + from];
  }
}

}  // namespace dptrain
