#include "common/optimizer_flags.h"

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"

ABSL_FLAG(std::string, optimizer, "sgd",
          "sgd (momentum, L2 weight decay), adam (L2 weight decay) or adamw (decoupled "
          "weight decay), with torch.optim's update rules; ps_server also takes none (the "
          "shards only average: each push is answered with the mean gradient, which the "
          "workers' own optimizers apply, as dptrain.torch's DistributedOptimizer does).");
ABSL_FLAG(bool, nesterov, false,
          "sgd with --momentum > 0: Nesterov momentum, as torch.optim.SGD(nesterov=True).");
ABSL_FLAG(double, beta1, 0.9, "adam/adamw: decay of the first moment, in [0, 1).");
ABSL_FLAG(double, beta2, 0.999, "adam/adamw: decay of the second moment, in [0, 1).");
ABSL_FLAG(double, eps, 1e-8, "adam/adamw: added to the denominator, > 0.");
ABSL_FLAG(std::string, lr_schedule, "constant",
          "constant, step (x --lr_gamma every --lr_step_size steps) or cosine (to --lr_min at "
          "--lr_total_steps); a pure function of the step, the same in every mode.");
ABSL_FLAG(int64_t, warmup_steps, 0,
          "Linear warmup: step s < N runs at rate * (s + 1) / N (Goyal et al.).");
ABSL_FLAG(int64_t, lr_step_size, 1, "step schedule: steps between two decays.");
ABSL_FLAG(double, lr_gamma, 0.1, "step schedule: the decay factor.");
ABSL_FLAG(int64_t, lr_total_steps, 0, "cosine schedule: steps until --lr_min (warmup included).");
ABSL_FLAG(double, lr_min, 0.0, "cosine schedule: the final rate.");
ABSL_FLAG(bool, scale_lr, false,
          "Multiply the rate by the number of workers (the linear scaling rule for a global "
          "batch that grows with them).");

namespace dptrain {
namespace {

absl::Status Named(const char* flag, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat("--", flag, ": ", s.message()));
}

}  // namespace

absl::StatusOr<OptimizerOptions> OptimizerFromFlags(OptimizerOptions base) {
  base.name = absl::GetFlag(FLAGS_optimizer);
  base.nesterov = absl::GetFlag(FLAGS_nesterov);
  base.beta1 = absl::GetFlag(FLAGS_beta1);
  base.beta2 = absl::GetFlag(FLAGS_beta2);
  base.eps = absl::GetFlag(FLAGS_eps);
  if (absl::Status s = CreateOptimizer(base).status(); !s.ok()) return Named("optimizer", s);
  return base;
}

absl::StatusOr<std::optional<LrScheduleOptions>> LrScheduleFromFlags(double base_lr,
                                                                     int workers) {
  LrScheduleOptions o;
  o.name = absl::GetFlag(FLAGS_lr_schedule);
  o.base_lr = base_lr;
  o.warmup_steps = absl::GetFlag(FLAGS_warmup_steps);
  o.step_size = absl::GetFlag(FLAGS_lr_step_size);
  o.gamma = absl::GetFlag(FLAGS_lr_gamma);
  o.total_steps = absl::GetFlag(FLAGS_lr_total_steps);
  o.min_lr = absl::GetFlag(FLAGS_lr_min);
  o.scale = absl::GetFlag(FLAGS_scale_lr) ? workers : 1;
  if (absl::Status s = ValidateLrSchedule(o); !s.ok()) return Named("lr_schedule", s);
  if (o.name == "constant" && o.warmup_steps == 0 && o.scale == 1) return std::nullopt;
  return o;
}

}  // namespace dptrain
