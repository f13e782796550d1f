/*
 * Colocated functions and objects from C: discovery of outputs, declared
 * outputs, the cache per input spec, argument-less calls on specialized
 * devices, and objects built once per host and destroyed after their calls.
 */
#include "harness.h"
#include "helpers.h"

static const char STRUCTURE[] = "one float32 leaf";

/* Calls so far of "twice" (discovery runs and others). */
static atomic_int twice_calls;
static atomic_int twice_discovering;

/* Native "twice": out = 2 * in, over this host's array of argument 0, with
 * its sharding. */
static colocated_error *native_twice(void *user_data, colocated_execution_context *ctx,
                                     const colocated_buffer *const *inputs, size_t num_inputs) {
  (void)inputs, (void)num_inputs;
  atomic_fetch_add(&twice_calls, 1);
  bool discovering = false;
  colocated_error *err = colocated_execution_context_discovering(ctx, &discovering);
  if (err) return err;
  if (discovering) atomic_fetch_add(&twice_discovering, 1);
  colocated_array *in = NULL;
  /* The program has one input: index 1 is refused. */
  colocated_error *beyond = colocated_execution_context_host_input(ctx, 1, &in);
  EXPECT(beyond != NULL && colocated_error_get_code(beyond) == COLOCATED_INVALID_ARGUMENT);
  colocated_error_destroy(beyond);
  if ((err = colocated_execution_context_host_input(ctx, 0, &in))) return err;
  const int64_t *dims;
  size_t num_dims;
  colocated_sharding *sharding = NULL;
  float values[8];
  if ((err = colocated_array_dims(in, &dims, &num_dims))) goto done;
  if (num_dims != 1 || dims[0] > 8) {
    err = make_error(COLOCATED_INVALID_ARGUMENT, "twice takes up to 8 floats");
    goto done;
  }
  if ((err = colocated_array_to_host(in, values, (size_t)dims[0] * sizeof(float)))) goto done;
  for (int64_t i = 0; i < dims[0]; ++i) values[i] *= 2;
  if ((err = colocated_array_sharding(in, &sharding))) goto done;
  const colocated_client *client;
  if ((err = colocated_execution_context_client(ctx, &client))) goto done;
  colocated_array_args args = array_args(client, COLOCATED_DTYPE_F32, dims, num_dims, sharding);
  args.data = values;
  args.data_size = (size_t)dims[0] * sizeof(float);
  colocated_array *out = NULL;
  if ((err = colocated_array_from_host(&args, &out))) goto done;
  const colocated_array *outs[1] = {out};
  err = colocated_execution_context_set_host_outputs(ctx, outs, 1, (const uint8_t *)STRUCTURE, strlen(STRUCTURE));
  /* "twice_again" sets its outputs a second time, which must be refused. */
  if (!err && user_data)
    err = colocated_execution_context_set_host_outputs(ctx, outs, 1, (const uint8_t *)STRUCTURE, strlen(STRUCTURE));
  colocated_array_destroy(out);
done:
  colocated_sharding_destroy(sharding);
  colocated_array_destroy(in);
  return err;
}

static colocated_function *make_function(const colocated_client *client, const char *native,
                                         const colocated_device *const *devices, size_t num_devices,
                                         const colocated_array_spec *const *out_specs, size_t num_out_specs) {
  colocated_function_args args = {sizeof args};
  args.client = client;
  args.name = sv(native);
  args.native_function = sv(native);
  args.devices = devices;
  args.num_devices = num_devices;
  args.out_specs = out_specs;
  args.num_out_specs = num_out_specs;
  colocated_function *function = NULL;
  CHECK_OK(colocated_function_create(&args, &function));
  CHECK(function != NULL);
  return function;
}

static colocated_call *call1(const colocated_function *function, const colocated_array *input) {
  colocated_function_call_args args = {sizeof args};
  args.inputs = &input;
  args.num_inputs = input ? 1 : 0;
  colocated_call *call = NULL;
  CHECK_OK(colocated_function_call(function, &args, &call));
  CHECK(call != NULL);
  return call;
}

/* The call's only output, awaited and read into `values`. */
static void read_output(const colocated_call *call, float *values, size_t n) {
  size_t num_outputs = 0;
  CHECK_OK(colocated_call_num_outputs(call, &num_outputs));
  CHECK(num_outputs == 1);
  colocated_event *status = NULL;
  CHECK_OK(colocated_call_status(call, &status));
  CHECK_OK(await_and_destroy(status));
  colocated_array *out = NULL;
  CHECK_OK(colocated_call_output(call, 0, &out));
  CHECK_OK(colocated_array_to_host(out, values, n * sizeof(float)));
  colocated_array_destroy(out);
}

TEST(a_function_discovers_its_outputs_then_runs_from_its_cache) {
  atomic_store(&twice_calls, 0);
  atomic_store(&twice_discovering, 0);
  struct native_fixture f = native_client(2, 2, "twice", native_twice, NULL);
  colocated_sharding *split = make_split(f.client, f.devices, 2);
  colocated_function *twice = make_function(f.client, "twice", NULL, 0, NULL, 0);
  float x[4] = {1, 2, 3, 4};
  colocated_array *input = f32_array(f.client, split, x, 4);

  colocated_call *first = call1(twice, input);
  float y[4];
  read_output(first, y, 4);
  CHECK(y[0] == 2 && y[1] == 4 && y[2] == 6 && y[3] == 8);
  const uint8_t *structure;
  size_t size;
  CHECK_OK(colocated_call_structure(first, &structure, &size));
  CHECK(size == strlen(STRUCTURE) && memcmp(structure, STRUCTURE, size) == 0);
  /* The output has the input's sharding: split over both devices. */
  colocated_array *out = NULL;
  CHECK_OK(colocated_call_output(first, 0, &out));
  size_t num_buffers = 0;
  CHECK_OK(colocated_array_num_buffers(out, &num_buffers));
  CHECK(num_buffers == 2);
  colocated_array_destroy(out);
  CHECK(atomic_load(&twice_discovering) == 1);

  /* Same spec: the cached program, no second discovery. */
  colocated_call *second = call1(twice, input);
  read_output(second, y, 4);
  CHECK(y[3] == 8);
  CHECK(atomic_load(&twice_discovering) == 1);
  CHECK(atomic_load(&twice_calls) == 2);

  CHECK_CODE(colocated_call_output(second, 1, &out), COLOCATED_INVALID_ARGUMENT);
  colocated_call_destroy(first);
  colocated_call_destroy(second);
  colocated_array_destroy(input);
  colocated_function_destroy(twice);
  colocated_sharding_destroy(split);
  colocated_client_destroy(f.client);
}

TEST(declared_outputs_skip_discovery_and_are_checked_against_what_the_host_sets) {
  atomic_store(&twice_discovering, 0);
  struct native_fixture f = native_client(2, 2, "twice", native_twice, NULL);
  colocated_sharding *split = make_split(f.client, f.devices, 2);
  int64_t dims[1] = {4};
  colocated_array_spec spec = make_spec(COLOCATED_DTYPE_F32, dims, 1, split);
  const colocated_array_spec *specs[1] = {&spec};
  colocated_function *twice = make_function(f.client, "twice", NULL, 0, specs, 1);
  float x[4] = {1, 2, 3, 4};
  colocated_array *input = f32_array(f.client, split, x, 4);
  colocated_call *call = call1(twice, input);
  float y[4];
  read_output(call, y, 4);
  CHECK(y[0] == 2 && y[3] == 8);
  CHECK(atomic_load(&twice_discovering) == 0);
  colocated_call_destroy(call);

  /* Declared as int32: the host's float32 output is refused, with the difference. */
  colocated_array_spec wrong = make_spec(COLOCATED_DTYPE_I32, dims, 1, split);
  const colocated_array_spec *wrongs[1] = {&wrong};
  colocated_function *lying = make_function(f.client, "twice", NULL, 0, wrongs, 1);
  call = call1(lying, input);
  colocated_event *status = NULL;
  CHECK_OK(colocated_call_status(call, &status));
  CHECK_CODE_MSG(await_and_destroy(status), COLOCATED_INVALID_ARGUMENT, "output 0 is");
  colocated_call_destroy(call);
  colocated_function_destroy(lying);

  colocated_array_destroy(input);
  colocated_function_destroy(twice);
  colocated_sharding_destroy(split);
  colocated_client_destroy(f.client);
}

static atomic_int built, destroyed, build_failures;
/* While set, "count" waits before it counts. */
static atomic_int gate_closed;

static void reset_counters(void) {
  atomic_store(&built, 0);
  atomic_store(&destroyed, 0);
  atomic_store(&build_failures, 0);
  atomic_store(&gate_closed, 0);
}

static void free_counter(void *value) {
  free(value);
  atomic_fetch_add(&destroyed, 1);
}

static colocated_error *build_counter(void *user_data, void **value, colocated_destructor *destructor) {
  (void)user_data;
  atomic_fetch_add(&built, 1);
  int *counter = calloc(1, sizeof *counter);
  if (counter == NULL) return make_error(COLOCATED_RESOURCE_EXHAUSTED, "no memory");
  *value = counter;
  *destructor = free_counter;
  return NULL;
}

static colocated_error *build_failing(void *user_data, void **value, colocated_destructor *destructor) {
  (void)user_data, (void)value, (void)destructor;
  atomic_fetch_add(&build_failures, 1);
  return make_error(COLOCATED_FAILED_PRECONDITION, "the counter refuses to be built");
}

/* Native "count": increments its object's counter (the object's id is the
 * function's data) and returns it as a float32 scalar on the host's device. */
static colocated_error *native_count(void *user_data, colocated_execution_context *ctx,
                                     const colocated_buffer *const *inputs, size_t num_inputs) {
  (void)inputs, (void)num_inputs;
  for (int i = 0; i < 5000 && atomic_load(&gate_closed); ++i) harness_sleep_ms(1);
  const uint8_t *data;
  size_t size;
  colocated_error *err = colocated_execution_context_native_data(ctx, &data, &size);
  if (err) return err;
  uint64_t id;
  if (size != sizeof id) return make_error(COLOCATED_INVALID_ARGUMENT, "count needs its object's id");
  memcpy(&id, data, sizeof id);
  void *value = NULL;
  if ((err = colocated_execution_context_host_object(ctx, id, user_data ? build_failing : build_counter, NULL,
                                                     &value)))
    return err;
  uint64_t session = 1;
  if ((err = colocated_execution_context_session(ctx, &session))) return err;
  if (session != 0) return make_error(COLOCATED_INTERNAL, "the controller's own host runs in session 0");
  int *counter = value;
  float now = (float)++*counter;
  const colocated_device *const *devices;
  size_t num_devices;
  if ((err = colocated_execution_context_devices(ctx, &devices, &num_devices))) return err;
  if (num_devices != 1) return make_error(COLOCATED_INVALID_ARGUMENT, "count runs on one device");
  const colocated_client *client;
  if ((err = colocated_execution_context_client(ctx, &client))) return err;
  colocated_sharding *sharding = NULL;
  if ((err = colocated_sharding_create_replicated(client, devices, 1, &sharding))) return err;
  colocated_array_args args = array_args(client, COLOCATED_DTYPE_F32, NULL, 0, sharding);
  args.data = &now;
  args.data_size = sizeof now;
  colocated_array *out = NULL;
  err = colocated_array_from_host(&args, &out);
  colocated_sharding_destroy(sharding);
  if (err) return err;
  const colocated_array *outs[1] = {out};
  bool discovering = false;
  if (!(err = colocated_execution_context_discovering(ctx, &discovering)))
    err = colocated_execution_context_set_host_outputs(ctx, outs, 1, (const uint8_t *)"scalar", discovering ? 6 : 0);
  colocated_array_destroy(out);
  return err;
}

static colocated_function *method_of(const colocated_client *client, const colocated_object *object,
                                     const colocated_device *device) {
  uint64_t id;
  CHECK_OK(colocated_object_id(object, &id));
  colocated_function_args args = {sizeof args};
  args.client = client;
  args.name = sv("count");
  args.native_function = sv("count");
  args.data = (const uint8_t *)&id;
  args.data_size = sizeof id;
  args.devices = &device;
  args.num_devices = 1;
  colocated_function *function = NULL;
  CHECK_OK(colocated_function_create(&args, &function));
  return function;
}

static colocated_call *call_on(const colocated_function *function, const colocated_object *object) {
  colocated_function_call_args args = {sizeof args};
  args.objects = &object;
  args.num_objects = 1;
  colocated_call *call = NULL;
  CHECK_OK(colocated_function_call(function, &args, &call));
  return call;
}

TEST(an_object_is_built_once_per_host_and_destroyed_after_its_calls) {
  reset_counters();
  colocated_client *client = make_client(1, 2);
  register_native(client, "count", native_count, NULL, NULL);
  colocated_object *object = NULL;
  CHECK_OK(colocated_object_create(&object));
  colocated_object *other = NULL;
  CHECK_OK(colocated_object_create(&other));
  uint64_t a, b;
  CHECK_OK(colocated_object_id(object, &a));
  CHECK_OK(colocated_object_id(other, &b));
  CHECK(a != b);
  const colocated_device *device = device_at(client, 0);
  colocated_function *count = method_of(client, object, device);
  colocated_function *count_other = method_of(client, other, device);
  float got = 0;
  for (int i = 1; i <= 3; ++i) {
    colocated_call *call = call_on(count, object);
    read_output(call, &got, 1);
    CHECK(got == (float)i);
    colocated_call_destroy(call);
  }
  colocated_call *call = call_on(count_other, other);
  read_output(call, &got, 1);
  CHECK(got == 1);
  colocated_call_destroy(call);
  CHECK(atomic_load(&built) == 2);
  CHECK(atomic_load(&destroyed) == 0);

  /* A call still running keeps the object: destroyed after it has run. */
  atomic_store(&gate_closed, 1);
  call = call_on(count, object);
  colocated_object_destroy(object);
  harness_sleep_ms(20);
  CHECK(atomic_load(&destroyed) == 0);
  atomic_store(&gate_closed, 0);
  read_output(call, &got, 1);
  CHECK(got == 4);
  colocated_call_destroy(call);
  for (int i = 0; i < 500 && atomic_load(&destroyed) < 1; ++i) harness_sleep_ms(2);
  CHECK(atomic_load(&destroyed) == 1);
  CHECK(atomic_load(&built) == 2);
  colocated_object_destroy(other);
  CHECK(atomic_load(&destroyed) == 2);

  colocated_function_destroy(count);
  colocated_function_destroy(count_other);
  colocated_client_destroy(client);
}

TEST(an_object_whose_builder_failed_gives_every_call_its_error) {
  reset_counters();
  colocated_client *client = make_client(1, 2);
  register_native(client, "count", native_count, (void *)1, NULL);
  colocated_object *object = NULL;
  CHECK_OK(colocated_object_create(&object));
  colocated_function *count = method_of(client, object, device_at(client, 0));
  colocated_function_call_args args = {sizeof args};
  args.objects = (const colocated_object *const *)&object;
  args.num_objects = 1;
  colocated_call *call = NULL;
  /* The first call discovers: it fails synchronously with the builder's error. */
  CHECK_CODE_MSG(colocated_function_call(count, &args, &call), COLOCATED_FAILED_PRECONDITION,
                 "the counter refuses to be built");
  CHECK_CODE_MSG(colocated_function_call(count, &args, &call), COLOCATED_FAILED_PRECONDITION,
                 "the counter refuses to be built");
  CHECK(atomic_load(&build_failures) == 1);
  colocated_object_destroy(object);
  colocated_function_destroy(count);
  colocated_client_destroy(client);
}

TEST(a_call_without_inputs_needs_devices_and_bad_arguments_are_refused) {
  colocated_client *client = make_client(2, 2);
  register_native(client, "twice", native_twice, NULL, NULL);
  colocated_function *twice = make_function(client, "twice", NULL, 0, NULL, 0);
  colocated_function_call_args none = {sizeof none};
  colocated_call *call = NULL;
  CHECK_CODE_MSG(colocated_function_call(twice, &none, &call), COLOCATED_INVALID_ARGUMENT, "No devices found");
  CHECK_CODE(colocated_function_call(twice, &none, NULL), COLOCATED_INVALID_ARGUMENT);
  CHECK_CODE(colocated_function_call(NULL, &none, &call), COLOCATED_INVALID_ARGUMENT);

  /* Inputs off the specialized devices. */
  size_t n;
  const colocated_device *const *devices = client_devices(client, &n);
  colocated_function *on_first = make_function(client, "twice", devices, 1, NULL, 0);
  colocated_sharding *split = make_split(client, devices, 2);
  float x[2] = {1, 2};
  colocated_array *input = f32_array(client, split, x, 2);
  colocated_function_call_args one = {sizeof one};
  one.inputs = (const colocated_array *const *)&input;
  one.num_inputs = 1;
  CHECK_CODE_MSG(colocated_function_call(on_first, &one, &call), COLOCATED_INVALID_ARGUMENT,
                 "the function is specialized to");

  colocated_function_args args = {sizeof args};
  colocated_function *f = NULL;
  CHECK_CODE_MSG(colocated_function_create(&args, &f), COLOCATED_INVALID_ARGUMENT, "client");
  args.client = client;
  CHECK_CODE_MSG(colocated_function_create(&args, &f), COLOCATED_INVALID_ARGUMENT, "native_function");
  args.language = sv("colocated");
  CHECK_CODE_MSG(colocated_function_create(&args, &f), COLOCATED_INVALID_ARGUMENT, "cannot be of language");
  args.language = sv("native");
  args.native_function = (colocated_string_view){"a\0b", 3};
  CHECK_CODE_MSG(colocated_function_create(&args, &f), COLOCATED_INVALID_ARGUMENT, "NUL");
  args.native_function = sv("twice");
  args.devices = devices;
  args.num_devices = 0;
  CHECK_CODE_MSG(colocated_function_create(&args, &f), COLOCATED_INVALID_ARGUMENT, "at least one");
  args.devices = NULL;
  args.num_devices = 1;
  CHECK_CODE_MSG(colocated_function_create(&args, &f), COLOCATED_INVALID_ARGUMENT, "devices is NULL");
  args.num_devices = 0;
  args.num_out_specs = 1;
  CHECK_CODE_MSG(colocated_function_create(&args, &f), COLOCATED_INVALID_ARGUMENT, "out_specs is NULL");
  args.num_out_specs = 0;
  args.language = sv("python");
  CHECK_CODE_MSG(colocated_function_create(&args, &f), COLOCATED_INVALID_ARGUMENT, "native_function is for");
  /* A function name with a NUL byte cannot be registered (it ends names in payloads). */
  colocated_native_function_args native = {sizeof native};
  native.name = (colocated_string_view){"a\0b", 3};
  native.function = native_twice;
  CHECK_CODE_MSG(colocated_client_register_native_function(client, &native), COLOCATED_INVALID_ARGUMENT, "NUL");

  CHECK_CODE(colocated_object_create(NULL), COLOCATED_INVALID_ARGUMENT);
  uint64_t id;
  CHECK_CODE(colocated_object_id(NULL, &id), COLOCATED_INVALID_ARGUMENT);
  CHECK_CODE(colocated_call_num_outputs(NULL, &n), COLOCATED_INVALID_ARGUMENT);
  colocated_function_destroy(NULL);
  colocated_call_destroy(NULL);
  colocated_object_destroy(NULL);

  colocated_array_destroy(input);
  colocated_sharding_destroy(split);
  colocated_function_destroy(on_first);
  colocated_function_destroy(twice);
  colocated_client_destroy(client);
}

TEST(a_host_that_sets_its_outputs_twice_fails_the_call) {
  struct native_fixture f = native_client(2, 2, "twice_again", native_twice, (void *)1);
  colocated_sharding *split = make_split(f.client, f.devices, 2);
  colocated_function *again = make_function(f.client, "twice_again", NULL, 0, NULL, 0);
  float x[2] = {1, 2};
  colocated_array *input = f32_array(f.client, split, x, 2);
  colocated_function_call_args args = {sizeof args};
  args.inputs = (const colocated_array *const *)&input;
  args.num_inputs = 1;
  colocated_call *call = NULL;
  CHECK_CODE_MSG(colocated_function_call(again, &args, &call), COLOCATED_INVALID_ARGUMENT, "already set");
  colocated_array_destroy(input);
  colocated_function_destroy(again);
  colocated_sharding_destroy(split);
  colocated_client_destroy(f.client);
}
