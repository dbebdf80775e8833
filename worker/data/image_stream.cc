#include "worker/data/image_stream.h"

#include <algorithm>
#include <cstring>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/data/image_decode.h"

namespace dptrain {
namespace {

constexpr int kMaxThreads = 8;
constexpr int64_t kMaxWindow = 8192;

}  // namespace

absl::StatusOr<std::shared_ptr<ImageStream>> ImageStream::Create(std::vector<std::string> paths,
                                                                 int channels, int rows, int cols,
                                                                 const Options& options) {
  if (paths.empty()) return absl::InvalidArgumentError("image stream: no images");
  if ((channels != 1 && channels != 3) || rows < 1 || cols < 1 || rows > kMaxDecodedSide ||
      cols > kMaxDecodedSide) {
    return absl::InvalidArgumentError(
        absl::StrCat("image stream: bad image shape ", channels, "x", rows, "x", cols));
  }
  int threads = options.threads;
  if (threads <= 0) {
    threads = std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, kMaxThreads);
  }
  threads = std::min(threads, 64);
  const int64_t image_bytes = int64_t{channels} * rows * cols;
  const int64_t window =
      std::clamp<int64_t>(options.window_bytes / image_bytes, 2 * int64_t{threads}, kMaxWindow);
  std::shared_ptr<ImageStream> stream(
      new ImageStream(std::move(paths), channels, rows, cols, options, window));
  for (int t = 0; t < threads; ++t) {
    try {
      stream->threads_.emplace_back([s = stream.get()] { s->DecodeLoop(); });
    } catch (const std::system_error&) {
      break;  // Fewer threads (or none: reads then decode on the caller's thread).
    }
  }
  return stream;
}

ImageStream::ImageStream(std::vector<std::string> paths, int channels, int rows, int cols,
                         const Options& options, int64_t window)
    : paths_(std::move(paths)),
      channels_(channels),
      rows_(rows),
      cols_(cols),
      size_(options.size),
      window_(window),
      image_bytes_(int64_t{channels} * rows * cols),
      slots_(static_cast<size_t>(window)) {}

ImageStream::~ImageStream() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

absl::Status ImageStream::Decode(int64_t index, std::vector<uint8_t>& out) const {
  if (index < 0 || index >= static_cast<int64_t>(paths_.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("image stream: index ", index, " outside [0, ", paths_.size(), ")"));
  }
  const std::string& path = paths_[index];
  absl::StatusOr<DecodedImage> image = DecodeImageFile(path);
  if (!image.ok()) return image.status();
  if (!size_.keep()) *image = FitImage(*image, size_);
  if (image->height != rows_ || image->width != cols_ || image->channels > channels_) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": image is ", image->channels, "x", image->height, "x", image->width,
                     " (channels x height x width) but the set's images are ", channels_, "x",
                     rows_, "x", cols_, " (was the file changed after the set was listed?)"));
  }
  out.resize(static_cast<size_t>(image_bytes_));
  ToPlanes(*image, channels_, out.data());
  return absl::OkStatus();
}

bool ImageStream::HasWorkLocked() const {
  return stopping_ ||
         (next_ - base_ < static_cast<int64_t>(plan_.size()) && next_ < consumed_ + window_);
}

void ImageStream::DecodeLoop() {
  std::vector<uint8_t> bytes;
  absl::MutexLock lock(&mu_);
  while (true) {
    mu_.Await(absl::Condition(this, &ImageStream::HasWorkLocked));
    if (stopping_) return;
    const int64_t position = next_++;
    const int64_t index = plan_[position - base_];
    mu_.Unlock();
    absl::Status status = Decode(index, bytes);
    mu_.Lock();
    // Kept unless a new plan put another image at this position, or it was read meanwhile.
    if (position < consumed_ || position - base_ >= static_cast<int64_t>(plan_.size()) ||
        plan_[position - base_] != index) {
      continue;
    }
    Slot& slot = slots_[position % window_];
    slot.position = position;
    slot.status = std::move(status);
    std::swap(slot.bytes, bytes);
  }
}

void ImageStream::Plan(absl::Span<const int64_t> order) {
  absl::MutexLock lock(&mu_);
  // The images already decoded (or being decoded) for the positions from consumed_ that the new
  // order keeps are kept; the rest of the window is decoded again.
  int64_t kept = 0;
  while (consumed_ + kept < next_ && kept < static_cast<int64_t>(order.size()) &&
         plan_[consumed_ + kept - base_] == order[kept]) {
    ++kept;
  }
  for (Slot& slot : slots_) {
    if (slot.position >= consumed_ + kept) slot.position = -1;
  }
  plan_.assign(order.begin(), order.end());
  base_ = consumed_;
  next_ = consumed_ + kept;
  ++plans_;  // A reader waiting on the old plan decodes on its own thread instead.
}

absl::Status ImageStream::Read(int64_t index, uint8_t* out) {
  std::vector<uint8_t> bytes;
  bool from_plan = false;
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    const int64_t position = consumed_;
    if (!threads_.empty() && position - base_ < static_cast<int64_t>(plan_.size()) &&
        plan_[position - base_] == index) {
      // Until the image is there, or another reader took this position, or a new plan came:
      // then the slot is not this read's, and it decodes on this thread.
      Slot& slot = slots_[position % window_];
      const int64_t plans = plans_;
      auto ready = [&slot, position, plans, this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return slot.position == position || consumed_ != position || plans_ != plans || stopping_;
      };
      mu_.Await(absl::Condition(&ready));
      if (slot.position == position && consumed_ == position && plans_ == plans) {
        std::swap(bytes, slot.bytes);
        status = std::move(slot.status);
        slot.position = -1;
        ++consumed_;  // Frees the slot: the decoders may go one further.
        from_plan = true;
      }
    }
    ++(from_plan ? planned_reads_ : unplanned_reads_);
  }
  if (!from_plan) status = Decode(index, bytes);
  if (!status.ok()) return status;
  std::memcpy(out, bytes.data(), bytes.size());
  return absl::OkStatus();
}

int64_t ImageStream::planned_reads() const {
  absl::MutexLock lock(&mu_);
  return planned_reads_;
}

int64_t ImageStream::unplanned_reads() const {
  absl::MutexLock lock(&mu_);
  return unplanned_reads_;
}

}  // namespace dptrain
