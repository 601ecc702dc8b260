/*
 * The C tests' one check: EXPECT(condition, printf-style message) counts a failure and says
 * where, and the test goes on; `failures` is what main returns on.
 */
#ifndef RINGREDUCE_NCCL_TEST_EXPECT_H
#define RINGREDUCE_NCCL_TEST_EXPECT_H

#include <stdio.h>

static int failures = 0;

#define EXPECT(cond, ...)                                                  \
  do {                                                                     \
    if (!(cond)) {                                                         \
      failures++;                                                          \
      fprintf(stderr, "FAILED %s:%d: %s: ", __FILE__, __LINE__, #cond);    \
      fprintf(stderr, __VA_ARGS__);                                        \
      fprintf(stderr, "\n");                                               \
    }                                                                      \
  } while (0)

#endif
