/*
 * The cases every SDK answers alike (tests/cases/colocated.json): the same
 * calls of colocated functions give the same outputs, shardings, errors and
 * cache counts in C, Python and Node, because core decides them. This is the
 * C runner; the Makefile writes the table as shared_cases.h
 * (tests/cases/to_c.py), one TEST per case and run (the table's `runs`).
 *
 * The local run registers the functions below as native functions of a
 * client of this process. The remote run starts a real worker process (the
 * `colocated` executable, COLOCATED_WORKER_BIN) on 127.0.0.1 with a token and
 * the plugin SHARED_CASES_PLUGIN (tests/plugin/shared_cases_plugin.c), which
 * serves `add_one` and `first` there, and calls them through a client
 * connected to it. Plugin functions cannot report their outputs, so the remote
 * run declares a function's outputs from its first call's inputs (as
 * `add_one` and `first` make them).
 *
 * C has no trees: a call's arguments are its flat inputs, and its outputs the
 * host's outputs in order; a case that needs trees is skipped, saying so. A
 * method of a colocated class is a native function whose data is its object's
 * id, called with that object.
 */
#include "harness.h"
#include "helpers.h"
#include "worker.h"

#ifndef SHARED_CASES_PLUGIN
#error "build with -DSHARED_CASES_PLUGIN='\"path of libshared_cases_plugin.so\"' (see the Makefile)"
#endif

/* An argument or an output: values of `dtype` on `devices`, split along the
 * first dimension or replicated, in memory of `memory_kind`. */
typedef struct {
  const char *dtype;
  size_t num_values;
  const double *values;
  size_t num_devices;
  const int *devices;
  int split;
  colocated_memory_kind memory_kind;
} case_array;

typedef struct {
  size_t num_args;
  const case_array *args;
  size_t num_outputs;
  const case_array *outputs;
  const char *error_code; /* NULL: the call succeeds */
  const char *fragment;
  int error_at_run; /* the call returns, and waiting for its outputs fails */
  int has_cache; /* 0: the table gives no cache counts */
  uint64_t hits, misses;
} case_call;

typedef struct {
  const char *name;
  const char *function;
  size_t num_calls;
  const case_call *calls;
  int freed; /* < 0: the case frees no object */
} shared_case;

static void run_case(const shared_case *c, bool remote);

/* The table (SHARED_CASES, SHARED_CASES_DEVICES) and one TEST per case. */
#include "shared_cases.h"

#define SHARED_CASES_DEVICES_MAX 16

static const char STRUCTURE[] = "flat";

/* Destructors of "count" objects that ran. */
static atomic_int freed;

/* `in` plus `increment` (float32 or int32), with its sharding. */
static colocated_error *plus(colocated_execution_context *ctx, colocated_array *in, int increment,
                             colocated_array **out) {
  colocated_dtype dtype;
  const int64_t *dims;
  size_t num_dims;
  colocated_error *err = colocated_array_dtype(in, &dtype);
  if (!err) err = colocated_array_dims(in, &dims, &num_dims);
  if (err) return err;
  if (num_dims != 1 || (dtype != COLOCATED_DTYPE_F32 && dtype != COLOCATED_DTYPE_I32))
    return make_error(COLOCATED_INVALID_ARGUMENT, "add_one takes vectors of float32 or int32");
  size_t n = (size_t)dims[0];
  union {
    float f[16];
    int32_t i[16];
  } values;
  if (n > 16) return make_error(COLOCATED_INVALID_ARGUMENT, "add_one takes up to 16 values");
  if ((err = colocated_array_to_host(in, &values, n * 4))) return err;
  for (size_t k = 0; k < n; ++k) {
    if (dtype == COLOCATED_DTYPE_F32)
      values.f[k] += (float)increment;
    else
      values.i[k] += increment;
  }
  colocated_sharding *sharding = NULL;
  if ((err = colocated_array_sharding(in, &sharding))) return err;
  const colocated_client *client;
  if (!(err = colocated_execution_context_client(ctx, &client))) {
    colocated_array_args args = array_args(client, dtype, dims, num_dims, sharding);
    args.data = &values;
    args.data_size = n * 4;
    err = colocated_array_from_host(&args, out);
  }
  colocated_sharding_destroy(sharding);
  return err;
}

/* Native "add_one" (every input plus one) and "first" (input 0 as it is),
 * over this host's arrays; `user_data` is non-NULL for "add_one". */
static colocated_error *native_case_function(void *user_data, colocated_execution_context *ctx,
                                             const colocated_buffer *const *inputs, size_t num_inputs) {
  (void)inputs, (void)num_inputs;
  colocated_array *outs[8] = {0};
  size_t n = 0;
  colocated_error *err = NULL;
  for (; n < 8; ++n) {
    colocated_array *in = NULL;
    colocated_error *beyond = colocated_execution_context_host_input(ctx, n, &in);
    if (beyond) {
      colocated_error_destroy(beyond);
      break;
    }
    if (user_data) {
      err = plus(ctx, in, 1, &outs[n]);
      colocated_array_destroy(in);
      if (err) break;
    } else {
      outs[n] = in;
      n += 1;
      break;
    }
  }
  if (!err) err = colocated_execution_context_set_host_outputs(ctx, (const colocated_array *const *)outs, n,
                                                                (const uint8_t *)STRUCTURE, strlen(STRUCTURE));
  for (size_t k = 0; k < 8; ++k) colocated_array_destroy(outs[k]);
  return err;
}

/* Native "restructures": input 0 as it is, reported as a "leaf" when its
 * first value is 0, else as a "tuple" (C's outputs are flat: the structure
 * alone says which). */
static colocated_error *native_restructures(void *user_data, colocated_execution_context *ctx,
                                            const colocated_buffer *const *inputs, size_t num_inputs) {
  (void)user_data, (void)inputs, (void)num_inputs;
  colocated_array *in = NULL;
  colocated_error *err = colocated_execution_context_host_input(ctx, 0, &in);
  if (err) return err;
  int32_t values[16];
  const int64_t *dims = NULL;
  size_t num_dims = 0;
  err = colocated_array_dims(in, &dims, &num_dims);
  if (!err && (num_dims != 1 || dims[0] < 1 || dims[0] > 16))
    err = make_error(COLOCATED_INVALID_ARGUMENT, "restructures takes vectors of 1 to 16 int32 values");
  if (!err) err = colocated_array_to_host(in, values, (size_t)dims[0] * 4);
  if (!err) {
    const char *structure = values[0] == 0 ? "leaf" : "tuple";
    err = colocated_execution_context_set_host_outputs(ctx, (const colocated_array *const *)&in, 1,
                                                       (const uint8_t *)structure, strlen(structure));
  }
  colocated_array_destroy(in);
  return err;
}

static void free_count(void *value) {
  free(value);
  atomic_fetch_add(&freed, 1);
}

static colocated_error *build_count(void *user_data, void **value, colocated_destructor *destructor) {
  (void)user_data;
  int *calls = calloc(1, sizeof *calls);
  if (calls == NULL) return make_error(COLOCATED_RESOURCE_EXHAUSTED, "no memory");
  *value = calls;
  *destructor = free_count;
  return NULL;
}

/* Native "count": a method of the object whose id is the function's data,
 * which counts its calls; returns the host's input 0 plus that count. */
static colocated_error *native_count(void *user_data, colocated_execution_context *ctx,
                                     const colocated_buffer *const *inputs, size_t num_inputs) {
  (void)user_data, (void)inputs, (void)num_inputs;
  const uint8_t *data;
  size_t size;
  colocated_error *err = colocated_execution_context_native_data(ctx, &data, &size);
  if (err) return err;
  uint64_t id;
  if (size != sizeof id) return make_error(COLOCATED_INVALID_ARGUMENT, "count needs its object's id");
  memcpy(&id, data, sizeof id);
  void *value = NULL;
  if ((err = colocated_execution_context_host_object(ctx, id, build_count, NULL, &value))) return err;
  int *calls = value;
  colocated_array *in = NULL;
  if ((err = colocated_execution_context_host_input(ctx, 0, &in))) return err;
  colocated_array *out = NULL;
  err = plus(ctx, in, ++*calls, &out);
  colocated_array_destroy(in);
  if (!err)
    err = colocated_execution_context_set_host_outputs(ctx, (const colocated_array *const *)&out, 1,
                                                        (const uint8_t *)STRUCTURE, strlen(STRUCTURE));
  colocated_array_destroy(out);
  return err;
}

/* Native "reentrant": calls `user_data`, the colocated function "add_one",
 * with this host's inputs from its host code, waits for it, and returns its
 * outputs (the nested call runs on a stream of its own). */
static colocated_error *native_reentrant(void *user_data, colocated_execution_context *ctx,
                                         const colocated_buffer *const *inputs, size_t num_inputs) {
  (void)inputs, (void)num_inputs;
  colocated_array *ins[8] = {0};
  colocated_array *outs[8] = {0};
  size_t n = 0, num_outputs = 0;
  for (; n < 8; ++n) {
    colocated_error *beyond = colocated_execution_context_host_input(ctx, n, &ins[n]);
    if (beyond) {
      colocated_error_destroy(beyond);
      break;
    }
  }
  colocated_function_call_args cargs = {sizeof cargs};
  cargs.inputs = (const colocated_array *const *)ins;
  cargs.num_inputs = n;
  colocated_call *call = NULL;
  colocated_event *status = NULL;
  colocated_error *err = colocated_function_call((const colocated_function *)user_data, &cargs, &call);
  if (!err) err = colocated_call_status(call, &status);
  if (!err) err = await_and_destroy(status);
  if (!err) err = colocated_call_num_outputs(call, &num_outputs);
  if (!err && num_outputs > 8) err = make_error(COLOCATED_INVALID_ARGUMENT, "reentrant returns up to 8 outputs");
  for (size_t o = 0; !err && o < num_outputs; ++o) err = colocated_call_output(call, o, &outs[o]);
  if (!err)
    err = colocated_execution_context_set_host_outputs(ctx, (const colocated_array *const *)outs, num_outputs,
                                                       (const uint8_t *)STRUCTURE, strlen(STRUCTURE));
  colocated_call_destroy(call);
  for (size_t k = 0; k < 8; ++k) {
    colocated_array_destroy(ins[k]);
    colocated_array_destroy(outs[k]);
  }
  return err;
}

/* A client of the worker's devices alone. */
static colocated_client *connect_to(const test_worker *w) {
  colocated_client *client = connect_to_worker(w);
  size_t n;
  const colocated_device *const *devices = client_devices(client, &n);
  CHECK(n == SHARED_CASES_DEVICES);
  for (size_t i = 0; i < n; ++i) {
    uint32_t process = 0;
    CHECK_OK(colocated_device_process_index(devices[i], &process));
    CHECK(process == 1);
  }
  return client;
}

static colocated_sharding *sharding_of(const colocated_client *client, const case_array *a) {
  const colocated_device *devices[SHARED_CASES_DEVICES_MAX];
  size_t n = a->num_devices;
  CHECK(n <= SHARED_CASES_DEVICES_MAX);
  for (size_t i = 0; i < n; ++i) devices[i] = device_at(client, (size_t)a->devices[i]);
  colocated_sharding *sharding = a->split ? make_split(client, devices, n) : make_replicated(client, devices, n);
  if (a->memory_kind == COLOCATED_MEMORY_DEVICE) return sharding;
  colocated_sharding *in_memory = NULL;
  CHECK_OK(colocated_sharding_with_memory_kind(sharding, (uint32_t)a->memory_kind, &in_memory));
  colocated_sharding_destroy(sharding);
  return in_memory;
}

static colocated_array *argument(const colocated_client *client, const case_array *arg) {
  CHECK(arg->num_values <= 16);
  float f[16];
  int32_t i[16];
  bool is_f32 = strcmp(arg->dtype, "float32") == 0;
  CHECK(is_f32 || strcmp(arg->dtype, "int32") == 0);
  for (size_t k = 0; k < arg->num_values; ++k) {
    f[k] = (float)arg->values[k];
    i[k] = (int32_t)arg->values[k];
  }
  colocated_sharding *sharding = sharding_of(client, arg);
  int64_t n = (int64_t)arg->num_values;
  colocated_array *array = make_array(client, sharding, is_f32 ? COLOCATED_DTYPE_F32 : COLOCATED_DTYPE_I32, &n, 1,
                                      is_f32 ? (const void *)f : (const void *)i, arg->num_values * 4);
  colocated_sharding_destroy(sharding);
  return array;
}

static void check_output(const colocated_client *client, const colocated_array *out, const case_array *want) {
  colocated_dtype dtype;
  CHECK_OK(colocated_array_dtype(out, &dtype));
  CHECK(dtype == (strcmp(want->dtype, "float32") == 0 ? COLOCATED_DTYPE_F32 : COLOCATED_DTYPE_I32));
  CHECK(want->num_values <= 16);
  union {
    float f[16];
    int32_t i[16];
  } got;
  CHECK_OK(colocated_array_to_host(out, &got, want->num_values * 4));
  for (size_t k = 0; k < want->num_values; ++k)
    CHECK((dtype == COLOCATED_DTYPE_F32 ? (double)got.f[k] : (double)got.i[k]) == want->values[k]);
  colocated_sharding *sharding = NULL;
  CHECK_OK(colocated_array_sharding(out, &sharding));
  const colocated_device *const *devices;
  size_t n;
  CHECK_OK(colocated_sharding_devices(sharding, &devices, &n));
  CHECK(n == want->num_devices);
  for (size_t k = 0; k < n; ++k) CHECK(devices[k] == device_at(client, (size_t)want->devices[k]));
  bool replicated = false;
  CHECK_OK(colocated_sharding_is_fully_replicated(sharding, &replicated));
  CHECK((n > 1 && !replicated) == (want->split != 0));
  colocated_memory_kind kind;
  CHECK_OK(colocated_sharding_memory_kind(sharding, &kind));
  CHECK(kind == want->memory_kind);
  /* ... and every shard is in that memory. */
  for (size_t k = 0; k < n; ++k) {
    colocated_buffer *buffer = NULL;
    CHECK_OK(colocated_array_buffer(out, k, &buffer));
    const colocated_memory_space *memory = NULL;
    CHECK_OK(colocated_buffer_memory_space(buffer, &memory));
    CHECK_OK(colocated_memory_space_kind(memory, &kind));
    CHECK(kind == want->memory_kind);
    colocated_buffer_destroy(buffer);
  }
  colocated_sharding_destroy(sharding);
}

static uint32_t code_of(const char *name) {
  if (strcmp(name, "invalid_argument") == 0) return COLOCATED_INVALID_ARGUMENT;
  if (strcmp(name, "failed_precondition") == 0) return COLOCATED_FAILED_PRECONDITION;
  if (strcmp(name, "unimplemented") == 0) return COLOCATED_UNIMPLEMENTED;
  FAIL("the table names an unknown code: %s", name);
  return 0;
}

/* The spec of `arg` (its sharding is the caller's to destroy). */
static colocated_array_spec spec_of(const colocated_client *client, const case_array *arg, int64_t *dims) {
  colocated_array_spec spec = {sizeof spec};
  spec.dtype = strcmp(arg->dtype, "float32") == 0 ? COLOCATED_DTYPE_F32 : COLOCATED_DTYPE_I32;
  *dims = (int64_t)arg->num_values;
  spec.dims = dims;
  spec.num_dims = 1;
  spec.sharding = sharding_of(client, arg);
  return spec;
}

static void run_case(const shared_case *c, bool remote) {
  test_worker worker;
  colocated_client *client;
  if (remote) {
    start_test_worker(&worker, SHARED_CASES_DEVICES, SHARED_CASES_PLUGIN);
    client = connect_to(&worker);
  } else {
    client = make_client(SHARED_CASES_DEVICES, 2);
  }
  bool reentrant = strcmp(c->function, "reentrant") == 0;
  bool add_one = strcmp(c->function, "add_one") == 0;
  bool count = strcmp(c->function, "count") == 0;
  bool restructures = strcmp(c->function, "restructures") == 0;
  CHECK(add_one || count || reentrant || restructures || strcmp(c->function, "first") == 0);
  /* The worker serves add_one and first (the table marks the rest). */
  CHECK(!remote || !(count || reentrant));
  atomic_store(&freed, 0);
  /* "reentrant" calls "add_one", a colocated function of its own. */
  colocated_function *inner = NULL;
  if (remote) {
    /* (The worker's plugin has them.) */
  } else if (reentrant) {
    register_native(client, "add_one", native_case_function, (void *)client, NULL);
    colocated_function_args iargs = {sizeof iargs};
    iargs.client = client;
    iargs.name = sv("add_one");
    iargs.native_function = sv("add_one");
    CHECK_OK(colocated_function_create(&iargs, &inner));
    register_native(client, c->function, native_reentrant, inner, NULL);
  } else if (count) {
    register_native(client, c->function, native_count, NULL, NULL);
  } else if (restructures) {
    register_native(client, c->function, native_restructures, NULL, NULL);
  } else {
    register_native(client, c->function, native_case_function, add_one ? (void *)client : NULL, NULL);
  }
  /* A method's object, and its id as the function's data. */
  colocated_object *object = NULL;
  uint64_t object_id = 0;
  colocated_function_args fargs = {sizeof fargs};
  fargs.client = client;
  fargs.name = sv(c->function);
  fargs.native_function = sv(c->function);
  if (count) {
    CHECK_OK(colocated_object_create(&object));
    CHECK_OK(colocated_object_id(object, &object_id));
    fargs.data = (const uint8_t *)&object_id;
    fargs.data_size = sizeof object_id;
  }
  /* On a worker: the outputs, declared from the first call's inputs (add_one:
   * one like each input; first: one like input 0). */
  colocated_array_spec out_specs[8];
  const colocated_array_spec *out_spec_ptrs[8];
  int64_t out_dims[8];
  size_t num_out_specs = 0;
  if (remote) {
    const case_call *call = &c->calls[0];
    num_out_specs = add_one ? call->num_args : (call->num_args > 0 ? 1 : 0);
    CHECK(num_out_specs <= 8);
    for (size_t o = 0; o < num_out_specs; ++o) {
      out_specs[o] = spec_of(client, &call->args[o], &out_dims[o]);
      out_spec_ptrs[o] = &out_specs[o];
    }
    fargs.out_specs = out_spec_ptrs;
    fargs.num_out_specs = num_out_specs;
  }
  colocated_function *function = NULL;
  CHECK_OK(colocated_function_create(&fargs, &function));
  for (size_t o = 0; o < num_out_specs; ++o) colocated_sharding_destroy((colocated_sharding *)out_specs[o].sharding);
  for (size_t s = 0; s < c->num_calls; ++s) {
    const case_call *call = &c->calls[s];
    colocated_array *args[8] = {0};
    CHECK(call->num_args <= 8);
    for (size_t a = 0; a < call->num_args; ++a) args[a] = argument(client, &call->args[a]);
    colocated_function_call_args cargs = {sizeof cargs};
    cargs.inputs = (const colocated_array *const *)args;
    cargs.num_inputs = call->num_args;
    if (object) {
      cargs.objects = (const colocated_object *const *)&object;
      cargs.num_objects = 1;
    }
    colocated_call *result = NULL;
    if (call->error_code && call->error_at_run) {
      /* The call returns; its status fails. */
      CHECK_OK(colocated_function_call(function, &cargs, &result));
      colocated_event *status = NULL;
      CHECK_OK(colocated_call_status(result, &status));
      CHECK_CODE_MSG(await_and_destroy(status), code_of(call->error_code), call->fragment);
      colocated_call_destroy(result);
    } else if (call->error_code) {
      CHECK_CODE_MSG(colocated_function_call(function, &cargs, &result), code_of(call->error_code), call->fragment);
    } else {
      CHECK_OK(colocated_function_call(function, &cargs, &result));
      colocated_event *status = NULL;
      CHECK_OK(colocated_call_status(result, &status));
      CHECK_OK(await_and_destroy(status));
      size_t num_outputs = 0;
      CHECK_OK(colocated_call_num_outputs(result, &num_outputs));
      CHECK(num_outputs == call->num_outputs);
      for (size_t o = 0; o < num_outputs; ++o) {
        colocated_array *out = NULL;
        CHECK_OK(colocated_call_output(result, o, &out));
        check_output(client, out, &call->outputs[o]);
        colocated_array_destroy(out);
      }
      colocated_call_destroy(result);
    }
    for (size_t a = 0; a < call->num_args; ++a) colocated_array_destroy(args[a]);
    if (!call->has_cache) continue;
    uint64_t hits = 0, misses = 0;
    size_t held = 0;
    CHECK_OK(colocated_function_cache_info(function, &hits, &misses, &held));
    /* Nothing is evicted: a program per input spec that missed. */
    CHECK(held == misses);
    if (hits != call->hits || misses != call->misses)
      FAIL("%s, call %zu: cache hits %llu, misses %llu; the table says %llu, %llu", c->name, s,
           (unsigned long long)hits, (unsigned long long)misses, (unsigned long long)call->hits,
           (unsigned long long)call->misses);
  }
  CHECK_CODE_MSG(colocated_function_cache_info(NULL, NULL, NULL, NULL), COLOCATED_INVALID_ARGUMENT, "NULL");
  if (c->freed >= 0) {
    /* C frees an object's wrapper by destroying it: its host's object goes
     * (after the calls that listed it). */
    colocated_object_destroy(object);
    object = NULL;
    for (int i = 0; i < 5000 && atomic_load(&freed) < c->freed; ++i) harness_sleep_ms(2);
    if (atomic_load(&freed) != c->freed)
      FAIL("%s: %d objects freed; the table says %d", c->name, atomic_load(&freed), c->freed);
  }
  colocated_object_destroy(object);
  colocated_function_destroy(function);
  colocated_function_destroy(inner);
  colocated_client_destroy(client);
  if (remote) stop_test_worker(&worker);
}
