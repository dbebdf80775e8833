// The worker's data from its config: the training and test sets of --data_dir (loaded, a test
// set held out where the data has none, checked to agree, cut to the subsets, normalised), and
// the loss they call for (--loss=auto: cross-entropy for class labels, mse for target values).
// Thread-compatible: the functions touch no shared state.
#ifndef DPTRAIN_WORKER_WORKER_DATA_H_
#define DPTRAIN_WORKER_WORKER_DATA_H_

#include <cstdint>
#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/data/dataset.h"
#include "worker/graph/graph_model.h"
#include "worker/worker_config.h"

namespace dptrain {

// The training and test sets of data.dir in data.format (detected when empty). Data without a
// test split is refused in one line naming the files it lacks, unless data.test_fraction
// holds one out of the training set (seeded by `seed`, the same on every rank; said on `log`,
// prefixed by `who`); the flag with a test split, or with --data_loading=stream, is refused.
// Both sets must hold the same kind, shape and targets; then each is cut to its subset and
// normalised (data.mean, data.std). The readers' errors otherwise.
absl::Status LoadWorkerData(const DataConfig& data, int threads, uint64_t seed,
                            const std::string& who, std::ostream& log, Dataset& train,
                            Dataset& test);

// The loss --loss calls for on `train` and `test`: auto is softmax cross-entropy for class
// labels and mse for target values. Target values need an ONNX model and mse, l1 or bce
// (whose targets must all be in [0, 1]); cross_entropy, label smoothing or class weights on
// them are refused. InvalidArgument naming the flag otherwise.
absl::StatusOr<graph::Loss> ChooseLoss(const WorkerConfig& config, const Dataset& train,
                                       const Dataset& test);

// What the data's samples are scored against, for the startup lines: "10 classes" or "2 target
// value(s) per sample (regression)".
std::string Scores(const Dataset& data);

}  // namespace dptrain

#endif  // DPTRAIN_WORKER_WORKER_DATA_H_
