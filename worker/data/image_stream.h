// The images of an image folder decoded as training reaches them, not all at load: for a set
// whose decoded images would not fit in memory (ImageNet's 1.28M photos at 224x224 are 180 GiB
// of bytes), as torchvision's DataLoader workers do. A pool of threads reads and decodes the
// images of the planned order (ImageSource::Plan: the trainer's sample order) a bounded window
// ahead of the reader, so decoding overlaps the steps; a read outside the plan is decoded on the
// caller's thread. Every read gives the bytes LoadImageFolder would hold for that image (the
// same decode, resize and channel layout: worker/data/image_decode.h, image_resize.h), so
// training on a stream and on the loaded set is the same computation bit for bit.
//
// Decoding an image each time it is read costs every epoch what loading costs once; the
// worker streams only when asked (--data_loading=stream) or when the decoded set would take
// more than a quarter of the machine's memory (auto; worker/data/data_source.h).
//
// Thread-safe. The destructor stops the threads (an image being decoded is finished first).
#ifndef DPTRAIN_WORKER_DATA_IMAGE_STREAM_H_
#define DPTRAIN_WORKER_DATA_IMAGE_STREAM_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "worker/data/dataset.h"
#include "worker/data/image_resize.h"

namespace dptrain {

class ImageStream final : public ImageSource {
 public:
  struct Options {
    // Decoding threads (at least 1 is asked for; if none can start, reads decode on the
    // caller's thread). 0: min(std::thread::hardware_concurrency(), 8).
    int threads = 0;
    // The size every image is brought to (default: kept; each must then be rows x cols).
    ImageSize size;
    // Decoded images held ahead of the reader, at most (and at least 2 per thread).
    int64_t window_bytes = int64_t{64} << 20;
  };

  // Image i is the file paths[i]; each decodes (after options.size) to rows x cols, and is
  // held as `channels` planes (1, or 3 with gray images replicated). InvalidArgument for an
  // empty list or a shape out of range; nothing is read before the first Plan or Read.
  static absl::StatusOr<std::shared_ptr<ImageStream>> Create(std::vector<std::string> paths,
                                                             int channels, int rows, int cols,
                                                             const Options& options);
  ~ImageStream() override;
  ImageStream(const ImageStream&) = delete;
  ImageStream& operator=(const ImageStream&) = delete;

  void Plan(absl::Span<const int64_t> order) override;
  // The file's read or decode error (naming it), or InvalidArgument naming it when it decodes
  // to another size than rows x cols, or to color in a gray set.
  absl::Status Read(int64_t index, uint8_t* out) override;

  // Reads answered from the plan's decoded window, and decoded on the caller's thread.
  int64_t planned_reads() const;
  int64_t unplanned_reads() const;

 private:
  struct Slot {
    int64_t position = -1;  // The plan position it holds (absolute), or -1.
    absl::Status status;
    std::vector<uint8_t> bytes;
  };

  ImageStream(std::vector<std::string> paths, int channels, int rows, int cols,
              const Options& options, int64_t window);
  // Image `index`, read and decoded, into `out` (image bytes).
  absl::Status Decode(int64_t index, std::vector<uint8_t>& out) const;
  void DecodeLoop();
  bool HasWorkLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::vector<std::string> paths_;
  const int channels_, rows_, cols_;
  const ImageSize size_;
  const int64_t window_;  // Slots: positions [consumed_, consumed_ + window_) may be held.
  const int64_t image_bytes_;

  mutable absl::Mutex mu_;
  // The plan: positions are absolute (they go on growing across plans); plan_[k] is the image
  // of position base_ + k. Positions below consumed_ were read; next_ is the next one to decode.
  std::vector<int64_t> plan_ ABSL_GUARDED_BY(mu_);
  int64_t base_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t consumed_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mu_);  // Position p in slots_[p % window_].
  int64_t plans_ ABSL_GUARDED_BY(mu_) = 0;        // Plans made so far.
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t planned_reads_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t unplanned_reads_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::thread> threads_;
};

}  // namespace dptrain

#endif  // DPTRAIN_WORKER_DATA_IMAGE_STREAM_H_
