/*
 * Host events in C: colocated_client_on_host_event tells a listener what
 * happens to the client's worker hosts, colocated_client_host_stats counts
 * it, and colocated_client_close ends the sessions with the workers (each
 * worker host's session is then lost, with a cancelled error). The remote
 * tests start a real worker process (worker.h). Null arguments are refused
 * with invalid_argument, and user data stays the caller's then.
 */
#include "harness.h"
#include "helpers.h"
#include "worker.h"

#define MAX_HEARD 8

/* What a listener heard, in order; its user data. */
typedef struct {
  atomic_int count;
  atomic_int destroyed;
  size_t host[MAX_HEARD];
  char kind[MAX_HEARD][16];
  uint32_t code[MAX_HEARD];
  char message[MAX_HEARD][256];
} heard_events;

/* Records an event (the listener is called one event at a time). */
static void hear(void *user_data, size_t host, const char *kind, const colocated_error *error) {
  heard_events *h = user_data;
  int i = atomic_load(&h->count);
  if (i >= MAX_HEARD) return;
  h->host[i] = host;
  snprintf(h->kind[i], sizeof h->kind[i], "%s", kind);
  h->code[i] = error == NULL ? COLOCATED_OK : (uint32_t)colocated_error_get_code(error);
  colocated_string_view message = colocated_error_message(error);
  snprintf(h->message[i], sizeof h->message[i], "%.*s", (int)message.size, message.data);
  atomic_store(&h->count, i + 1);
}

static void forget(void *user_data) {
  heard_events *h = user_data;
  atomic_fetch_add(&h->destroyed, 1);
}

static colocated_host_stats stats_of(const colocated_client *client, size_t host) {
  colocated_host_stats stats = {sizeof stats};
  CHECK_OK(colocated_client_host_stats(client, host, &stats));
  CHECK(stats.struct_size == sizeof stats);
  return stats;
}

TEST(close_tells_each_listener_lost_with_a_cancelled_error_and_counts_it) {
  test_worker worker;
  start_test_worker(&worker, 1, NULL);
  colocated_client *client = connect_to_worker(&worker);
  static heard_events heard, removed_before;
  uint64_t id = 0, other = 0;
  CHECK_OK(colocated_client_on_host_event(client, hear, &heard, forget, &id));
  CHECK_OK(colocated_client_on_host_event(client, hear, &removed_before, forget, &other));
  CHECK(id != other);
  bool removed = false;
  CHECK_OK(colocated_client_remove_host_listener(client, other, &removed));
  CHECK(removed);
  /* Removed, and its last call (there was none) returned: its destructor ran. */
  CHECK(WAIT_FOR(atomic_load(&removed_before.destroyed) == 1, 20000));

  CHECK_OK(colocated_client_close(client));
  CHECK(WAIT_FOR(atomic_load(&heard.count) >= 1, 20000));
  CHECK(heard.host[0] == 0);
  CHECK(strcmp(heard.kind[0], "lost") == 0);
  CHECK(heard.code[0] == COLOCATED_CANCELLED);
  CHECK(strstr(heard.message[0], "was closed") != NULL);
  colocated_host_stats stats = stats_of(client, 0);
  CHECK_EQ_U64(stats.disconnects, 0);
  CHECK_EQ_U64(stats.reconnects, 0);
  CHECK_EQ_U64(stats.sessions_lost, 1);
  CHECK_EQ_U64(stats.sessions_reopened, 0);
  /* Closing twice does nothing, and tells nothing more. */
  CHECK_OK(colocated_client_close(client));
  harness_sleep_ms(100);
  CHECK(atomic_load(&heard.count) == 1);
  CHECK(atomic_load(&removed_before.count) == 0);

  CHECK_OK(colocated_client_remove_host_listener(client, id, NULL));
  CHECK(WAIT_FOR(atomic_load(&heard.destroyed) == 1, 20000));
  CHECK_OK(colocated_client_remove_host_listener(client, id, &removed));
  CHECK(!removed);
  colocated_client_destroy(client);
  stop_test_worker(&worker);
  CHECK(atomic_load(&heard.destroyed) == 1);
}

TEST(a_listener_of_a_local_client_is_destroyed_with_the_client) {
  colocated_client *client = make_client(1, 1);
  static heard_events heard;
  uint64_t id = 0;
  CHECK_OK(colocated_client_on_host_event(client, hear, &heard, forget, &id));
  colocated_host_stats stats = stats_of(client, 0); /* the in-process host */
  CHECK_EQ_U64(stats.disconnects + stats.reconnects + stats.sessions_lost + stats.sessions_reopened, 0);
  CHECK_OK(colocated_client_close(client)); /* no worker: nothing to tell */
  colocated_client_destroy(client);
  CHECK(WAIT_FOR(atomic_load(&heard.destroyed) == 1, 20000));
  CHECK(atomic_load(&heard.count) == 0);
}

TEST(bad_arguments_are_invalid_argument_and_user_data_stays_the_callers) {
  colocated_client *client = make_client(1, 1);
  static heard_events heard;
  uint64_t id = 0;
  CHECK_CODE_MSG(colocated_client_on_host_event(NULL, hear, &heard, forget, &id), COLOCATED_INVALID_ARGUMENT,
                 "NULL");
  CHECK_CODE_MSG(colocated_client_on_host_event(client, NULL, &heard, forget, &id), COLOCATED_INVALID_ARGUMENT,
                 "callback is NULL");
  CHECK_CODE_MSG(colocated_client_on_host_event(client, hear, &heard, forget, NULL), COLOCATED_INVALID_ARGUMENT,
                 "listener_id");
  bool removed = true;
  CHECK_CODE(colocated_client_remove_host_listener(NULL, 1, &removed), COLOCATED_INVALID_ARGUMENT);
  CHECK_OK(colocated_client_remove_host_listener(client, 12345, &removed));
  CHECK(!removed);
  colocated_host_stats stats = {sizeof stats};
  CHECK_CODE(colocated_client_host_stats(NULL, 0, &stats), COLOCATED_INVALID_ARGUMENT);
  CHECK_CODE_MSG(colocated_client_host_stats(client, 0, NULL), COLOCATED_INVALID_ARGUMENT, "out");
  CHECK_CODE_MSG(colocated_client_host_stats(client, 1, &stats), COLOCATED_INVALID_ARGUMENT,
                 "host 1 is out of range");
  colocated_host_stats small = {sizeof(size_t)};
  CHECK_CODE_MSG(colocated_client_host_stats(client, 0, &small), COLOCATED_INVALID_ARGUMENT, "struct_size");
  CHECK_CODE(colocated_client_close(NULL), COLOCATED_INVALID_ARGUMENT);
  colocated_client_destroy(client);
  /* Every registration failed: the destructor never ran. */
  harness_sleep_ms(50);
  CHECK(atomic_load(&heard.destroyed) == 0);
}
