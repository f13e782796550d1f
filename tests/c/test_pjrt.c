/*
 * PJRT plugins (XLA's CPU plugin from PyPI, `COLOCATED_TEST_PJRT_PLUGIN`, which
 * `make test-c` sets): a client with a plugin's devices, their platform and
 * backend, buffers on them, a StableHLO module compiled and run there, and the
 * typed errors of a missing plugin, bad options and bad modules.
 */
#include "harness.h"
#include "helpers.h"

#include <stdlib.h>
#include <string.h>

static const char ADD_ONE[] =
    "module @add_one {\n"
    "  func.func public @main(%arg0: tensor<4xf32>) -> tensor<4xf32> {\n"
    "    %c = stablehlo.constant dense<1.0> : tensor<4xf32>\n"
    "    %0 = stablehlo.add %arg0, %c : tensor<4xf32>\n"
    "    return %0 : tensor<4xf32>\n"
    "  }\n"
    "}\n";

/* The plugin's path; fails the test when unset (`make test-c` sets it). */
static const char *plugin_path(void) {
  const char *path = getenv("COLOCATED_TEST_PJRT_PLUGIN");
  if (path == NULL || path[0] == '\0') FAIL("COLOCATED_TEST_PJRT_PLUGIN is unset: run make test-c");
  return path;
}

/* A client with one CPU device and two devices of the plugin. */
static colocated_client *plugin_client(void) {
  colocated_string_view options[1] = {sv("cpu_device_count=2")};
  colocated_client_options o = {sizeof o};
  o.num_cpu_devices = 1;
  o.executor_threads = 2;
  o.pjrt_plugin = sv(plugin_path());
  o.pjrt_options = options;
  o.num_pjrt_options = 1;
  colocated_client *client = NULL;
  CHECK_OK(colocated_client_create_local(&o, &client));
  return client;
}

TEST(a_plugin_s_devices_follow_the_cpu_devices_as_the_default_backend) {
  colocated_client *client = plugin_client();
  size_t n;
  const colocated_device *const *devices = client_devices(client, &n);
  CHECK_EQ_U64(n, 3);
  colocated_string_view s;
  CHECK_OK(colocated_client_default_backend(client, &s));
  CHECK_VIEW_EQ(s, "pjrt_cpu");
  CHECK_OK(colocated_device_backend(devices[0], &s));
  CHECK_VIEW_EQ(s, "cpu");
  CHECK_OK(colocated_device_platform(devices[0], &s));
  CHECK_VIEW_EQ(s, "cpu");
  for (size_t i = 1; i < 3; i++) {
    CHECK_OK(colocated_device_backend(devices[i], &s));
    CHECK_VIEW_EQ(s, "pjrt_cpu");
    CHECK_OK(colocated_device_platform(devices[i], &s));
    CHECK_VIEW_EQ(s, "cpu");
    uint32_t id;
    CHECK_OK(colocated_device_id(devices[i], &id));
    CHECK_EQ_U64(id, i);
  }
  colocated_client_destroy(client);
}

TEST(a_stablehlo_module_compiles_and_runs_on_a_plugin_device) {
  colocated_client *client = plugin_client();
  const colocated_device *device = device_at(client, 1);
  colocated_loaded_executable *exe = NULL;
  CHECK_OK(colocated_client_compile_stablehlo(client, (const uint8_t *)ADD_ONE, strlen(ADD_ONE), &device, 1, &exe));
  float x[4] = {0.5f, 1.5f, 2.5f, -1.0f};
  colocated_buffer *input = make_f32(client, device, x, 4);
  colocated_buffer *output = NULL;
  colocated_event *status = NULL;
  const colocated_buffer *args[1] = {input};
  CHECK_OK(colocated_loaded_executable_execute_sharded(exe, args, 1, device, NULL, &output, 1, &status));
  CHECK_OK(await_and_destroy(status));
  float y[4];
  read_buffer(output, y, sizeof y);
  for (int i = 0; i < 4; i++) CHECK(y[i] == x[i] + 1.0f);
  colocated_buffer_destroy(output);
  colocated_buffer_destroy(input);
  colocated_loaded_executable_destroy(exe);
  colocated_client_destroy(client);
}

TEST(a_plugin_buffer_pins_its_device_memory) {
  colocated_client *client = plugin_client();
  float x[4] = {1.0f, 2.0f, 3.0f, 4.0f};
  colocated_buffer *buffer = make_f32(client, device_at(client, 2), x, 4);
  void *data = NULL;
  size_t size = 0;
  CHECK_OK(colocated_buffer_pin(buffer, &data, &size));
  CHECK_EQ_U64(size, sizeof x);
  /* XLA's CPU plugin keeps device memory in this process. */
  CHECK(memcmp(data, x, sizeof x) == 0);
  CHECK_OK(colocated_buffer_delete(buffer));
  CHECK(memcmp(data, x, sizeof x) == 0); /* pinned across the delete */
  CHECK_OK(colocated_buffer_unpin(buffer));
  colocated_buffer_destroy(buffer);
  colocated_client_destroy(client);
}

TEST(bad_plugins_options_and_modules_get_typed_errors) {
  colocated_client *client = NULL;
  colocated_client_options o = {sizeof o};
  o.num_cpu_devices = 1;
  o.pjrt_plugin = sv("/nonexistent/pjrt_plugin.so");
  CHECK_CODE_MSG(colocated_client_create_local(&o, &client), COLOCATED_NOT_FOUND, "does not exist");
  colocated_string_view bad[1] = {sv("no equals sign")};
  o.pjrt_plugin = sv(plugin_path());
  o.pjrt_options = bad;
  o.num_pjrt_options = 1;
  CHECK_CODE_MSG(colocated_client_create_local(&o, &client), COLOCATED_INVALID_ARGUMENT, "KEY=VALUE");
  colocated_string_view good[1] = {sv("cpu_device_count=2")};
  o.pjrt_options = good;
  o.pjrt_plugin = sv("");
  CHECK_CODE_MSG(colocated_client_create_local(&o, &client), COLOCATED_INVALID_ARGUMENT, "need a PJRT plugin");

  client = plugin_client();
  const colocated_device *cpu = device_at(client, 0);
  const colocated_device *plugin = device_at(client, 1);
  colocated_loaded_executable *exe = NULL;
  const char *garbage = "module { func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> { nonsense } }";
  CHECK_CODE(colocated_client_compile_stablehlo(client, (const uint8_t *)garbage, strlen(garbage), &plugin, 1, &exe),
             COLOCATED_INVALID_ARGUMENT);
  CHECK_CODE_MSG(colocated_client_compile_stablehlo(client, (const uint8_t *)ADD_ONE, strlen(ADD_ONE), &cpu, 1, &exe),
                 COLOCATED_INVALID_ARGUMENT, "CPU devices");
  CHECK_CODE(colocated_client_compile_stablehlo(client, NULL, 5, &plugin, 1, &exe), COLOCATED_INVALID_ARGUMENT);
  CHECK(exe == NULL);
  colocated_client_destroy(client);
}
