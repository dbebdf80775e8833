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
#include "worker/data/image_stream.h"
#include "worker/data/input_file.h"

namespace dptrain {
namespace {

namespace fs = std::filesystem;

constexpr int kMaxThreads = 8;

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

// Runs work(i) for every example i on `threads` threads. Returns the error of the first failing
// example in order, whatever the number of threads: a thread stops taking examples after any
// failure, but all examples before a failing one were taken before it.
template <typename Work>
absl::Status ForEachExample(int64_t n, int threads, Work work) {
  std::vector<absl::Status> errors(n);
  std::atomic<int64_t> next{0};
  std::atomic<bool> stop{false};
  auto loop = [&] {
    while (!stop.load(std::memory_order_relaxed)) {
      const int64_t i = next.fetch_add(1);
      if (i >= n) return;
      errors[i] = work(i);
      if (!errors[i].ok()) stop = true;
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < std::min<int64_t>(threads, n); ++t) {
    try {
      pool.emplace_back(loop);
    } catch (const std::system_error&) {
      break;  // Fewer threads: the work is the same.
    }
  }
  loop();
  for (std::thread& t : pool) t.join();
  for (int64_t i = 0; i < n; ++i) {
    if (!errors[i].ok()) return errors[i];
  }
  return absl::OkStatus();
}

// Decodes examples[i] into images[i], each brought to `size`.
absl::Status DecodeAll(const std::string& split_dir, const std::vector<Example>& examples,
                       int threads, const ImageSize& size, int64_t max_values,
                       std::vector<DecodedImage>& images) {
  images.assign(examples.size(), DecodedImage());
  std::atomic<int64_t> values{0};
  return ForEachExample(static_cast<int64_t>(examples.size()), threads, [&](int64_t i) {
    absl::StatusOr<DecodedImage> image = DecodeImageFile(examples[i].path);
    if (!image.ok()) return image.status();
    if (!size.keep()) *image = FitImage(*image, size);
    // Counted as 3 channels: the set may turn out to be RGB.
    const int64_t added = int64_t{3} * image->width * image->height;
    if (values.fetch_add(added) + added > max_values) {
      return absl::ResourceExhaustedError(
          absl::StrCat(split_dir, ": the images hold more than ", max_values,
                       " values in all, too many to hold in memory (--data_loading=stream "
                       "reads them as training reaches them)"));
    }
    images[i] = *std::move(image);
    return absl::OkStatus();
  });
}

// What each of examples[i] decodes to (brought to `size`), from its header: into shapes[i].
absl::Status ProbeAll(const std::vector<Example>& examples, int threads, const ImageSize& size,
                      std::vector<ImageInfo>& shapes) {
  shapes.assign(examples.size(), ImageInfo());
  return ForEachExample(static_cast<int64_t>(examples.size()), threads, [&](int64_t i) {
    absl::StatusOr<ImageInfo> info = ProbeImageFile(examples[i].path);
    if (!info.ok()) return info.status();
    if (!size.keep()) info->height = size.rows, info->width = size.cols;
    shapes[i] = *info;
    return absl::OkStatus();
  });
}

// The set's image shape (channels x rows x cols) from its images' (as decoded): one size, and
// 3 channels unless every image is gray and `color` is false.
absl::Status SetShape(const std::vector<Example>& examples, const std::vector<ImageInfo>& shapes,
                      bool color, Dataset& data) {
  const int height = shapes[0].height, width = shapes[0].width;
  bool any_color = false;
  for (size_t i = 0; i < shapes.size(); ++i) {
    if (shapes[i].height != height || shapes[i].width != width) {
      return absl::InvalidArgumentError(
          absl::StrCat(examples[i].path, ": image is ", shapes[i].height, "x", shapes[i].width,
                       " (height x width) but ", examples[0].path, " is ", height, "x", width,
                       "; all images of a set must have one size, or give one to bring them "
                       "to (--image_size=S or HxW)"));
    }
    any_color = any_color || shapes[i].channels == 3;
  }
  data.channels = any_color || color ? 3 : 1;
  data.rows = height;
  data.cols = width;
  return absl::OkStatus();
}

int ThreadCount(const ImageFolderOptions& options) {
  if (options.threads > 0) return std::min(options.threads, 64);
  const int hardware = static_cast<int>(std::thread::hardware_concurrency());
  return std::clamp(hardware, 1, kMaxThreads);
}

// Folders under one class folder, at most: a link cycle would be endless.
constexpr size_t kMaxFoldersPerClass = 100000;

// The images of a class folder and of every folder under it, in torchvision's make_dataset
// order (sorted(os.walk(class_dir, followlinks=True)), each folder's files sorted): folders by
// path, byte order, then each folder's image files by name; '.'-names skipped.
absl::StatusOr<std::vector<std::string>> ListClassImages(const std::string& class_dir) {
  std::vector<std::string> folders = {class_dir};
  for (size_t i = 0; i < folders.size(); ++i) {
    absl::StatusOr<std::vector<std::string>> under =
        ListSorted(folders[i], [](const std::string& path, const std::string&) {
          std::error_code ec;
          return fs::is_directory(path, ec);
        });
    if (!under.ok()) return under.status();
    for (const std::string& name : *under) folders.push_back(JoinPath(folders[i], name));
    if (folders.size() > kMaxFoldersPerClass) {
      return absl::InvalidArgumentError(absl::StrCat(class_dir, ": more than ", kMaxFoldersPerClass,
                                                     " folders under it (a link cycle?)"));
    }
  }
  std::sort(folders.begin(), folders.end());
  std::vector<std::string> images;
  for (const std::string& folder : folders) {
    absl::StatusOr<std::vector<std::string>> files =
        ListSorted(folder, [](const std::string& path, const std::string& file) {
          std::error_code ec;
          return IsImageName(file) && fs::is_regular_file(path, ec);
        });
    if (!files.ok()) return files.status();
    for (const std::string& file : *files) images.push_back(JoinPath(folder, file));
  }
  return images;
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
    return absl::InvalidArgumentError(
        absl::StrCat(train_dir, ": ", classes->size(), " class folders; at most ", kMaxClasses));
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
    absl::StatusOr<std::vector<std::string>> files = ListClassImages(class_dir);
    if (!files.ok()) return files.status();
    if (files->empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(class_dir, ": no .png, .jpg or .jpeg files (in it or in its subfolders)"));
    }
    const int label = static_cast<int>(found - classes->begin());
    for (const std::string& file : *files) examples.push_back({file, label});
  }

  Dataset data;
  data.size = static_cast<int64_t>(examples.size());
  data.num_classes = static_cast<int>(classes->size());
  data.byte_storage = true;  // A quarter of the memory of floats (dataset.h).
  data.labels.resize(static_cast<size_t>(data.size));
  for (int64_t i = 0; i < data.size; ++i)
    data.labels[i] = static_cast<nn::Label>(examples[i].label);
  const int threads = ThreadCount(options);
  if (options.loading != DataLoading::kLoad) {
    std::vector<ImageInfo> shapes;
    if (absl::Status s = ProbeAll(examples, threads, options.size, shapes); !s.ok()) return s;
    if (absl::Status s = SetShape(examples, shapes, options.color, data); !s.ok()) return s;
    // Auto streams a set larger than its limit, or than a load may hold (DecodeAll's bound).
    const bool loadable = data.size * 3 * data.rows * data.cols <= options.max_load_values;
    if (options.loading == DataLoading::kStream || !loadable ||
        data.size * data.image_size() > options.stream_above_bytes) {
      std::vector<std::string> paths;
      paths.reserve(examples.size());
      for (Example& e : examples) paths.push_back(std::move(e.path));
      ImageStream::Options stream;
      stream.threads = threads;
      stream.size = options.size;
      absl::StatusOr<std::shared_ptr<ImageStream>> source =
          ImageStream::Create(std::move(paths), data.channels, data.rows, data.cols, stream);
      if (!source.ok()) return source.status();
      data.source = *std::move(source);
      return data;
    }
  }
  std::vector<DecodedImage> images;
  if (absl::Status s =
          DecodeAll(split_dir, examples, threads, options.size, options.max_load_values, images);
      !s.ok()) {
    return s;
  }
  std::vector<ImageInfo> shapes(images.size());
  for (size_t i = 0; i < images.size(); ++i) {
    shapes[i] = {images[i].width, images[i].height, images[i].channels};
  }
  if (absl::Status s = SetShape(examples, shapes, options.color, data); !s.ok()) return s;
  data.bytes.resize(static_cast<size_t>(data.size * data.image_size()));
  for (int64_t i = 0; i < data.size; ++i) {
    ToPlanes(images[i], data.channels, data.bytes.data() + i * data.image_size());
    std::vector<uint8_t>().swap(images[i].pixels);  // Frees as it goes.
  }
  return data;
}

}  // namespace dptrain
