#include "tests/bench/comm_report.h"

#include "gtest/gtest.h"

namespace dptrain {
namespace {

TEST(CommReportTest, TrafficFollowsEachAlgorithm) {
  const double k = 64.0 * (1 << 20);
  EXPECT_DOUBLE_EQ(ModelTraffic("allreduce", 4, 1, k).bytes, 1.5 * k);  // 2(N-1)/N K.
  EXPECT_DOUBLE_EQ(ModelTraffic("allreduce", 4, 1, k).messages, 6);
  EXPECT_DOUBLE_EQ(ModelTraffic("master", 8, 1, k).bytes, 8 * k);   // N K.
  EXPECT_DOUBLE_EQ(ModelTraffic("ps", 8, 4, k).bytes, 2 * k);       // N K / S.
  EXPECT_DOUBLE_EQ(ModelTraffic("ps", 2, 4, k).bytes, k);           // A worker's own K.
}

TEST(CommReportTest, FitRecoversAKnownModel) {
  const double alpha = 1e-4, beta = 2e-9;
  std::vector<Result> results;
  for (int n : {2, 4, 8}) {
    for (double mib : {1.0, 16.0, 64.0}) {
      Result r;
      r.point = {"allreduce", n, 1, static_cast<int64_t>(mib * (1 << 18)), "x"};
      const Traffic t = ModelTraffic("allreduce", n, 1, r.point.bytes());
      r.seconds = alpha * t.messages + beta * t.bytes;
      results.push_back(r);
    }
  }
  const CostModel m = FitCostModel(results, "allreduce");
  EXPECT_NEAR(m.alpha, alpha, 1e-9);
  EXPECT_NEAR(m.beta, beta, 1e-14);
}

TEST(CommReportTest, BusBandwidthIsNcclTestsDefinition) {
  Result r;
  r.point = {"allreduce", 4, 1, 1 << 20, "x"};
  r.seconds = 0.5;
  EXPECT_DOUBLE_EQ(r.AlgBw(), 4.0 * (1 << 20) / 0.5);
  EXPECT_DOUBLE_EQ(r.BusBw(), r.AlgBw() * 1.5);
}

}  // namespace
}  // namespace dptrain
