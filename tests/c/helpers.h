/*
 * helpers.h — shared fixtures of the C tests: clients, buffers, shardings,
 * programs and a few native functions. Include after harness.h.
 *
 * Helpers that run on the test thread use CHECK (they abandon the test on
 * failure). Native functions and callbacks run on executor threads: they never
 * use CHECK, they return errors or use EXPECT.
 */
#ifndef COLOCATED_TEST_HELPERS_H
#define COLOCATED_TEST_HELPERS_H

#include "harness.h"

/* Threads of this process (/proc/self/status), or -1. Tests that count threads
 * call quiet_runtime() first: a trace writer (COLOCATED_TRACE) is one more. */
static inline int thread_count(void) {
  FILE *f = fopen("/proc/self/status", "r");
  if (f == NULL) return -1;
  char line[256];
  int n = -1;
  while (fgets(line, sizeof line, f))
    if (strncmp(line, "Threads:", 8) == 0) n = atoi(line + 8);
  fclose(f);
  return n;
}

/* Keeps the runtime from starting log or trace threads in this test process. */
static inline void quiet_runtime(void) {
  unsetenv("COLOCATED_TRACE");
  unsetenv("COLOCATED_LOG");
}

static inline colocated_string_view sv(const char *s) {
  colocated_string_view v = {s, s ? strlen(s) : 0};
  return v;
}

/* An error with `code` and `message`, as native functions return them. */
static inline colocated_error *make_error(uint32_t code, const char *message) {
  return colocated_error_create(code, (const uint8_t *)message, strlen(message));
}

static inline colocated_client *make_client(uint32_t num_devices, uint32_t executor_threads) {
  colocated_client_options options = {sizeof options};
  options.num_cpu_devices = num_devices;
  options.executor_threads = executor_threads;
  colocated_client *client = NULL;
  CHECK_OK(colocated_client_create_local(&options, &client));
  CHECK(client != NULL);
  return client;
}

static inline const colocated_device *const *client_devices(const colocated_client *client, size_t *count) {
  const colocated_device *const *devices = NULL;
  CHECK_OK(colocated_client_devices(client, &devices, count));
  CHECK(devices != NULL);
  return devices;
}

static inline const colocated_device *device_at(const colocated_client *client, size_t index) {
  size_t n;
  const colocated_device *const *devices = client_devices(client, &n);
  CHECK(index < n);
  return devices[index];
}

/* A memory space of `device` of the given kind. */
static inline const colocated_memory_space *memory_of_kind(const colocated_device *device, colocated_memory_kind kind) {
  const colocated_memory_space *const *spaces;
  size_t n;
  CHECK_OK(colocated_device_memory_spaces(device, &spaces, &n));
  for (size_t i = 0; i < n; ++i) {
    colocated_memory_kind k;
    CHECK_OK(colocated_memory_space_kind(spaces[i], &k));
    if (k == kind) return spaces[i];
  }
  FAIL("device has no memory space of kind %u", (unsigned)kind);
  return NULL;
}

/* The arguments of colocated_buffer_from_host for `data_size` bytes at `data`
 * (default semantics). No CHECK: native functions use it too. */
static inline colocated_buffer_from_host_args buffer_args(const colocated_client *client,
                                                          const colocated_device *device, uint32_t dtype,
                                                          const int64_t *dims, size_t num_dims, const void *data,
                                                          size_t data_size) {
  colocated_buffer_from_host_args args = {sizeof args};
  args.client = client;
  args.device = device;
  args.dtype = dtype;
  args.dims = dims;
  args.num_dims = num_dims;
  args.data = data;
  args.data_size = data_size;
  return args;
}

/* A buffer from host data with host-buffer `semantics`; `done` (may be NULL)
 * receives the event of the host data's release. */
static inline colocated_buffer *make_buffer_with(const colocated_client *client, const colocated_device *device,
                                                 uint32_t dtype, const int64_t *dims, size_t num_dims,
                                                 const void *data, size_t data_size, uint32_t semantics,
                                                 colocated_event **done) {
  colocated_buffer_from_host_args args = buffer_args(client, device, dtype, dims, num_dims, data, data_size);
  args.semantics = semantics;
  colocated_buffer *buffer = NULL;
  CHECK_OK(colocated_buffer_from_host(&args, &buffer, done));
  return buffer;
}

/* A buffer from host data (default semantics); checks it is not NULL. */
static inline colocated_buffer *make_buffer(const colocated_client *client, const colocated_device *device,
                                            uint32_t dtype, const int64_t *dims, size_t num_dims, const void *data,
                                            size_t data_size) {
  colocated_buffer *buffer = make_buffer_with(client, device, dtype, dims, num_dims, data, data_size, 0, NULL);
  CHECK(buffer != NULL);
  return buffer;
}

/* A rank-1 float32 buffer of `n` values. */
static inline colocated_buffer *make_f32(const colocated_client *client, const colocated_device *device,
                                         const float *values, size_t n) {
  int64_t dims[1] = {(int64_t)n};
  return make_buffer(client, device, COLOCATED_DTYPE_F32, dims, 1, values, n * sizeof(float));
}

/* Awaits and destroys `event`, returning its outcome. */
static inline colocated_error *await_and_destroy(colocated_event *event) {
  colocated_error *err = colocated_event_await(event);
  colocated_event_destroy(event);
  return err;
}

static inline bool event_is_ready(const colocated_event *event) {
  bool ready = false;
  CHECK_OK(colocated_event_is_ready(event, &ready));
  return ready;
}

/* Checks that `buffer` is on `device`. */
static inline void check_buffer_device(const colocated_buffer *buffer, const colocated_device *device) {
  const colocated_device *on = NULL;
  CHECK_OK(colocated_buffer_device(buffer, &on));
  CHECK(on == device);
}

/* Checks that `buffer` is on `device`, in `memory` (NULL: in the device's
 * default memory space). */
static inline void check_buffer_place(const colocated_buffer *buffer, const colocated_device *device,
                                      const colocated_memory_space *memory) {
  check_buffer_device(buffer, device);
  const colocated_memory_space *in = NULL;
  CHECK_OK(colocated_buffer_memory_space(buffer, &in));
  if (memory == NULL) CHECK_OK(colocated_device_default_memory_space(device, &memory));
  CHECK(in == memory);
}

/* Waits until `buffer` is ready; fails the test if it became ready with an error. */
static inline void await_buffer_ready(const colocated_buffer *buffer) {
  colocated_event *ready = NULL;
  CHECK_OK(colocated_buffer_ready_event(buffer, &ready));
  CHECK_OK(await_and_destroy(ready));
}

/* Waits until every buffer of `array` is ready; fails the test on an error. */
static inline void await_array_ready(const colocated_array *array) {
  colocated_event *ready = NULL;
  CHECK_OK(colocated_array_ready_event(array, &ready));
  CHECK_OK(await_and_destroy(ready));
}

/* Copies a buffer to host memory (waits). */
static inline void read_buffer(const colocated_buffer *buffer, void *dst, size_t size) {
  colocated_event *done = NULL;
  CHECK_OK(colocated_buffer_to_host(buffer, dst, size, &done));
  CHECK_OK(await_and_destroy(done));
}

static inline colocated_sharding *make_replicated(const colocated_client *client,
                                                  const colocated_device *const *devices, size_t n) {
  colocated_sharding *sharding = NULL;
  CHECK_OK(colocated_sharding_create_replicated(client, devices, n, &sharding));
  CHECK(sharding != NULL);
  return sharding;
}

/* The arguments of a named sharding: `devices` as a mesh of `mesh_shape`
 * (axes `names`), dimension i split `counts[i]` ways over mesh axis `axes[i]`.
 * No CHECK. */
static inline colocated_named_sharding_args named_args(const colocated_client *client,
                                                       const colocated_device *const *devices, size_t num_devices,
                                                       const size_t *mesh_shape, size_t num_axes,
                                                       const colocated_string_view *names, const size_t *counts,
                                                       size_t num_dims, const uint32_t *axes) {
  colocated_named_sharding_args args = {sizeof args};
  args.client = client;
  args.devices = devices;
  args.num_devices = num_devices;
  args.mesh_shape = mesh_shape;
  args.num_mesh_axes = num_axes;
  args.axis_names = names;
  args.partition_counts = counts;
  args.num_partition_dims = num_dims;
  args.partition_axes = axes;
  return args;
}

/* Dimension 0 split over a 1-D mesh of `n` devices (axis "x"). */
static inline colocated_sharding *make_split(const colocated_client *client, const colocated_device *const *devices,
                                             size_t n) {
  size_t mesh_shape[1] = {n};
  colocated_string_view axis = {"x", 1};
  size_t counts[1] = {1};
  uint32_t axes[1] = {0};
  colocated_named_sharding_args args = named_args(client, devices, n, mesh_shape, 1, &axis, counts, 1, axes);
  colocated_sharding *sharding = NULL;
  CHECK_OK(colocated_sharding_create_named(&args, &sharding));
  CHECK(sharding != NULL);
  return sharding;
}

static inline colocated_array_spec make_spec(uint32_t dtype, const int64_t *dims, size_t num_dims,
                                             const colocated_sharding *sharding) {
  colocated_array_spec spec = {sizeof spec};
  spec.dtype = dtype;
  spec.dims = dims;
  spec.num_dims = num_dims;
  spec.sharding = sharding;
  return spec;
}

/* The arguments of an array of `dtype` and `dims` over `sharding`; the caller
 * adds the data (from_host) or the buffers (assemble). No CHECK. */
static inline colocated_array_args array_args(const colocated_client *client, uint32_t dtype, const int64_t *dims,
                                              size_t num_dims, const colocated_sharding *sharding) {
  colocated_array_args args = {sizeof args};
  args.client = client;
  args.dtype = dtype;
  args.dims = dims;
  args.num_dims = num_dims;
  args.sharding = sharding;
  return args;
}

/* An array from `data_size` bytes of host data at `data`. */
static inline colocated_array *make_array(const colocated_client *client, const colocated_sharding *sharding,
                                          uint32_t dtype, const int64_t *dims, size_t num_dims, const void *data,
                                          size_t data_size) {
  colocated_array_args args = array_args(client, dtype, dims, num_dims, sharding);
  args.data = data;
  args.data_size = data_size;
  colocated_array *a = NULL;
  CHECK_OK(colocated_array_from_host(&args, &a));
  return a;
}

/* A float32 array of `n` values over `sharding` (dims {n}). */
static inline colocated_array *f32_array(const colocated_client *client, const colocated_sharding *sharding,
                                         const float *values, size_t n) {
  const int64_t dims[1] = {(int64_t)n};
  return make_array(client, sharding, COLOCATED_DTYPE_F32, dims, 1, values, n * sizeof(float));
}

/* An array of dtype and dims over `sharding` made of `num_buffers` buffers. */
static inline colocated_array *assemble_array(const colocated_client *client, const colocated_sharding *sharding,
                                              uint32_t dtype, const int64_t *dims, size_t num_dims,
                                              const colocated_buffer *const *buffers, size_t num_buffers) {
  colocated_array_args args = array_args(client, dtype, dims, num_dims, sharding);
  args.buffers = buffers;
  args.num_buffers = num_buffers;
  colocated_array *a = NULL;
  CHECK_OK(colocated_array_assemble(&args, &a));
  return a;
}

/* A program of `language` whose payload is `function`. */
static inline colocated_program make_program(const char *language, const char *function,
                                             const colocated_array_spec *const *inputs, size_t num_inputs,
                                             const colocated_array_spec *const *outputs, size_t num_outputs,
                                             const colocated_device *const *devices, size_t num_devices) {
  colocated_program program = {sizeof program};
  program.name = sv(function);
  program.language = sv(language);
  program.payload = (const uint8_t *)function;
  program.payload_size = strlen(function);
  program.input_specs = inputs;
  program.num_input_specs = num_inputs;
  program.output_specs = outputs;
  program.num_output_specs = num_outputs;
  program.devices = devices;
  program.num_devices = num_devices;
  return program;
}

/* Compiles the native program `function` taking one array of `spec` and
 * returning one of the same spec, on `devices`. */
static inline colocated_loaded_executable *compile_unary(const colocated_client *client, const char *function,
                                                         const colocated_array_spec *spec,
                                                         const colocated_device *const *devices, size_t num_devices,
                                                         const colocated_compile_options *options) {
  const colocated_array_spec *specs[1] = {spec};
  colocated_program program = make_program("native", function, specs, 1, specs, 1, devices, num_devices);
  colocated_loaded_executable *exe = NULL;
  CHECK_OK(colocated_client_compile(client, &program, options, &exe));
  CHECK(exe != NULL);
  return exe;
}

/* Compiles native `function` taking one float32[len] array sharded by `sharding`
 * and returning one of the same spec, on `devices`. */
static inline colocated_loaded_executable *compile_f32_unary(const colocated_client *client, const char *function,
                                                             int64_t len, const colocated_sharding *sharding,
                                                             const colocated_device *const *devices,
                                                             size_t num_devices,
                                                             const colocated_compile_options *options) {
  const int64_t dims[1] = {len};
  colocated_array_spec spec = make_spec(COLOCATED_DTYPE_F32, dims, 1, sharding);
  return compile_unary(client, function, &spec, devices, num_devices, options);
}

/* Compile options that pass `num_callbacks` host callbacks. */
static inline colocated_compile_options callback_options(const colocated_loaded_host_callback *const *callbacks,
                                                         size_t num_callbacks) {
  colocated_compile_options options = {sizeof options};
  options.host_callbacks = callbacks;
  options.num_host_callbacks = num_callbacks;
  return options;
}

/* A new stream of `client`. */
static inline colocated_stream *make_stream(const colocated_client *client) {
  colocated_stream *s = NULL;
  CHECK_OK(colocated_client_create_stream(client, &s));
  return s;
}

/* Runs a one-input one-output executable on `stream` (NULL: this thread's
 * default); returns the output, its status in *status (status may be NULL). */
static inline colocated_array *run1(const colocated_loaded_executable *exe, const colocated_array *arg,
                                    const colocated_stream *stream, colocated_event **status) {
  colocated_execute_options options = {sizeof options};
  options.stream = stream;
  const colocated_array *args[1] = {arg};
  colocated_array *out[1] = {NULL};
  CHECK_OK(colocated_loaded_executable_execute(exe, args, 1, &options, out, 1, status));
  CHECK(out[0] != NULL);
  return out[0];
}

static inline void register_native(const colocated_client *client, const char *name, colocated_native_fn fn,
                                   void *user_data, colocated_destructor destructor) {
  colocated_native_function_args args = {sizeof args};
  args.name = sv(name);
  args.function = fn;
  args.user_data = user_data;
  args.destructor = destructor;
  CHECK_OK(colocated_client_register_native_function(client, &args));
}

/* A client and its devices, and a sharding over them once the test makes one:
 * the start of the sharding, array and device tests. */
struct client_fixture {
  colocated_client *client;
  const colocated_device *const *devices; /* every device of the client */
  size_t num_devices;
  colocated_sharding *sharding; /* NULL until the test sets one */
};

/* A client of `num_devices` devices and `executor_threads` executor threads. */
static inline struct client_fixture client_fixture(uint32_t num_devices, uint32_t executor_threads) {
  struct client_fixture f = {0};
  f.client = make_client(num_devices, executor_threads);
  f.devices = client_devices(f.client, &f.num_devices);
  return f;
}

/* Destroys the sharding (if any), then the client. */
static inline void client_fixture_destroy(struct client_fixture *f) {
  if (f->sharding) colocated_sharding_destroy(f->sharding);
  colocated_client_destroy(f->client);
}

/* The usual start of an executable test: a client with one native function
 * registered, a sharding and that function compiled over float32[len]
 * (native_client, then compile_replicated or compile_split). Tests that make
 * their own sharding and program use the client part alone. */
struct native_fixture {
  colocated_client *client;
  const colocated_device *const *devices; /* every device of the client */
  size_t num_devices;
  const char *function;
  colocated_sharding *sharding;
  colocated_loaded_executable *exe;
};

/* A client of `num_devices` devices and `executor_threads` executor threads
 * with `fn` registered as `function` (with `user_data`, no destructor). */
static inline struct native_fixture native_client(uint32_t num_devices, uint32_t executor_threads,
                                                  const char *function, colocated_native_fn fn, void *user_data) {
  struct native_fixture f = {0};
  f.client = make_client(num_devices, executor_threads);
  register_native(f.client, function, fn, user_data, NULL);
  f.devices = client_devices(f.client, &f.num_devices);
  f.function = function;
  return f;
}

/* Compiles the fixture's function over float32[len] on device 0 alone
 * (replicated sharding of that one device). */
static inline void compile_replicated(struct native_fixture *f, int64_t len,
                                      const colocated_compile_options *options) {
  f->sharding = make_replicated(f->client, f->devices, 1);
  f->exe = compile_f32_unary(f->client, f->function, len, f->sharding, f->devices, 1, options);
}

/* Compiles the fixture's function over float32[len], dimension 0 split over
 * the first `over` devices. */
static inline void compile_split(struct native_fixture *f, size_t over, int64_t len,
                                 const colocated_compile_options *options) {
  f->sharding = make_split(f->client, f->devices, over);
  f->exe = compile_f32_unary(f->client, f->function, len, f->sharding, f->devices, over, options);
}

/* Destroys the executable, the sharding and the client, in that order. */
static inline void native_fixture_destroy(struct native_fixture *f) {
  colocated_loaded_executable_destroy(f->exe);
  colocated_sharding_destroy(f->sharding);
  colocated_client_destroy(f->client);
}

/* Builds output shard `index` of `ctx` from `size` bytes at `data`. */
static inline colocated_error *set_output_from(colocated_execution_context *ctx, size_t index, const void *data,
                                               size_t size) {
  const colocated_client *client;
  colocated_error *err = colocated_execution_context_client(ctx, &client);
  if (err) return err;
  colocated_dtype dtype;
  const int64_t *dims;
  size_t num_dims;
  const colocated_device *device;
  if ((err = colocated_execution_context_output_spec(ctx, index, &dtype, &dims, &num_dims, &device))) return err;
  colocated_buffer_from_host_args args = buffer_args(client, device, dtype, dims, num_dims, data, size);
  colocated_buffer *out;
  if ((err = colocated_buffer_from_host(&args, &out, NULL))) return err;
  err = colocated_execution_context_set_output(ctx, index, out);
  colocated_buffer_destroy(out);
  return err;
}

/* Reads a dense buffer inside a native function into a malloc'ed block. */
static inline colocated_error *read_shard(const colocated_buffer *buffer, void **data, size_t *size) {
  colocated_error *err = colocated_buffer_on_host_size(buffer, size);
  if (err) return err;
  *data = malloc(*size ? *size : 1);
  colocated_event *done;
  if ((err = colocated_buffer_to_host(buffer, *data, *size, &done))) {
    free(*data);
    return err;
  }
  err = await_and_destroy(done);
  if (err) free(*data);
  return err;
}

/* Native function "add_one": each float32 output shard is its input shard + 1
 * (one argument, sharded like the result). */
static inline colocated_error *native_add_one(void *user_data, colocated_execution_context *ctx,
                                              const colocated_buffer *const *inputs, size_t num_inputs) {
  (void)user_data;
  size_t num_outputs;
  colocated_error *err = colocated_execution_context_num_outputs(ctx, &num_outputs);
  if (err) return err;
  if (num_outputs != num_inputs) return make_error(COLOCATED_INVALID_ARGUMENT, "add_one: shard counts differ");
  for (size_t i = 0; i < num_inputs; ++i) {
    void *data;
    size_t size;
    if ((err = read_shard(inputs[i], &data, &size))) return err;
    float *values = data;
    for (size_t k = 0; k < size / sizeof(float); ++k) values[k] += 1.0f;
    err = set_output_from(ctx, i, data, size);
    free(data);
    if (err) return err;
  }
  return NULL;
}

#endif /* COLOCATED_TEST_HELPERS_H */
