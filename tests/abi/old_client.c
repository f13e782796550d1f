/*
 * An "old binary": a C program compiled against the FIRST released header,
 * tests/abi/colocated-1.0.h (API 1.0, never edited), and linked against the
 * CURRENT libcolocated. It must keep working as the library grows (SPEC §7).
 *
 * It exercises the struct_size-versioned argument structs (including an older,
 * smaller struct and a newer, larger one) and the core flows: client, devices,
 * buffers, events, shardings, native functions, compile / execute / serialize.
 * Prints one line per check and a final "N passed, M failed"; exits non-zero on
 * any failure.
 *
 *   make -C tests/abi run LIBDIR=<dir of libcolocated.so> BUILD=<scratch dir>
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "colocated-1.0.h"

static int passed, failed;

/* Records one check. */
static int expect(int cond, const char *what) {
  if (cond) {
    ++passed;
    printf("ok   %s\n", what);
  } else {
    ++failed;
    printf("FAIL %s\n", what);
  }
  return cond;
}

/* Records a call that must succeed; prints and frees the error if it did not. */
static int ok(colocated_error *err, const char *what) {
  if (err == NULL) return expect(1, what);
  colocated_string_view code = colocated_error_code_name(colocated_error_get_code(err));
  colocated_string_view msg = colocated_error_message(err);
  ++failed;
  printf("FAIL %s: %.*s: %.*s\n", what, (int)code.size, code.data, (int)msg.size, msg.data);
  colocated_error_destroy(err);
  return 0;
}

/* Like ok() for calls inside loops: counts and prints only a failure. */
static int succeeded(colocated_error *err, const char *what) {
  if (err == NULL) return 1;
  return ok(err, what);
}

/* Records a call that must fail with `code` (and a non-empty message). */
static int fails_with(colocated_error *err, colocated_error_code code, const char *what) {
  if (err == NULL) return expect(0, what);
  colocated_string_view msg = colocated_error_message(err);
  int good = colocated_error_get_code(err) == code && msg.size > 0 && msg.data[msg.size] == '\0';
  if (!good) printf("     got code %u: %.*s\n", (unsigned)colocated_error_get_code(err), (int)msg.size, msg.data);
  colocated_error_destroy(err);
  return expect(good, what);
}

static int sv_eq(colocated_string_view s, const char *text) {
  return s.size == strlen(text) && memcmp(s.data, text, s.size) == 0;
}

/* ---- a native function: y = 2 * x + 1 over each float32 shard ---- */

static atomic_int native_calls;
static atomic_int destructor_calls;

static void count_destructor(void *user_data) {
  (void)user_data;
  atomic_fetch_add(&destructor_calls, 1);
}

static colocated_error *axpb(void *user_data, colocated_execution_context *ctx,
                             const colocated_buffer *const *inputs, size_t num_inputs) {
  (void)user_data;
  atomic_fetch_add(&native_calls, 1);
  const colocated_client *client;
  colocated_error *err = colocated_execution_context_client(ctx, &client);
  if (err) return err;
  size_t num_outputs;
  if ((err = colocated_execution_context_num_outputs(ctx, &num_outputs))) return err;
  if (num_outputs != num_inputs) {
    const char *msg = "axpb: one output per input shard expected";
    return colocated_error_create(COLOCATED_INTERNAL, (const uint8_t *)msg, strlen(msg));
  }
  for (size_t i = 0; i < num_inputs; ++i) {
    float shard[16];
    size_t size;
    if ((err = colocated_buffer_on_host_size(inputs[i], &size))) return err;
    if (size > sizeof shard) {
      const char *msg = "axpb: shard too large";
      return colocated_error_create(COLOCATED_INVALID_ARGUMENT, (const uint8_t *)msg, strlen(msg));
    }
    colocated_event *copied;
    if ((err = colocated_buffer_to_host(inputs[i], shard, size, &copied))) return err;
    err = colocated_event_await(copied);
    colocated_event_destroy(copied);
    if (err) return err;
    for (size_t k = 0; k < size / sizeof(float); ++k) shard[k] = 2.0f * shard[k] + 1.0f;

    colocated_dtype dtype;
    const int64_t *dims;
    size_t num_dims;
    const colocated_device *device;
    if ((err = colocated_execution_context_output_spec(ctx, i, &dtype, &dims, &num_dims, &device))) return err;
    colocated_buffer_from_host_args args = {sizeof args};
    args.client = client;
    args.data = shard;
    args.data_size = size;
    args.dtype = dtype;
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

/* ---- an event callback ---- */

struct ready_record {
  int calls;
  colocated_error_code code;
};

static void on_ready(colocated_error *error, void *user_data) {
  struct ready_record *r = user_data;
  r->calls++;
  r->code = error ? colocated_error_get_code(error) : COLOCATED_OK;
  colocated_error_destroy(error); /* the callback owns it */
}

/* ---- the checks ---- */

static void check_version(void) {
  uint32_t v = colocated_api_version();
  printf("     library API %u.%u, header API %d.%d\n", (unsigned)(v >> 16), (unsigned)(v & 0xffff),
         COLOCATED_API_VERSION_MAJOR, COLOCATED_API_VERSION_MINOR);
  expect(v >> 16 == COLOCATED_API_VERSION_MAJOR, "api_version: library major == header major");
  uint32_t header_minor = COLOCATED_API_VERSION_MINOR; /* a variable: minor 0 makes `>=` trivially true */
  expect((v & 0xffff) >= header_minor, "api_version: library minor >= header minor");
  expect(COLOCATED_API_VERSION == ((COLOCATED_API_VERSION_MAJOR << 16) | COLOCATED_API_VERSION_MINOR),
         "COLOCATED_API_VERSION == (major << 16) | minor");
}

static void check_errors(void) {
  expect(sv_eq(colocated_error_code_name(COLOCATED_INVALID_ARGUMENT), "invalid_argument"),
         "error_code_name(INVALID_ARGUMENT)");
  const char *text = "made by the old client";
  colocated_error *err = colocated_error_create(COLOCATED_NOT_FOUND, (const uint8_t *)text, strlen(text));
  expect(err != NULL && colocated_error_get_code(err) == COLOCATED_NOT_FOUND &&
             sv_eq(colocated_error_message(err), text),
         "error_create: code and message");
  colocated_error_destroy(err);
  expect(colocated_error_get_code(NULL) == COLOCATED_INVALID_ARGUMENT, "error_get_code(NULL)");
  /* Every destroy accepts NULL. */
  colocated_error_destroy(NULL);
  colocated_client_destroy(NULL);
  colocated_buffer_destroy(NULL);
  colocated_array_destroy(NULL);
  colocated_event_destroy(NULL);
  colocated_sharding_destroy(NULL);
  colocated_bytes_destroy(NULL);
  colocated_stream_destroy(NULL);
  colocated_loaded_executable_destroy(NULL);
  colocated_loaded_host_callback_destroy(NULL);
  expect(1, "destroy functions accept NULL");
}

/* Older (smaller) and newer (larger) versions of colocated_client_options. */
static void check_struct_versions(void) {
  colocated_client *client = NULL;
  const colocated_device *const *devices;
  size_t n = 0;

  /* A caller that only knew num_cpu_devices: executor_threads takes its default. */
  colocated_client_options small = {COLOCATED_STRUCT_SIZE(colocated_client_options, num_cpu_devices)};
  small.num_cpu_devices = 3;
  if (ok(colocated_client_create_local(&small, &client), "client_create_local with a smaller (older) options struct")) {
    ok(colocated_client_devices(client, &devices, &n), "client_devices");
    expect(n == 3, "smaller struct: its fields are honoured (3 devices)");
    colocated_client_destroy(client);
  }

  /* A caller from the future whose extra fields are zero: accepted. */
  struct {
    colocated_client_options known;
    uint64_t future[4];
  } big;
  memset(&big, 0, sizeof big);
  big.known.struct_size = sizeof big;
  big.known.num_cpu_devices = 2;
  client = NULL;
  if (ok(colocated_client_create_local(&big.known, &client), "client_create_local with a larger struct, zero tail")) {
    ok(colocated_client_devices(client, &devices, &n), "client_devices");
    expect(n == 2, "larger struct: known fields are honoured (2 devices)");
    colocated_client_destroy(client);
  }
  /* A non-zero unknown tail is refused, while the library knows no more fields than
   * this header (a later library may give that byte a meaning). */
  if ((colocated_api_version() & 0xffff) == COLOCATED_API_VERSION_MINOR) {
    big.future[3] = 1;
    client = NULL;
    fails_with(colocated_client_create_local(&big.known, &client), COLOCATED_INVALID_ARGUMENT,
               "larger struct with a non-zero unknown tail: invalid_argument");
    colocated_client_destroy(client);
  }

  colocated_client_options bad = {0};
  bad.num_cpu_devices = 1;
  client = NULL;
  fails_with(colocated_client_create_local(&bad, &client), COLOCATED_INVALID_ARGUMENT,
             "struct_size 0: invalid_argument, no crash");
  colocated_client_destroy(client);
  client = NULL;
  fails_with(colocated_client_create_local(NULL, NULL), COLOCATED_INVALID_ARGUMENT,
             "NULL out-parameter: invalid_argument, no crash");
}

static void check_devices(colocated_client *client, const colocated_device *const *devices, size_t n) {
  colocated_string_view platform;
  if (ok(colocated_client_platform_name(client, &platform), "client_platform_name"))
    expect(platform.size > 0 && platform.data[platform.size] == '\0', "platform name is NUL-terminated");
  const colocated_device *const *addressable;
  size_t num_addressable;
  ok(colocated_client_addressable_devices(client, &addressable, &num_addressable), "client_addressable_devices");
  expect(num_addressable == n, "every local device is addressable");
  int ids_ok = 1, kinds_ok = 1, lookup_ok = 1, memory_ok = 1, attrs_ok = 1;
  for (size_t i = 0; i < n; ++i) {
    uint32_t id = 0;
    colocated_string_view kind = {0}, text = {0};
    const colocated_device *found = NULL;
    const colocated_memory_space *memory = NULL;
    colocated_memory_kind mkind = 0;
    ids_ok &= succeeded(colocated_device_id(devices[i], &id), "device_id") && id == i;
    kinds_ok &= succeeded(colocated_device_kind(devices[i], &kind), "device_kind") && sv_eq(kind, "cpu");
    kinds_ok &= succeeded(colocated_device_to_string(devices[i], &text), "device_to_string") && text.size > 0;
    lookup_ok &= succeeded(colocated_client_lookup_device(client, id, &found), "client_lookup_device") && found == devices[i];
    memory_ok &= succeeded(colocated_device_default_memory_space(devices[i], &memory), "device_default_memory_space") &&
                 succeeded(colocated_memory_space_kind(memory, &mkind), "memory_space_kind") &&
                 mkind >= COLOCATED_MEMORY_DEVICE && mkind <= COLOCATED_MEMORY_UNPINNED_HOST;
    /* colocated_device_attribute is read as an array: its stride is part of the ABI. */
    const colocated_device_attribute *attrs = NULL;
    size_t num_attrs = 0;
    attrs_ok &= succeeded(colocated_device_attributes(devices[i], &attrs, &num_attrs), "device_attributes");
    for (size_t k = 0; k < num_attrs; ++k) {
      attrs_ok &= attrs[k].name.size > 0 && attrs[k].name.data[attrs[k].name.size] == '\0';
      attrs_ok &= attrs[k].type_ >= COLOCATED_ATTRIBUTE_INT && attrs[k].type_ <= COLOCATED_ATTRIBUTE_BOOL;
    }
  }
  expect(ids_ok, "device ids are 0..n-1 in order");
  expect(kinds_ok, "devices are \"cpu\" with a description");
  expect(lookup_ok, "client_lookup_device finds each device");
  expect(memory_ok, "each device has a default memory space of a known kind");
  expect(attrs_ok, "device attributes are well-formed");
  const colocated_device *missing = NULL;
  fails_with(colocated_client_lookup_device(client, 1000, &missing), COLOCATED_NOT_FOUND,
             "client_lookup_device(1000): not_found");
}

static void check_buffers(colocated_client *client, const colocated_device *const *devices) {
  float data[2][3] = {{1, 2, 3}, {4, 5, 6}};
  int64_t dims[2] = {2, 3};
  colocated_buffer_from_host_args args = {sizeof args};
  args.client = client;
  args.data = data;
  args.data_size = sizeof data;
  args.dtype = COLOCATED_DTYPE_F32;
  args.dims = dims;
  args.num_dims = 2;
  args.device = devices[1];
  colocated_buffer *buffer = NULL;
  colocated_event *done = NULL;
  if (!ok(colocated_buffer_from_host(&args, &buffer, &done), "buffer_from_host")) return;
  ok(colocated_event_await(done), "done_with_host_buffer event");
  colocated_event_destroy(done);

  colocated_dtype dtype = 0;
  const int64_t *got_dims = NULL;
  size_t num_dims = 0;
  const colocated_device *device = NULL;
  size_t size = 0;
  ok(colocated_buffer_dtype(buffer, &dtype), "buffer_dtype");
  ok(colocated_buffer_dims(buffer, &got_dims, &num_dims), "buffer_dims");
  ok(colocated_buffer_device(buffer, &device), "buffer_device");
  ok(colocated_buffer_on_host_size(buffer, &size), "buffer_on_host_size");
  expect(dtype == COLOCATED_DTYPE_F32 && num_dims == 2 && got_dims[0] == 2 && got_dims[1] == 3 &&
             device == devices[1] && size == sizeof data,
         "buffer metadata (f32[2,3] on device 1, 24 bytes)");

  float back[2][3] = {{0}};
  colocated_event *copied = NULL;
  if (ok(colocated_buffer_to_host(buffer, back, sizeof back, &copied), "buffer_to_host")) {
    ok(colocated_event_await(copied), "await buffer_to_host");
    colocated_event_destroy(copied);
    expect(memcmp(back, data, sizeof data) == 0, "buffer read back equals the host data");
  }

  colocated_buffer *moved = NULL;
  if (ok(colocated_buffer_copy_to_device(buffer, devices[2], &moved), "buffer_copy_to_device")) {
    memset(back, 0, sizeof back);
    copied = NULL;
    ok(colocated_buffer_to_host(moved, back, sizeof back, &copied), "buffer_to_host after copy");
    ok(colocated_event_await(copied), "await buffer_to_host after copy");
    colocated_event_destroy(copied);
    expect(memcmp(back, data, sizeof data) == 0, "copied buffer holds the same data");
  }
  colocated_buffer_destroy(moved);

  fails_with(colocated_buffer_to_host(buffer, back, 5, &copied), COLOCATED_INVALID_ARGUMENT,
             "buffer_to_host with a wrong size: invalid_argument");
  ok(colocated_buffer_delete(buffer), "buffer_delete");
  bool deleted = false;
  ok(colocated_buffer_is_deleted(buffer, &deleted), "buffer_is_deleted");
  expect(deleted, "a deleted buffer says so");
  fails_with(colocated_buffer_to_host(buffer, back, sizeof back, &copied), COLOCATED_FAILED_PRECONDITION,
             "buffer_to_host after delete: failed_precondition");
  colocated_buffer_destroy(buffer);
}

static void check_events(void) {
  colocated_event *event = NULL;
  if (!ok(colocated_event_create(&event), "event_create")) return;
  bool ready = true;
  ok(colocated_event_is_ready(event, &ready), "event_is_ready");
  expect(!ready, "a new event is not ready");
  fails_with(colocated_event_await_timeout(event, 1000000), COLOCATED_DEADLINE_EXCEEDED,
             "event_await_timeout on an unset event: deadline_exceeded");
  ok(colocated_event_set(event, COLOCATED_OK, NULL, 0), "event_set(OK)");
  ok(colocated_event_is_ready(event, &ready), "event_is_ready");
  expect(ready, "a set event is ready");
  ok(colocated_event_await(event), "event_await on a successful event");
  colocated_error *outcome = (colocated_error *)1;
  ok(colocated_event_error(event, &outcome), "event_error");
  expect(outcome == NULL, "event_error of a successful event is NULL");
  fails_with(colocated_event_set(event, COLOCATED_OK, NULL, 0), COLOCATED_FAILED_PRECONDITION,
             "event_set twice: failed_precondition");
  colocated_event_destroy(event);

  struct ready_record record = {0, COLOCATED_OK};
  event = NULL;
  if (!ok(colocated_event_create(&event), "event_create")) return;
  ok(colocated_event_on_ready(event, on_ready, &record), "event_on_ready");
  expect(record.calls == 0, "on_ready callback waits for the event");
  const char *why = "stopped by the old client";
  ok(colocated_event_set(event, COLOCATED_CANCELLED, (const uint8_t *)why, strlen(why)), "event_set(CANCELLED)");
  colocated_error *err = colocated_event_await(event);
  expect(err != NULL && colocated_error_get_code(err) == COLOCATED_CANCELLED &&
             sv_eq(colocated_error_message(err), why),
         "event_await gives the event's error");
  colocated_error_destroy(err);
  expect(record.calls == 1 && record.code == COLOCATED_CANCELLED, "on_ready callback ran once with the error");
  colocated_event_destroy(event);
}

static colocated_sharding *check_shardings(colocated_client *client, const colocated_device *const *devices,
                                           size_t n) {
  colocated_sharding *replicated = NULL;
  if (ok(colocated_sharding_create_replicated(client, devices, 2, &replicated), "sharding_create_replicated")) {
    bool full = false;
    ok(colocated_sharding_is_fully_replicated(replicated, &full), "sharding_is_fully_replicated");
    expect(full, "a replicated sharding is fully replicated");
  }
  colocated_sharding_destroy(replicated);

  size_t mesh_shape[1] = {n};
  colocated_string_view axis = {"x", 1};
  size_t counts[1] = {1};
  uint32_t axes[1] = {0};
  colocated_named_sharding_args args = {sizeof args};
  args.client = client;
  args.devices = devices;
  args.num_devices = n;
  args.mesh_shape = mesh_shape;
  args.num_mesh_axes = 1;
  args.axis_names = &axis;
  args.partition_counts = counts;
  args.num_partition_dims = 1;
  args.partition_axes = axes;
  colocated_sharding *sharding = NULL;
  if (!ok(colocated_sharding_create_named(&args, &sharding), "sharding_create_named")) return NULL;
  bool full = true;
  ok(colocated_sharding_is_fully_replicated(sharding, &full), "sharding_is_fully_replicated");
  expect(!full, "a split sharding is not fully replicated");
  const colocated_device *const *sdevices;
  size_t count = 0;
  ok(colocated_sharding_devices(sharding, &sdevices, &count), "sharding_devices");
  expect(count == n, "the named sharding spans every device");
  int64_t dims[1] = {2 * (int64_t)n};
  int slices_ok = 1;
  for (size_t i = 0; i < n; ++i) {
    int64_t start = -1, limit = -1;
    slices_ok &= succeeded(colocated_sharding_shard_index(sharding, i, dims, 1, &start, &limit), "sharding_shard_index") &&
                 start == 2 * (int64_t)i && limit == 2 * (int64_t)i + 2;
  }
  expect(slices_ok, "device i holds x[2i:2i+2]");
  return sharding;
}

static int check_results(colocated_array *out, const float *x, size_t n, const char *what) {
  float y[16] = {0};
  if (!ok(colocated_array_to_host(out, y, n * sizeof(float)), "array_to_host")) return 0;
  int good = 1;
  for (size_t i = 0; i < n; ++i) good &= y[i] == 2.0f * x[i] + 1.0f;
  return expect(good, what);
}

static void check_native_program(colocated_client *client, const colocated_device *const *devices, size_t n,
                                 const colocated_sharding *sharding) {
  colocated_native_function_args fargs = {sizeof fargs};
  fargs.name = (colocated_string_view){"old_client_axpb", strlen("old_client_axpb")};
  fargs.function = axpb;
  fargs.destructor = count_destructor;
  ok(colocated_client_register_native_function(client, &fargs), "client_register_native_function");
  colocated_native_function_args again = fargs;
  again.destructor = NULL;
  fails_with(colocated_client_register_native_function(client, &again), COLOCATED_ALREADY_EXISTS,
             "registering the same name twice: already_exists");

  size_t count = 2 * n;
  int64_t dims[1] = {(int64_t)count};
  colocated_array_spec spec = {sizeof spec};
  spec.dtype = COLOCATED_DTYPE_F32;
  spec.dims = dims;
  spec.num_dims = 1;
  spec.sharding = sharding;
  const colocated_array_spec *specs[1] = {&spec};
  const char *payload = "old_client_axpb";
  colocated_program program = {sizeof program};
  program.name = (colocated_string_view){"axpb", 4};
  program.language = (colocated_string_view){"native", 6};
  program.payload = (const uint8_t *)payload;
  program.payload_size = strlen(payload);
  program.input_specs = specs;
  program.num_input_specs = 1;
  program.output_specs = specs;
  program.num_output_specs = 1;
  program.devices = devices;
  program.num_devices = n;
  colocated_compile_options copts = {sizeof copts};
  colocated_loaded_executable *exe = NULL;
  if (!ok(colocated_client_compile(client, &program, &copts, &exe), "client_compile (native program)")) return;

  colocated_string_view name, fingerprint;
  size_t num_inputs = 0, num_outputs = 0;
  ok(colocated_loaded_executable_name(exe, &name), "loaded_executable_name");
  ok(colocated_loaded_executable_fingerprint(exe, &fingerprint), "loaded_executable_fingerprint");
  ok(colocated_loaded_executable_num_inputs(exe, &num_inputs), "loaded_executable_num_inputs");
  ok(colocated_loaded_executable_num_outputs(exe, &num_outputs), "loaded_executable_num_outputs");
  expect(sv_eq(name, "axpb") && fingerprint.size == 16 && num_inputs == 1 && num_outputs == 1,
         "executable metadata (name, 16-digit fingerprint, 1 in, 1 out)");

  float x[16];
  for (size_t i = 0; i < count; ++i) x[i] = (float)i - 3.0f;
  colocated_array_args aargs = {sizeof aargs};
  aargs.client = client;
  aargs.dtype = COLOCATED_DTYPE_F32;
  aargs.dims = dims;
  aargs.num_dims = 1;
  aargs.sharding = sharding;
  aargs.data = x;
  aargs.data_size = count * sizeof(float);
  colocated_array *input = NULL;
  if (ok(colocated_array_from_host(&aargs, &input), "array_from_host")) {
    size_t num_buffers = 0;
    ok(colocated_array_num_buffers(input, &num_buffers), "array_num_buffers");
    expect(num_buffers == n, "one buffer per device");

    colocated_stream *stream = NULL;
    ok(colocated_client_create_stream(client, &stream), "client_create_stream");
    colocated_execute_options eopts = {sizeof eopts};
    eopts.stream = stream;
    const colocated_array *args[1] = {input};
    colocated_array *outputs[1] = {NULL};
    colocated_event *status = NULL;
    if (ok(colocated_loaded_executable_execute(exe, args, 1, &eopts, outputs, 1, &status), "loaded_executable_execute")) {
      ok(colocated_event_await(status), "execution status");
      colocated_event_destroy(status);
      check_results(outputs[0], x, count, "native program computed 2x+1 on every shard");
      colocated_array_destroy(outputs[0]);
    }
    expect(atomic_load(&native_calls) >= 1, "the native function ran");

    /* Serialize, check and reload the executable; run the copy with default options. */
    colocated_bytes *bytes = NULL;
    if (ok(colocated_loaded_executable_serialize(exe, &bytes), "loaded_executable_serialize")) {
      const uint8_t *data = NULL;
      size_t size = 0;
      ok(colocated_bytes_data(bytes, &data, &size), "bytes_data");
      ok(colocated_executable_is_compatible(data, size), "executable_is_compatible");
      fails_with(colocated_executable_is_compatible(data, size / 2), COLOCATED_INVALID_ARGUMENT,
                 "executable_is_compatible(truncated): invalid_argument");
      colocated_loaded_executable *copy = NULL;
      if (ok(colocated_client_deserialize_and_load(client, data, size, NULL, &copy), "client_deserialize_and_load")) {
        outputs[0] = NULL;
        status = NULL;
        if (ok(colocated_loaded_executable_execute(copy, args, 1, NULL, outputs, 1, &status),
               "execute the reloaded executable")) {
          ok(colocated_event_await(status), "execution status (reloaded)");
          colocated_event_destroy(status);
          check_results(outputs[0], x, count, "reloaded executable computes the same");
          colocated_array_destroy(outputs[0]);
        }
      }
      colocated_loaded_executable_destroy(copy);
    }
    colocated_bytes_destroy(bytes);

    colocated_array *no_outputs[1] = {NULL};
    fails_with(colocated_loaded_executable_execute(exe, args, 0, NULL, no_outputs, 1, NULL),
               COLOCATED_INVALID_ARGUMENT, "execute with the wrong argument count: invalid_argument");
    colocated_stream_destroy(stream);
  }
  colocated_array_destroy(input);
  colocated_loaded_executable_destroy(exe);
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  check_version();
  check_errors();
  check_struct_versions();

  colocated_client_options options = {sizeof options};
  options.num_cpu_devices = 4;
  options.executor_threads = 2;
  colocated_client *client = NULL;
  if (ok(colocated_client_create_local(&options, &client), "client_create_local (4 devices, 2 threads)")) {
    const colocated_device *const *devices = NULL;
    size_t n = 0;
    ok(colocated_client_devices(client, &devices, &n), "client_devices");
    if (expect(n == 4, "the client has the 4 devices asked for")) {
      check_devices(client, devices, n);
      check_buffers(client, devices);
      check_events();
      colocated_sharding *sharding = check_shardings(client, devices, n);
      if (sharding) check_native_program(client, devices, n, sharding);
      colocated_sharding_destroy(sharding);
    }
    colocated_client_destroy(client);
    expect(atomic_load(&destructor_calls) == 1, "the native function's destructor ran once, after the client");
  }

  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
