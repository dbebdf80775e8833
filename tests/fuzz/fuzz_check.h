// FUZZ_CHECK for the fuzz targets: an invariant that must hold for every input. A failure
// prints the condition and aborts, which libFuzzer reports as a crash with the input saved.
#ifndef DPTRAIN_TESTS_FUZZ_FUZZ_CHECK_H_
#define DPTRAIN_TESTS_FUZZ_FUZZ_CHECK_H_

#include <cstdio>
#include <cstdlib>

#define FUZZ_CHECK(condition)                                                                 \
  do {                                                                                        \
    if (!(condition)) {                                                                       \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK failed: %s\n", __FILE__, __LINE__, #condition); \
      std::abort();                                                                           \
    }                                                                                         \
  } while (0)

#endif  // DPTRAIN_TESTS_FUZZ_FUZZ_CHECK_H_
