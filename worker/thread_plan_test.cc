#include "worker/thread_plan.h"

#include "gtest/gtest.h"

namespace dptrain {
namespace {

ThreadPlan Plan(const std::string& flag, int cores, int local_workers, int cgroup = 0) {
  ThreadPlanInputs in;
  in.flag = flag;
  in.affinity_cores = cores;
  in.local_workers = local_workers;
  in.cgroup_cores = cgroup;
  absl::StatusOr<ThreadPlan> plan = PlanThreads(in);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.ok() ? *plan : ThreadPlan{};
}

TEST(ThreadPlanTest, AutoUsesEveryCoreOfALoneWorker) {
  ThreadPlan p = Plan("auto", 2, 0);
  EXPECT_EQ(p.threads, 2);
  EXPECT_EQ(p.dense_gemm, nn::DenseGemm::kByModel);
  EXPECT_NE(p.description.find("auto"), std::string::npos) << p.description;
  EXPECT_EQ(Plan("auto", 16, 1).threads, 16);
}

TEST(ThreadPlanTest, AutoDividesTheCoresAmongTheHostsWorkers) {
  EXPECT_EQ(Plan("auto", 2, 2).threads, 1);
  EXPECT_EQ(Plan("auto", 16, 4).threads, 4);
  EXPECT_EQ(Plan("auto", 16, 3).threads, 5);  // Rounded down: never oversubscribe.
  EXPECT_EQ(Plan("auto", 2, 8).threads, 1);   // More workers than cores: one each.
  EXPECT_EQ(Plan("auto", 2, 2).dense_gemm, nn::DenseGemm::kPoolSplit);  // 1 thread: no pool.
}

TEST(ThreadPlanTest, CgroupQuotaCapsTheAffinityMask) {
  EXPECT_EQ(Plan("auto", 64, 0, 4).threads, 4);
  EXPECT_EQ(Plan("auto", 64, 2, 4).threads, 2);
  EXPECT_EQ(Plan("auto", 2, 0, 8).threads, 2);  // A quota above the mask changes nothing.
  EXPECT_NE(Plan("auto", 64, 0, 4).description.find("quota"), std::string::npos);
}

TEST(ThreadPlanTest, AnExplicitCountWins) {
  EXPECT_EQ(Plan("1", 16, 0).threads, 1);
  EXPECT_EQ(Plan("3", 2, 2).threads, 3);
  ThreadPlan zero = Plan("0", 16, 0);
  EXPECT_EQ(zero.threads, 0);  // The old default: BLAS's own threads, no pool.
  EXPECT_EQ(zero.dense_gemm, nn::DenseGemm::kPoolSplit);
}

TEST(ThreadPlanTest, BadInputsAreInvalidArgument) {
  for (const char* flag : {"", "-1", "two", "1.5", "autox"}) {
    ThreadPlanInputs in;
    in.flag = flag;
    in.affinity_cores = 2;
    EXPECT_EQ(PlanThreads(in).status().code(), absl::StatusCode::kInvalidArgument) << flag;
  }
  ThreadPlanInputs in;
  in.local_workers = -1;
  EXPECT_EQ(PlanThreads(in).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ThreadPlanTest, TheSystemQueriesAnswerSomethingSane) {
  EXPECT_GE(AffinityCores(), 1);
  EXPECT_GE(CgroupCpuLimit(), 0);
}

}  // namespace
}  // namespace dptrain
