// Reads a JSON number as a C++ arithmetic type, refusing what the type cannot hold.
//
// nlohmann's get<T>() converts unchecked: a float 1.4e19 read as int64_t, or 1e300 read as
// float, is undefined behaviour (UBSan reports it; the sparse checkpoint fuzzer found one),
// and 3.5 read as int silently becomes 3. Files and requests we parse use JsonNumber<T> so a
// bad value is an exception the parser already turns into a clear error.
#ifndef DPTRAIN_COMMON_JSON_NUMBER_H_
#define DPTRAIN_COMMON_JSON_NUMBER_H_

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

#include "nlohmann/json.hpp"

namespace dptrain {

// Integers: a JSON integer within T's range (a JSON float, even 3.0, is refused).
// Floating point: any JSON number whose magnitude T can hold, a nonzero one not rounding to
// zero (NaN and infinities cannot be written in JSON). Throws nlohmann::json::type_error (not
// a number of that kind) or nlohmann::json::out_of_range (outside T's range); both derive
// from nlohmann::json::exception.
template <typename T>
T JsonNumber(const nlohmann::json& v) {
  static_assert(std::is_arithmetic_v<T> && !std::is_same_v<T, bool>, "a number type");
  using Json = nlohmann::json;
  auto out_of_range = [&v]() {
    return Json::out_of_range::create(406, "number " + v.dump() + " is out of range", &v);
  };
  if constexpr (std::is_integral_v<T>) {
    if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<T>::max())) throw out_of_range();
      return static_cast<T>(u);
    }
    if (v.is_number_integer()) {
      const int64_t i = v.get<int64_t>();
      if constexpr (std::is_unsigned_v<T>) {
        if (i < 0) throw out_of_range();
      } else {
        if (i < static_cast<int64_t>(std::numeric_limits<T>::lowest()) ||
            i > static_cast<int64_t>(std::numeric_limits<T>::max())) {
          throw out_of_range();
        }
      }
      return static_cast<T>(i);
    }
    throw Json::type_error::create(302, "expected an integer, got " + v.dump(), &v);
  } else {
    if (!v.is_number()) {
      throw Json::type_error::create(302, "expected a number, got " + v.dump(), &v);
    }
    const double d = v.get<double>();
    if (std::isfinite(d) && std::fabs(d) > static_cast<double>(std::numeric_limits<T>::max())) {
      throw out_of_range();
    }
    // Nor a nonzero value too small for T (1e-50 as float would read as 0).
    if (d != 0 && static_cast<T>(d) == 0) throw out_of_range();
    return static_cast<T>(d);
  }
}

}  // namespace dptrain

#endif  // DPTRAIN_COMMON_JSON_NUMBER_H_
