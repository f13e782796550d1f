/*
 * Plugin libraries through the C ABI: colocated_client_load_plugin's bad
 * arguments, and the test plugin (tests/plugin/add_one_plugin.c, built with
 * AddressSanitizer too, at TEST_PLUGIN_PATH) loaded into a local client, its
 * functions run over every shard and its errors reaching the status.
 */
#include "harness.h"
#include "helpers.h"

#ifndef TEST_PLUGIN_PATH
#error "TEST_PLUGIN_PATH must name the built test plugin (see Makefile)"
#endif

TEST(load_plugin_refuses_bad_arguments) {
  colocated_client *client = make_client(1, 1);
  CHECK_CODE_MSG(colocated_client_load_plugin(NULL, sv(TEST_PLUGIN_PATH)), COLOCATED_INVALID_ARGUMENT, "client");
  CHECK_CODE_MSG(colocated_client_load_plugin(client, sv("")), COLOCATED_INVALID_ARGUMENT, "path is empty");
  colocated_string_view null_data = {NULL, 4};
  CHECK_CODE_MSG(colocated_client_load_plugin(client, null_data), COLOCATED_INVALID_ARGUMENT, "path is NULL");
  colocated_string_view not_utf8 = {"\xff\xfe", 2};
  CHECK_CODE_MSG(colocated_client_load_plugin(client, not_utf8), COLOCATED_INVALID_ARGUMENT, "not UTF-8");
  CHECK_CODE_MSG(colocated_client_load_plugin(client, sv("/nonexistent/libnothing.so")), COLOCATED_NOT_FOUND,
                 "plugin library /nonexistent/libnothing.so does not exist");
  CHECK_CODE_MSG(colocated_client_load_plugin(client, sv("/")), COLOCATED_INVALID_ARGUMENT, "is a directory");
  /* A file the loader refuses. */
  char path[] = "/tmp/colocated-not-a-library-XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  CHECK(write(fd, "text", 4) == 4);
  close(fd);
  colocated_error *err = colocated_client_load_plugin(client, sv(path));
  unlink(path);
  CHECK_CODE_MSG(err, COLOCATED_INVALID_ARGUMENT, "cannot load plugin library");
  colocated_client_destroy(client);
}

TEST(a_loaded_plugin_runs_over_every_shard_and_its_errors_reach_the_status) {
  colocated_client *client = make_client(2, 2);
  CHECK_OK(colocated_client_load_plugin(client, sv(TEST_PLUGIN_PATH)));
  size_t n;
  const colocated_device *const *devices = client_devices(client, &n);
  colocated_sharding *s = make_split(client, devices, 2);
  const int64_t dims[1] = {6};
  colocated_array_spec spec = make_spec(COLOCATED_DTYPE_I32, dims, 1, s);
  int32_t x[6] = {-3, -2, -1, 0, 1, 2147483646};
  colocated_array *in = make_array(client, s, COLOCATED_DTYPE_I32, dims, 1, x, sizeof x);

  colocated_loaded_executable *add = compile_unary(client, "plugin_add_one_i32", &spec, devices, 2, NULL);
  colocated_event *status = NULL;
  colocated_array *out = run1(add, in, NULL, &status);
  CHECK_OK(await_and_destroy(status));
  int32_t y[6];
  CHECK_OK(colocated_array_to_host(out, y, sizeof y));
  for (int i = 0; i < 6; ++i) CHECK_EQ_I64(y[i], x[i] + 1);

  colocated_loaded_executable *fail = compile_unary(client, "plugin_fail", &spec, devices, 2, NULL);
  colocated_array *failed = run1(fail, in, NULL, &status);
  CHECK_CODE_MSG(await_and_destroy(status), COLOCATED_FAILED_PRECONDITION,
                 "plugin function 'plugin_fail': plugin_fail failed on purpose (2 input shards)");

  /* Its names are taken now: loading it again into this client fails. */
  CHECK_CODE_MSG(colocated_client_load_plugin(client, sv(TEST_PLUGIN_PATH)), COLOCATED_ALREADY_EXISTS,
                 "native function 'plugin_add_one_i32' is already registered");

  colocated_array_destroy(failed);
  colocated_array_destroy(out);
  colocated_array_destroy(in);
  colocated_loaded_executable_destroy(fail);
  colocated_loaded_executable_destroy(add);
  colocated_sharding_destroy(s);
  colocated_client_destroy(client);
}
