// From a Dataset to a model's input: the one check that the data's images are the shape the
// model takes (before any step, so that a mismatch is one clear error rather than a step that
// reads past its batch buffer), and the gathering of a batch, bounded by its buffers.
// Thread-compatible: the functions touch no shared state.
#ifndef DPTRAIN_WORKER_DATA_BATCH_H_
#define DPTRAIN_WORKER_DATA_BATCH_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "worker/data/dataset.h"

namespace dptrain {

// The shape of one input sample: channels x height x width; or, where `ids`, `channels`
// integer ids (token or category ids: height and width 1; Dataset::ids).
struct ImageShape {
  int channels = 1;
  int height = 0;
  int width = 0;
  bool ids = false;
  // Ids: every one must be below this (the model's embedding tables' rows); 0: not checked.
  int64_t ids_below = 0;
};

// OK if `data`'s samples are `model_input` (the same kind, images or ids, and the same shape)
// and, for ids, each is below model_input.ids_below; else InvalidArgument naming `what` (e.g.
// "the training set"), both shapes and `model`, or the first id out of range (sample, position).
absl::Status CheckImageShape(const Dataset& data, const ImageShape& model_input,
                             absl::string_view model, absl::string_view what);

// Copies the images and labels of `indices` into the front of `images` and `labels` (of a
// regression set, Dataset::regression(): their target values into `targets`, and `labels` is
// not used). InvalidArgument (copying nothing) for an index outside the data set, or buffers
// too small for indices.size() samples of data.image_size() values (and their targets); the
// error of a source's read (Dataset::source) when one fails.
absl::Status GatherBatch(const Dataset& data, absl::Span<const int64_t> indices,
                         absl::Span<float> images, absl::Span<nn::Label> labels,
                         absl::Span<float> targets = {});

}  // namespace dptrain

#endif  // DPTRAIN_WORKER_DATA_BATCH_H_
