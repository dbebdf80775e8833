#include "worker/data/idx_reader.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"

namespace dptrain {
namespace {

constexpr uint32_t kImagesMagic = 0x00000803;
constexpr uint32_t kLabelsMagic = 0x00000801;
constexpr int64_t kMaxSide = 4096;
constexpr int64_t kMaxElements = int64_t{1} << 31;
constexpr int64_t kChunkBytes = int64_t{1} << 20;
constexpr int kNumClasses = 10;

struct GzCloser {
  void operator()(gzFile f) const { gzclose(f); }
};
using GzPtr = std::unique_ptr<gzFile_s, GzCloser>;

absl::StatusOr<GzPtr> Open(const std::string& path) {
  errno = 0;
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) {
    const int error = errno;
    if (error == 0) return absl::ResourceExhaustedError(absl::StrCat(path, ": gzopen failed"));
    return absl::ErrnoToStatus(error, absl::StrCat(path, ": cannot open"));
  }
  gzbuffer(f, 1 << 17);
  return GzPtr(f);
}

// zlib's last error message, without the "path: " prefix that gzerror adds; empty if none.
std::string GzError(gzFile f, const std::string& path) {
  int code = Z_OK;
  absl::string_view message = gzerror(f, &code);
  if (code == Z_OK) return "";
  absl::ConsumePrefix(&message, absl::StrCat(path, ": "));
  return std::string(message);
}

// Reads up to n bytes (fewer only at the end of the data). A gzip or I/O error is DataLoss.
absl::StatusOr<int64_t> ReadUpTo(gzFile f, const std::string& path, uint8_t* buf, int64_t n) {
  int64_t got = 0;
  while (got < n) {
    const unsigned want = static_cast<unsigned>(std::min<int64_t>(n - got, kChunkBytes));
    const int r = gzread(f, buf + got, want);
    if (r < 0) {
      return absl::DataLossError(absl::StrCat(path, ": read error: ", GzError(f, path)));
    }
    if (r == 0) break;
    got += r;
  }
  return got;
}

absl::Status Truncated(const std::string& path, gzFile f, const char* what, int64_t expected,
                       int64_t got) {
  const std::string error = GzError(f, path);
  return absl::DataLossError(absl::StrCat(path, ": truncated ", what, ": expected ", expected,
                                          " bytes, got ", got,
                                          error.empty() ? "" : absl::StrCat(" (", error, ")")));
}

// Reads the magic and `ndims` big-endian dimensions; checks the magic.
absl::StatusOr<std::vector<int64_t>> ReadHeader(gzFile f, const std::string& path, uint32_t magic,
                                                int ndims) {
  std::array<uint8_t, 16> header{};
  const int64_t bytes = 4 * (1 + ndims);
  absl::StatusOr<int64_t> got = ReadUpTo(f, path, header.data(), bytes);
  if (!got.ok()) return got.status();
  auto word = [&](int i) {
    const uint8_t* p = header.data() + 4 * i;
    return uint32_t{p[0]} << 24 | uint32_t{p[1]} << 16 | uint32_t{p[2]} << 8 | uint32_t{p[3]};
  };
  if (*got >= 4 && word(0) != magic) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: bad magic 0x%08x, expected 0x%08x (not an IDX %s file)", path, word(0),
                        magic, magic == kImagesMagic ? "images" : "labels"));
  }
  if (*got < bytes) return Truncated(path, f, "header", bytes, *got);
  std::vector<int64_t> dims;
  for (int i = 1; i <= ndims; ++i) dims.push_back(word(i));
  return dims;
}

// Reads exactly `count` payload bytes, handing them to `sink` in chunks, then checks that the
// file ends there. Buffers grow only as data arrive.
template <typename Sink>
absl::Status ReadPayload(gzFile f, const std::string& path, int64_t count, Sink sink) {
  std::vector<uint8_t> chunk(std::min(count, kChunkBytes) + 1);
  int64_t done = 0;
  while (done < count) {
    const int64_t want = std::min(count - done, kChunkBytes);
    absl::StatusOr<int64_t> got = ReadUpTo(f, path, chunk.data(), want);
    if (!got.ok()) return got.status();
    sink(chunk.data(), *got);
    done += *got;
    if (*got < want) return Truncated(path, f, "data", count, done);
  }
  // Reading past the end also makes zlib verify the gzip trailer (CRC and length).
  absl::StatusOr<int64_t> extra = ReadUpTo(f, path, chunk.data(), 1);
  if (!extra.ok()) return extra.status();
  if (*extra != 0) {
    return absl::DataLossError(
        absl::StrCat(path, ": trailing data after the ", count, " bytes the header promises"));
  }
  return absl::OkStatus();
}

// Makes room for `extra` more elements in `v`, growing capacity geometrically but never beyond
// `limit` elements.
template <typename T>
void ReserveFor(std::vector<T>& v, int64_t extra, int64_t limit) {
  const int64_t need = static_cast<int64_t>(v.size()) + extra;
  if (need <= static_cast<int64_t>(v.capacity())) return;
  v.reserve(std::min(limit, std::max(need, 2 * static_cast<int64_t>(v.capacity()))));
}

absl::Status ReadImages(const std::string& path, Dataset& out) {
  absl::StatusOr<GzPtr> f = Open(path);
  if (!f.ok()) return f.status();
  absl::StatusOr<std::vector<int64_t>> dims = ReadHeader(f->get(), path, kImagesMagic, 3);
  if (!dims.ok()) return dims.status();
  const int64_t count = (*dims)[0], rows = (*dims)[1], cols = (*dims)[2];
  if (rows < 1 || rows > kMaxSide || cols < 1 || cols > kMaxSide ||
      count * rows * cols > kMaxElements) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": absurd dimensions ", count, " x ", rows, " x ", cols,
        " (rows and cols must be in [1, ", kMaxSide, "], at most ", kMaxElements, " pixels)"));
  }
  const int64_t pixels = count * rows * cols;
  out.size = count;
  out.channels = 1;
  out.rows = static_cast<int>(rows);
  out.cols = static_cast<int>(cols);
  out.images.clear();
  out.byte_storage = true;  // The file's bytes, as stored (Dataset::CopyImages reads them).
  out.bytes.clear();
  return ReadPayload(f->get(), path, pixels, [&](const uint8_t* data, int64_t n) {
    ReserveFor(out.bytes, n, pixels);
    out.bytes.insert(out.bytes.end(), data, data + n);
  });
}

absl::Status ReadLabels(const std::string& path, std::vector<nn::Label>& labels) {
  absl::StatusOr<GzPtr> f = Open(path);
  if (!f.ok()) return f.status();
  absl::StatusOr<std::vector<int64_t>> dims = ReadHeader(f->get(), path, kLabelsMagic, 1);
  if (!dims.ok()) return dims.status();
  const int64_t count = (*dims)[0];
  if (count > kMaxElements) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": absurd label count ", count, " (at most ", kMaxElements, ")"));
  }
  labels.clear();
  absl::Status status = ReadPayload(f->get(), path, count, [&](const uint8_t* data, int64_t n) {
    ReserveFor(labels, n, count);
    labels.insert(labels.end(), data, data + n);
  });
  if (!status.ok()) return status;
  for (size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] >= kNumClasses) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": label ", static_cast<int>(labels[i]),
                                                     " at index ", i, " is not in [0, ",
                                                     kNumClasses, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Dataset> LoadIdxPair(const std::string& images_path,
                                    const std::string& labels_path) {
  Dataset data;
  data.num_classes = kNumClasses;
  if (absl::Status s = ReadImages(images_path, data); !s.ok()) return s;
  if (absl::Status s = ReadLabels(labels_path, data.labels); !s.ok()) return s;
  if (static_cast<int64_t>(data.labels.size()) != data.size) {
    return absl::InvalidArgumentError(absl::StrCat(labels_path, ": has ", data.labels.size(),
                                                   " labels but ", images_path, " has ", data.size,
                                                   " images"));
  }
  return data;
}

absl::StatusOr<Dataset> LoadFashionMnist(const std::string& data_dir, bool train) {
  std::string dir = data_dir.empty() ? "." : data_dir;
  if (dir.back() != '/') dir += '/';
  const std::string prefix = train ? "train" : "t10k";
  return LoadIdxPair(absl::StrCat(dir, prefix, "-images-idx3-ubyte.gz"),
                     absl::StrCat(dir, prefix, "-labels-idx1-ubyte.gz"));
}

}  // namespace dptrain
