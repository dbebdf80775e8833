#include "common/json_number.h"

#include <cstdint>
#include <limits>

#include "gtest/gtest.h"

namespace dptrain {
namespace {

using Json = nlohmann::json;

TEST(JsonNumberTest, IntegersInRangeAreRead) {
  EXPECT_EQ(JsonNumber<int>(Json::parse("7")), 7);
  EXPECT_EQ(JsonNumber<int>(Json::parse("-7")), -7);
  EXPECT_EQ(JsonNumber<int64_t>(Json::parse("-9223372036854775808")),
            std::numeric_limits<int64_t>::lowest());
  EXPECT_EQ(JsonNumber<uint64_t>(Json::parse("18446744073709551615")),
            std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(JsonNumber<int>(Json::parse("2147483647")), 2147483647);
}

TEST(JsonNumberTest, IntegersOutOfRangeAreRefused) {
  EXPECT_THROW(JsonNumber<int>(Json::parse("2147483648")), Json::out_of_range);
  EXPECT_THROW(JsonNumber<int>(Json::parse("-2147483649")), Json::out_of_range);
  EXPECT_THROW(JsonNumber<int64_t>(Json::parse("9223372036854775808")), Json::out_of_range);
  EXPECT_THROW(JsonNumber<uint64_t>(Json::parse("-1")), Json::out_of_range);
}

TEST(JsonNumberTest, FloatsAreNotIntegers) {
  // The fuzzer's case: a float far beyond int64 (get<int64_t>() is undefined behaviour there).
  EXPECT_THROW(JsonNumber<int64_t>(Json::parse("1.44444e+19")), Json::type_error);
  EXPECT_THROW(JsonNumber<int>(Json::parse("3.0")), Json::type_error);
  EXPECT_THROW(JsonNumber<int>(Json::parse("\"3\"")), Json::type_error);
  EXPECT_THROW(JsonNumber<int>(Json::parse("true")), Json::type_error);
  EXPECT_THROW(JsonNumber<int>(Json::parse("null")), Json::type_error);
}

TEST(JsonNumberTest, FloatingPoint) {
  EXPECT_EQ(JsonNumber<double>(Json::parse("0.5")), 0.5);
  EXPECT_EQ(JsonNumber<float>(Json::parse("3")), 3.0f);
  EXPECT_EQ(JsonNumber<double>(Json::parse("1e300")), 1e300);
  EXPECT_THROW(JsonNumber<float>(Json::parse("1e300")), Json::out_of_range);
  EXPECT_THROW(JsonNumber<float>(Json::parse("-1e39")), Json::out_of_range);
  EXPECT_EQ(JsonNumber<float>(Json::parse("3.4e38")), 3.4e38f);
  EXPECT_THROW(JsonNumber<double>(Json::parse("\"0.5\"")), Json::type_error);
  EXPECT_THROW(JsonNumber<float>(Json::parse("1e-50")), Json::out_of_range);  // Not 0.
  EXPECT_EQ(JsonNumber<float>(Json::parse("0.0")), 0.0f);
  EXPECT_EQ(JsonNumber<double>(Json::parse("1e-50")), 1e-50);
}

TEST(JsonNumberTest, ErrorsNameTheValue) {
  try {
    JsonNumber<int>(Json::parse("4294967296"));
    FAIL() << "no exception";
  } catch (const Json::exception& e) {
    EXPECT_NE(std::string(e.what()).find("4294967296"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dptrain
