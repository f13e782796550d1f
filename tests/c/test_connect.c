/*
 * colocated_client_connect without worker processes: bad options are
 * invalid_argument, a worker nobody serves is unavailable within the timeout,
 * a struct of an older caller is read only up to its struct_size, and a
 * connected client of the local host alone describes that host.
 */
#include "harness.h"
#include "helpers.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stddef.h>
#include <sys/socket.h>

/* A loopback TCP port held by a socket (in *fd) that is bound but does not
 * listen: connections to it are refused, and nothing else takes the port while
 * the socket is open. */
static uint16_t bound_port(int *fd) {
  *fd = socket(AF_INET, SOCK_STREAM, 0);
  CHECK(*fd >= 0);
  struct sockaddr_in addr;
  memset(&addr, 0, sizeof addr);
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  CHECK(bind(*fd, (struct sockaddr *)&addr, sizeof addr) == 0);
  socklen_t len = sizeof addr;
  CHECK(getsockname(*fd, (struct sockaddr *)&addr, &len) == 0);
  return ntohs(addr.sin_port);
}

/* A held port (bound_port) and its worker address "127.0.0.1:port". */
struct held_port {
  int fd;
  char address[32];
  colocated_string_view worker; /* the address as a view */
};

static void hold_port(struct held_port *p) {
  snprintf(p->address, sizeof p->address, "127.0.0.1:%u", (unsigned)bound_port(&p->fd));
  p->worker = sv(p->address);
}

/* Options naming the `n` workers in `workers`, with a short timeout. */
static colocated_connect_options options_for(const colocated_string_view *workers, size_t n) {
  colocated_connect_options o = {sizeof o};
  o.workers = workers;
  o.num_workers = n;
  o.timeout_ms = 2000;
  o.executor_threads = 2;
  return o;
}

TEST(connect_with_null_options_or_out_is_invalid_argument) {
  colocated_client *client = NULL;
  CHECK_CODE_MSG(colocated_client_connect(NULL, &client), COLOCATED_INVALID_ARGUMENT,
                 "colocated_connect_options is NULL");
  colocated_connect_options o = options_for(NULL, 0);
  o.include_local = 1;
  CHECK_CODE_MSG(colocated_client_connect(&o, NULL), COLOCATED_INVALID_ARGUMENT, "out");
  CHECK(client == NULL);
}

TEST(connect_without_workers_or_the_local_host_is_invalid_argument) {
  colocated_connect_options o = options_for(NULL, 0);
  colocated_client *client = NULL;
  CHECK_CODE_MSG(colocated_client_connect(&o, &client), COLOCATED_INVALID_ARGUMENT, "at least one host");
  CHECK(client == NULL);
}

TEST(connect_to_an_address_that_does_not_parse_is_invalid_argument) {
  colocated_string_view worker = sv("not an address");
  colocated_connect_options o = options_for(&worker, 1);
  colocated_client *client = NULL;
  CHECK_CODE_MSG(colocated_client_connect(&o, &client), COLOCATED_INVALID_ARGUMENT, "bad worker address");
  CHECK(client == NULL);
  /* an address of bytes that are not UTF-8 */
  colocated_string_view binary = {"\xff\xfe:1", 4};
  o = options_for(&binary, 1);
  CHECK_CODE_MSG(colocated_client_connect(&o, &client), COLOCATED_INVALID_ARGUMENT, "workers[0]");
  CHECK(client == NULL);
}

TEST(connect_rejects_bad_fields_before_connecting) {
  struct held_port port;
  hold_port(&port);
  colocated_client *client = NULL;

  colocated_connect_options o = options_for(&port.worker, 1);
  o.include_local = 2;
  CHECK_CODE_MSG(colocated_client_connect(&o, &client), COLOCATED_INVALID_ARGUMENT, "include_local");

  o = options_for(NULL, 1); /* a count without an array */
  CHECK_CODE_MSG(colocated_client_connect(&o, &client), COLOCATED_INVALID_ARGUMENT, "workers");

  o = options_for(&port.worker, 1);
  o.token = sv("two words");
  CHECK_CODE_MSG(colocated_client_connect(&o, &client), COLOCATED_INVALID_ARGUMENT, "token");

  o = options_for(&port.worker, 1);
  o.tls_ca_size = 16; /* a size without bytes */
  CHECK_CODE_MSG(colocated_client_connect(&o, &client), COLOCATED_INVALID_ARGUMENT, "tls_ca");

  o = options_for(&port.worker, 1);
  o.tls_domain = (colocated_string_view){NULL, 3};
  CHECK_CODE_MSG(colocated_client_connect(&o, &client), COLOCATED_INVALID_ARGUMENT, "tls_domain");

  o = options_for(NULL, 0);
  o.include_local = 1;
  o.num_cpu_devices = 4097;
  CHECK_CODE_MSG(colocated_client_connect(&o, &client), COLOCATED_INVALID_ARGUMENT, "num_cpu_devices");
  CHECK(client == NULL);
  close(port.fd);
}

TEST(connect_to_a_port_nothing_serves_waits_up_to_the_timeout_then_is_unavailable) {
  struct held_port port;
  hold_port(&port);
  colocated_connect_options o = options_for(&port.worker, 1);
  o.token = sv("a-token");
  o.timeout_ms = 300;
  colocated_client *client = NULL;
  uint64_t start = harness_now_ns();
  CHECK_CODE_MSG(colocated_client_connect(&o, &client), COLOCATED_UNAVAILABLE, port.address);
  /* a worker that is not up yet is waited for, up to the timeout, and no longer */
  uint64_t waited = harness_now_ns() - start;
  CHECK(waited >= 300u * 1000000u);
  CHECK(waited < 5000u * 1000000u);
  CHECK(client == NULL);
  /* the same with the local host as well: nothing is made (LeakSanitizer checks) */
  o.include_local = 1;
  o.num_cpu_devices = 2;
  CHECK_CODE_MSG(colocated_client_connect(&o, &client), COLOCATED_UNAVAILABLE, port.address);
  CHECK(client == NULL);
  close(port.fd);
}

TEST(connect_to_a_worker_that_never_answers_gives_up_after_timeout_ms) {
  /* A socket that accepts connections (the kernel completes the handshake) but
   * never reads or answers: a worker that hangs. */
  struct held_port port;
  hold_port(&port);
  CHECK(listen(port.fd, 8) == 0);
  colocated_connect_options o = options_for(&port.worker, 1);
  o.timeout_ms = 300;
  colocated_client *client = NULL;
  uint64_t start = harness_now_ns();
  colocated_error *err = colocated_client_connect(&o, &client);
  uint64_t elapsed_ms = (harness_now_ns() - start) / 1000000u;
  /* A worker that never answers is as good as unreachable, within the bound. */
  CHECK(err != NULL);
  CHECK(colocated_error_get_code(err) == COLOCATED_UNAVAILABLE);
  colocated_string_view msg = colocated_error_message(err);
  CHECK(harness_contains(msg.data, msg.size, port.address));
  colocated_error_destroy(err);
  CHECK(elapsed_ms >= 250 && elapsed_ms < 5000);
  CHECK(client == NULL);
  close(port.fd);
}

TEST(connect_reports_the_first_unreachable_worker_in_order) {
  struct held_port p1, p2;
  hold_port(&p1);
  hold_port(&p2);
  colocated_string_view workers[2] = {p1.worker, p2.worker};
  colocated_connect_options o = options_for(workers, 2);
  colocated_client *client = NULL;
  CHECK_CODE_MSG(colocated_client_connect(&o, &client), COLOCATED_UNAVAILABLE, p1.address);
  CHECK(client == NULL);
  close(p1.fd);
  close(p2.fd);
}

TEST(connect_options_of_an_older_caller_ignore_the_bytes_past_struct_size) {
  struct held_port port;
  hold_port(&port);
  /* A caller that knows only the required fields: everything after them is
   * garbage (a token pointer, sizes, flags) that must not be read. */
  colocated_connect_options o;
  memset(&o, 0xA5, sizeof o);
  o.struct_size = COLOCATED_STRUCT_SIZE(colocated_connect_options, num_workers);
  o.workers = &port.worker;
  o.num_workers = 1;
  colocated_client *client = NULL;
  CHECK_CODE_MSG(colocated_client_connect(&o, &client), COLOCATED_UNAVAILABLE, port.address);
  CHECK(client == NULL);
  close(port.fd);
}

TEST(connect_with_only_the_local_host_makes_a_client_of_this_process) {
  colocated_connect_options o = options_for(NULL, 0);
  o.include_local = 1;
  o.num_cpu_devices = 3;
  colocated_client *client = NULL;
  CHECK_OK(colocated_client_connect(&o, &client));
  CHECK(client != NULL);
  size_t n;
  const colocated_device *const *devices = client_devices(client, &n);
  CHECK_EQ_U64(n, 3);
  const colocated_host *const *hosts;
  size_t num_hosts;
  CHECK_OK(colocated_client_hosts(client, &hosts, &num_hosts));
  CHECK_EQ_U64(num_hosts, 1);
  bool remote = true;
  CHECK_OK(colocated_host_is_remote(hosts[0], &remote));
  CHECK(!remote);
  colocated_string_view name;
  CHECK_OK(colocated_host_name(hosts[0], &name));
  CHECK_VIEW_EQ(name, "local");
  uint32_t process_index = 99;
  CHECK_OK(colocated_host_process_index(hosts[0], &process_index));
  CHECK_EQ_U64(process_index, 0);
  const colocated_device *const *owned;
  size_t num_owned;
  CHECK_OK(colocated_host_devices(hosts[0], &owned, &num_owned));
  CHECK_EQ_U64(num_owned, n);
  for (size_t i = 0; i < n; ++i) CHECK(owned[i] == devices[i]);
  /* and it runs work like any client */
  float v[2] = {1, 2}, back[2] = {0, 0};
  colocated_buffer *buffer = make_f32(client, devices[2], v, 2);
  read_buffer(buffer, back, sizeof back);
  CHECK(back[0] == 1 && back[1] == 2);
  colocated_buffer_destroy(buffer);
  colocated_client_destroy(client);
}

TEST(host_is_remote_checks_its_arguments) {
  colocated_client *client = make_client(1, 1);
  const colocated_host *const *hosts;
  size_t num_hosts;
  CHECK_OK(colocated_client_hosts(client, &hosts, &num_hosts));
  bool remote = true;
  CHECK_OK(colocated_host_is_remote(hosts[0], &remote));
  CHECK(!remote); /* a local client's host is this process */
  CHECK_CODE_MSG(colocated_host_is_remote(hosts[0], NULL), COLOCATED_INVALID_ARGUMENT, "out");
  CHECK_CODE_MSG(colocated_host_is_remote(NULL, &remote), COLOCATED_INVALID_ARGUMENT, "NULL");
  CHECK_CODE_MSG(colocated_host_is_remote((const colocated_host *)client, &remote), COLOCATED_INVALID_ARGUMENT,
                 "not a live");
  colocated_client_destroy(client);
}
