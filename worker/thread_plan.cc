#include "worker/thread_plan.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace dptrain {

absl::StatusOr<ThreadPlan> PlanThreads(const ThreadPlanInputs& in) {
  if (in.local_workers < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("local world size must be >= 0, got ", in.local_workers));
  }
  ThreadPlan plan;
  if (in.flag != "auto") {
    int explicit_threads = 0;
    if (!absl::SimpleAtoi(in.flag, &explicit_threads) || explicit_threads < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--threads must be auto or an integer >= 0, got '", in.flag, "'"));
    }
    plan.threads = explicit_threads;
    plan.description =
        explicit_threads == 0
            ? "threads 0 (--threads=0: no pool, BLAS at its own default)"
            : absl::StrCat("threads ", explicit_threads, " (--threads=", explicit_threads, ")");
  } else {
    int cores = std::max(1, in.affinity_cores);
    std::string cores_from = absl::StrCat(cores, " cores in the affinity mask");
    if (in.cgroup_cores > 0 && in.cgroup_cores < cores) {
      cores = in.cgroup_cores;
      cores_from = absl::StrCat(cores, " cores of CPU quota (cgroup)");
    }
    const int workers = std::max(1, in.local_workers);
    plan.threads = std::max(1, cores / workers);
    plan.description = absl::StrCat("threads ", plan.threads, " (auto: ", cores_from, " / ",
                                    workers, " worker(s) on this host",
                                    in.local_workers == 0 ? ", none said otherwise" : "", ")");
  }
  if (plan.threads > 1) {
    // Measured (tools/compute_bench.sh's thread-plan table, docs/benchmarks/compute.md): a model of Linear layers
    // only (mlp) is fastest on BLAS's threads with no pool beside them, a model with
    // convolutions (LeNet, ResNet-18) with its layers split over the pool.
    plan.dense_gemm = nn::DenseGemm::kByModel;
    absl::StrAppend(&plan.description,
                    "; layers split over the model's pool, or, in a model without "
                    "convolutions, every GEMM on BLAS's threads and no pool");
  }
  return plan;
}

int AffinityCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  return online > 0 ? static_cast<int>(online) : 1;
}

int CgroupCpuLimit() {
  std::ifstream f("/sys/fs/cgroup/cpu.max");
  std::string quota, period;
  if (!(f >> quota >> period) || quota == "max") return 0;
  int64_t q = 0, p = 0;
  if (!absl::SimpleAtoi(quota, &q) || !absl::SimpleAtoi(period, &p) || q <= 0 || p <= 0) return 0;
  return static_cast<int>((q + p - 1) / p);
}

}  // namespace dptrain
