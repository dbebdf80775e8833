#include "common/loss_scaler.h"

#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace dptrain {
namespace {

TEST(LossScalerTest, GradScalerSemantics) {
  LossScalerOptions o;
  o.growth_interval = 3;
  auto s = LossScaler::Create(o);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->scale(), 65536.0f);
  // Overflow: halve and skip.
  EXPECT_FALSE(s->Update(true));
  EXPECT_EQ(s->scale(), 32768.0f);
  // Three finite steps in a row: double once.
  EXPECT_TRUE(s->Update(false));
  EXPECT_TRUE(s->Update(false));
  EXPECT_EQ(s->scale(), 32768.0f);
  EXPECT_TRUE(s->Update(false));
  EXPECT_EQ(s->scale(), 65536.0f);
  EXPECT_EQ(s->growth_tracker(), 0);
  // An overflow resets the run of finite steps.
  EXPECT_TRUE(s->Update(false));
  EXPECT_TRUE(s->Update(false));
  EXPECT_FALSE(s->Update(true));
  EXPECT_EQ(s->growth_tracker(), 0);
  EXPECT_TRUE(s->Update(false));
  EXPECT_TRUE(s->Update(false));
  EXPECT_EQ(s->scale(), 32768.0f);
}

TEST(LossScalerTest, DefaultsAreTorchsAndBadOptionsFail) {
  auto s = LossScaler::Create({});
  ASSERT_TRUE(s.ok());
  for (int i = 0; i < 1999; ++i) s->Update(false);
  EXPECT_EQ(s->scale(), 65536.0f);
  s->Update(false);
  EXPECT_EQ(s->scale(), 131072.0f);
  LossScalerOptions bad;
  bad.backoff_factor = 1.0f;
  EXPECT_FALSE(LossScaler::Create(bad).ok());
  bad = {};
  bad.growth_interval = 0;
  EXPECT_FALSE(LossScaler::Create(bad).ok());
  bad = {};
  bad.initial_scale = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(LossScaler::Create(bad).ok());
}

TEST(LossScalerTest, NeverGrowsPastFloatMax) {
  LossScalerOptions o;
  o.initial_scale = 3e38f;
  o.growth_interval = 1;
  auto s = LossScaler::Create(o);
  ASSERT_TRUE(s.ok());
  s->Update(false);
  EXPECT_EQ(s->scale(), 3e38f);
}

TEST(LossScalerTest, FindsInfAndNan) {
  std::vector<float> v(1001, 1.5f);
  EXPECT_FALSE(HasNonFinite(v));
  v[777] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(HasNonFinite(v));
  v[777] = -std::numeric_limits<float>::infinity();
  EXPECT_TRUE(HasNonFinite(v));
  v[777] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(HasNonFinite(v));
  v[777] = std::numeric_limits<float>::max();
  EXPECT_FALSE(HasNonFinite(v));
  EXPECT_FALSE(HasNonFinite({}));
}

}  // namespace
}  // namespace dptrain
