#include "worker/data/npy_reader.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/status_macros.h"
#include "worker/data/held_memory.h"
#include "worker/data/input_file.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the .npy reader assumes little endian");

namespace dptrain {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr int64_t kMaxHeaderBytes = int64_t{1} << 20;
constexpr int64_t kMaxDim = int64_t{1} << 40;   // Any one axis of a shape.
constexpr int64_t kMaxSide = int64_t{1} << 20;  // C, H and W of an image.
constexpr int64_t kMaxImageValues = int64_t{1} << 31;
constexpr int64_t kChunkBytes = int64_t{4} << 20;

struct Dtype {
  char kind = 0;  // 'u', 'i' or 'f'.
  int size = 0;   // Bytes per element.
};

struct NpyHeader {
  std::string descr;
  Dtype dtype;
  std::vector<int64_t> shape;
  int64_t data_bytes = 0;  // What the file holds after the header.
};

// A recursive-descent parser for the header's Python dict literal, e.g.
// {'descr': '<f4', 'fortran_order': False, 'shape': (10, 3, 32, 32), }
class HeaderParser {
 public:
  explicit HeaderParser(absl::string_view text) : text_(text) {}

  // Fills descr, shape; fortran_order True is an error. Errors are the message only.
  bool Parse(NpyHeader& out, std::string& error) {
    bool has_descr = false, has_order = false, has_shape = false;
    SkipSpace();
    if (!Consume('{')) return Fail("the header is not a dict", error);
    while (true) {
      SkipSpace();
      if (Consume('}')) break;
      std::string key;
      if (!ParseString(key)) return Fail("expected a quoted key in the header dict", error);
      SkipSpace();
      if (!Consume(':')) return Fail(absl::StrCat("expected ':' after '", key, "'"), error);
      SkipSpace();
      if (key == "descr") {
        if (Peek() == '[') {
          return Fail("structured dtypes (a list descr) are unsupported", error);
        }
        if (!ParseString(out.descr)) return Fail("'descr' is not a string", error);
        has_descr = true;
      } else if (key == "fortran_order") {
        bool fortran = false;
        if (ConsumeWord("True")) {
          fortran = true;
        } else if (!ConsumeWord("False")) {
          return Fail("'fortran_order' is not True or False", error);
        }
        if (fortran) {
          return Fail(
              "fortran_order True is unsupported (save a C-ordered array: "
              "np.ascontiguousarray)",
              error);
        }
        has_order = true;
      } else if (key == "shape") {
        if (!ParseShape(out.shape, error)) return false;
        has_shape = true;
      } else {
        return Fail(absl::StrCat("unexpected key '", key, "' in the header"), error);
      }
      SkipSpace();
      if (Consume(',')) continue;
      if (Consume('}')) break;
      return Fail("expected ',' or '}' in the header dict", error);
    }
    if (!has_descr || !has_order || !has_shape) {
      return Fail("the header lacks one of 'descr', 'fortran_order', 'shape'", error);
    }
    return true;
  }

 private:
  static bool Fail(std::string message, std::string& error) {
    error = std::move(message);
    return false;
  }
  char Peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  bool Consume(char c) {
    if (Peek() != c) return false;
    ++pos_;
    return true;
  }
  bool ConsumeWord(absl::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }
  void SkipSpace() {
    while (pos_ < text_.size() && absl::ascii_isspace(static_cast<unsigned char>(text_[pos_]))) {
      ++pos_;
    }
  }
  // A '...' or "..." literal without escapes.
  bool ParseString(std::string& out) {
    const char quote = Peek();
    if (quote != '\'' && quote != '"') return false;
    const size_t end = text_.find(quote, pos_ + 1);
    if (end == absl::string_view::npos) return false;
    out = std::string(text_.substr(pos_ + 1, end - pos_ - 1));
    pos_ = end + 1;
    return true;
  }
  // A tuple of non-negative integers: (), (5,), (5, 3) or (5, 3,); Python 2's 5L too.
  bool ParseShape(std::vector<int64_t>& shape, std::string& error) {
    if (!Consume('(')) return Fail("'shape' is not a tuple", error);
    while (true) {
      SkipSpace();
      if (Consume(')')) return true;
      if (!absl::ascii_isdigit(static_cast<unsigned char>(Peek()))) {
        return Fail("'shape' holds something other than non-negative integers", error);
      }
      int64_t value = 0;
      while (absl::ascii_isdigit(static_cast<unsigned char>(Peek()))) {
        value = value * 10 + (text_[pos_++] - '0');
        if (value > kMaxDim) return Fail("absurd dimension in 'shape'", error);
      }
      Consume('L');
      shape.push_back(value);
      if (shape.size() > 32) return Fail("'shape' has more than 32 axes", error);
      SkipSpace();
      if (Consume(')')) return true;
      if (!Consume(',')) return Fail("expected ',' or ')' in 'shape'", error);
    }
  }

  absl::string_view text_;
  size_t pos_ = 0;
};

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    absl::StrAppend(&s, i == 0 ? "" : ", ", shape[i]);
  }
  return absl::StrCat(s, shape.size() == 1 ? ",)" : ")");
}

// Parses the descr of a simple little-endian (or byte-order-free) numeric dtype.
absl::Status ParseDtype(const std::string& path, const std::string& descr, Dtype& dtype) {
  if (descr.size() >= 3 &&
      (descr[0] == '<' || descr[0] == '|' || descr[0] == '>' || descr[0] == '=')) {
    const absl::string_view digits = absl::string_view(descr).substr(2);
    int size = 0;
    bool ok = !digits.empty() && digits.size() <= 2;
    for (char c : digits) ok = ok && absl::ascii_isdigit(static_cast<unsigned char>(c));
    if (ok) size = std::stoi(std::string(digits));
    const char kind = descr[1];
    if (ok && (kind == 'u' || kind == 'i' || kind == 'f') &&
        (size == 1 || size == 2 || size == 4 || size == 8)) {
      if (descr[0] == '>' && size > 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            path, ": big-endian dtype '", descr,
            "' is unsupported (save little-endian: a.astype(a.dtype.newbyteorder('<')))"));
      }
      dtype = {kind, size};
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(path, ": unsupported dtype '", descr, "'"));
}

// Reads the preamble and header and checks the data size against the file's size.
absl::StatusOr<NpyHeader> ReadHeader(InputFile& file) {
  const std::string& path = file.path();
  char preamble[10];
  const int64_t preamble_bytes = std::min<int64_t>(file.size(), 8);
  if (absl::Status s = file.ReadExactly(preamble, preamble_bytes, "preamble"); !s.ok()) return s;
  if (preamble_bytes < 6 || std::memcmp(preamble, kMagic, 6) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a .npy file (no \\x93NUMPY magic)"));
  }
  if (preamble_bytes < 8) {
    return absl::DataLossError(absl::StrCat(path, ": truncated header"));
  }
  const int major = static_cast<uint8_t>(preamble[6]), minor = static_cast<uint8_t>(preamble[7]);
  if (major < 1 || major > 3 || minor != 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": unsupported .npy format version ",
                                                   major, ".", minor,
                                                   " (1.0, 2.0 and 3.0 are read)"));
  }
  const int len_bytes = major == 1 ? 2 : 4;
  uint8_t len_buf[4] = {0, 0, 0, 0};
  if (absl::Status s = file.ReadExactly(len_buf, len_bytes, "header"); !s.ok()) return s;
  int64_t header_len = 0;
  for (int i = len_bytes - 1; i >= 0; --i) header_len = header_len << 8 | len_buf[i];
  if (header_len > kMaxHeaderBytes || header_len > file.size() - file.offset()) {
    return absl::DataLossError(absl::StrCat(path, ": header length ", header_len,
                                            " exceeds the file's remaining ",
                                            file.size() - file.offset(), " bytes"));
  }
  std::string text(static_cast<size_t>(header_len), '\0');
  if (absl::Status s = file.ReadExactly(text.data(), header_len, "header"); !s.ok()) return s;
  NpyHeader header;
  std::string error;
  if (!HeaderParser(text).Parse(header, error)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", error));
  }
  if (absl::Status s = ParseDtype(path, header.descr, header.dtype); !s.ok()) return s;
  header.data_bytes = file.size() - file.offset();
  return header;
}

// The number of data bytes a shape promises; -1 if beyond what any file could hold.
int64_t PromisedBytes(const std::vector<int64_t>& shape, int item_size) {
  int64_t bytes = item_size;
  for (int64_t d : shape) {
    if (__builtin_mul_overflow(bytes, d, &bytes)) return -1;
  }
  return bytes;
}

absl::Status CheckDataSize(const std::string& path, const NpyHeader& h) {
  const int64_t promised = PromisedBytes(h.shape, h.dtype.size);
  if (promised < 0 || promised > h.data_bytes) {
    return absl::DataLossError(
        absl::StrCat(path, ": truncated data: shape ", ShapeString(h.shape), " of '", h.descr,
                     "' needs ", promised < 0 ? "more than 2^63" : absl::StrCat(promised),
                     " bytes, the file holds ", h.data_bytes));
  }
  if (promised < h.data_bytes) {
    return absl::DataLossError(absl::StrCat(path, ": trailing data: ", h.data_bytes - promised,
                                            " bytes after the ", promised, " that shape ",
                                            ShapeString(h.shape), " needs"));
  }
  return absl::OkStatus();
}

// uint8 images read from the file as training reaches them: one pread per image (the page cache
// keeps what fits), transposed to planes when stored channels last; the planned order is
// announced to the kernel a window ahead (InputFile::WillNeed), so that a set on disk is read
// ahead although its order is random.
class NpyImageSource final : public ImageSource {
 public:
  NpyImageSource(InputFile file, int64_t data_at, int64_t count, int64_t channels, int64_t plane,
                 bool channels_last)
      : file_(std::move(file)),
        data_at_(data_at),
        count_(count),
        channels_(channels),
        plane_(plane),
        channels_last_(channels_last) {}

  void Plan(absl::Span<const int64_t> order) override {
    absl::MutexLock lock(&mu_);
    plan_.assign(order.begin(), order.end());
    at_ = 0;
    announced_ = 0;
  }

  absl::Status Read(int64_t index, uint8_t* out) override {
    if (index < 0 || index >= count_) {
      return absl::InvalidArgumentError(
          absl::StrCat(file_.path(), ": image index ", index, " outside [0, ", count_, ")"));
    }
    const int64_t values = channels_ * plane_;
    std::vector<int64_t> announce;  // Images to announce to the kernel, after the lock.
    {
      absl::MutexLock lock(&mu_);
      // The plan's next read, or one a little further (reads out of order skip ahead).
      const size_t end = std::min(plan_.size(), std::max(announced_, at_ + 1));
      for (size_t k = at_; k < end; ++k) {
        if (plan_[k] != index) continue;
        at_ = k + 1;
        for (; announced_ < std::min(plan_.size(), at_ + kAhead); ++announced_) {
          const int64_t i = plan_[announced_];
          if (i >= 0 && i < count_) announce.push_back(i);
        }
        break;
      }
    }
    for (int64_t i : announce) file_.WillNeed(data_at_ + i * values, values);
    if (!channels_last_) return file_.ReadAt(data_at_ + index * values, out, values, "image");
    std::vector<uint8_t> image(static_cast<size_t>(values));
    if (absl::Status s = file_.ReadAt(data_at_ + index * values, image.data(), values, "image");
        !s.ok()) {
      return s;
    }
    for (int64_t p = 0; p < plane_; ++p) {
      for (int64_t c = 0; c < channels_; ++c) out[c * plane_ + p] = image[p * channels_ + c];
    }
    return absl::OkStatus();
  }

 private:
  static constexpr size_t kAhead = 256;  // Images announced ahead of the reader.
  const InputFile file_;
  const int64_t data_at_, count_, channels_, plane_;
  const bool channels_last_;
  absl::Mutex mu_;
  std::vector<int64_t> plan_ ABSL_GUARDED_BY(mu_);
  size_t at_ ABSL_GUARDED_BY(mu_) = 0;         // The plan's next position.
  size_t announced_ ABSL_GUARDED_BY(mu_) = 0;  // Positions before it were announced.
};

// `v` as float32, as NumPy's astype(np.float32) rounds it: a value beyond float's range but
// within half a unit of its largest finite value rounds to that value; further out it is an
// infinity of its sign (then refused as not finite), never a cast out of range.
float ToFloat32(double v) {
  constexpr double kMax = std::numeric_limits<float>::max();
  constexpr double kRoundsToMax = 340282356779733661637539395458142568448.0;  // 2^128 - 2^103.
  if (std::fabs(v) <= kMax) return static_cast<float>(v);
  if (std::isnan(v)) return std::numeric_limits<float>::quiet_NaN();
  if (std::fabs(v) < kRoundsToMax) return std::copysign(std::numeric_limits<float>::max(), v);
  return std::copysign(std::numeric_limits<float>::infinity(), v);
}

// Integer ids: (N, L) of any integer dtype, each in [0, kMaxId), held as floats.
constexpr int64_t kMaxId = int64_t{1} << 24;  // Floats hold every integer below it exactly.

constexpr int64_t kMaxIdsPerSample = int64_t{1} << 20;

absl::Status ReadIds(const std::string& path, const NpyOptions& options, InputFile& file,
                     const NpyHeader& h, Dataset& out) {
  if (options.loading == DataLoading::kStream) {
    return absl::InvalidArgumentError(
        absl::StrCat(path,
                     ": integer ids are held in memory; reading as training goes (stream) is for "
                     "uint8 images"));
  }
  const int64_t n = h.shape[0], length = h.shape[1];
  if (n < 1 || length < 1 || length > kMaxIdsPerSample) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ids of shape ", ShapeString(h.shape),
                                                   ": no samples, or absurd dimensions"));
  }
  if (absl::Status st = CheckDataSize(path, h); !st.ok()) return st;
  out.size = n;
  out.ids = true;
  out.channels = static_cast<int>(length);
  out.rows = out.cols = 1;
  DPTRAIN_RETURN_IF_ERROR(HoldInMemory(out.images, static_cast<size_t>(n * length), path));
  const int size = h.dtype.size;
  const bool is_signed = h.dtype.kind == 'i';
  const int64_t per_chunk = std::max<int64_t>(1, kChunkBytes / size);
  std::vector<uint8_t> chunk(static_cast<size_t>(std::min(n * length, per_chunk) * size));
  for (int64_t first = 0; first < n * length; first += per_chunk) {
    const int64_t count = std::min(n * length - first, per_chunk);
    if (absl::Status st = file.ReadExactly(chunk.data(), count * size, "data"); !st.ok()) {
      return st;
    }
    for (int64_t i = 0; i < count; ++i) {
      uint64_t bits = 0;
      std::memcpy(&bits, chunk.data() + i * size, size);
      int64_t value = static_cast<int64_t>(bits);
      if (is_signed && size < 8 && ((bits >> (8 * size - 1)) & 1)) {
        value -= int64_t{1} << (8 * size);  // Sign-extend.
      }
      const bool too_large = !is_signed && size == 8 ? bits >= kMaxId : value >= kMaxId;
      if (value < 0 || too_large) {
        const int64_t k = first + i;
        return absl::InvalidArgumentError(absl::StrCat(
            path, ": id ", is_signed ? absl::StrCat(value) : absl::StrCat(bits), " at sample ",
            k / length, ", position ", k % length,
            " is outside [0, 2^24) (an integer array of rank 2 is read as ids, table rows; "
            "save features, or any other integers, as float32)"));
      }
      out.images[first + i] = static_cast<float>(value);
    }
  }
  return absl::OkStatus();
}

// What a samples file must hold: anything (SPLIT_images.npy), ids (SPLIT_ids.npy) or feature
// vectors (SPLIT_features.npy).
enum class Samples { kAny, kIds, kFeatures };

absl::Status ReadImages(const std::string& path, const NpyOptions& options, Samples want,
                        Dataset& out) {
  absl::StatusOr<InputFile> file = InputFile::Open(path);
  if (!file.ok()) return file.status();
  absl::StatusOr<NpyHeader> h = ReadHeader(*file);
  if (!h.ok()) return h.status();
  const bool is_int = h->dtype.kind == 'i' || h->dtype.kind == 'u';
  // Checked before any data is read: the file's name says what it must hold.
  const bool rank2 = h->shape.size() == 2;
  const char* holds = rank2 && is_int                 ? "integer ids"
                      : rank2 && h->dtype.kind == 'f' ? "feature vectors"
                                                      : "images";
  if (want == Samples::kIds && !(rank2 && is_int)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": holds ", holds, "; an ids file holds integers of shape (N, L)"));
  }
  if (want == Samples::kFeatures && !(rank2 && h->dtype.kind == 'f')) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": holds ", holds,
                     "; a features file holds floats of shape (N, F) (integers: save them as "
                     "float32)"));
  }
  if (is_int && h->shape.size() == 2) return ReadIds(path, options, *file, *h, out);
  const bool is_u8 = h->dtype.kind == 'u' && h->dtype.size == 1;
  const bool is_float = h->dtype.kind == 'f' && (h->dtype.size == 4 || h->dtype.size == 8);
  if (!is_u8 && !is_float) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": images of dtype '", h->descr,
                     "' are unsupported (uint8, float32 or float64 only; integer ids are (N, L))"));
  }
  const std::vector<int64_t>& s = h->shape;
  int64_t channels = 1, rows = 0, cols = 0;
  bool channels_last = false;
  if (s.size() == 2 && is_float) {  // Feature vectors: F x 1 x 1.
    channels = s[1];
    rows = cols = 1;
  } else if (s.size() == 3) {
    rows = s[1];
    cols = s[2];
  } else if (s.size() == 4) {
    auto is_channel_count = [](int64_t d) { return d == 1 || d == 3 || d == 4; };
    channels_last = is_channel_count(s[3]) && !is_channel_count(s[1]);
    channels = channels_last ? s[3] : s[1];
    rows = channels_last ? s[1] : s[2];
    cols = channels_last ? s[2] : s[3];
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": images of shape ", ShapeString(s),
                     "; expected (N, H, W), (N, C, H, W) or (N, H, W, C) (or float features "
                     "(N, F))"));
  }
  if (s[0] < 1 || channels < 1 || rows < 1 || cols < 1 || channels > kMaxSide || rows > kMaxSide ||
      cols > kMaxSide || channels * rows * cols > kMaxImageValues) {  // Features: F <= 2^20.
    return absl::InvalidArgumentError(absl::StrCat(path, ": images of shape ", ShapeString(s),
                                                   ": no images, or absurd dimensions"));
  }
  if (absl::Status st = CheckDataSize(path, *h); !st.ok()) return st;
  const int64_t n = s[0];
  const int64_t plane = rows * cols, values = channels * plane;
  out.size = n;
  out.channels = static_cast<int>(channels);
  out.rows = static_cast<int>(rows);
  out.cols = static_cast<int>(cols);
  const bool stream =
      options.loading == DataLoading::kStream ||
      (options.loading == DataLoading::kAuto && is_u8 && n * values > options.stream_above_bytes);
  if (stream) {
    if (!is_u8) {
      return absl::InvalidArgumentError(absl::StrCat(
          path,
          ": float images are held in memory; reading as training goes (stream) is for "
          "uint8 images"));
    }
    out.byte_storage = true;
    const int64_t data_at = file->offset();  // Just after the header.
    out.source = std::make_shared<NpyImageSource>(*std::move(file), data_at, n, channels, plane,
                                                  channels_last);
    return absl::OkStatus();
  }
  // uint8 images are held as the file's bytes (Dataset's byte storage: a quarter of the
  // memory of floats, read as byte / 255 by CopyImages); float ones as float32 (float64, as
  // NumPy makes by default, rounded to the model's type), each checked finite.
  out.byte_storage = is_u8;
  const size_t count = static_cast<size_t>(n * values);  // The file's size bounds it.
  DPTRAIN_RETURN_IF_ERROR(
      is_u8 ? HoldInMemory(out.bytes, count, path,
                           " (--data_loading=stream reads uint8 images as training goes)")
            : HoldInMemory(out.images, count, path,
                           " (float images are held in memory; uint8 ones can be streamed)"));
  const int64_t sample_bytes = values * h->dtype.size;
  const int64_t per_chunk = std::max<int64_t>(1, kChunkBytes / sample_bytes);
  std::vector<uint8_t> chunk(std::min(n, per_chunk) * sample_bytes);
  // Channels last: [(y * W + x) * C + c] -> [c * H * W + y * W + x].
  auto to_channels_first = [plane, channels](const auto* in, auto* out_image) {
    for (int64_t p = 0; p < plane; ++p) {
      for (int64_t c = 0; c < channels; ++c) out_image[c * plane + p] = in[p * channels + c];
    }
  };
  std::vector<float> sample(is_u8 ? 0 : values);
  std::vector<double> sample64(h->dtype.size == 8 ? values : 0);
  for (int64_t first = 0; first < n; first += per_chunk) {
    const int64_t count = std::min(n - first, per_chunk);
    if (absl::Status st = file->ReadExactly(chunk.data(), count * sample_bytes, "data"); !st.ok()) {
      return st;
    }
    for (int64_t i = 0; i < count; ++i) {
      const uint8_t* src = chunk.data() + i * sample_bytes;
      if (is_u8) {
        uint8_t* dst = out.bytes.data() + (first + i) * values;
        if (channels_last) {
          to_channels_first(src, dst);
        } else {
          std::memcpy(dst, src, values);
        }
        continue;
      }
      // Through an aligned copy: the file's floats may be unaligned.
      if (h->dtype.size == 8) {
        std::memcpy(sample64.data(), src, values * sizeof(double));
        for (int64_t k = 0; k < values; ++k) sample[k] = ToFloat32(sample64[k]);
      } else {
        std::memcpy(sample.data(), src, values * sizeof(float));
      }
      for (int64_t k = 0; k < values; ++k) {
        if (std::isfinite(sample[k])) continue;
        // A NaN or an infinity (or a float64 beyond float's range) would make every loss NaN.
        return absl::InvalidArgumentError(absl::StrCat(
            path, ": value ",
            h->dtype.size == 8 ? absl::StrFormat("%.9g", sample64[k]) : absl::StrCat(sample[k]),
            " at sample ", first + i, ", index ", k, " (of the sample as stored) is not finite",
            h->dtype.size == 8 ? " in float32" : ""));
      }
      float* dst = out.images.data() + (first + i) * values;
      if (channels_last) {
        to_channels_first(sample.data(), dst);
      } else {
        std::copy_n(sample.data(), values, dst);
      }
    }
  }
  return absl::OkStatus();
}

// Reads a float labels file, whose header `h` was read: regression targets, (N,) for one per
// sample or (N, T) for T, each finite in float32, into data.targets.
absl::Status ReadTargets(InputFile& file, const NpyHeader& h, Dataset& data) {
  const std::string& path = file.path();
  if (h.dtype.size != 4 && h.dtype.size != 8) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": target values of dtype '", h.descr,
                                                   "' are unsupported (float32 or float64)"));
  }
  if (h.shape.empty() || h.shape.size() > 2 || (h.shape.size() == 2 && h.shape[1] < 1) ||
      (h.shape.size() == 2 && h.shape[1] > kMaxClasses)) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": target values of shape ", ShapeString(h.shape),
        "; expected (N,) or (N, T) with T in [1, ", kMaxClasses, "] (regression targets)"));
  }
  if (absl::Status st = CheckDataSize(path, h); !st.ok()) return st;
  const int64_t n = h.shape[0];
  const int per_sample = h.shape.size() == 2 ? static_cast<int>(h.shape[1]) : 1;
  const int64_t count = n * per_sample;  // The file's size bounds it.
  std::vector<uint8_t> raw;
  DPTRAIN_RETURN_IF_ERROR(HoldInMemory(raw, static_cast<size_t>(count * h.dtype.size), path));
  if (absl::Status st = file.ReadExactly(raw.data(), raw.size(), "data"); !st.ok()) return st;
  DPTRAIN_RETURN_IF_ERROR(HoldInMemory(data.targets, static_cast<size_t>(count), path));
  for (int64_t k = 0; k < count; ++k) {
    double v;
    if (h.dtype.size == 8) {
      std::memcpy(&v, raw.data() + k * 8, 8);
    } else {
      float f;
      std::memcpy(&f, raw.data() + k * 4, 4);
      v = f;
    }
    const float as_float = ToFloat32(v);
    if (!std::isfinite(as_float)) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": target value ", absl::StrFormat("%.9g", v), " at sample ", k / per_sample,
          per_sample > 1 ? absl::StrCat(", index ", k % per_sample) : "", " is not finite",
          h.dtype.size == 8 ? " in float32" : ""));
    }
    data.targets[k] = as_float;
  }
  data.targets_per_sample = per_sample;
  data.num_classes = 0;
  return absl::OkStatus();
}

// Reads a labels file of class labels; `max_label` is the largest value (-1 for none).
// `limit`: the labels must be below it. `h`: its header, read.
absl::Status ReadClassLabels(InputFile& file, const NpyHeader& header, int limit,
                             std::vector<nn::Label>& labels, int& max_label) {
  const std::string& path = file.path();
  const NpyHeader* h = &header;
  if (h->shape.size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": labels of shape ", ShapeString(h->shape),
                     "; expected (N,) class labels (multi-label 0/1 targets: save them as float32, "
                     "for --loss=bce)"));
  }
  if (absl::Status st = CheckDataSize(path, *h); !st.ok()) return st;
  const int64_t n = h->shape[0];
  const int size = h->dtype.size;
  std::vector<uint8_t> raw;  // The file's size bounds it.
  DPTRAIN_RETURN_IF_ERROR(HoldInMemory(raw, static_cast<size_t>(n * size), path));
  if (absl::Status st = file.ReadExactly(raw.data(), n * size, "data"); !st.ok()) return st;
  DPTRAIN_RETURN_IF_ERROR(HoldInMemory(labels, static_cast<size_t>(n), path));
  max_label = -1;
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* p = raw.data() + i * size;
    uint64_t bits = 0;
    std::memcpy(&bits, p, size);
    bool negative = false;
    if (h->dtype.kind == 'i' && size < 8) {
      negative = (bits >> (8 * size - 1)) & 1;
    } else if (h->dtype.kind == 'i') {
      negative = static_cast<int64_t>(bits) < 0;
    }
    if (negative) {
      const int64_t value = size < 8 ? static_cast<int64_t>(bits) - (int64_t{1} << (8 * size))
                                     : static_cast<int64_t>(bits);
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": label ", value, " at index ", i, " is negative"));
    }
    if (bits >= static_cast<uint64_t>(limit)) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": label ", bits, " at index ", i, " is not below ", limit,
          limit == kMaxClasses ? " (the most classes a data set may have)" : " (num_classes)"));
    }
    labels[i] = static_cast<nn::Label>(bits);
    max_label = std::max<int>(max_label, labels[i]);
  }
  return absl::OkStatus();
}

// Reads a labels file of class labels (integers); `max_label` is the largest value (-1 for
// none). `limit`: the labels must be below it. A float file (regression targets) is refused.
absl::Status ReadLabels(const std::string& path, int limit, std::vector<nn::Label>& labels,
                        int& max_label) {
  DPTRAIN_ASSIGN_OR_RETURN(InputFile file, InputFile::Open(path));
  DPTRAIN_ASSIGN_OR_RETURN(const NpyHeader h, ReadHeader(file));
  if (h.dtype.kind == 'f') {
    return absl::InvalidArgumentError(
        absl::StrCat(path,
                     ": float labels (regression targets) where the other split has class labels "
                     "(integers): save both the same"));
  }
  return ReadClassLabels(file, h, limit, labels, max_label);
}

absl::Status CheckOptions(const NpyOptions& options) {
  if (options.num_classes < 0 || options.num_classes > kMaxClasses) {
    return absl::InvalidArgumentError(absl::StrCat("npy: num_classes ", options.num_classes,
                                                   " is not in [1, ", kMaxClasses,
                                                   "] (or 0: from the labels)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Dataset> LoadPair(const std::string& images_path, const std::string& labels_path,
                                 const NpyOptions& options, Samples want) {
  if (absl::Status s = CheckOptions(options); !s.ok()) return s;
  Dataset data;
  if (absl::Status s = ReadImages(images_path, options, want, data); !s.ok()) return s;
  DPTRAIN_ASSIGN_OR_RETURN(InputFile file, InputFile::Open(labels_path));
  DPTRAIN_ASSIGN_OR_RETURN(const NpyHeader h, ReadHeader(file));
  if (h.dtype.kind == 'f') {  // Regression.
    if (options.num_classes > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(labels_path, ": float labels are regression targets; num_classes (",
                       options.num_classes, ") applies to class labels (integers)"));
    }
    DPTRAIN_RETURN_IF_ERROR(ReadTargets(file, h, data));
    if (h.shape[0] != data.size) {
      return absl::InvalidArgumentError(absl::StrCat(labels_path, ": has ", h.shape[0],
                                                     " samples' targets but ", images_path, " has ",
                                                     data.size, " samples"));
    }
    return data;
  }
  int max_label = -1;
  const int limit = options.num_classes > 0 ? options.num_classes : kMaxClasses;
  DPTRAIN_RETURN_IF_ERROR(ReadClassLabels(file, h, limit, data.labels, max_label));
  if (static_cast<int64_t>(data.labels.size()) != data.size) {
    return absl::InvalidArgumentError(absl::StrCat(labels_path, ": has ", data.labels.size(),
                                                   " labels but ", images_path, " has ", data.size,
                                                   " images"));
  }
  data.num_classes = options.num_classes > 0 ? options.num_classes : max_label + 1;
  return data;
}

}  // namespace

absl::StatusOr<Dataset> LoadNpyPair(const std::string& images_path, const std::string& labels_path,
                                    const NpyOptions& options) {
  return LoadPair(images_path, labels_path, options, Samples::kAny);
}

absl::StatusOr<Dataset> LoadNpy(const std::string& dir, bool train, const NpyOptions& options) {
  if (absl::Status s = CheckOptions(options); !s.ok()) return s;
  const std::string split = train ? "train" : "test";
  // The samples: SPLIT_images.npy (any kind), SPLIT_ids.npy for token ids (which must be ids)
  // or SPLIT_features.npy for feature vectors (which must be floats of shape (N, F)).
  std::string file = split + "_images.npy";
  Samples want = Samples::kAny;
  for (const auto& [name, kind] :
       {std::pair{"ids", Samples::kIds}, std::pair{"features", Samples::kFeatures}}) {
    const std::string other = absl::StrCat(split, "_", name, ".npy");
    if (!IsRegularFile(JoinPath(dir, other))) continue;
    if (IsRegularFile(JoinPath(dir, file))) {
      return absl::InvalidArgumentError(
          absl::StrCat(dir, ": both ", file, " and ", other, "; keep one"));
    }
    file = other;
    want = kind;
  }
  absl::StatusOr<Dataset> data =
      LoadPair(JoinPath(dir, file), JoinPath(dir, split + "_labels.npy"), options, want);
  if (!data.ok() || options.num_classes > 0 || data->regression()) return data;
  // The other split's labels, so that both splits have the same num_classes.
  const std::string other = JoinPath(dir, train ? "test_labels.npy" : "train_labels.npy");
  if (!IsRegularFile(other)) return data;
  std::vector<nn::Label> labels;
  int max_label = -1;
  if (absl::Status s = ReadLabels(other, kMaxClasses, labels, max_label); !s.ok()) return s;
  data->num_classes = std::max(data->num_classes, max_label + 1);
  return data;
}

}  // namespace dptrain
