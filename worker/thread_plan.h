// How many math threads a CPU worker uses and how its layers use them, from what the process
// may run on and how many workers share the host. A pure function (PlanThreads) plus the two
// system queries main feeds it (AffinityCores, CgroupCpuLimit).
#ifndef DPTRAIN_WORKER_THREAD_PLAN_H_
#define DPTRAIN_WORKER_THREAD_PLAN_H_

#include <string>

#include "absl/status/statusor.h"
#include "worker/nn/thread_pool.h"

namespace dptrain {

struct ThreadPlanInputs {
  // --threads as given: "auto", or an integer >= 0 (an explicit count, which wins; 0 keeps the
  // old meaning: no pool, the BLAS library's own default).
  std::string flag = "auto";
  // CPUs this process may run on (sched_getaffinity), >= 1.
  int affinity_cores = 1;
  // A container's CPU quota in whole cores (cgroup cpu.max rounded up), 0 for none.
  int cgroup_cores = 0;
  // Workers sharing this host's cores: --local_world_size, else $LOCAL_WORLD_SIZE (torchrun and
  // deploy/local_cluster.sh set it), 0 when nobody said (counted as 1: compose and Kubernetes
  // run one worker per container).
  int local_workers = 0;
};

struct ThreadPlan {
  int threads = 1;                                       // nn::ModelOptions::threads
  nn::DenseGemm dense_gemm = nn::DenseGemm::kPoolSplit;  // nn::ModelOptions::dense_gemm
  std::string description;  // For the startup line: what was chosen and why.
};

// The plan. "auto": threads = max(1, cores / local workers), cores = the affinity count capped
// by the cgroup quota. With more than one thread, every layer splits over the model's pool,
// except in a model without convolutions, which has no pool and runs each GEMM on BLAS's
// threads (DenseGemm::kByModel: the faster way per model as measured on the 2-core machine,
// tools/compute_bench.sh, docs/benchmarks/compute.md). An explicit count wins over auto, with the same
// rule. InvalidArgument for a flag that is neither "auto" nor an integer >= 0, or for
// local_workers < 0.
absl::StatusOr<ThreadPlan> PlanThreads(const ThreadPlanInputs& in);

// CPUs in this process's affinity mask (sched_getaffinity); the online CPU count if that fails.
int AffinityCores();

// Whole cores of the cgroup v2 CPU quota (/sys/fs/cgroup/cpu.max, rounded up), 0 if unlimited or
// unreadable.
int CgroupCpuLimit();

}  // namespace dptrain

#endif  // DPTRAIN_WORKER_THREAD_PLAN_H_
