#include "worker/data/image_folder.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "worker/data/image_decode.h"
#include "worker/data/input_file.h"

namespace dptrain {
namespace {

namespace fs = std::filesystem;

constexpr int kMaxThreads = 8;
constexpr int64_t kMaxFileBytes = int64_t{1} << 30;
// Values (pixels x channels) of a whole set: 16 GiB of bytes.
constexpr int64_t kMaxSetValues = int64_t{1} << 34;

struct Example {
  std::string path;
  int label = 0;
};

bool IsImageName(const std::string& name) {
  const std::string lower = absl::AsciiStrToLower(name);
  return absl::EndsWith(lower, ".png") || absl::EndsWith(lower, ".jpg") ||
         absl::EndsWith(lower, ".jpeg");
}

// The names of the entries of `dir` for which `keep(path)` holds, sorted; '.'-names skipped.
template <typename Keep>
absl::StatusOr<std::vector<std::string>> ListSorted(const std::string& dir, Keep keep) {
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) return absl::ErrnoToStatus(ec.value(), absl::StrCat(dir, ": cannot list"));
  std::vector<std::string> names;
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!name.empty() && name[0] != '.' && keep(it->path().string(), name)) names.push_back(name);
  }
  if (ec) return absl::ErrnoToStatus(ec.value(), absl::StrCat(dir, ": cannot list"));
  std::sort(names.begin(), names.end());
  return names;
}

absl::StatusOr<std::string> ReadAll(const std::string& path) {
  absl::StatusOr<InputFile> file = InputFile::Open(path);
  if (!file.ok()) return file.status();
  if (file->size() > kMaxFileBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", file->size(), " bytes is too large for an image file"));
  }
  std::string bytes(static_cast<size_t>(file->size()), '\0');
  if (absl::Status s = file->ReadExactly(bytes.data(), file->size(), "image"); !s.ok()) return s;
  return bytes;
}

// Decodes examples[i] into images[i] on `threads` threads. Returns the error of the first
// failing example in order, whatever the number of threads: a thread stops taking examples
// after any failure, but all examples before a failing one were taken before it.
absl::Status DecodeAll(const std::string& split_dir, const std::vector<Example>& examples,
                       int threads, const ImageSize& size, std::vector<DecodedImage>& images) {
  const int64_t n = static_cast<int64_t>(examples.size());
  images.assign(n, DecodedImage());
  std::vector<absl::Status> errors(n);
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> values{0};
  std::atomic<bool> stop{false};
  std::atomic<bool> too_large{false};
  auto work = [&] {
    while (!stop.load(std::memory_order_relaxed)) {
      const int64_t i = next.fetch_add(1);
      if (i >= n) return;
      absl::StatusOr<std::string> bytes = ReadAll(examples[i].path);
      absl::StatusOr<DecodedImage> image =
          bytes.ok() ? DecodeImage(*bytes, examples[i].path) : bytes.status();
      if (!image.ok()) {
        errors[i] = image.status();
        stop = true;
        continue;
      }
      if (!size.keep()) *image = FitImage(*image, size);
      // Counted as 3 channels: the set may turn out to be RGB.
      if (values.fetch_add(int64_t{3} * image->width * image->height) > kMaxSetValues) {
        too_large = true;
        stop = true;
      }
      images[i] = *std::move(image);
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < std::min<int64_t>(threads, n); ++t) {
    try {
      pool.emplace_back(work);
    } catch (const std::system_error&) {
      break;  // Fewer threads: the work is the same.
    }
  }
  work();
  for (std::thread& t : pool) t.join();
  for (int64_t i = 0; i < n; ++i) {
    if (!errors[i].ok()) return errors[i];
  }
  if (too_large) {
    return absl::ResourceExhaustedError(absl::StrCat(split_dir, ": the images hold more than ",
                                                     kMaxSetValues,
                                                     " values in all, too many to hold in memory"));
  }
  return absl::OkStatus();
}

int ThreadCount(const ImageFolderOptions& options) {
  if (options.threads > 0) return std::min(options.threads, 64);
  const int hardware = static_cast<int>(std::thread::hardware_concurrency());
  return std::clamp(hardware, 1, kMaxThreads);
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ListClassFolders(const std::string& split_dir) {
  if (!IsDirectory(split_dir)) {
    return absl::NotFoundError(absl::StrCat(split_dir, ": no such directory"));
  }
  return ListSorted(split_dir, [](const std::string& path, const std::string&) {
    std::error_code ec;
    return fs::is_directory(path, ec);
  });
}

absl::StatusOr<Dataset> LoadImageFolder(const std::string& dir, bool train,
                                        const ImageFolderOptions& options) {
  const std::string train_dir = JoinPath(dir, "train");
  absl::StatusOr<std::vector<std::string>> classes = ListClassFolders(train_dir);
  if (!classes.ok()) return classes.status();
  if (classes->empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(train_dir, ": no class folders (expected ", train_dir, "/<class>/<image>)"));
  }
  if (classes->size() > static_cast<size_t>(kMaxClasses)) {
    return absl::InvalidArgumentError(absl::StrCat(train_dir, ": ", classes->size(),
                                                   " class folders; at most ", kMaxClasses,
                                                   " (labels are bytes)"));
  }
  const std::string split_dir = train ? train_dir : JoinPath(dir, "test");
  absl::StatusOr<std::vector<std::string>> split_classes = classes;
  if (!train) split_classes = ListClassFolders(split_dir);
  if (!split_classes.ok()) return split_classes.status();
  if (split_classes->empty()) {
    return absl::InvalidArgumentError(absl::StrCat(split_dir, ": no class folders"));
  }

  std::vector<Example> examples;
  for (const std::string& name : *split_classes) {
    const auto found = std::lower_bound(classes->begin(), classes->end(), name);
    const std::string class_dir = JoinPath(split_dir, name);
    if (found == classes->end() || *found != name) {
      return absl::InvalidArgumentError(absl::StrCat(class_dir, ": class '", name,
                                                     "' is not among the ", classes->size(),
                                                     " classes of ", train_dir));
    }
    absl::StatusOr<std::vector<std::string>> files =
        ListSorted(class_dir, [](const std::string& path, const std::string& file) {
          std::error_code ec;
          return IsImageName(file) && fs::is_regular_file(path, ec);
        });
    if (!files.ok()) return files.status();
    if (files->empty()) {
      return absl::InvalidArgumentError(absl::StrCat(class_dir, ": no .png, .jpg or .jpeg files"));
    }
    const int label = static_cast<int>(found - classes->begin());
    for (const std::string& file : *files) examples.push_back({JoinPath(class_dir, file), label});
  }

  std::vector<DecodedImage> images;
  if (absl::Status s = DecodeAll(split_dir, examples, ThreadCount(options), options.size, images);
      !s.ok()) {
    return s;
  }
  const int height = images[0].height, width = images[0].width;
  bool any_color = false;
  for (size_t i = 0; i < images.size(); ++i) {
    if (images[i].height != height || images[i].width != width) {
      return absl::InvalidArgumentError(
          absl::StrCat(examples[i].path, ": image is ", images[i].height, "x", images[i].width,
                       " (height x width) but ", examples[0].path, " is ", height, "x", width,
                       "; all images of a set must have one size, or give one to bring them "
                       "to (--image_size=S or HxW)"));
    }
    any_color = any_color || images[i].channels == 3;
  }

  Dataset data;
  data.size = static_cast<int64_t>(images.size());
  data.channels = any_color ? 3 : 1;
  data.rows = height;
  data.cols = width;
  data.num_classes = static_cast<int>(classes->size());
  const int64_t plane = int64_t{height} * width;
  data.byte_storage = true;  // A quarter of the memory of floats (dataset.h).
  data.bytes.resize(static_cast<size_t>(data.size * data.image_size()));
  data.labels.resize(static_cast<size_t>(data.size));
  for (int64_t i = 0; i < data.size; ++i) {
    data.labels[i] = static_cast<uint8_t>(examples[i].label);
    const DecodedImage& image = images[i];
    uint8_t* out = data.bytes.data() + i * data.image_size();
    for (int c = 0; c < data.channels; ++c) {
      const int from = image.channels == 1 ? 0 : c;
      for (int64_t p = 0; p < plane; ++p)
        out[c * plane + p] = image.pixels[p * image.channels + from];
    }
    std::vector<uint8_t>().swap(images[i].pixels);  // Frees as it goes.
  }
  return data;
}

}  // namespace dptrain
