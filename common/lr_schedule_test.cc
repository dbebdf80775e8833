#include "common/lr_schedule.h"

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace dptrain {
namespace {

// The rates of torch.optim.lr_scheduler, written by tools/make_optimizer_fixtures.py.
struct TorchSchedule {
  const char* name;
  LrScheduleOptions options;
  std::vector<double> rates;  // Of steps 0, 1, ...
};

const std::vector<TorchSchedule>& Schedules() {
  static const auto* schedules = new std::vector<TorchSchedule>{
#include "common/testdata/lr_schedule_fixtures.inc"
  };
  return *schedules;
}

class TorchScheduleTest : public ::testing::TestWithParam<size_t> {};

TEST_P(TorchScheduleTest, MatchesTorch) {
  const TorchSchedule& s = Schedules()[GetParam()];
  ASSERT_TRUE(ValidateLrSchedule(s.options).ok()) << ValidateLrSchedule(s.options);
  for (size_t step = 0; step < s.rates.size(); ++step) {
    const double lr = LearningRateAt(s.options, static_cast<int64_t>(step));
    EXPECT_LE(std::abs(lr - s.rates[step]), 1e-6 * s.rates[step])
        << "step " << step << ": " << lr << " vs torch " << s.rates[step];
  }
}

INSTANTIATE_TEST_SUITE_P(Torch, TorchScheduleTest, ::testing::Range<size_t>(0, Schedules().size()),
                         [](const ::testing::TestParamInfo<size_t>& info) {
                           return std::string(Schedules()[info.param].name);
                         });

LrScheduleOptions Cosine() {
  LrScheduleOptions o;
  o.name = "cosine";
  o.base_lr = 0.1;
  o.warmup_steps = 2;
  o.total_steps = 10;
  o.min_lr = 0.01;
  return o;
}

TEST(LrScheduleTest, CosineStaysAtMinLrFromTotalSteps) {
  const LrScheduleOptions o = Cosine();
  EXPECT_GT(LearningRateAt(o, 9), 0.01f);
  for (int64_t step : {10, 11, 15, 1000}) EXPECT_EQ(LearningRateAt(o, step), 0.01f) << step;
}

TEST(LrScheduleTest, WarmupRampsToTheScaledRateWithoutAZeroStep) {
  LrScheduleOptions o;
  o.base_lr = 0.1;
  o.scale = 8;  // 8 workers, Goyal et al.
  o.warmup_steps = 4;
  EXPECT_FLOAT_EQ(LearningRateAt(o, 0), 0.2f);
  EXPECT_FLOAT_EQ(LearningRateAt(o, 3), 0.8f);
  EXPECT_FLOAT_EQ(LearningRateAt(o, 4), 0.8f);
  EXPECT_FLOAT_EQ(LearningRateAt(o, -5), LearningRateAt(o, 0));  // A negative step counts as 0.
}

TEST(LrScheduleTest, ConstantWithoutWarmupIsTheBaseRate) {
  LrScheduleOptions o;
  ASSERT_TRUE(ValidateLrSchedule(o).ok());
  for (int64_t step : {0, 1, 1000000}) EXPECT_EQ(LearningRateAt(o, step), 0.1f);
}

struct BadSchedule {
  std::function<void(LrScheduleOptions&)> change;
  std::string message;
};

TEST(LrScheduleTest, RejectsBadOptionsNamingTheField) {
  const std::vector<BadSchedule> cases = {
      {[](auto& o) { o.name = "onecycle"; },
       "unknown lr schedule 'onecycle' (expected one of: constant, step, cosine)"},
      {[](auto& o) { o.base_lr = -0.1; }, "lr schedule: base_lr must be finite and >= 0, got -0.1"},
      {[](auto& o) { o.base_lr = NAN; }, "lr schedule: base_lr must be finite and >= 0, got nan"},
      {[](auto& o) { o.scale = 0; }, "lr schedule: scale must be finite and > 0, got 0"},
      {[](auto& o) { o.warmup_steps = -1; }, "lr schedule: warmup_steps must be >= 0, got -1"},
      {[](auto& o) { o.name = "step", o.step_size = 0; },
       "lr schedule: step_size must be >= 1 for step, got 0"},
      {[](auto& o) { o.name = "step", o.gamma = -0.5; },
       "lr schedule: gamma must be finite and > 0 for step, got -0.5"},
      {[](auto& o) { o.total_steps = 2; },
       "lr schedule: total_steps must be > warmup_steps (2) for cosine, got 2"},
      {[](auto& o) { o.min_lr = -1; }, "lr schedule: min_lr must be finite and >= 0, got -1"},
      {[](auto& o) { o.min_lr = 0.2; },
       "lr schedule: min_lr must be <= base_lr * scale for cosine, got 0.2"},
  };
  for (const BadSchedule& c : cases) {
    LrScheduleOptions o = Cosine();
    c.change(o);
    const absl::Status status = ValidateLrSchedule(o);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_EQ(status.message(), c.message);
  }
}

TEST(LrScheduleTest, FieldsOfOtherSchedulesAreIgnored) {
  LrScheduleOptions o;  // constant
  o.step_size = 0;
  o.total_steps = -3;
  EXPECT_TRUE(ValidateLrSchedule(o).ok());
}

}  // namespace
}  // namespace dptrain
