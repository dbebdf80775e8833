// The optimizer and learning-rate-schedule flags both binaries take (ps_server applies the
// optimizer in ps mode, gpu_worker in master and all-reduce mode), defined once here and
// read only by each binary's main. --lr, --momentum and --weight_decay stay in each main:
// their defaults differ (a worker's --lr is optional in ps mode).
#ifndef DPTRAIN_COMMON_OPTIMIZER_FLAGS_H_
#define DPTRAIN_COMMON_OPTIMIZER_FLAGS_H_

#include <optional>

#include "absl/status/statusor.h"
#include "common/lr_schedule.h"
#include "common/optimizer.h"

namespace dptrain {

// `base` (learning rate, momentum, weight decay from the binary's own flags) with
// --optimizer, --nesterov, --beta1, --beta2 and --eps; InvalidArgument naming the flag for an
// unknown optimizer or a bad value.
absl::StatusOr<OptimizerOptions> OptimizerFromFlags(OptimizerOptions base);

// The schedule of --lr_schedule, --warmup_steps, --lr_step_size, --lr_gamma,
// --lr_total_steps, --lr_min and --scale_lr (x `workers`) around `base_lr`; nullopt for a
// constant rate without warmup or scaling (then the optimizer's own rate holds).
// InvalidArgument naming the problem for an unknown schedule or bad values.
absl::StatusOr<std::optional<LrScheduleOptions>> LrScheduleFromFlags(double base_lr, int workers);

}  // namespace dptrain

#endif  // DPTRAIN_COMMON_OPTIMIZER_FLAGS_H_
