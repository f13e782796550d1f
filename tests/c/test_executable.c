/*
 * Native functions, compilation and loaded executables: execute /
 * execute_sharded / execute_portable, program order per stream, dependencies on
 * not-yet-ready outputs, error propagation, host callbacks and the lifetime of
 * their user data, the execution context, serialize / deserialize_and_load.
 *
 * This file is also linked statically against libcolocated.a (see Makefile).
 */
#include "harness.h"
#include "helpers.h"

#include <pthread.h>

/* ---- native functions ------------------------------------------------------ */

/* "gate": waits for `open` (a caller event), then sets every output shard
 * (float32[1]) to `value`. Lets a test hold a stream busy deterministically. The
 * test must not await anything the gate produces before opening it. */
struct gate {
  colocated_event *open;
  atomic_int entered;
  float value;
};

static colocated_error *native_gate(void *user_data, colocated_execution_context *ctx,
                                    const colocated_buffer *const *inputs, size_t num_inputs) {
  (void)inputs;
  (void)num_inputs;
  struct gate *g = user_data;
  atomic_fetch_add(&g->entered, 1);
  colocated_error *err = colocated_event_await(g->open);
  if (err) return err;
  size_t n;
  if ((err = colocated_execution_context_num_outputs(ctx, &n))) return err;
  for (size_t i = 0; i < n; ++i)
    if ((err = set_output_from(ctx, i, &g->value, sizeof g->value))) return err;
  return NULL;
}

/* "record": appends the first float of its (single-shard) input to a log, and
 * returns the input. */
struct order_log {
  atomic_int count;
  int tags[1024];
};

static colocated_error *native_record(void *user_data, colocated_execution_context *ctx,
                                      const colocated_buffer *const *inputs, size_t num_inputs) {
  struct order_log *log = user_data;
  if (num_inputs != 1) return make_error(COLOCATED_INVALID_ARGUMENT, "record takes one shard");
  void *data;
  size_t size;
  colocated_error *err = read_shard(inputs[0], &data, &size);
  if (err) return err;
  int at = atomic_fetch_add(&log->count, 1);
  if (at < 1024) log->tags[at] = (int)((float *)data)[0];
  err = set_output_from(ctx, 0, data, size);
  free(data);
  return err;
}

static colocated_error *native_fail(void *user_data, colocated_execution_context *ctx,
                                    const colocated_buffer *const *inputs, size_t num_inputs) {
  (void)user_data;
  (void)ctx;
  (void)inputs;
  (void)num_inputs;
  return make_error(COLOCATED_RESOURCE_EXHAUSTED, "disk on fire");
}

static colocated_error *native_set_nothing(void *user_data, colocated_execution_context *ctx,
                                           const colocated_buffer *const *inputs, size_t num_inputs) {
  (void)user_data;
  (void)ctx;
  (void)inputs;
  (void)num_inputs;
  return NULL;
}

/* "sum_cb": each output shard is filled with what host callback `index` answers
 * for the shard's bytes (a float32 sum, see cb_sum). */
static colocated_error *native_sum_via_callback(void *user_data, colocated_execution_context *ctx,
                                                const colocated_buffer *const *inputs, size_t num_inputs) {
  size_t index = user_data ? *(const size_t *)user_data : 0;
  for (size_t i = 0; i < num_inputs; ++i) {
    void *data;
    size_t size;
    colocated_error *err = read_shard(inputs[i], &data, &size);
    if (err) return err;
    colocated_bytes *answer = NULL;
    err = colocated_execution_context_call_host_callback(ctx, index, data, size, &answer);
    if (err) {
      free(data);
      return err;
    }
    const uint8_t *bytes;
    size_t num_bytes;
    if ((err = colocated_bytes_data(answer, &bytes, &num_bytes)) == NULL) {
      float sum = 0;
      if (num_bytes == sizeof sum) memcpy(&sum, bytes, sizeof sum);
      for (size_t k = 0; k < size / sizeof(float); ++k) ((float *)data)[k] = sum;
      err = set_output_from(ctx, i, data, size);
    }
    colocated_bytes_destroy(answer);
    free(data);
    if (err) return err;
  }
  return NULL;
}

/* ---- host callbacks --------------------------------------------------------- */

struct callback_state {
  atomic_int calls;
  atomic_int destroyed;
};

static colocated_error *cb_sum(void *user_data, const uint8_t *input, size_t size,
                               colocated_callback_result *result) {
  struct callback_state *state = user_data;
  atomic_fetch_add(&state->calls, 1);
  float total = 0;
  for (size_t i = 0; i + sizeof(float) <= size; i += sizeof(float)) {
    float v;
    memcpy(&v, input + i, sizeof v);
    total += v;
  }
  /* setting again replaces the answer */
  const uint8_t junk[3] = {1, 2, 3};
  colocated_error *err = colocated_callback_result_set(result, junk, sizeof junk);
  if (err) return err;
  return colocated_callback_result_set(result, (const uint8_t *)&total, sizeof total);
}

static colocated_error *cb_refuse(void *user_data, const uint8_t *input, size_t size,
                                  colocated_callback_result *result) {
  (void)input;
  (void)size;
  (void)result;
  struct callback_state *state = user_data;
  atomic_fetch_add(&state->calls, 1);
  return make_error(COLOCATED_PERMISSION_DENIED, "callback says no");
}

static void count_destroy(void *user_data) {
  struct callback_state *state = user_data;
  atomic_fetch_add(&state->destroyed, 1);
}

static colocated_loaded_host_callback *make_callback(const colocated_client *client, colocated_host_callback_fn fn,
                                                     struct callback_state *state, const char *name) {
  colocated_host_callback_args args = {sizeof args};
  args.function = fn;
  args.user_data = state;
  args.destructor = count_destroy;
  args.name = sv(name);
  colocated_loaded_host_callback *cb = NULL;
  CHECK_OK(colocated_client_make_loaded_host_callback(client, &args, &cb));
  CHECK(cb != NULL);
  return cb;
}

/* ---- fixtures ----------------------------------------------------------------- */

/* Compiles "gate" (no inputs, one float32[1] output on `device`). */
static colocated_loaded_executable *compile_gate(const colocated_client *client, const colocated_device *device,
                                                 colocated_sharding **sharding) {
  *sharding = make_replicated(client, &device, 1);
  const int64_t dims[1] = {1};
  colocated_array_spec spec = make_spec(COLOCATED_DTYPE_F32, dims, 1, *sharding);
  const colocated_array_spec *outs[1] = {&spec};
  colocated_program program = make_program("native", "gate", NULL, 0, outs, 1, &device, 1);
  colocated_loaded_executable *exe = NULL;
  CHECK_OK(colocated_client_compile(client, &program, NULL, &exe));
  return exe;
}

/* A client with "gate" registered (its output `value`) and compiled on device
 * 0, the gate still closed: the start of the tests that hold a stream busy. */
struct gate_fixture {
  struct gate gate;
  colocated_client *client;
  const colocated_device *device; /* device 0, where the gate runs */
  colocated_sharding *sharding;   /* the gate's output sharding */
  colocated_loaded_executable *exe;
};

static void gate_fixture_init(struct gate_fixture *g, uint32_t num_devices, uint32_t executor_threads, float value) {
  g->client = make_client(num_devices, executor_threads);
  g->gate.open = NULL;
  atomic_init(&g->gate.entered, 0);
  g->gate.value = value;
  CHECK_OK(colocated_event_create(&g->gate.open));
  register_native(g->client, "gate", native_gate, &g->gate, NULL);
  g->device = device_at(g->client, 0);
  g->exe = compile_gate(g->client, g->device, &g->sharding);
}

/* Submits the gate on `stream` (NULL: no options, this thread's default
 * stream); returns its output, its status in *status (may be NULL). */
static colocated_array *gate_submit(const struct gate_fixture *g, const colocated_stream *stream,
                                    colocated_event **status) {
  colocated_execute_options options = {sizeof options};
  options.stream = stream;
  colocated_array *out = NULL;
  CHECK_OK(colocated_loaded_executable_execute(g->exe, NULL, 0, stream ? &options : NULL, &out, 1, status));
  return out;
}

/* Registers "add_one" with the gate's client and compiles it over the gate's
 * output (float32[1] on device 0): the execution to queue behind the gate. */
static colocated_loaded_executable *compile_add_one_after_gate(const struct gate_fixture *g) {
  register_native(g->client, "add_one", native_add_one, NULL, NULL);
  return compile_f32_unary(g->client, "add_one", 1, g->sharding, &g->device, 1, NULL);
}

/* Submits the gate on this thread's default stream, then a copy of a float32
 * buffer of `values` from device 0 to device 1 on the same stream: the copy
 * waits for the gate. */
struct queued_copy {
  colocated_array *gated; /* the gate's output */
  colocated_buffer *src;  /* on device 0 */
  colocated_buffer *copy; /* on device 1, once the gate opens */
};

static struct queued_copy queue_copy_behind_gate(const struct gate_fixture *g, const float *values, size_t n) {
  struct queued_copy q;
  q.gated = gate_submit(g, NULL, NULL);
  q.src = make_f32(g->client, device_at(g->client, 0), values, n);
  q.copy = NULL;
  CHECK_OK(colocated_buffer_copy_to_device(q.src, device_at(g->client, 1), &q.copy));
  return q;
}

/* Opens the gate: every gate execution waiting on it goes on. */
static void gate_open(struct gate_fixture *g) { CHECK_OK(colocated_event_set(g->gate.open, COLOCATED_OK, NULL, 0)); }

/* Destroys the gate's executable, its sharding, the client, then the gate's event. */
static void gate_fixture_destroy(struct gate_fixture *g) {
  colocated_loaded_executable_destroy(g->exe);
  colocated_sharding_destroy(g->sharding);
  colocated_client_destroy(g->client);
  colocated_event_destroy(g->gate.open);
}

static bool is_hex16(colocated_string_view v) {
  if (v.size != 16 || v.data[16] != '\0') return false;
  for (size_t i = 0; i < 16; ++i)
    if (!((v.data[i] >= '0' && v.data[i] <= '9') || (v.data[i] >= 'a' && v.data[i] <= 'f'))) return false;
  return true;
}

/* Awaits the `status` of a one-output execute_sharded / execute_portable, then
 * checks that its output shard `out` is on `device` and reads its `n` float32
 * values into `values`. */
static void await_shard_on(colocated_event *status, const colocated_buffer *out, const colocated_device *device,
                           float *values, size_t n) {
  CHECK_OK(await_and_destroy(status));
  check_buffer_device(out, device);
  read_buffer(out, values, n * sizeof(float));
}

/* ---- tests -------------------------------------------------------------------- */

TEST(execute_runs_the_native_function_once_per_host_over_every_shard) {
  struct native_fixture f = native_client(4, 2, "add_one", native_add_one, NULL);
  compile_split(&f, 4, 8, NULL);

  colocated_string_view name, fingerprint;
  CHECK_OK(colocated_loaded_executable_name(f.exe, &name));
  CHECK_VIEW_EQ(name, "add_one");
  CHECK_OK(colocated_loaded_executable_fingerprint(f.exe, &fingerprint));
  CHECK(is_hex16(fingerprint));
  const colocated_device *const *exe_devices;
  size_t num_exe_devices, num_inputs, num_outputs;
  CHECK_OK(colocated_loaded_executable_devices(f.exe, &exe_devices, &num_exe_devices));
  CHECK_EQ_U64(num_exe_devices, 4);
  for (size_t i = 0; i < 4; ++i) CHECK(exe_devices[i] == f.devices[i]);
  CHECK_OK(colocated_loaded_executable_num_inputs(f.exe, &num_inputs));
  CHECK_OK(colocated_loaded_executable_num_outputs(f.exe, &num_outputs));
  CHECK(num_inputs == 1 && num_outputs == 1);

  float x[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  colocated_array *in = f32_array(f.client, f.sharding, x, 8);
  colocated_event *status = NULL;
  colocated_array *out = run1(f.exe, in, NULL, &status);
  CHECK(status != NULL);
  CHECK_OK(await_and_destroy(status));
  float y[8];
  CHECK_OK(colocated_array_to_host(out, y, sizeof y));
  for (int i = 0; i < 8; ++i) CHECK(y[i] == x[i] + 1);
  /* the output has the program's output spec */
  const int64_t *od;
  size_t nd, nb;
  colocated_dtype dtype;
  CHECK_OK(colocated_array_dims(out, &od, &nd));
  CHECK(nd == 1 && od[0] == 8);
  CHECK_OK(colocated_array_dtype(out, &dtype));
  CHECK_EQ_U64(dtype, COLOCATED_DTYPE_F32);
  CHECK_OK(colocated_array_num_buffers(out, &nb));
  CHECK_EQ_U64(nb, 4);
  colocated_array_destroy(out);
  colocated_array_destroy(in);
  native_fixture_destroy(&f);
}

TEST(execute_accepts_null_status_and_an_equivalent_sharding_handle) {
  struct native_fixture f = native_client(2, 2, "add_one", native_add_one, NULL);
  compile_split(&f, 2, 4, NULL);
  colocated_sharding *same_layout = make_split(f.client, f.devices, 2);
  float x[4] = {1, 2, 3, 4};
  colocated_array *in = f32_array(f.client, same_layout, x, 4);
  colocated_array *out = run1(f.exe, in, NULL, NULL);
  await_array_ready(out);
  float y[4];
  CHECK_OK(colocated_array_to_host(out, y, sizeof y));
  CHECK(y[0] == 2 && y[3] == 5);
  colocated_array_destroy(out);
  colocated_array_destroy(in);
  colocated_sharding_destroy(same_layout);
  native_fixture_destroy(&f);
}

TEST(program_order_holds_per_stream) {
  struct order_log log = {0};
  struct native_fixture f = native_client(1, 2, "record", native_record, &log);
  compile_replicated(&f, 1, NULL);
  colocated_stream *streams[2] = {make_stream(f.client), make_stream(f.client)};
  enum { PER_STREAM = 60 };
  colocated_array *outs[2 * PER_STREAM];
  colocated_event *last[2] = {NULL, NULL};
  for (int i = 0; i < PER_STREAM; ++i) {
    for (int k = 0; k < 2; ++k) {
      float tag = (float)(k * 1000 + i);
      colocated_array *in = f32_array(f.client, f.sharding, &tag, 1);
      colocated_event_destroy(last[k]);
      outs[2 * i + k] = run1(f.exe, in, streams[k], &last[k]);
      colocated_array_destroy(in); /* the execution keeps its input */
    }
  }
  for (int k = 0; k < 2; ++k) CHECK_OK(await_and_destroy(last[k]));
  for (int i = 0; i < 2 * PER_STREAM; ++i) {
    await_array_ready(outs[i]);
  }
  CHECK_EQ_I64(atomic_load(&log.count), 2 * PER_STREAM);
  int next[2] = {0, 0};
  for (int i = 0; i < 2 * PER_STREAM; ++i) {
    int k = log.tags[i] / 1000, seq = log.tags[i] % 1000;
    CHECK(k == 0 || k == 1);
    if (seq != next[k]) FAIL("stream %d ran execution %d when %d was next", k, seq, next[k]);
    next[k]++;
  }
  for (int i = 0; i < 2 * PER_STREAM; ++i) colocated_array_destroy(outs[i]);
  colocated_stream_destroy(streams[0]);
  colocated_stream_destroy(streams[1]);
  native_fixture_destroy(&f);
}

struct submitter {
  const colocated_client *client;
  const colocated_loaded_executable *exe;
  const colocated_sharding *sharding;
  int thread_index;
  atomic_int failures;
};

static void *submit_in_order(void *arg) {
  struct submitter *sub = arg;
  colocated_array *outs[40] = {NULL};
  colocated_event *last = NULL;
  for (int i = 0; i < 40; ++i) {
    float tag = (float)(sub->thread_index * 1000 + i);
    const int64_t dims[1] = {1};
    colocated_array_args a = array_args(sub->client, COLOCATED_DTYPE_F32, dims, 1, sub->sharding);
    a.data = &tag;
    a.data_size = sizeof tag;
    colocated_array *in = NULL;
    colocated_error *err = colocated_array_from_host(&a, &in);
    if (err == NULL) {
      const colocated_array *args[1] = {in};
      colocated_event_destroy(last);
      last = NULL;
      err = colocated_loaded_executable_execute(sub->exe, args, 1, NULL, &outs[i], 1, &last);
      colocated_array_destroy(in);
    }
    if (err) {
      EXPECT_OK(err);
      atomic_fetch_add(&sub->failures, 1);
      break;
    }
  }
  if (last) EXPECT_OK(await_and_destroy(last));
  for (int i = 0; i < 40; ++i) colocated_array_destroy(outs[i]);
  return NULL;
}

TEST(each_thread_has_its_own_default_stream_in_program_order) {
  struct order_log log = {0};
  struct native_fixture f = native_client(1, 2, "record", native_record, &log);
  compile_replicated(&f, 1, NULL);
  struct submitter subs[3];
  pthread_t threads[3];
  for (int t = 0; t < 3; ++t) {
    subs[t].client = f.client;
    subs[t].exe = f.exe;
    subs[t].sharding = f.sharding;
    subs[t].thread_index = t;
    atomic_init(&subs[t].failures, 0);
    CHECK(pthread_create(&threads[t], NULL, submit_in_order, &subs[t]) == 0);
  }
  for (int t = 0; t < 3; ++t) {
    CHECK(pthread_join(threads[t], NULL) == 0);
    CHECK_EQ_I64(atomic_load(&subs[t].failures), 0);
  }
  CHECK(WAIT_FOR(atomic_load(&log.count) == 120, 5000));
  int next[3] = {0, 0, 0};
  for (int i = 0; i < 120; ++i) {
    int t = log.tags[i] / 1000, seq = log.tags[i] % 1000;
    CHECK(t >= 0 && t < 3);
    if (seq != next[t]) FAIL("thread %d: execution %d ran when %d was next", t, seq, next[t]);
    next[t]++;
  }
  native_fixture_destroy(&f);
}

TEST(a_not_yet_ready_output_is_a_valid_argument_of_the_next_execution) {
  struct gate_fixture g;
  gate_fixture_init(&g, 1, 2, 41.0f);
  colocated_loaded_executable *add = compile_add_one_after_gate(&g);

  colocated_stream *gate_stream = make_stream(g.client);
  colocated_event *gate_status = NULL;
  colocated_array *x = gate_submit(&g, gate_stream, &gate_status);
  colocated_event *y_status = NULL;
  colocated_array *y = run1(add, x, NULL, &y_status); /* returns at once */
  CHECK(WAIT_FOR(atomic_load(&g.gate.entered) == 1, 5000));
  harness_sleep_ms(20);
  CHECK(!event_is_ready(gate_status));
  CHECK(!event_is_ready(y_status)); /* waits for its input */
  colocated_event *x_ready;
  CHECK_OK(colocated_array_ready_event(x, &x_ready));
  CHECK(!event_is_ready(x_ready));
  gate_open(&g);
  CHECK_OK(await_and_destroy(y_status));
  CHECK_OK(await_and_destroy(x_ready));
  CHECK_OK(await_and_destroy(gate_status));
  float value = 0;
  CHECK_OK(colocated_array_to_host(y, &value, sizeof value));
  CHECK(value == 42.0f);
  CHECK_OK(colocated_array_to_host(x, &value, sizeof value));
  CHECK(value == 41.0f);
  colocated_array_destroy(y);
  colocated_array_destroy(x);
  colocated_stream_destroy(gate_stream);
  colocated_loaded_executable_destroy(add);
  gate_fixture_destroy(&g);
}

TEST(deleting_an_argument_of_a_queued_execution_waits_for_it) {
  struct gate_fixture g;
  gate_fixture_init(&g, 1, 2, 0.0f);
  colocated_loaded_executable *add = compile_add_one_after_gate(&g);
  colocated_stream *stream = make_stream(g.client);
  colocated_array *gated = gate_submit(&g, stream, NULL);
  float x = 7;
  colocated_array *in = f32_array(g.client, g.sharding, &x, 1);
  colocated_event *status;
  colocated_array *out = run1(add, in, stream, &status); /* queued behind the gate */
  CHECK_OK(colocated_array_delete(in));
  gate_open(&g);
  CHECK_OK(await_and_destroy(status));
  float y = 0;
  CHECK_OK(colocated_array_to_host(out, &y, sizeof y));
  CHECK(y == 8);
  colocated_array_destroy(out);
  colocated_array_destroy(in);
  colocated_array_destroy(gated);
  colocated_stream_destroy(stream);
  colocated_loaded_executable_destroy(add);
  gate_fixture_destroy(&g);
}

TEST(deleting_the_source_of_a_queued_copy_waits_for_the_copy) {
  struct gate_fixture g;
  gate_fixture_init(&g, 2, 2, 0.0f);
  float values[3] = {1, 2, 3};
  struct queued_copy q = queue_copy_behind_gate(&g, values, 3);
  CHECK_OK(colocated_buffer_delete(q.src));
  gate_open(&g);
  float back[3];
  read_buffer(q.copy, back, sizeof back);
  CHECK(back[0] == 1 && back[2] == 3);
  colocated_buffer_destroy(q.copy);
  colocated_buffer_destroy(q.src);
  colocated_array_destroy(q.gated);
  gate_fixture_destroy(&g);
}

static void count_calls(colocated_error *error, void *user_data) {
  colocated_error_destroy(error);
  atomic_fetch_add((atomic_int *)user_data, 1);
}

TEST(on_ready_callbacks_and_to_host_outlive_the_event_handle_and_a_delete) {
  struct gate_fixture g;
  gate_fixture_init(&g, 2, 2, 0.0f);
  float values[3] = {4, 5, 6};
  struct queued_copy q = queue_copy_behind_gate(&g, values, 3);
  atomic_int calls = 0;
  colocated_event *ready;
  CHECK_OK(colocated_buffer_ready_event(q.copy, &ready));
  CHECK(!event_is_ready(ready));
  CHECK_OK(colocated_event_on_ready(ready, count_calls, &calls));
  colocated_event_destroy(ready); /* the event lives on while the runtime needs it */
  float back[3] = {0};
  colocated_event *copied = NULL;
  CHECK_OK(colocated_buffer_to_host(q.copy, back, sizeof back, &copied));
  CHECK_OK(colocated_buffer_delete(q.copy)); /* the pending to_host is in-flight work */
  colocated_buffer_destroy(q.copy);
  CHECK_EQ_I64(atomic_load(&calls), 0);
  gate_open(&g);
  CHECK_OK(await_and_destroy(copied));
  CHECK(back[0] == 4 && back[2] == 6);
  CHECK(WAIT_FOR(atomic_load(&calls) == 1, 5000));
  colocated_buffer_destroy(q.src);
  colocated_array_destroy(q.gated);
  gate_fixture_destroy(&g);
  CHECK_EQ_I64(atomic_load(&calls), 1);
}

/* "plus_and_times": output 0 is x + 1, output 1 is 2x (single device). */
static colocated_error *native_two_outputs(void *user_data, colocated_execution_context *ctx,
                                           const colocated_buffer *const *inputs, size_t num_inputs) {
  (void)user_data;
  if (num_inputs != 1) return make_error(COLOCATED_INVALID_ARGUMENT, "one shard expected");
  void *data;
  size_t size;
  colocated_error *err = read_shard(inputs[0], &data, &size);
  if (err) return err;
  float *v = data;
  size_t n = size / sizeof(float);
  for (size_t k = 0; k < n; ++k) v[k] += 1;
  err = set_output_from(ctx, 0, v, size);
  for (size_t k = 0; k < n && !err; ++k) v[k] = (v[k] - 1) * 2;
  if (!err) err = set_output_from(ctx, 1, v, size);
  free(data);
  return err;
}

TEST(several_outputs_come_back_in_program_order) {
  struct native_fixture f = native_client(1, 1, "plus_and_times", native_two_outputs, NULL);
  f.sharding = make_replicated(f.client, f.devices, 1);
  const int64_t dims[1] = {2};
  colocated_array_spec spec = make_spec(COLOCATED_DTYPE_F32, dims, 1, f.sharding);
  const colocated_array_spec *ins[1] = {&spec};
  const colocated_array_spec *outs[2] = {&spec, &spec};
  colocated_program program = make_program("native", "plus_and_times", ins, 1, outs, 2, f.devices, 1);
  CHECK_OK(colocated_client_compile(f.client, &program, NULL, &f.exe));
  size_t num_outputs = 0;
  CHECK_OK(colocated_loaded_executable_num_outputs(f.exe, &num_outputs));
  CHECK_EQ_U64(num_outputs, 2);
  float x[2] = {3, 4};
  colocated_array *in = f32_array(f.client, f.sharding, x, 2);
  const colocated_array *args[1] = {in};
  colocated_array *out[2] = {NULL, NULL};
  colocated_event *status;
  CHECK_OK(colocated_loaded_executable_execute(f.exe, args, 1, NULL, out, 2, &status));
  CHECK_OK(await_and_destroy(status));
  float plus[2], times[2];
  CHECK_OK(colocated_array_to_host(out[0], plus, sizeof plus));
  CHECK_OK(colocated_array_to_host(out[1], times, sizeof times));
  CHECK(plus[0] == 4 && plus[1] == 5 && times[0] == 6 && times[1] == 8);
  colocated_buffer *outs_sharded[2] = {NULL, NULL};
  colocated_buffer *arg = make_f32(f.client, f.devices[0], x, 2);
  const colocated_buffer *bargs[1] = {arg};
  CHECK_OK(colocated_loaded_executable_execute_sharded(f.exe, bargs, 1, f.devices[0], NULL, outs_sharded, 2, &status));
  CHECK_OK(await_and_destroy(status));
  read_buffer(outs_sharded[1], times, sizeof times);
  CHECK(times[0] == 6 && times[1] == 8);
  colocated_buffer_destroy(outs_sharded[0]);
  colocated_buffer_destroy(outs_sharded[1]);
  colocated_buffer_destroy(arg);
  colocated_array_destroy(out[0]);
  colocated_array_destroy(out[1]);
  colocated_array_destroy(in);
  native_fixture_destroy(&f);
}

/* Counts successful completions only. */
static void count_successes(colocated_error *error, void *user_data) {
  if (error == NULL) atomic_fetch_add((atomic_int *)user_data, 1);
  colocated_error_destroy(error);
}

TEST(dropping_every_handle_while_work_is_in_flight_finishes_it_and_stops_the_executors) {
  quiet_runtime();
  int before = thread_count();
  struct gate_fixture g;
  gate_fixture_init(&g, 2, 2, 1.0f);
  atomic_int done = 0;
  colocated_loaded_executable *add = compile_add_one_after_gate(&g);
  colocated_array *x = gate_submit(&g, NULL, NULL);
  colocated_event *status;
  colocated_array *y = run1(add, x, NULL, &status);
  CHECK_OK(colocated_event_on_ready(status, count_successes, &done)); /* ran, and succeeded */
  colocated_buffer *y0;
  CHECK_OK(colocated_array_buffer(y, 0, &y0));
  colocated_buffer *moved;
  CHECK_OK(colocated_buffer_copy_to_device(y0, device_at(g.client, 1), &moved));
  /* nothing waits for any of it */
  colocated_buffer_destroy(moved);
  colocated_buffer_destroy(y0);
  colocated_array_destroy(y);
  colocated_event_destroy(status);
  colocated_array_destroy(x);
  colocated_loaded_executable_destroy(add);
  colocated_loaded_executable_destroy(g.exe);
  colocated_sharding_destroy(g.sharding);
  colocated_client_destroy(g.client);
  CHECK(thread_count() >= before + 2); /* the queued work keeps the runtime */
  gate_open(&g);
  CHECK(WAIT_FOR(atomic_load(&done) == 1, 5000));
  CHECK(WAIT_FOR(thread_count() == before, 5000));
  colocated_event_destroy(g.gate.open);
}

TEST(a_native_error_fails_the_status_the_outputs_and_dependent_executions) {
  struct native_fixture f = native_client(2, 2, "fail", native_fail, NULL);
  register_native(f.client, "add_one", native_add_one, NULL, NULL);
  compile_split(&f, 2, 2, NULL);
  colocated_loaded_executable *add = compile_f32_unary(f.client, "add_one", 2, f.sharding, f.devices, 2, NULL);
  float x[2] = {1, 2};
  colocated_array *in = f32_array(f.client, f.sharding, x, 2);
  colocated_event *status;
  colocated_array *bad = run1(f.exe, in, NULL, &status); /* submission itself succeeds */
  colocated_event *dependent_status;
  colocated_array *dependent = run1(add, bad, NULL, &dependent_status);
  CHECK_CODE_MSG(await_and_destroy(status), COLOCATED_RESOURCE_EXHAUSTED, "disk on fire");
  colocated_event *ready;
  CHECK_OK(colocated_array_ready_event(bad, &ready));
  CHECK_CODE_MSG(await_and_destroy(ready), COLOCATED_RESOURCE_EXHAUSTED, "disk on fire");
  float y[2];
  CHECK_CODE_MSG(colocated_array_to_host(bad, y, sizeof y), COLOCATED_RESOURCE_EXHAUSTED, "disk on fire");
  colocated_buffer *shard;
  CHECK_OK(colocated_array_buffer(bad, 1, &shard));
  size_t size;
  CHECK_OK(colocated_buffer_on_host_size(shard, &size)); /* dense: known without the data */
  colocated_event *copied = NULL;
  colocated_error *err = colocated_buffer_to_host(shard, y, sizeof(float), &copied);
  if (err == NULL) err = await_and_destroy(copied);
  CHECK_CODE_MSG(err, COLOCATED_RESOURCE_EXHAUSTED, "disk on fire");
  void *ptr;
  CHECK_CODE_MSG(colocated_buffer_pin(shard, &ptr, &size), COLOCATED_RESOURCE_EXHAUSTED, "disk on fire");
  colocated_buffer_destroy(shard);
  /* the execution that consumed the failed output fails with the same error */
  CHECK_CODE_MSG(await_and_destroy(dependent_status), COLOCATED_RESOURCE_EXHAUSTED, "disk on fire");
  CHECK_CODE_MSG(colocated_array_to_host(dependent, y, sizeof y), COLOCATED_RESOURCE_EXHAUSTED, "disk on fire");
  colocated_array_destroy(dependent);
  colocated_array_destroy(bad);
  colocated_array_destroy(in);
  colocated_loaded_executable_destroy(add);
  native_fixture_destroy(&f);
}

TEST(a_native_function_that_sets_no_output_fails_with_internal) {
  struct native_fixture f = native_client(1, 1, "lazy", native_set_nothing, NULL);
  compile_replicated(&f, 1, NULL);
  float x = 1;
  colocated_array *in = f32_array(f.client, f.sharding, &x, 1);
  colocated_event *status;
  colocated_array *out = run1(f.exe, in, NULL, &status);
  CHECK_CODE_MSG(await_and_destroy(status), COLOCATED_INTERNAL, "did not set output");
  colocated_array_destroy(out);
  colocated_array_destroy(in);
  native_fixture_destroy(&f);
}

TEST(host_callbacks_run_with_their_user_data_and_answer_the_program) {
  struct native_fixture f = native_client(2, 2, "sum_cb", native_sum_via_callback, NULL);
  struct callback_state state = {0};
  colocated_loaded_host_callback *cb = make_callback(f.client, cb_sum, &state, "sum");
  const colocated_loaded_host_callback *cbs[1] = {cb};
  colocated_compile_options options = callback_options(cbs, 1);
  compile_split(&f, 2, 4, &options);
  colocated_loaded_host_callback_destroy(cb); /* the executable keeps its own reference */
  CHECK_EQ_I64(atomic_load(&state.destroyed), 0);
  float x[4] = {1, 2, 10, 20};
  colocated_array *in = f32_array(f.client, f.sharding, x, 4);
  colocated_event *status;
  colocated_array *out = run1(f.exe, in, NULL, &status);
  CHECK_OK(await_and_destroy(status));
  float y[4];
  CHECK_OK(colocated_array_to_host(out, y, sizeof y));
  CHECK(y[0] == 3 && y[1] == 3 && y[2] == 30 && y[3] == 30);
  CHECK_EQ_I64(atomic_load(&state.calls), 2); /* once per shard */
  colocated_array_destroy(out);
  colocated_array_destroy(in);
  colocated_loaded_executable_destroy(f.exe);
  CHECK(WAIT_FOR(atomic_load(&state.destroyed) == 1, 5000));
  colocated_sharding_destroy(f.sharding);
  colocated_client_destroy(f.client);
  CHECK_EQ_I64(atomic_load(&state.destroyed), 1);
}

TEST(host_callback_errors_and_bad_indices_reach_the_status) {
  static const size_t index_one = 1;
  struct native_fixture f = native_client(1, 1, "sum_cb", native_sum_via_callback, NULL);
  register_native(f.client, "sum_cb1", native_sum_via_callback, (void *)&index_one, NULL);
  struct callback_state state = {0};
  colocated_loaded_host_callback *cb = make_callback(f.client, cb_refuse, &state, "refuse");
  const colocated_loaded_host_callback *cbs[1] = {cb};
  colocated_compile_options options = callback_options(cbs, 1);
  compile_replicated(&f, 2, &options);
  colocated_loaded_executable *out_of_range =
      compile_f32_unary(f.client, "sum_cb1", 2, f.sharding, f.devices, 1, &options);
  float x[2] = {1, 2};
  colocated_array *in = f32_array(f.client, f.sharding, x, 2);
  colocated_event *status;
  colocated_array *out = run1(f.exe, in, NULL, &status);
  CHECK_CODE_MSG(await_and_destroy(status), COLOCATED_PERMISSION_DENIED, "callback says no");
  colocated_array_destroy(out);
  out = run1(out_of_range, in, NULL, &status);
  CHECK_CODE_MSG(await_and_destroy(status), COLOCATED_INVALID_ARGUMENT, "out of range");
  colocated_array_destroy(out);
  CHECK_EQ_I64(atomic_load(&state.calls), 1);
  colocated_array_destroy(in);
  colocated_loaded_executable_destroy(out_of_range);
  colocated_loaded_host_callback_destroy(cb);
  native_fixture_destroy(&f);
  CHECK(WAIT_FOR(atomic_load(&state.destroyed) == 1, 5000));
}

TEST(host_callback_user_data_is_destroyed_once_after_the_executable_and_in_flight_executions) {
  struct gate_fixture g;
  gate_fixture_init(&g, 1, 2, 0.0f);
  register_native(g.client, "sum_cb", native_sum_via_callback, NULL, NULL);
  struct callback_state state = {0};
  colocated_loaded_host_callback *cb = make_callback(g.client, cb_sum, &state, "sum");
  const colocated_loaded_host_callback *cbs[1] = {cb};
  colocated_compile_options options = callback_options(cbs, 1);
  colocated_loaded_executable *exe = compile_f32_unary(g.client, "sum_cb", 1, g.sharding, &g.device, 1, &options);
  colocated_loaded_host_callback_destroy(cb);

  colocated_stream *stream = make_stream(g.client);
  colocated_array *gated = gate_submit(&g, stream, NULL);
  float x = 5;
  colocated_array *in = f32_array(g.client, g.sharding, &x, 1);
  colocated_event *status;
  colocated_array *out = run1(exe, in, stream, &status); /* queued behind the gate */
  colocated_loaded_executable_destroy(exe);             /* in flight: keeps the callback */
  harness_sleep_ms(20);
  CHECK_EQ_I64(atomic_load(&state.destroyed), 0);
  CHECK_EQ_I64(atomic_load(&state.calls), 0);
  gate_open(&g);
  CHECK_OK(await_and_destroy(status));
  CHECK_EQ_I64(atomic_load(&state.calls), 1);
  float y = 0;
  CHECK_OK(colocated_array_to_host(out, &y, sizeof y));
  CHECK(y == 5);
  CHECK(WAIT_FOR(atomic_load(&state.destroyed) == 1, 5000));
  harness_sleep_ms(20);
  CHECK_EQ_I64(atomic_load(&state.destroyed), 1);
  colocated_array_destroy(out);
  colocated_array_destroy(in);
  colocated_array_destroy(gated);
  colocated_stream_destroy(stream);
  gate_fixture_destroy(&g);
  CHECK_EQ_I64(atomic_load(&state.destroyed), 1);
}

TEST(a_host_callback_shared_by_two_executables_is_destroyed_after_both) {
  struct native_fixture f = native_client(1, 1, "sum_cb", native_sum_via_callback, NULL);
  struct callback_state state = {0}, unused = {0};
  colocated_loaded_host_callback *cb = make_callback(f.client, cb_sum, &state, "sum");
  colocated_loaded_host_callback *lonely = make_callback(f.client, cb_sum, &unused, "");
  colocated_loaded_host_callback_destroy(lonely); /* no executable: destroyed at once */
  CHECK_EQ_I64(atomic_load(&unused.destroyed), 1);
  const colocated_loaded_host_callback *cbs[1] = {cb};
  colocated_compile_options options = callback_options(cbs, 1);
  compile_replicated(&f, 1, &options);
  colocated_loaded_executable *b = compile_f32_unary(f.client, "sum_cb", 1, f.sharding, f.devices, 1, &options);
  colocated_loaded_host_callback_destroy(cb);
  colocated_loaded_executable_destroy(f.exe);
  harness_sleep_ms(10);
  CHECK_EQ_I64(atomic_load(&state.destroyed), 0);
  colocated_loaded_executable_destroy(b);
  CHECK(WAIT_FOR(atomic_load(&state.destroyed) == 1, 5000));
  colocated_loaded_host_callback_destroy(NULL);
  colocated_sharding_destroy(f.sharding);
  colocated_client_destroy(f.client);
  CHECK_EQ_I64(atomic_load(&unused.destroyed), 1);
  CHECK_EQ_I64(atomic_load(&state.destroyed), 1);
}

static atomic_int native_destroyed;
static void count_native_destroy(void *user_data) {
  EXPECT((uintptr_t)user_data == 0x1234); /* may run on another thread: no CHECK */
  atomic_fetch_add(&native_destroyed, 1);
}

TEST(native_function_destructor_runs_once_after_the_client_and_all_its_objects) {
  atomic_store(&native_destroyed, 0);
  colocated_client *client = make_client(2, 2);
  register_native(client, "add_one", native_add_one, (void *)(uintptr_t)0x1234, count_native_destroy);
  const colocated_device *d = device_at(client, 0);
  colocated_sharding *s = make_replicated(client, &d, 1);
  colocated_loaded_executable *exe = compile_f32_unary(client, "add_one", 1, s, &d, 1, NULL);
  float x = 1;
  colocated_array *in = f32_array(client, s, &x, 1);
  colocated_event *status;
  colocated_array *out = run1(exe, in, NULL, &status);
  CHECK_OK(await_and_destroy(status));
  colocated_buffer *kept;
  CHECK_OK(colocated_array_buffer(out, 0, &kept));

  colocated_client_destroy(client);
  colocated_loaded_executable_destroy(exe);
  colocated_array_destroy(in);
  colocated_array_destroy(out);
  colocated_sharding_destroy(s);
  harness_sleep_ms(20);
  CHECK_EQ_I64(atomic_load(&native_destroyed), 0); /* a buffer still uses the client */
  float y = 0;
  read_buffer(kept, &y, sizeof y);
  CHECK(y == 2);
  colocated_buffer_destroy(kept);
  CHECK(WAIT_FOR(atomic_load(&native_destroyed) == 1, 5000));
  harness_sleep_ms(20);
  CHECK_EQ_I64(atomic_load(&native_destroyed), 1);
}

struct probe {
  atomic_int ran;
  const colocated_device *d0, *d1;
};

/* Exercises the execution context from inside a native function. Program: two
 * inputs (split float32[4], replicated float32[3]) and one split float32[4]
 * output over two devices. */
static colocated_error *native_probe(void *user_data, colocated_execution_context *ctx,
                                     const colocated_buffer *const *inputs, size_t num_inputs) {
  struct probe *p = user_data;
  EXPECT(num_inputs == 4);
  const colocated_client *client = NULL;
  EXPECT_OK(colocated_execution_context_client(ctx, &client));
  colocated_string_view platform = {NULL, 0};
  EXPECT_OK(colocated_client_platform_name(client, &platform));
  EXPECT(platform.size == 9);
  size_t num_outputs = 0;
  EXPECT_OK(colocated_execution_context_num_outputs(ctx, &num_outputs));
  EXPECT(num_outputs == 2);
  const size_t *counts = NULL;
  size_t num_args = 0;
  EXPECT_OK(colocated_execution_context_input_shard_counts(ctx, &counts, &num_args));
  EXPECT(num_args == 2 && counts[0] == 2 && counts[1] == 2);
  colocated_dtype dtype = 0;
  const int64_t *dims = NULL;
  size_t num_dims = 0;
  const colocated_device *device = NULL;
  EXPECT_OK(colocated_execution_context_output_spec(ctx, 1, &dtype, &dims, &num_dims, &device));
  EXPECT(dtype == COLOCATED_DTYPE_F32 && num_dims == 1 && dims[0] == 2 && device == p->d1);
  EXPECT_OK(colocated_execution_context_output_spec(ctx, 0, NULL, NULL, NULL, &device));
  EXPECT(device == p->d0);
  EXPECT_OK(colocated_execution_context_output_spec(ctx, 0, NULL, NULL, NULL, NULL));
  EXPECT_CODE_MSG(colocated_execution_context_output_spec(ctx, 2, &dtype, &dims, &num_dims, &device),
                  COLOCATED_INVALID_ARGUMENT, "out of range");

  /* input shards: argument-major, each argument in its sharding's device order */
  const colocated_device *on = NULL;
  EXPECT_OK(colocated_buffer_device(inputs[1], &on));
  EXPECT(on == p->d1);
  EXPECT_OK(colocated_buffer_dims(inputs[2], &dims, &num_dims));
  EXPECT(num_dims == 1 && dims[0] == 3);

  float two[2] = {1, 2}, three[3] = {1, 2, 3};
  int64_t d2[1] = {2}, d3[1] = {3};
  colocated_buffer_from_host_args a = buffer_args(client, p->d0, COLOCATED_DTYPE_F32, d3, 1, three, sizeof three);
  colocated_buffer *wrong_dims = NULL, *wrong_device = NULL, *good0 = NULL, *good1 = NULL, *deleted = NULL;
  EXPECT_OK(colocated_buffer_from_host(&a, &wrong_dims, NULL));
  a.dims = d2;
  a.data = two;
  a.data_size = sizeof two;
  a.device = p->d1;
  EXPECT_OK(colocated_buffer_from_host(&a, &wrong_device, NULL));
  EXPECT_OK(colocated_buffer_from_host(&a, &good1, NULL));
  a.device = p->d0;
  EXPECT_OK(colocated_buffer_from_host(&a, &good0, NULL));
  EXPECT_OK(colocated_buffer_from_host(&a, &deleted, NULL));
  EXPECT_OK(colocated_buffer_delete(deleted));
  EXPECT_CODE_MSG(colocated_execution_context_set_output(ctx, 0, wrong_dims), COLOCATED_INVALID_ARGUMENT,
                  "output shard 0 must be");
  EXPECT_CODE_MSG(colocated_execution_context_set_output(ctx, 0, wrong_device), COLOCATED_INVALID_ARGUMENT,
                  "output shard 0 must be");
  EXPECT_CODE_MSG(colocated_execution_context_set_output(ctx, 5, good0), COLOCATED_INVALID_ARGUMENT,
                  "out of range");
  EXPECT_CODE_MSG(colocated_execution_context_set_output(ctx, 0, NULL), COLOCATED_INVALID_ARGUMENT, "NULL");
  EXPECT_CODE_MSG(colocated_execution_context_set_output(ctx, 0, deleted), COLOCATED_FAILED_PRECONDITION,
                  "deleted");
  EXPECT_OK(colocated_execution_context_set_output(ctx, 0, good0));
  EXPECT_CODE_MSG(colocated_execution_context_set_output(ctx, 0, good0), COLOCATED_INVALID_ARGUMENT,
                  "already set");
  EXPECT_OK(colocated_execution_context_set_output(ctx, 1, good1));

  colocated_bytes *answer = NULL;
  EXPECT_CODE_MSG(colocated_execution_context_call_host_callback(ctx, 0, NULL, 0, &answer),
                  COLOCATED_INVALID_ARGUMENT, "out of range");
  EXPECT_CODE_MSG(colocated_execution_context_call_host_callback(ctx, 0, NULL, 4, &answer),
                  COLOCATED_INVALID_ARGUMENT, "NULL");
  EXPECT(answer == NULL);
  EXPECT_CODE_MSG(colocated_execution_context_num_outputs(ctx, NULL), COLOCATED_INVALID_ARGUMENT, "out");
  EXPECT_CODE_MSG(colocated_execution_context_client(ctx, NULL), COLOCATED_INVALID_ARGUMENT, "out");
  EXPECT_CODE_MSG(colocated_execution_context_input_shard_counts(ctx, NULL, &num_args), COLOCATED_INVALID_ARGUMENT,
                  "counts");
  colocated_buffer_destroy(wrong_dims);
  colocated_buffer_destroy(wrong_device);
  colocated_buffer_destroy(good0); /* the runtime keeps its own reference */
  colocated_buffer_destroy(good1);
  colocated_buffer_destroy(deleted);
  atomic_fetch_add(&p->ran, 1);
  return NULL;
}

TEST(the_execution_context_describes_inputs_and_outputs_and_checks_set_output) {
  colocated_client *client = make_client(2, 2);
  size_t n;
  const colocated_device *const *devices = client_devices(client, &n);
  struct probe p = {0, devices[0], devices[1]};
  register_native(client, "probe", native_probe, &p, NULL);
  colocated_sharding *split = make_split(client, devices, 2);
  colocated_sharding *repl = make_replicated(client, devices, 2);
  const int64_t d4[1] = {4}, d3[1] = {3};
  colocated_array_spec s0 = make_spec(COLOCATED_DTYPE_F32, d4, 1, split);
  colocated_array_spec s1 = make_spec(COLOCATED_DTYPE_F32, d3, 1, repl);
  const colocated_array_spec *ins[2] = {&s0, &s1};
  const colocated_array_spec *outs[1] = {&s0};
  colocated_program program = make_program("native", "probe", ins, 2, outs, 1, devices, 2);
  colocated_loaded_executable *exe = NULL;
  CHECK_OK(colocated_client_compile(client, &program, NULL, &exe));
  float x4[4] = {1, 2, 3, 4}, x3[3] = {5, 6, 7};
  colocated_array *a0 = f32_array(client, split, x4, 4);
  colocated_array *a1 = f32_array(client, repl, x3, 3);
  const colocated_array *args[2] = {a0, a1};
  colocated_array *out = NULL;
  colocated_event *status;
  CHECK_OK(colocated_loaded_executable_execute(exe, args, 2, NULL, &out, 1, &status));
  CHECK_OK(await_and_destroy(status));
  CHECK_EQ_I64(atomic_load(&p.ran), 1);
  float y[4];
  CHECK_OK(colocated_array_to_host(out, y, sizeof y));
  CHECK(y[0] == 1 && y[1] == 2 && y[2] == 1 && y[3] == 2);
  colocated_array_destroy(out);
  colocated_array_destroy(a0);
  colocated_array_destroy(a1);
  colocated_loaded_executable_destroy(exe);
  colocated_sharding_destroy(split);
  colocated_sharding_destroy(repl);
  colocated_client_destroy(client);
}

TEST(execute_sharded_runs_the_part_of_one_device) {
  struct native_fixture f = native_client(3, 2, "add_one", native_add_one, NULL);
  compile_split(&f, 2, 4, NULL); /* devices 0 and 1 */
  float shard[2] = {10, 20};
  colocated_buffer *on1 = make_f32(f.client, f.devices[1], shard, 2);
  colocated_buffer *on0 = make_f32(f.client, f.devices[0], shard, 2);
  float whole[4] = {0};
  colocated_buffer *too_big = make_f32(f.client, f.devices[1], whole, 4);
  const colocated_buffer *args[1] = {on1};
  colocated_buffer *out[1] = {NULL};
  colocated_event *status = NULL;
  CHECK_OK(colocated_loaded_executable_execute_sharded(f.exe, args, 1, f.devices[1], NULL, out, 1, &status));
  float y[2];
  await_shard_on(status, out[0], f.devices[1], y, 2);
  CHECK(y[0] == 11 && y[1] == 21);
  colocated_buffer_destroy(out[0]);
  out[0] = NULL;

  CHECK_CODE_MSG(colocated_loaded_executable_execute_sharded(f.exe, args, 1, f.devices[2], NULL, out, 1, &status),
                 COLOCATED_INVALID_ARGUMENT, "does not run on");
  const colocated_buffer *wrong_device[1] = {on0};
  CHECK_CODE_MSG(
      colocated_loaded_executable_execute_sharded(f.exe, wrong_device, 1, f.devices[1], NULL, out, 1, &status),
      COLOCATED_INVALID_ARGUMENT, "argument 0");
  const colocated_buffer *wrong_shape[1] = {too_big};
  CHECK_CODE_MSG(
      colocated_loaded_executable_execute_sharded(f.exe, wrong_shape, 1, f.devices[1], NULL, out, 1, &status),
      COLOCATED_INVALID_ARGUMENT, "argument 0");
  CHECK_CODE_MSG(colocated_loaded_executable_execute_sharded(f.exe, NULL, 0, f.devices[1], NULL, out, 1, &status),
                 COLOCATED_INVALID_ARGUMENT, "arguments");
  CHECK_CODE_MSG(colocated_loaded_executable_execute_sharded(f.exe, args, 1, f.devices[1], NULL, out, 0, &status),
                 COLOCATED_INVALID_ARGUMENT, "num_outputs");
  CHECK_CODE_MSG(colocated_loaded_executable_execute_sharded(f.exe, args, 1, f.devices[1], NULL, NULL, 1, &status),
                 COLOCATED_INVALID_ARGUMENT, "outputs");
  CHECK_CODE_MSG(colocated_loaded_executable_execute_sharded(f.exe, args, 1, NULL, NULL, out, 1, &status),
                 COLOCATED_INVALID_ARGUMENT, "NULL");
  CHECK_OK(colocated_buffer_delete(on1));
  CHECK_CODE_MSG(colocated_loaded_executable_execute_sharded(f.exe, args, 1, f.devices[1], NULL, out, 1, &status),
                 COLOCATED_FAILED_PRECONDITION, "deleted");
  CHECK(out[0] == NULL);
  colocated_buffer_destroy(on0);
  colocated_buffer_destroy(on1);
  colocated_buffer_destroy(too_big);
  native_fixture_destroy(&f);
}

TEST(execute_portable_runs_a_single_device_executable_on_any_device) {
  struct native_fixture f = native_client(3, 2, "add_one", native_add_one, NULL);
  colocated_client *other = make_client(1, 1);
  compile_replicated(&f, 3, NULL);
  float x[3] = {1, 2, 3};
  colocated_buffer *on2 = make_f32(f.client, f.devices[2], x, 3);
  const colocated_buffer *args[1] = {on2};
  colocated_buffer *out[1] = {NULL};
  colocated_event *status;
  CHECK_OK(colocated_loaded_executable_execute_portable(f.exe, args, 1, f.devices[2], NULL, out, 1, &status));
  float y[3];
  await_shard_on(status, out[0], f.devices[2], y, 3);
  CHECK(y[0] == 2 && y[2] == 4);
  colocated_buffer_destroy(out[0]);
  out[0] = NULL;

  CHECK_CODE_MSG(colocated_loaded_executable_execute_portable(f.exe, args, 1, f.devices[1], NULL, out, 1, &status),
                 COLOCATED_INVALID_ARGUMENT, "argument 0");
  CHECK_CODE_MSG(
      colocated_loaded_executable_execute_portable(f.exe, args, 1, device_at(other, 0), NULL, out, 1, &status),
      COLOCATED_INVALID_ARGUMENT, "another client");

  colocated_sharding *three = make_split(f.client, f.devices, 3);
  colocated_loaded_executable *multi = compile_f32_unary(f.client, "add_one", 3, three, f.devices, 3, NULL);
  CHECK_CODE_MSG(colocated_loaded_executable_execute_portable(multi, args, 1, f.devices[2], NULL, out, 1, &status),
                 COLOCATED_INVALID_ARGUMENT, "single-device");
  CHECK(out[0] == NULL);
  colocated_loaded_executable_destroy(multi);
  colocated_sharding_destroy(three);
  colocated_buffer_destroy(on2);
  colocated_client_destroy(other);
  native_fixture_destroy(&f);
}

TEST(executions_in_flight_finish_after_the_executable_handle_is_destroyed) {
  struct native_fixture f = native_client(2, 2, "add_one", native_add_one, NULL);
  compile_split(&f, 2, 2, NULL);
  float x[2] = {1, 2};
  colocated_array *in = f32_array(f.client, f.sharding, x, 2);
  colocated_event *status;
  colocated_array *out = run1(f.exe, in, NULL, &status);
  colocated_loaded_executable_destroy(f.exe);
  colocated_array_destroy(in);
  colocated_sharding_destroy(f.sharding);
  colocated_client_destroy(f.client);
  CHECK_OK(await_and_destroy(status));
  float y[2];
  CHECK_OK(colocated_array_to_host(out, y, sizeof y));
  CHECK(y[0] == 2 && y[1] == 3);
  colocated_array_destroy(out);
}

TEST(a_stream_of_another_client_is_rejected) {
  colocated_client *a = make_client(1, 1);
  struct native_fixture f = native_client(1, 1, "add_one", native_add_one, NULL);
  compile_replicated(&f, 1, NULL);
  colocated_stream *foreign = make_stream(a);
  colocated_client_destroy(a); /* its executors stop */
  float x = 1;
  colocated_array *in = f32_array(f.client, f.sharding, &x, 1);
  colocated_execute_options options = {sizeof options};
  options.stream = foreign;
  const colocated_array *args[1] = {in};
  colocated_array *out = NULL;
  colocated_event *status = NULL;
  colocated_error *err = colocated_loaded_executable_execute(f.exe, args, 1, &options, &out, 1, &status);
  if (err == NULL) {
    /* accepted: then it must run without anyone waiting for it */
    bool ran = WAIT_FOR(event_is_ready(status), 3000);
    colocated_error *outcome = colocated_event_await(status);
    colocated_error_destroy(outcome);
    colocated_event_destroy(status);
    colocated_array_destroy(out);
    if (!ran) FAIL("an execution on a stream of a destroyed client never ran");
  } else {
    CHECK_CODE_MSG(err, COLOCATED_INVALID_ARGUMENT, "another client");
    CHECK(out == NULL);
  }
  colocated_array_destroy(in);
  colocated_stream_destroy(foreign);
  native_fixture_destroy(&f);
}

TEST(serialize_and_deserialize_round_trip_within_and_across_clients) {
  colocated_client *other = make_client(2, 2);
  struct native_fixture f = native_client(2, 2, "add_one", native_add_one, NULL);
  register_native(other, "add_one", native_add_one, NULL, NULL);
  compile_split(&f, 2, 4, NULL);
  colocated_bytes *bytes = NULL;
  CHECK_OK(colocated_loaded_executable_serialize(f.exe, &bytes));
  const uint8_t *data = NULL;
  size_t size = 0;
  CHECK_OK(colocated_bytes_data(bytes, &data, &size));
  CHECK(data != NULL && size > 0);
  CHECK_OK(colocated_executable_is_compatible(data, size));

  colocated_loaded_executable *same = NULL, *moved = NULL;
  CHECK_OK(colocated_client_deserialize_and_load(f.client, data, size, NULL, &same));
  CHECK_OK(colocated_client_deserialize_and_load(other, data, size, NULL, &moved));
  colocated_string_view f1, f2, f3, name;
  CHECK_OK(colocated_loaded_executable_fingerprint(f.exe, &f1));
  CHECK_OK(colocated_loaded_executable_fingerprint(same, &f2));
  CHECK_OK(colocated_loaded_executable_fingerprint(moved, &f3));
  CHECK(f1.size == 16 && memcmp(f1.data, f2.data, 16) == 0 && memcmp(f1.data, f3.data, 16) == 0);
  CHECK_OK(colocated_loaded_executable_name(moved, &name));
  CHECK_VIEW_EQ(name, "add_one");
  const colocated_device *const *moved_devices;
  size_t count;
  CHECK_OK(colocated_loaded_executable_devices(moved, &moved_devices, &count));
  CHECK_EQ_U64(count, 2);
  CHECK(moved_devices[0] == device_at(other, 0) && moved_devices[1] == device_at(other, 1));
  colocated_bytes_destroy(bytes);

  /* the loaded executable runs, on the other client too */
  size_t n;
  const colocated_device *const *od = client_devices(other, &n);
  colocated_sharding *os = make_split(other, od, 2);
  float x[4] = {1, 2, 3, 4}, y[4];
  colocated_array *in = f32_array(other, os, x, 4);
  colocated_event *status;
  colocated_array *out = run1(moved, in, NULL, &status);
  CHECK_OK(await_and_destroy(status));
  CHECK_OK(colocated_array_to_host(out, y, sizeof y));
  CHECK(y[0] == 2 && y[3] == 5);
  colocated_array_destroy(out);
  colocated_array_destroy(in);

  /* a different program has a different fingerprint */
  colocated_loaded_executable *bigger = compile_f32_unary(f.client, "add_one", 8, f.sharding, f.devices, 2, NULL);
  colocated_string_view f4;
  CHECK_OK(colocated_loaded_executable_fingerprint(bigger, &f4));
  CHECK(is_hex16(f4) && memcmp(f1.data, f4.data, 16) != 0);
  colocated_loaded_executable_destroy(bigger);

  colocated_loaded_executable_destroy(same);
  colocated_loaded_executable_destroy(moved);
  colocated_loaded_executable_destroy(f.exe);
  colocated_loaded_executable_destroy(NULL);
  colocated_bytes_destroy(NULL);
  colocated_sharding_destroy(os);
  colocated_sharding_destroy(f.sharding);
  colocated_client_destroy(other);
  colocated_client_destroy(f.client);
}

/* Checks that both is_compatible and deserialize_and_load reject `data`. */
static void check_rejected(const colocated_client *client, const uint8_t *data, size_t size, const char *reason) {
  CHECK_CODE_MSG(colocated_executable_is_compatible(data, size), COLOCATED_INVALID_ARGUMENT, reason);
  colocated_loaded_executable *exe = NULL;
  CHECK_CODE_MSG(colocated_client_deserialize_and_load(client, data, size, NULL, &exe), COLOCATED_INVALID_ARGUMENT,
                 reason);
  CHECK(exe == NULL);
}

TEST(truncated_corrupted_and_foreign_bytes_are_rejected_with_the_reason) {
  struct native_fixture f = native_client(1, 1, "add_one", native_add_one, NULL);
  compile_replicated(&f, 1, NULL);
  colocated_bytes *bytes;
  CHECK_OK(colocated_loaded_executable_serialize(f.exe, &bytes));
  const uint8_t *data;
  size_t size;
  CHECK_OK(colocated_bytes_data(bytes, &data, &size));
  uint8_t *copy = malloc(size + 1);
  memcpy(copy, data, size);
  /* The offsets below are the serialized format's fixed header (core/src/format.rs):
   * magic at 0, format version (u32) at 8, producer version at 12, reserved (zero) at
   * 18, CRC-32 at 28 (in format version 2, of the header before it and the payload),
   * payload from 32. */

  check_rejected(f.client, NULL, 0, "truncated");
  check_rejected(f.client, copy, 10, "truncated");
  check_rejected(f.client, copy, 31, "truncated");
  check_rejected(f.client, copy, size - 1, "truncated");
  copy[size] = 0;
  check_rejected(f.client, copy, size + 1, "extra bytes");
  copy[size - 1] ^= 0xff;
  check_rejected(f.client, copy, size, "checksum");
  copy[size - 1] ^= 0xff;
  copy[0] = 'X';
  check_rejected(f.client, copy, size, "magic");
  copy[0] = data[0];
  copy[8] = 9; /* a future format version */
  check_rejected(f.client, copy, size, "format version 9");
  copy[8] = data[8];
  copy[12] ^= 1; /* another producer version than the checksum covers */
  check_rejected(f.client, copy, size, "checksum mismatch over the header");
  copy[12] = data[12];
  copy[19] = 1;
  check_rejected(f.client, copy, size, "reserved");
  copy[19] = data[19];
  CHECK_OK(colocated_executable_is_compatible(copy, size));
  CHECK_CODE_MSG(colocated_executable_is_compatible(NULL, 5), COLOCATED_INVALID_ARGUMENT, "NULL");
  free(copy);
  colocated_bytes_destroy(bytes);
  native_fixture_destroy(&f);
}

TEST(loading_needs_the_host_callbacks_functions_and_devices_it_was_compiled_with) {
  struct native_fixture f = native_client(2, 2, "sum_cb", native_sum_via_callback, NULL);
  struct callback_state state = {0};
  colocated_loaded_host_callback *cb = make_callback(f.client, cb_sum, &state, "sum");
  const colocated_loaded_host_callback *cbs[2] = {cb, cb};
  colocated_compile_options one = callback_options(cbs, 1);
  compile_split(&f, 2, 2, &one);
  colocated_bytes *bytes;
  CHECK_OK(colocated_loaded_executable_serialize(f.exe, &bytes));
  const uint8_t *data;
  size_t size;
  CHECK_OK(colocated_bytes_data(bytes, &data, &size));
  colocated_loaded_executable *loaded = NULL;
  CHECK_CODE_MSG(colocated_client_deserialize_and_load(f.client, data, size, NULL, &loaded), COLOCATED_INVALID_ARGUMENT,
                 "host callbacks");
  colocated_compile_options two = one;
  two.num_host_callbacks = 2;
  CHECK_CODE_MSG(colocated_client_deserialize_and_load(f.client, data, size, &two, &loaded), COLOCATED_INVALID_ARGUMENT,
                 "host callbacks");
  CHECK_OK(colocated_client_deserialize_and_load(f.client, data, size, &one, &loaded));
  colocated_loaded_executable_destroy(loaded);

  colocated_client *small = make_client(1, 1); /* lacks device 1 */
  register_native(small, "sum_cb", native_sum_via_callback, NULL, NULL);
  colocated_loaded_host_callback *small_cb = make_callback(small, cb_sum, &state, "sum");
  const colocated_loaded_host_callback *small_cbs[1] = {small_cb};
  colocated_compile_options small_one = callback_options(small_cbs, 1);
  loaded = NULL;
  CHECK_CODE_MSG(colocated_client_deserialize_and_load(small, data, size, &small_one, &loaded),
                 COLOCATED_INVALID_ARGUMENT, "no device with id 1");
  colocated_client *no_fn = make_client(2, 2); /* lacks the native function */
  colocated_loaded_host_callback *no_fn_cb = make_callback(no_fn, cb_sum, &state, "sum");
  const colocated_loaded_host_callback *no_fn_cbs[1] = {no_fn_cb};
  colocated_compile_options no_fn_one = callback_options(no_fn_cbs, 1);
  CHECK_CODE_MSG(colocated_client_deserialize_and_load(no_fn, data, size, &no_fn_one, &loaded), COLOCATED_NOT_FOUND,
                 "sum_cb");
  CHECK(loaded == NULL);
  colocated_loaded_host_callback_destroy(no_fn_cb);
  colocated_loaded_host_callback_destroy(small_cb);
  colocated_client_destroy(no_fn);
  colocated_client_destroy(small);
  colocated_bytes_destroy(bytes);
  colocated_loaded_executable_destroy(f.exe);
  colocated_loaded_host_callback_destroy(cb);
  colocated_sharding_destroy(f.sharding);
  colocated_client_destroy(f.client);
  CHECK(WAIT_FOR(atomic_load(&state.destroyed) == 3, 5000));
}

TEST(registering_a_native_name_twice_is_already_exists) {
  colocated_client *client = make_client(1, 1);
  register_native(client, "add_one", native_add_one, NULL, NULL);
  colocated_native_function_args args = {sizeof args};
  args.name = sv("add_one");
  args.function = native_add_one;
  CHECK_CODE_MSG(colocated_client_register_native_function(client, &args), COLOCATED_ALREADY_EXISTS, "add_one");
  args.name = sv("");
  CHECK_CODE_MSG(colocated_client_register_native_function(client, &args), COLOCATED_INVALID_ARGUMENT, "name");
  args.name = (colocated_string_view){"\xc3\x28", 2};
  CHECK_CODE_MSG(colocated_client_register_native_function(client, &args), COLOCATED_INVALID_ARGUMENT, "UTF-8");
  args.name = (colocated_string_view){NULL, 3};
  CHECK_CODE_MSG(colocated_client_register_native_function(client, &args), COLOCATED_INVALID_ARGUMENT, "NULL");
  args.name = sv("other");
  args.function = NULL;
  CHECK_CODE_MSG(colocated_client_register_native_function(client, &args), COLOCATED_INVALID_ARGUMENT, "function");
  /* the same name in another client is fine */
  colocated_client *other = make_client(1, 1);
  register_native(other, "add_one", native_add_one, NULL, NULL);
  colocated_client_destroy(other);
  colocated_client_destroy(client);
}

/* A failed call takes no ownership: the caller still owns user_data (and may free
 * it), so the library must not call the destructor. */
TEST(a_failed_registration_does_not_call_the_destructor) {
  struct callback_state state = {0};
  colocated_client *client = make_client(1, 1);
  register_native(client, "taken", native_add_one, NULL, NULL);
  colocated_native_function_args args = {sizeof args};
  args.user_data = &state;
  args.destructor = count_destroy;
  args.function = native_add_one;
  args.name = sv("taken");
  CHECK_CODE(colocated_client_register_native_function(client, &args), COLOCATED_ALREADY_EXISTS);
  args.name = sv("");
  CHECK_CODE(colocated_client_register_native_function(client, &args), COLOCATED_INVALID_ARGUMENT);
  args.name = (colocated_string_view){"\xff", 1};
  CHECK_CODE(colocated_client_register_native_function(client, &args), COLOCATED_INVALID_ARGUMENT);
  args.name = sv("free");
  args.function = NULL;
  CHECK_CODE(colocated_client_register_native_function(client, &args), COLOCATED_INVALID_ARGUMENT);
  colocated_client_destroy(client);
  harness_sleep_ms(10);
  CHECK_EQ_I64(atomic_load(&state.destroyed), 0);
}

TEST(a_failed_host_callback_creation_does_not_call_the_destructor) {
  struct callback_state state = {0};
  colocated_client *client = make_client(1, 1);
  colocated_host_callback_args args = {sizeof args};
  args.user_data = &state;
  args.destructor = count_destroy;
  colocated_loaded_host_callback *cb = NULL;
  CHECK_CODE_MSG(colocated_client_make_loaded_host_callback(client, &args, &cb), COLOCATED_INVALID_ARGUMENT,
                 "function");
  args.function = cb_sum;
  args.name = (colocated_string_view){"\xff", 1};
  CHECK_CODE_MSG(colocated_client_make_loaded_host_callback(client, &args, &cb), COLOCATED_INVALID_ARGUMENT, "UTF-8");
  args.name = sv("ok");
  CHECK_CODE_MSG(colocated_client_make_loaded_host_callback(client, &args, NULL), COLOCATED_INVALID_ARGUMENT, "out");
  CHECK_CODE_MSG(colocated_client_make_loaded_host_callback(NULL, &args, &cb), COLOCATED_INVALID_ARGUMENT, "NULL");
  CHECK_CODE_MSG(colocated_client_make_loaded_host_callback(client, NULL, &cb), COLOCATED_INVALID_ARGUMENT, "NULL");
  CHECK(cb == NULL);
  colocated_client_destroy(client);
  CHECK_EQ_I64(atomic_load(&state.destroyed), 0);
}

TEST(bytes_and_callback_results_reject_null_arguments) {
  const uint8_t *data;
  size_t size;
  CHECK_CODE_MSG(colocated_bytes_data(NULL, &data, &size), COLOCATED_INVALID_ARGUMENT, "NULL");
  CHECK_CODE_MSG(colocated_callback_result_set(NULL, (const uint8_t *)"x", 1), COLOCATED_INVALID_ARGUMENT, "NULL");
  struct native_fixture f = native_client(1, 1, "add_one", native_add_one, NULL);
  compile_replicated(&f, 1, NULL);
  colocated_bytes *bytes;
  CHECK_OK(colocated_loaded_executable_serialize(f.exe, &bytes));
  CHECK_CODE_MSG(colocated_bytes_data(bytes, NULL, &size), COLOCATED_INVALID_ARGUMENT, "data");
  CHECK_CODE_MSG(colocated_bytes_data(bytes, &data, NULL), COLOCATED_INVALID_ARGUMENT, "size");
  colocated_bytes_destroy(bytes);
  native_fixture_destroy(&f);
}

TEST(serialize_with_null_out_is_invalid_and_leaks_nothing) {
  struct native_fixture f = native_client(1, 1, "add_one", native_add_one, NULL);
  compile_replicated(&f, 1, NULL);
  CHECK_CODE_MSG(colocated_loaded_executable_serialize(f.exe, NULL), COLOCATED_INVALID_ARGUMENT, "out");
  native_fixture_destroy(&f);
}

/* Destroys the handles it is lent (a caller mistake), then still uses them. */
static colocated_error *native_destroys_what_it_is_lent(void *user_data, colocated_execution_context *ctx,
                                                        const colocated_buffer *const *inputs, size_t num_inputs) {
  (void)user_data;
  const colocated_client *client;
  colocated_error *err = colocated_execution_context_client(ctx, &client);
  if (err) return err;
  colocated_client_destroy((colocated_client *)client);
  for (size_t i = 0; i < num_inputs; ++i) colocated_buffer_destroy((colocated_buffer *)inputs[i]);
  void *data;
  size_t size;
  if ((err = read_shard(inputs[0], &data, &size))) return err;
  err = set_output_from(ctx, 0, data, size);
  free(data);
  return err;
}

TEST(destroying_a_lent_handle_inside_a_native_function_is_a_no_op) {
  struct native_fixture f = native_client(1, 2, "destroys_what_it_is_lent", native_destroys_what_it_is_lent, NULL);
  compile_replicated(&f, 2, NULL);
  const float x[2] = {4.0f, 5.0f};
  colocated_array *in = f32_array(f.client, f.sharding, x, 2);
  colocated_event *status;
  colocated_array *out = run1(f.exe, in, NULL, &status);
  CHECK_OK(await_and_destroy(status));
  float y[2] = {0, 0};
  CHECK_OK(colocated_array_to_host(out, y, sizeof y));
  CHECK(y[0] == 4.0f && y[1] == 5.0f);
  colocated_array_destroy(out);
  colocated_array_destroy(in);
  native_fixture_destroy(&f);
}
