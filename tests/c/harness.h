/*
 * harness.h — a tiny test harness for the plain-C tests of libcolocated.
 *
 * Each test binary includes this header exactly once (it defines `main`):
 *
 *   #include "harness.h"
 *   TEST(buffer_round_trips_float32) {
 *     colocated_client *client = make_client(2);
 *     CHECK_OK(colocated_...(...));
 *     CHECK_CODE(colocated_...(NULL, ...), COLOCATED_INVALID_ARGUMENT);
 *     CHECK_CODE_MSG(colocated_...(...), COLOCATED_NOT_FOUND, "no device");
 *     CHECK(count == 4);
 *     colocated_client_destroy(client);
 *   }
 *
 * Every test runs in its own forked child process, so a crash, an AddressSanitizer
 * report or a LeakSanitizer report (which fires when the child exits) fails exactly
 * the test that caused it. A failing CHECK prints where and why, then abandons the
 * test (longjmp back to the harness). EXPECT records a failure without leaving the
 * test: it is the one to use from callbacks and native functions, which run on
 * other threads.
 *
 * The last line printed is exactly `N passed, M failed` (CI reads it); the exit
 * status is non-zero when any test failed.
 *
 * Usage: ./test_x [substring]          runs the tests whose name contains substring
 *        HARNESS_NO_FORK=1 ./test_x     runs in one process (for gdb)
 *        HARNESS_TIMEOUT=seconds        per-test limit (default 30)
 */
#ifndef COLOCATED_TEST_HARNESS_H
#define COLOCATED_TEST_HARNESS_H

#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "colocated.h"

typedef void (*harness_fn)(void);

struct harness_test {
  const char *name;
  harness_fn fn;
};

/* Harness functions; not every test file uses each. */
#define HARNESS_FN static __attribute__((unused))

#define HARNESS_MAX_TESTS 512
static struct harness_test harness_tests[HARNESS_MAX_TESTS];
static int harness_num_tests;
static atomic_int harness_failed;
static jmp_buf harness_jmp;

HARNESS_FN void harness_register(const char *name, harness_fn fn) {
  if (harness_num_tests == HARNESS_MAX_TESTS) {
    fprintf(stderr, "harness: more than %d tests\n", HARNESS_MAX_TESTS);
    abort();
  }
  harness_tests[harness_num_tests].name = name;
  harness_tests[harness_num_tests].fn = fn;
  harness_num_tests++;
}

/* Defines and registers a test. Names say the behaviour they pin down. */
#define TEST(name)                                                            \
  static void harness_test_##name(void);                                      \
  __attribute__((constructor)) static void harness_register_##name(void) {    \
    harness_register(#name, harness_test_##name);                             \
  }                                                                           \
  static void harness_test_##name(void)

/* Records a failure (thread-safe) without leaving the test. */
__attribute__((format(printf, 3, 4))) HARNESS_FN void harness_note(const char *file, int line, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "%s:%d: FAILED: ", file, line);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  fflush(stderr);
  atomic_store(&harness_failed, 1);
}

/* Records a failure and abandons the test (main test thread only). */
#define HARNESS_ABANDON() longjmp(harness_jmp, 1)

#define FAIL(...)                                \
  do {                                           \
    harness_note(__FILE__, __LINE__, __VA_ARGS__); \
    HARNESS_ABANDON();                           \
  } while (0)

/* Fatal check (test thread only). */
#define CHECK(cond)                                          \
  do {                                                       \
    if (!(cond)) FAIL("CHECK(%s)", #cond);                   \
  } while (0)

/* Non-fatal check; safe from any thread (callbacks, native functions). */
#define EXPECT(cond)                                                   \
  do {                                                                 \
    if (!(cond)) harness_note(__FILE__, __LINE__, "EXPECT(%s)", #cond); \
  } while (0)

#define CHECK_EQ_U64(a, b)                                                                  \
  do {                                                                                      \
    unsigned long long harness_a_ = (unsigned long long)(a), harness_b_ = (unsigned long long)(b); \
    if (harness_a_ != harness_b_) FAIL("CHECK_EQ(%s, %s): %llu != %llu", #a, #b, harness_a_, harness_b_); \
  } while (0)

#define CHECK_EQ_I64(a, b)                                                                  \
  do {                                                                                      \
    long long harness_a_ = (long long)(a), harness_b_ = (long long)(b);                     \
    if (harness_a_ != harness_b_) FAIL("CHECK_EQ(%s, %s): %lld != %lld", #a, #b, harness_a_, harness_b_); \
  } while (0)

HARNESS_FN bool harness_contains(const char *hay, size_t hay_size, const char *needle) {
  size_t n = strlen(needle);
  if (n == 0) return true;
  if (hay == NULL) return false;
  for (size_t i = 0; i + n <= hay_size; ++i)
    if (memcmp(hay + i, needle, n) == 0) return true;
  return false;
}

/* "code_name: message" of an error, for failure reports. */
HARNESS_FN void harness_describe(const colocated_error *err, char *out, size_t out_size) {
  colocated_string_view code = colocated_error_code_name(colocated_error_get_code(err));
  colocated_string_view msg = colocated_error_message(err);
  snprintf(out, out_size, "%.*s: %.*s", (int)code.size, code.data, (int)msg.size, msg.data);
}

/* Returns 0 if `err` is NULL, else describes and destroys it and returns 1. */
HARNESS_FN int harness_take_unexpected(colocated_error *err, const char *file, int line, const char *expr) {
  if (err == NULL) return 0;
  char text[1024];
  harness_describe(err, text, sizeof text);
  colocated_error_destroy(err);
  harness_note(file, line, "%s returned an error: %s", expr, text);
  return 1;
}

/* Checks `err` has `code` and (unless NULL) a message containing `needle`; destroys it. */
HARNESS_FN int harness_take_expected(colocated_error *err, uint32_t code, const char *needle, const char *file, int line,
                                 const char *expr) {
  colocated_string_view want = colocated_error_code_name(code);
  if (err == NULL) {
    harness_note(file, line, "%s succeeded, expected %.*s", expr, (int)want.size, want.data);
    return 1;
  }
  int bad = 0;
  char text[1024];
  harness_describe(err, text, sizeof text);
  if ((uint32_t)colocated_error_get_code(err) != code) {
    harness_note(file, line, "%s gave %s, expected code %.*s", expr, text, (int)want.size, want.data);
    bad = 1;
  } else if (needle != NULL) {
    colocated_string_view msg = colocated_error_message(err);
    if (!harness_contains(msg.data, msg.size, needle)) {
      harness_note(file, line, "%s gave %s, expected the message to contain \"%s\"", expr, text, needle);
      bad = 1;
    }
  }
  colocated_error_destroy(err);
  return bad;
}

/* Fatal: `expr` (a colocated_error*) must be NULL. */
#define CHECK_OK(expr)                                                          \
  do {                                                                          \
    if (harness_take_unexpected((expr), __FILE__, __LINE__, #expr)) HARNESS_ABANDON(); \
  } while (0)

/* Non-fatal, any thread: `expr` must be NULL (the error is destroyed). */
#define EXPECT_OK(expr) ((void)harness_take_unexpected((expr), __FILE__, __LINE__, #expr))

/* Fatal: `expr` must fail with `code`; the error is destroyed. */
#define CHECK_CODE(expr, code)                                                          \
  do {                                                                                  \
    if (harness_take_expected((expr), (code), NULL, __FILE__, __LINE__, #expr)) HARNESS_ABANDON(); \
  } while (0)

/* Fatal: `expr` must fail with `code` and a message containing `needle`. */
#define CHECK_CODE_MSG(expr, code, needle)                                                 \
  do {                                                                                     \
    if (harness_take_expected((expr), (code), (needle), __FILE__, __LINE__, #expr)) HARNESS_ABANDON(); \
  } while (0)

/* Non-fatal, any thread. */
#define EXPECT_CODE_MSG(expr, code, needle) \
  ((void)harness_take_expected((expr), (code), (needle), __FILE__, __LINE__, #expr))

/* Fatal: a library string view equals `lit` and is NUL-terminated. */
#define CHECK_VIEW_EQ(view, lit)                                                                     \
  do {                                                                                               \
    colocated_string_view harness_v_ = (view);                                                       \
    const char *harness_l_ = (lit);                                                                  \
    if (harness_v_.data == NULL || harness_v_.size != strlen(harness_l_) ||                          \
        memcmp(harness_v_.data, harness_l_, harness_v_.size) != 0 || harness_v_.data[harness_v_.size] != '\0') \
      FAIL("%s is \"%.*s\" (size %zu), expected \"%s\"", #view, (int)harness_v_.size,                 \
           harness_v_.data ? harness_v_.data : "", harness_v_.size, harness_l_);                     \
  } while (0)

/* Monotonic clock in nanoseconds. */
HARNESS_FN uint64_t harness_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

HARNESS_FN void harness_sleep_ms(unsigned ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

/* Polls `cond` every millisecond for up to `ms` milliseconds; true if it held. */
#define WAIT_FOR(cond, ms)                                                     \
  __extension__({                                                        \
    uint64_t harness_deadline_ = harness_now_ns() + (uint64_t)(ms) * 1000000u; \
    bool harness_ok_ = false;                                                  \
    for (;;) {                                                                 \
      if (cond) {                                                              \
        harness_ok_ = true;                                                    \
        break;                                                                 \
      }                                                                        \
      if (harness_now_ns() > harness_deadline_) break;                         \
      harness_sleep_ms(1);                                                     \
    }                                                                          \
    harness_ok_;                                                               \
  })

/* Runs one test in this process; 0 when it passed. */
HARNESS_FN int harness_run_here(const struct harness_test *t) {
  atomic_store(&harness_failed, 0);
  if (setjmp(harness_jmp) == 0) t->fn();
  return atomic_load(&harness_failed) ? 1 : 0;
}

HARNESS_FN int harness_run_forked(const struct harness_test *t, unsigned timeout_s) {
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) {
    perror("fork");
    return 1;
  }
  if (pid == 0) {
    alarm(timeout_s);
    int failed = harness_run_here(t);
    fflush(stdout);
    fflush(stderr);
    /* exit() (not _exit) on success so that LeakSanitizer checks this test. A
     * failed test skips the leak check: what it abandoned would only add noise. */
    if (failed) _exit(1);
    exit(0);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
  }
  if (WIFEXITED(status)) {
    if (WEXITSTATUS(status) == 0) return 0;
    if (WEXITSTATUS(status) != 1)
      fprintf(stderr, "  (%s exited with status %d: a sanitizer report above?)\n", t->name, WEXITSTATUS(status));
    return 1;
  }
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    fprintf(stderr, "  (%s killed by signal %d%s)\n", t->name, sig,
            sig == SIGALRM   ? ": timed out"
            : sig == SIGABRT ? ": abort, e.g. an AddressSanitizer/LeakSanitizer report above"
                             : "");
  }
  return 1;
}

int main(int argc, char **argv) {
  const char *filter = argc > 1 ? argv[1] : NULL;
  const char *nofork = getenv("HARNESS_NO_FORK");
  const char *timeout_env = getenv("HARNESS_TIMEOUT");
  unsigned timeout_s = timeout_env ? (unsigned)atoi(timeout_env) : 30;
  int passed = 0, failed = 0;
  for (int i = 0; i < harness_num_tests; ++i) {
    const struct harness_test *t = &harness_tests[i];
    if (filter && !strstr(t->name, filter)) continue;
    printf("[ RUN      ] %s\n", t->name);
    uint64_t start = harness_now_ns();
    int bad = (nofork && *nofork && *nofork != '0') ? harness_run_here(t) : harness_run_forked(t, timeout_s);
    unsigned ms = (unsigned)((harness_now_ns() - start) / 1000000u);
    printf("%s %s (%u ms)\n", bad ? "[  FAILED  ]" : "[       OK ]", t->name, ms);
    if (bad)
      ++failed;
    else
      ++passed;
  }
  printf("%d passed, %d failed\n", passed, failed);
  fflush(stdout);
  return failed ? 1 : 0;
}

#endif /* COLOCATED_TEST_HARNESS_H */
