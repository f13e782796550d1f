/*
 * Events: create / set / is_ready / await / await_timeout / error / on_ready /
 * destroy.
 */
#include "harness.h"
#include "helpers.h"

#include <pthread.h>

TEST(new_event_is_pending_until_set_ok) {
  colocated_event *ev = NULL;
  CHECK_OK(colocated_event_create(&ev));
  CHECK(ev != NULL);
  CHECK(!event_is_ready(ev));
  CHECK_OK(colocated_event_set(ev, COLOCATED_OK, NULL, 0));
  CHECK(event_is_ready(ev));
  CHECK_OK(colocated_event_await(ev));
  CHECK_OK(colocated_event_await(ev)); /* awaiting again gives the same outcome */
  colocated_error *outcome = (colocated_error *)1;
  CHECK_OK(colocated_event_error(ev, &outcome));
  CHECK(outcome == NULL);
  colocated_event_destroy(ev);
}

TEST(set_with_an_error_code_delivers_code_and_message_to_every_reader) {
  colocated_event *ev;
  CHECK_OK(colocated_event_create(&ev));
  const char *msg = "disk full";
  CHECK_OK(colocated_event_set(ev, COLOCATED_RESOURCE_EXHAUSTED, (const uint8_t *)msg, strlen(msg)));
  CHECK(event_is_ready(ev));
  /* await and event_error each hand out a new error the caller owns */
  CHECK_CODE_MSG(colocated_event_await(ev), COLOCATED_RESOURCE_EXHAUSTED, "disk full");
  CHECK_CODE_MSG(colocated_event_await_timeout(ev, 0), COLOCATED_RESOURCE_EXHAUSTED, "disk full");
  colocated_error *first = NULL, *second = NULL;
  CHECK_OK(colocated_event_error(ev, &first));
  CHECK_OK(colocated_event_error(ev, &second));
  CHECK(first != NULL && second != NULL && first != second);
  CHECK_EQ_U64(colocated_error_get_code(first), COLOCATED_RESOURCE_EXHAUSTED);
  CHECK_VIEW_EQ(colocated_error_message(first), "disk full");
  colocated_error_destroy(first);
  CHECK_VIEW_EQ(colocated_error_message(second), "disk full"); /* independent of first */
  colocated_error_destroy(second);
  colocated_event_destroy(ev);
}

TEST(set_copies_the_message) {
  colocated_event *ev;
  CHECK_OK(colocated_event_create(&ev));
  char msg[] = "original";
  CHECK_OK(colocated_event_set(ev, COLOCATED_CANCELLED, (const uint8_t *)msg, strlen(msg)));
  memset(msg, 'X', strlen(msg));
  CHECK_CODE_MSG(colocated_event_await(ev), COLOCATED_CANCELLED, "original");
  colocated_event_destroy(ev);
}

TEST(setting_an_event_twice_is_a_failed_precondition_and_keeps_the_first_outcome) {
  colocated_event *ev;
  CHECK_OK(colocated_event_create(&ev));
  CHECK_OK(colocated_event_set(ev, COLOCATED_OK, NULL, 0));
  CHECK_CODE_MSG(colocated_event_set(ev, COLOCATED_OK, NULL, 0), COLOCATED_FAILED_PRECONDITION, "already set");
  CHECK_CODE_MSG(colocated_event_set(ev, COLOCATED_INTERNAL, (const uint8_t *)"x", 1), COLOCATED_FAILED_PRECONDITION,
                 "already set");
  CHECK_OK(colocated_event_await(ev));
  colocated_event_destroy(ev);
}

TEST(set_with_an_unknown_code_is_invalid_and_leaves_the_event_pending) {
  colocated_event *ev;
  CHECK_OK(colocated_event_create(&ev));
  const uint32_t unknown[] = {2, 10, 11, 15, 17, 99, 0xffffffffu};
  for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; ++i) {
    CHECK_CODE_MSG(colocated_event_set(ev, unknown[i], (const uint8_t *)"m", 1), COLOCATED_INVALID_ARGUMENT,
                   "not an error code");
    CHECK(!event_is_ready(ev));
  }
  /* every code of the header is accepted */
  const uint32_t known[] = {COLOCATED_CANCELLED,        COLOCATED_INVALID_ARGUMENT,
                            COLOCATED_DEADLINE_EXCEEDED,  COLOCATED_NOT_FOUND,         COLOCATED_ALREADY_EXISTS,
                            COLOCATED_PERMISSION_DENIED,  COLOCATED_RESOURCE_EXHAUSTED, COLOCATED_FAILED_PRECONDITION,
                            COLOCATED_UNIMPLEMENTED,      COLOCATED_INTERNAL,          COLOCATED_UNAVAILABLE,
                            COLOCATED_UNAUTHENTICATED};
  for (size_t i = 0; i < sizeof known / sizeof known[0]; ++i) {
    colocated_event *e;
    CHECK_OK(colocated_event_create(&e));
    CHECK_OK(colocated_event_set(e, known[i], (const uint8_t *)"m", 1));
    colocated_error *err = colocated_event_await(e);
    CHECK(err != NULL);
    CHECK_EQ_U64(colocated_error_get_code(err), known[i]);
    colocated_error_destroy(err);
    colocated_event_destroy(e);
  }
  colocated_event_destroy(ev);
}

TEST(set_rejects_a_null_message_with_a_size) {
  colocated_event *ev;
  CHECK_OK(colocated_event_create(&ev));
  CHECK_CODE_MSG(colocated_event_set(ev, COLOCATED_INTERNAL, NULL, 5), COLOCATED_INVALID_ARGUMENT, "NULL");
  CHECK(!event_is_ready(ev));
  /* NULL with size 0 is an empty message */
  CHECK_OK(colocated_event_set(ev, COLOCATED_INTERNAL, NULL, 0));
  colocated_error *err = colocated_event_await(ev);
  CHECK(err != NULL);
  CHECK_EQ_U64(colocated_error_message(err).size, 0);
  colocated_error_destroy(err);
  colocated_event_destroy(ev);
}

TEST(set_replaces_invalid_utf8_in_the_message) {
  colocated_event *ev;
  CHECK_OK(colocated_event_create(&ev));
  const uint8_t bad[] = {'a', 0xff, 0xfe, 'b'};
  CHECK_OK(colocated_event_set(ev, COLOCATED_INTERNAL, bad, sizeof bad));
  colocated_error *err = colocated_event_await(ev);
  CHECK(err != NULL);
  colocated_string_view msg = colocated_error_message(err);
  CHECK(msg.size >= 2 && msg.data[0] == 'a' && msg.data[msg.size - 1] == 'b');
  CHECK(msg.data[msg.size] == '\0');
  colocated_error_destroy(err);
  colocated_event_destroy(ev);
}

TEST(await_timeout_on_a_pending_event_is_deadline_exceeded_and_leaves_it_usable) {
  colocated_event *ev;
  CHECK_OK(colocated_event_create(&ev));
  CHECK_CODE_MSG(colocated_event_await_timeout(ev, 0), COLOCATED_DEADLINE_EXCEEDED, "deadline");
  uint64_t start = harness_now_ns();
  CHECK_CODE_MSG(colocated_event_await_timeout(ev, 20 * 1000 * 1000), COLOCATED_DEADLINE_EXCEEDED, "deadline");
  uint64_t waited = harness_now_ns() - start;
  CHECK(waited >= 19 * 1000 * 1000);      /* it did wait */
  CHECK(waited < 5000ull * 1000 * 1000);  /* and gave up */
  CHECK(!event_is_ready(ev));
  colocated_error *outcome = NULL;
  CHECK_CODE_MSG(colocated_event_error(ev, &outcome), COLOCATED_FAILED_PRECONDITION, "not ready");
  CHECK_OK(colocated_event_set(ev, COLOCATED_OK, NULL, 0));
  CHECK_OK(colocated_event_await_timeout(ev, 0));
  CHECK_OK(colocated_event_await_timeout(ev, UINT64_MAX));
  colocated_event_destroy(ev);
}

struct callback_log {
  atomic_int calls;
  atomic_int errors;
  atomic_uint last_code;
  pthread_t thread;
  atomic_int thread_set;
};

static void count_callback(colocated_error *error, void *user_data) {
  struct callback_log *log = user_data;
  if (error != NULL) {
    atomic_fetch_add(&log->errors, 1);
    atomic_store(&log->last_code, (unsigned)colocated_error_get_code(error));
    colocated_error_destroy(error); /* the callback owns it */
  }
  log->thread = pthread_self();
  atomic_store(&log->thread_set, 1);
  atomic_fetch_add(&log->calls, 1);
}

TEST(on_ready_registered_before_completion_runs_exactly_once_on_set) {
  colocated_event *ev;
  CHECK_OK(colocated_event_create(&ev));
  struct callback_log a = {0}, b = {0};
  CHECK_OK(colocated_event_on_ready(ev, count_callback, &a));
  CHECK_OK(colocated_event_on_ready(ev, count_callback, &b));
  CHECK_EQ_I64(atomic_load(&a.calls), 0);
  CHECK_OK(colocated_event_set(ev, COLOCATED_OK, NULL, 0));
  CHECK_EQ_I64(atomic_load(&a.calls), 1);
  CHECK_EQ_I64(atomic_load(&b.calls), 1);
  CHECK_EQ_I64(atomic_load(&a.errors), 0);
  /* a failed second set does not run them again */
  CHECK_CODE(colocated_event_set(ev, COLOCATED_OK, NULL, 0), COLOCATED_FAILED_PRECONDITION);
  CHECK_OK(colocated_event_await(ev));
  colocated_event_destroy(ev);
  CHECK_EQ_I64(atomic_load(&a.calls), 1);
  CHECK_EQ_I64(atomic_load(&b.calls), 1);
}

TEST(on_ready_registered_after_completion_runs_at_once_on_the_calling_thread) {
  colocated_event *ev;
  CHECK_OK(colocated_event_create(&ev));
  CHECK_OK(colocated_event_set(ev, COLOCATED_NOT_FOUND, (const uint8_t *)"gone", 4));
  struct callback_log log = {0};
  CHECK_OK(colocated_event_on_ready(ev, count_callback, &log));
  CHECK_EQ_I64(atomic_load(&log.calls), 1);
  CHECK_EQ_I64(atomic_load(&log.errors), 1);
  CHECK_EQ_U64(atomic_load(&log.last_code), COLOCATED_NOT_FOUND);
  CHECK(pthread_equal(log.thread, pthread_self()));
  colocated_event_destroy(ev);
  CHECK_EQ_I64(atomic_load(&log.calls), 1);
}

TEST(on_ready_callback_receives_an_owned_error_for_a_failed_event) {
  colocated_event *ev;
  CHECK_OK(colocated_event_create(&ev));
  struct callback_log log = {0};
  CHECK_OK(colocated_event_on_ready(ev, count_callback, &log));
  CHECK_OK(colocated_event_set(ev, COLOCATED_UNAVAILABLE, (const uint8_t *)"link down", 9));
  CHECK_EQ_I64(atomic_load(&log.calls), 1);
  CHECK_EQ_I64(atomic_load(&log.errors), 1);
  CHECK_EQ_U64(atomic_load(&log.last_code), COLOCATED_UNAVAILABLE);
  colocated_event_destroy(ev);
}

TEST(on_ready_rejects_a_null_callback) {
  colocated_event *ev;
  CHECK_OK(colocated_event_create(&ev));
  CHECK_CODE_MSG(colocated_event_on_ready(ev, NULL, NULL), COLOCATED_INVALID_ARGUMENT, "callback is NULL");
  colocated_event_destroy(ev);
}

struct setter {
  colocated_event *event;
  unsigned delay_ms;
};

static void *set_later(void *arg) {
  struct setter *s = arg;
  harness_sleep_ms(s->delay_ms);
  EXPECT_OK(colocated_event_set(s->event, COLOCATED_OK, NULL, 0));
  return NULL;
}

struct waiter {
  colocated_event *event;
  atomic_int done;
  atomic_int ok;
};

static void *await_in_thread(void *arg) {
  struct waiter *w = arg;
  colocated_error *err = colocated_event_await(w->event);
  if (err == NULL) atomic_store(&w->ok, 1);
  colocated_error_destroy(err);
  atomic_store(&w->done, 1);
  return NULL;
}

TEST(set_from_another_thread_wakes_every_waiter_and_runs_callbacks_there) {
  colocated_event *ev;
  CHECK_OK(colocated_event_create(&ev));
  struct callback_log log = {0};
  CHECK_OK(colocated_event_on_ready(ev, count_callback, &log));
  struct waiter waiters[4];
  pthread_t threads[4];
  for (int i = 0; i < 4; ++i) {
    waiters[i].event = ev;
    atomic_init(&waiters[i].done, 0);
    atomic_init(&waiters[i].ok, 0);
    CHECK(pthread_create(&threads[i], NULL, await_in_thread, &waiters[i]) == 0);
  }
  struct setter s = {ev, 30};
  pthread_t setter_thread;
  CHECK(pthread_create(&setter_thread, NULL, set_later, &s) == 0);
  CHECK_OK(colocated_event_await_timeout(ev, 10ull * 1000 * 1000 * 1000));
  CHECK(pthread_join(setter_thread, NULL) == 0);
  for (int i = 0; i < 4; ++i) {
    CHECK(pthread_join(threads[i], NULL) == 0);
    CHECK(atomic_load(&waiters[i].ok) == 1);
  }
  CHECK_EQ_I64(atomic_load(&log.calls), 1);
  CHECK(pthread_equal(log.thread, setter_thread)); /* runs on the completing thread */
  colocated_event_destroy(ev);
}

TEST(destroying_a_handle_accepts_null) {
  colocated_event_destroy(NULL);
}

TEST(event_functions_reject_null_handles_and_out_params) {
  bool ready;
  colocated_error *outcome;
  CHECK_CODE_MSG(colocated_event_set(NULL, COLOCATED_OK, NULL, 0), COLOCATED_INVALID_ARGUMENT, "NULL");
  CHECK_CODE_MSG(colocated_event_is_ready(NULL, &ready), COLOCATED_INVALID_ARGUMENT, "NULL");
  CHECK_CODE_MSG(colocated_event_await(NULL), COLOCATED_INVALID_ARGUMENT, "NULL");
  CHECK_CODE_MSG(colocated_event_await_timeout(NULL, 1), COLOCATED_INVALID_ARGUMENT, "NULL");
  CHECK_CODE_MSG(colocated_event_error(NULL, &outcome), COLOCATED_INVALID_ARGUMENT, "NULL");
  CHECK_CODE_MSG(colocated_event_on_ready(NULL, count_callback, NULL), COLOCATED_INVALID_ARGUMENT, "NULL");
  colocated_event *ev;
  CHECK_OK(colocated_event_create(&ev));
  CHECK_OK(colocated_event_set(ev, COLOCATED_OK, NULL, 0));
  CHECK_CODE_MSG(colocated_event_is_ready(ev, NULL), COLOCATED_INVALID_ARGUMENT, "out");
  CHECK_CODE_MSG(colocated_event_error(ev, NULL), COLOCATED_INVALID_ARGUMENT, "out");
  colocated_event_destroy(ev);
}

/* Kept apart from the other NULL checks: LeakSanitizer reports at the end of the
 * test process, so a leak here must not be blamed on other calls. */
TEST(event_create_with_null_out_is_invalid_and_leaks_nothing) {
  CHECK_CODE_MSG(colocated_event_create(NULL), COLOCATED_INVALID_ARGUMENT, "out");
}

TEST(event_error_with_null_out_on_a_failed_event_is_invalid_and_leaks_nothing) {
  colocated_event *ev;
  CHECK_OK(colocated_event_create(&ev));
  CHECK_OK(colocated_event_set(ev, COLOCATED_INTERNAL, (const uint8_t *)"boom", 4));
  CHECK_CODE_MSG(colocated_event_error(ev, NULL), COLOCATED_INVALID_ARGUMENT, "out");
  colocated_event_destroy(ev);
}
