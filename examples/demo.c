/*
 * The colocated demo: create a client, move a buffer, run a native program that
 * calls a host callback, and print what happened.
 *
 *   make demo
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "colocated.h"

/* Print an error (if any), free it, and exit. */
static void check(colocated_error *err, const char *what) {
  if (err == NULL) return;
  colocated_string_view msg = colocated_error_message(err);
  colocated_string_view code = colocated_error_code_name(colocated_error_get_code(err));
  fprintf(stderr, "%s failed: %.*s: %.*s\n", what, (int)code.size, code.data, (int)msg.size, msg.data);
  colocated_error_destroy(err);
  exit(1);
}

/* A host callback: it runs in this (the controller) process and answers with the
 * sum of the float32 values it receives. */
static colocated_error *sum_callback(void *user_data, const uint8_t *input, size_t size,
                                     colocated_callback_result *result) {
  int *calls = user_data;
  ++*calls;
  float total = 0;
  for (size_t i = 0; i + sizeof(float) <= size; i += sizeof(float)) {
    float v;
    memcpy(&v, input + i, sizeof v);
    total += v;
  }
  return colocated_callback_result_set(result, (const uint8_t *)&total, sizeof total);
}

/* A native function: each device's shard of x, scaled by the sum the host callback
 * returns. It runs once per host with that host's shards. */
static colocated_error *scale_by_sum(void *user_data, colocated_execution_context *ctx,
                                     const colocated_buffer *const *inputs, size_t num_inputs) {
  (void)user_data;
  const colocated_client *client;
  colocated_error *err = colocated_execution_context_client(ctx, &client);
  if (err) return err;
  for (size_t i = 0; i < num_inputs; ++i) {
    float shard[2];
    colocated_event *copied;
    if ((err = colocated_buffer_to_host(inputs[i], shard, sizeof shard, &copied))) return err;
    err = colocated_event_await(copied);
    colocated_event_destroy(copied);
    if (err) return err;

    colocated_bytes *answer;
    err = colocated_execution_context_call_host_callback(ctx, 0, (const uint8_t *)shard, sizeof shard, &answer);
    if (err) return err;
    const uint8_t *data;
    size_t size;
    float sum = 0;
    if ((err = colocated_bytes_data(answer, &data, &size)) == NULL && size == sizeof sum) memcpy(&sum, data, sizeof sum);
    colocated_bytes_destroy(answer);
    if (err) return err;
    for (int k = 0; k < 2; ++k) shard[k] *= sum;

    const colocated_device *device;
    const int64_t *dims;
    size_t num_dims;
    if ((err = colocated_execution_context_output_spec(ctx, i, NULL, &dims, &num_dims, &device))) return err;
    colocated_buffer_from_host_args args = {sizeof args};
    args.client = client;
    args.data = shard;
    args.data_size = sizeof shard;
    args.dtype = COLOCATED_DTYPE_F32;
    args.dims = dims;
    args.num_dims = num_dims;
    args.device = device;
    colocated_buffer *out;
    if ((err = colocated_buffer_from_host(&args, &out, NULL))) return err;
    err = colocated_execution_context_set_output(ctx, i, out);
    colocated_buffer_destroy(out);
    if (err) return err;
  }
  return NULL;
}

int main(void) {
  unsigned version = colocated_api_version();
  printf("libcolocated API %u.%u\n", version >> 16, version & 0xffff);

  colocated_client_options options = {sizeof options};
  options.num_cpu_devices = 4;
  colocated_client *client;
  check(colocated_client_create_local(&options, &client), "create client");

  colocated_string_view platform;
  check(colocated_client_platform_name(client, &platform), "platform name");
  const colocated_device *const *devices;
  size_t num_devices;
  check(colocated_client_devices(client, &devices, &num_devices), "devices");
  printf("client: platform %.*s with %zu devices:", (int)platform.size, platform.data, num_devices);
  for (size_t i = 0; i < num_devices; ++i) {
    colocated_string_view name;
    check(colocated_device_to_string(devices[i], &name), "device name");
    printf(" %.*s", (int)name.size, name.data);
  }
  printf("\n");

  /* Move a buffer: host -> device 0 -> device 3 -> host. */
  float hello[3] = {1.5f, 2.5f, 3.5f};
  int64_t hello_dims[1] = {3};
  colocated_buffer_from_host_args bargs = {sizeof bargs};
  bargs.client = client;
  bargs.data = hello;
  bargs.data_size = sizeof hello;
  bargs.dtype = COLOCATED_DTYPE_F32;
  bargs.dims = hello_dims;
  bargs.num_dims = 1;
  bargs.device = devices[0];
  colocated_buffer *on_0, *on_3;
  check(colocated_buffer_from_host(&bargs, &on_0, NULL), "buffer_from_host");
  check(colocated_buffer_copy_to_device(on_0, devices[3], &on_3), "copy_to_device");
  float back[3];
  colocated_event *copied;
  check(colocated_buffer_to_host(on_3, back, sizeof back, &copied), "to_host");
  check(colocated_event_await(copied), "await to_host");
  colocated_event_destroy(copied);
  uint32_t where;
  check(colocated_device_id(devices[3], &where), "device id");
  printf("buffer moved host -> device 0 -> device %u -> host: [%g, %g, %g]\n", where, back[0], back[1], back[2]);
  colocated_buffer_destroy(on_0);
  colocated_buffer_destroy(on_3);

  /* A native program over an array sharded across all 4 devices. */
  colocated_native_function_args fargs = {sizeof fargs};
  fargs.name = (colocated_string_view){"scale_by_sum", strlen("scale_by_sum")};
  fargs.function = scale_by_sum;
  check(colocated_client_register_native_function(client, &fargs), "register native function");

  int callback_calls = 0;
  colocated_host_callback_args cargs = {sizeof cargs};
  cargs.function = sum_callback;
  cargs.user_data = &callback_calls;
  cargs.name = (colocated_string_view){"sum", 3};
  colocated_loaded_host_callback *callback;
  check(colocated_client_make_loaded_host_callback(client, &cargs, &callback), "make host callback");

  size_t mesh_shape[1] = {num_devices};
  colocated_string_view axis = {"x", 1};
  size_t counts[1] = {1};
  uint32_t axes[1] = {0};
  colocated_named_sharding_args sargs = {sizeof sargs};
  sargs.client = client;
  sargs.devices = devices;
  sargs.num_devices = num_devices;
  sargs.mesh_shape = mesh_shape;
  sargs.num_mesh_axes = 1;
  sargs.axis_names = &axis;
  sargs.partition_counts = counts;
  sargs.num_partition_dims = 1;
  sargs.partition_axes = axes;
  colocated_sharding *sharding;
  check(colocated_sharding_create_named(&sargs, &sharding), "sharding");

  int64_t dims[1] = {8};
  colocated_array_spec spec = {sizeof spec};
  spec.dtype = COLOCATED_DTYPE_F32;
  spec.dims = dims;
  spec.num_dims = 1;
  spec.sharding = sharding;
  const colocated_array_spec *specs[1] = {&spec};
  const char *fn_name = "scale_by_sum";
  colocated_program program = {sizeof program};
  program.name = (colocated_string_view){fn_name, strlen(fn_name)};
  program.language = (colocated_string_view){"native", 6};
  program.payload = (const uint8_t *)fn_name;
  program.payload_size = strlen(fn_name);
  program.input_specs = specs;
  program.num_input_specs = 1;
  program.output_specs = specs;
  program.num_output_specs = 1;
  program.devices = devices;
  program.num_devices = num_devices;
  const colocated_loaded_host_callback *callbacks[1] = {callback};
  colocated_compile_options copts = {sizeof copts};
  copts.host_callbacks = callbacks;
  copts.num_host_callbacks = 1;
  colocated_loaded_executable *exe;
  check(colocated_client_compile(client, &program, &copts, &exe), "compile");
  colocated_loaded_host_callback_destroy(callback); /* the executable keeps it alive */

  float x[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  colocated_array_args aargs = {sizeof aargs};
  aargs.client = client;
  aargs.dtype = COLOCATED_DTYPE_F32;
  aargs.dims = dims;
  aargs.num_dims = 1;
  aargs.sharding = sharding;
  aargs.data = x;
  aargs.data_size = sizeof x;
  colocated_array *input;
  check(colocated_array_from_host(&aargs, &input), "array_from_host");

  const colocated_array *args[1] = {input};
  colocated_array *outputs[1];
  colocated_event *status;
  check(colocated_loaded_executable_execute(exe, args, 1, NULL, outputs, 1, &status), "execute");
  check(colocated_event_await(status), "execution");
  colocated_event_destroy(status);

  float y[8];
  check(colocated_array_to_host(outputs[0], y, sizeof y), "array_to_host");
  printf("scale_by_sum over 4 devices (each shard times its own sum, via %d host callback calls):\n ", callback_calls);
  for (int i = 0; i < 8; ++i) printf(" %g", y[i]);
  printf("\n");
  for (size_t i = 0; i < 4; ++i) {
    int64_t start, limit;
    check(colocated_sharding_shard_index(sharding, i, dims, 1, &start, &limit), "shard index");
    printf("  device %zu held x[%lld:%lld]\n", i, (long long)start, (long long)limit);
  }

  colocated_array_destroy(outputs[0]);
  colocated_array_destroy(input);
  colocated_loaded_executable_destroy(exe);
  colocated_sharding_destroy(sharding);
  colocated_client_destroy(client);
  printf("done\n");
  return 0;
}
