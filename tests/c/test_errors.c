/*
 * Bad input across the API, and the error and version functions themselves:
 * NULL handles and out-parameters, handles of the wrong type, versioned structs
 * (too small, mid-field, larger with zero / non-zero tails), bad dtypes and dims,
 * objects of another client, unsupported languages, unknown native functions,
 * wrong arguments at execute; colocated_error_* and colocated_api_version.
 */
#include "harness.h"
#include "helpers.h"

#include <stddef.h>

/* ---- versions and errors -------------------------------------------------------- */

_Static_assert(COLOCATED_API_VERSION == ((COLOCATED_API_VERSION_MAJOR << 16) | COLOCATED_API_VERSION_MINOR),
               "COLOCATED_API_VERSION packs major and minor");
_Static_assert(COLOCATED_API_VERSION_MAJOR == 1, "this suite is written against major version 1");

TEST(api_version_matches_the_header_this_was_built_against) {
  uint32_t v = colocated_api_version();
  CHECK_EQ_U64(v >> 16, COLOCATED_API_VERSION_MAJOR);
  int64_t minor = (int64_t)(v & 0xffff);
  CHECK(minor >= (int64_t)COLOCATED_API_VERSION_MINOR);
  CHECK_EQ_U64(v, COLOCATED_API_VERSION);
}

TEST(the_release_is_readable_without_a_client_and_is_a_dotted_version) {
  const char *release = colocated_version();
  CHECK(release != NULL);
  CHECK(release == colocated_version()); /* static: the same string every time */
  unsigned major = 0, minor = 0, patch = 0;
  int end = 0;
  CHECK(sscanf(release, "%u.%u.%u%n", &major, &minor, &patch, &end) == 3);
  CHECK(end > 0 && (release[end] == '\0' || release[end] == '-' || release[end] == '+'));
}

TEST(error_code_names_are_static_lower_case_and_unknown_for_non_codes) {
  static const struct {
    uint32_t code;
    const char *name;
  } names[] = {
      {COLOCATED_OK, "ok"},
      {COLOCATED_CANCELLED, "cancelled"},
      {COLOCATED_INVALID_ARGUMENT, "invalid_argument"},
      {COLOCATED_DEADLINE_EXCEEDED, "deadline_exceeded"},
      {COLOCATED_NOT_FOUND, "not_found"},
      {COLOCATED_ALREADY_EXISTS, "already_exists"},
      {COLOCATED_PERMISSION_DENIED, "permission_denied"},
      {COLOCATED_RESOURCE_EXHAUSTED, "resource_exhausted"},
      {COLOCATED_FAILED_PRECONDITION, "failed_precondition"},
      {COLOCATED_UNIMPLEMENTED, "unimplemented"},
      {COLOCATED_INTERNAL, "internal"},
      {COLOCATED_UNAVAILABLE, "unavailable"},
      {COLOCATED_UNAUTHENTICATED, "unauthenticated"},
      {2, "unknown"},
      {10, "unknown"},
      {11, "unknown"},
      {15, "unknown"},
      {17, "unknown"},
      {UINT32_MAX, "unknown"},
  };
  for (size_t i = 0; i < sizeof names / sizeof names[0]; ++i) {
    colocated_string_view a = colocated_error_code_name(names[i].code);
    CHECK_VIEW_EQ(a, names[i].name);
    colocated_string_view b = colocated_error_code_name(names[i].code);
    CHECK(a.data == b.data); /* static */
  }
}

TEST(error_create_copies_code_and_message) {
  const uint32_t codes[] = {COLOCATED_CANCELLED,        COLOCATED_INVALID_ARGUMENT,  COLOCATED_DEADLINE_EXCEEDED,
                            COLOCATED_NOT_FOUND,        COLOCATED_ALREADY_EXISTS,    COLOCATED_PERMISSION_DENIED,
                            COLOCATED_RESOURCE_EXHAUSTED, COLOCATED_FAILED_PRECONDITION, COLOCATED_UNIMPLEMENTED,
                            COLOCATED_INTERNAL,         COLOCATED_UNAVAILABLE,       COLOCATED_UNAUTHENTICATED};
  for (size_t i = 0; i < sizeof codes / sizeof codes[0]; ++i) {
    char message[] = "something broke";
    colocated_error *err = colocated_error_create(codes[i], (const uint8_t *)message, strlen(message));
    CHECK(err != NULL);
    memset(message, 'x', strlen(message));
    CHECK_EQ_U64(colocated_error_get_code(err), codes[i]);
    CHECK_VIEW_EQ(colocated_error_message(err), "something broke");
    colocated_string_view tb = colocated_error_remote_traceback(err);
    CHECK(tb.size == 0 && tb.data != NULL && tb.data[0] == '\0');
    colocated_error_destroy(err);
  }
  colocated_error *empty = colocated_error_create(COLOCATED_NOT_FOUND, NULL, 0);
  CHECK_VIEW_EQ(colocated_error_message(empty), "");
  colocated_error_destroy(empty);
}

TEST(error_create_with_ok_or_a_non_code_gives_internal_saying_so) {
  colocated_error *err = colocated_error_create(COLOCATED_OK, (const uint8_t *)"fine", 4);
  CHECK(err != NULL);
  CHECK_EQ_U64(colocated_error_get_code(err), COLOCATED_INTERNAL);
  colocated_string_view msg = colocated_error_message(err);
  CHECK(harness_contains(msg.data, msg.size, "code 0"));
  CHECK(harness_contains(msg.data, msg.size, "fine"));
  colocated_error_destroy(err);
  err = colocated_error_create(99, (const uint8_t *)"odd", 3);
  CHECK_EQ_U64(colocated_error_get_code(err), COLOCATED_INTERNAL);
  msg = colocated_error_message(err);
  CHECK(harness_contains(msg.data, msg.size, "code 99"));
  colocated_error_destroy(err);
}

TEST(error_messages_are_valid_nul_terminated_utf8) {
  const uint8_t bad[] = {'o', 'k', 0xc3, 0x28, 0xff, '!'};
  colocated_error *err = colocated_error_create(COLOCATED_INTERNAL, bad, sizeof bad);
  colocated_string_view msg = colocated_error_message(err);
  CHECK(msg.size >= 3 && memcmp(msg.data, "ok", 2) == 0 && msg.data[msg.size - 1] == '!');
  CHECK(msg.data[msg.size] == '\0');
  CHECK(harness_contains(msg.data, msg.size, "\xef\xbf\xbd")); /* U+FFFD replaces bad bytes */
  colocated_error_destroy(err);
  /* an embedded NUL cannot end the message early */
  const uint8_t with_nul[] = {'a', 0, 'b'};
  err = colocated_error_create(COLOCATED_INTERNAL, with_nul, sizeof with_nul);
  msg = colocated_error_message(err);
  CHECK(msg.data[msg.size] == '\0');
  CHECK_EQ_U64(strlen(msg.data), msg.size);
  CHECK(msg.data[0] == 'a' && msg.data[msg.size - 1] == 'b');
  colocated_error_destroy(err);
}

TEST(error_getters_accept_null) {
  CHECK_EQ_U64(colocated_error_get_code(NULL), COLOCATED_INVALID_ARGUMENT);
  colocated_string_view msg = colocated_error_message(NULL);
  CHECK(msg.size == 0 && msg.data != NULL && msg.data[0] == '\0');
  colocated_string_view tb = colocated_error_remote_traceback(NULL);
  CHECK(tb.size == 0 && tb.data != NULL && tb.data[0] == '\0');
  colocated_error_destroy(NULL);
}

/* ---- a fixture with one of every object ---------------------------------------------- */

struct fixture {
  colocated_client *client, *other;
  const colocated_device *device, *device1, *foreign_device;
  const colocated_memory_space *memory, *foreign_memory;
  const colocated_host *host;
  colocated_stream *stream;
  colocated_event *event;
  colocated_buffer *buffer;
  colocated_sharding *sharding;
  colocated_array *array;
  colocated_bytes *bytes;
  colocated_loaded_host_callback *callback;
  colocated_loaded_executable *exe;
  colocated_array_spec spec;
  int64_t dims[1];
  float values[2];
};

static colocated_error *cb_echo(void *user_data, const uint8_t *input, size_t size,
                                colocated_callback_result *result) {
  (void)user_data;
  return colocated_callback_result_set(result, input, size);
}

static void fixture_make(struct fixture *f) {
  memset(f, 0, sizeof *f);
  f->client = make_client(2, 2);
  f->other = make_client(1, 1);
  register_native(f->client, "add_one", native_add_one, NULL, NULL);
  f->device = device_at(f->client, 0);
  f->device1 = device_at(f->client, 1);
  f->foreign_device = device_at(f->other, 0);
  CHECK_OK(colocated_device_default_memory_space(f->device, &f->memory));
  CHECK_OK(colocated_device_default_memory_space(f->foreign_device, &f->foreign_memory));
  const colocated_host *const *hosts;
  size_t n;
  CHECK_OK(colocated_client_hosts(f->client, &hosts, &n));
  f->host = hosts[0];
  CHECK_OK(colocated_client_create_stream(f->client, &f->stream));
  CHECK_OK(colocated_event_create(&f->event));
  f->values[0] = 1;
  f->values[1] = 2;
  f->dims[0] = 2;
  f->buffer = make_f32(f->client, f->device, f->values, 2);
  f->sharding = make_replicated(f->client, &f->device, 1);
  f->array = make_array(f->client, f->sharding, COLOCATED_DTYPE_F32, f->dims, 1, f->values, sizeof f->values);
  f->spec = make_spec(COLOCATED_DTYPE_F32, f->dims, 1, f->sharding);
  f->exe = compile_unary(f->client, "add_one", &f->spec, &f->device, 1, NULL);
  CHECK_OK(colocated_loaded_executable_serialize(f->exe, &f->bytes));
  colocated_host_callback_args ca = {sizeof ca};
  ca.function = cb_echo;
  CHECK_OK(colocated_client_make_loaded_host_callback(f->client, &ca, &f->callback));
}

static void fixture_destroy(struct fixture *f) {
  colocated_loaded_host_callback_destroy(f->callback);
  colocated_bytes_destroy(f->bytes);
  colocated_loaded_executable_destroy(f->exe);
  colocated_array_destroy(f->array);
  colocated_sharding_destroy(f->sharding);
  colocated_buffer_destroy(f->buffer);
  colocated_event_destroy(f->event);
  colocated_stream_destroy(f->stream);
  colocated_client_destroy(f->other);
  colocated_client_destroy(f->client);
}

/* ---- NULL handles, NULL out-parameters, foreign handles -------------------------------- */

#define INVALID(expr) CHECK_CODE_MSG((expr), COLOCATED_INVALID_ARGUMENT, "NULL")
#define NOT_LIVE(expr) CHECK_CODE_MSG((expr), COLOCATED_INVALID_ARGUMENT, "not a live")

TEST(every_function_rejects_a_null_handle) {
  colocated_string_view s;
  uint32_t u32;
  uint64_t u64;
  size_t sz;
  bool flag;
  colocated_dtype dtype;
  colocated_memory_kind kind;
  const colocated_device *const *devices;
  const colocated_device *device;
  const colocated_memory_space *const *spaces;
  const colocated_memory_space *space;
  const colocated_host *const *hosts;
  const colocated_device_attribute *attrs;
  const int64_t *dims;
  const uint8_t *data;
  const size_t *counts;
  const colocated_client *cclient;
  colocated_sharding *sharding;
  colocated_buffer *buffer;
  colocated_event *event;
  colocated_stream *stream;
  colocated_array *array;
  colocated_bytes *bytes;
  colocated_loaded_executable *exe;
  colocated_loaded_host_callback *cb;
  void *ptr;
  float f4[4];

  INVALID(colocated_client_platform_name(NULL, &s));
  INVALID(colocated_client_platform_version(NULL, &s));
  INVALID(colocated_client_process_index(NULL, &u32));
  INVALID(colocated_client_devices(NULL, &devices, &sz));
  INVALID(colocated_client_addressable_devices(NULL, &devices, &sz));
  INVALID(colocated_client_memory_spaces(NULL, &spaces, &sz));
  INVALID(colocated_client_hosts(NULL, &hosts, &sz));
  INVALID(colocated_client_lookup_device(NULL, 0, &device));
  INVALID(colocated_client_cpu_devices(NULL, NULL, 0, NULL));
  INVALID(colocated_client_create_stream(NULL, &stream));
  INVALID(colocated_client_register_native_function(NULL, NULL));
  INVALID(colocated_client_make_loaded_host_callback(NULL, NULL, &cb));
  INVALID(colocated_client_compile(NULL, NULL, NULL, &exe));
  INVALID(colocated_client_deserialize_and_load(NULL, NULL, 0, NULL, &exe));
  INVALID(colocated_device_id(NULL, &u32));
  INVALID(colocated_device_kind(NULL, &s));
  INVALID(colocated_device_process_index(NULL, &u32));
  INVALID(colocated_device_local_hardware_id(NULL, &u32));
  INVALID(colocated_device_to_string(NULL, &s));
  INVALID(colocated_device_debug_string(NULL, &s));
  INVALID(colocated_device_memory_spaces(NULL, &spaces, &sz));
  INVALID(colocated_device_default_memory_space(NULL, &space));
  INVALID(colocated_device_attributes(NULL, &attrs, &sz));
  INVALID(colocated_memory_space_id(NULL, &u32));
  INVALID(colocated_memory_space_kind(NULL, &kind));
  INVALID(colocated_memory_space_kind_name(NULL, &s));
  INVALID(colocated_memory_space_devices(NULL, &devices, &sz));
  INVALID(colocated_host_index(NULL, &sz));
  INVALID(colocated_host_process_index(NULL, &u32));
  INVALID(colocated_host_name(NULL, &s));
  INVALID(colocated_host_devices(NULL, &devices, &sz));
  INVALID(colocated_host_is_remote(NULL, &flag));
  INVALID(colocated_stream_id(NULL, &u64));
  INVALID(colocated_sharding_create_replicated(NULL, NULL, 0, &sharding));
  INVALID(colocated_sharding_create_named(NULL, &sharding));
  INVALID(colocated_sharding_devices(NULL, &devices, &sz));
  INVALID(colocated_sharding_is_fully_replicated(NULL, &flag));
  INVALID(colocated_sharding_shard_index(NULL, 0, NULL, 0, NULL, NULL));
  INVALID(colocated_array_assemble(NULL, &array));
  INVALID(colocated_array_from_host(NULL, &array));
  INVALID(colocated_array_to_host(NULL, f4, sizeof f4));
  INVALID(colocated_array_delete(NULL));
  INVALID(colocated_array_is_deleted(NULL, &flag));
  INVALID(colocated_array_dtype(NULL, &dtype));
  INVALID(colocated_array_num_buffers(NULL, &sz));
  INVALID(colocated_array_dims(NULL, &dims, &sz));
  INVALID(colocated_array_sharding(NULL, &sharding));
  INVALID(colocated_array_buffer(NULL, 0, &buffer));
  INVALID(colocated_array_ready_event(NULL, &event));
  INVALID(colocated_buffer_from_host(NULL, &buffer, NULL));
  INVALID(colocated_buffer_delete(NULL));
  INVALID(colocated_buffer_is_deleted(NULL, &flag));
  INVALID(colocated_buffer_dtype(NULL, &dtype));
  INVALID(colocated_buffer_device(NULL, &device));
  INVALID(colocated_buffer_memory_space(NULL, &space));
  INVALID(colocated_buffer_dims(NULL, &dims, &sz));
  INVALID(colocated_buffer_on_host_size(NULL, &sz));
  INVALID(colocated_buffer_ready_event(NULL, &event));
  INVALID(colocated_buffer_to_host(NULL, f4, sizeof f4, &event));
  INVALID(colocated_buffer_pin(NULL, &ptr, &sz));
  INVALID(colocated_buffer_unpin(NULL));
  INVALID(colocated_buffer_copy_to_device(NULL, NULL, &buffer));
  INVALID(colocated_buffer_copy_to_memory_space(NULL, NULL, &buffer));
  INVALID(colocated_event_set(NULL, COLOCATED_OK, NULL, 0));
  INVALID(colocated_event_is_ready(NULL, &flag));
  INVALID(colocated_event_await(NULL));
  INVALID(colocated_event_await_timeout(NULL, 0));
  INVALID(colocated_event_error(NULL, NULL));
  INVALID(colocated_bytes_data(NULL, &data, &sz));
  INVALID(colocated_callback_result_set(NULL, NULL, 0));
  INVALID(colocated_loaded_executable_name(NULL, &s));
  INVALID(colocated_loaded_executable_fingerprint(NULL, &s));
  INVALID(colocated_loaded_executable_devices(NULL, &devices, &sz));
  INVALID(colocated_loaded_executable_num_inputs(NULL, &sz));
  INVALID(colocated_loaded_executable_num_outputs(NULL, &sz));
  INVALID(colocated_loaded_executable_serialize(NULL, &bytes));
  INVALID(colocated_loaded_executable_execute(NULL, NULL, 0, NULL, NULL, 0, NULL));
  INVALID(colocated_loaded_executable_execute_sharded(NULL, NULL, 0, NULL, NULL, NULL, 0, NULL));
  INVALID(colocated_loaded_executable_execute_portable(NULL, NULL, 0, NULL, NULL, NULL, 0, NULL));
  INVALID(colocated_execution_context_client(NULL, &cclient));
  INVALID(colocated_execution_context_num_outputs(NULL, &sz));
  INVALID(colocated_execution_context_input_shard_counts(NULL, &counts, &sz));
  INVALID(colocated_execution_context_output_spec(NULL, 0, NULL, NULL, NULL, NULL));
  INVALID(colocated_execution_context_set_output(NULL, 0, NULL));
  INVALID(colocated_execution_context_call_host_callback(NULL, 0, NULL, 0, &bytes));
}

TEST(every_getter_rejects_a_null_out_parameter) {
  struct fixture f;
  fixture_make(&f);
  const colocated_device *const *devices;
  const colocated_memory_space *const *spaces;
  const colocated_host *const *hosts;
  const colocated_device_attribute *attrs;
  const int64_t *dims;
  const uint8_t *data;
  size_t sz;
#define OUT_NULL(expr) CHECK_CODE_MSG((expr), COLOCATED_INVALID_ARGUMENT, "out-parameter")
  OUT_NULL(colocated_client_platform_name(f.client, NULL));
  OUT_NULL(colocated_client_platform_version(f.client, NULL));
  OUT_NULL(colocated_client_process_index(f.client, NULL));
  OUT_NULL(colocated_client_devices(f.client, NULL, &sz));
  OUT_NULL(colocated_client_devices(f.client, &devices, NULL));
  OUT_NULL(colocated_client_addressable_devices(f.client, NULL, &sz));
  OUT_NULL(colocated_client_addressable_devices(f.client, &devices, NULL));
  OUT_NULL(colocated_client_memory_spaces(f.client, NULL, &sz));
  OUT_NULL(colocated_client_memory_spaces(f.client, &spaces, NULL));
  OUT_NULL(colocated_client_hosts(f.client, NULL, &sz));
  OUT_NULL(colocated_client_hosts(f.client, &hosts, NULL));
  OUT_NULL(colocated_client_lookup_device(f.client, 0, NULL));
  OUT_NULL(colocated_device_id(f.device, NULL));
  OUT_NULL(colocated_device_kind(f.device, NULL));
  OUT_NULL(colocated_device_process_index(f.device, NULL));
  OUT_NULL(colocated_device_local_hardware_id(f.device, NULL));
  OUT_NULL(colocated_device_to_string(f.device, NULL));
  OUT_NULL(colocated_device_debug_string(f.device, NULL));
  OUT_NULL(colocated_device_memory_spaces(f.device, NULL, &sz));
  OUT_NULL(colocated_device_memory_spaces(f.device, &spaces, NULL));
  OUT_NULL(colocated_device_default_memory_space(f.device, NULL));
  OUT_NULL(colocated_device_attributes(f.device, NULL, &sz));
  OUT_NULL(colocated_device_attributes(f.device, &attrs, NULL));
  OUT_NULL(colocated_memory_space_id(f.memory, NULL));
  OUT_NULL(colocated_memory_space_kind(f.memory, NULL));
  OUT_NULL(colocated_memory_space_kind_name(f.memory, NULL));
  OUT_NULL(colocated_memory_space_devices(f.memory, NULL, &sz));
  OUT_NULL(colocated_memory_space_devices(f.memory, &devices, NULL));
  OUT_NULL(colocated_host_index(f.host, NULL));
  OUT_NULL(colocated_host_process_index(f.host, NULL));
  OUT_NULL(colocated_host_name(f.host, NULL));
  OUT_NULL(colocated_host_devices(f.host, NULL, &sz));
  OUT_NULL(colocated_host_devices(f.host, &devices, NULL));
  OUT_NULL(colocated_host_is_remote(f.host, NULL));
  OUT_NULL(colocated_stream_id(f.stream, NULL));
  OUT_NULL(colocated_event_is_ready(f.event, NULL));
  OUT_NULL(colocated_sharding_devices(f.sharding, NULL, &sz));
  OUT_NULL(colocated_sharding_devices(f.sharding, &devices, NULL));
  OUT_NULL(colocated_sharding_is_fully_replicated(f.sharding, NULL));
  OUT_NULL(colocated_array_is_deleted(f.array, NULL));
  OUT_NULL(colocated_array_dtype(f.array, NULL));
  OUT_NULL(colocated_array_num_buffers(f.array, NULL));
  OUT_NULL(colocated_array_dims(f.array, NULL, &sz));
  OUT_NULL(colocated_array_dims(f.array, &dims, NULL));
  OUT_NULL(colocated_buffer_is_deleted(f.buffer, NULL));
  OUT_NULL(colocated_buffer_dtype(f.buffer, NULL));
  OUT_NULL(colocated_buffer_device(f.buffer, NULL));
  OUT_NULL(colocated_buffer_memory_space(f.buffer, NULL));
  OUT_NULL(colocated_buffer_dims(f.buffer, NULL, &sz));
  OUT_NULL(colocated_buffer_dims(f.buffer, &dims, NULL));
  OUT_NULL(colocated_buffer_on_host_size(f.buffer, NULL));
  OUT_NULL(colocated_buffer_pin(f.buffer, NULL, &sz));
  OUT_NULL(colocated_bytes_data(f.bytes, NULL, &sz));
  OUT_NULL(colocated_bytes_data(f.bytes, &data, NULL));
  OUT_NULL(colocated_loaded_executable_name(f.exe, NULL));
  OUT_NULL(colocated_loaded_executable_fingerprint(f.exe, NULL));
  OUT_NULL(colocated_loaded_executable_devices(f.exe, NULL, &sz));
  OUT_NULL(colocated_loaded_executable_devices(f.exe, &devices, NULL));
  OUT_NULL(colocated_loaded_executable_num_inputs(f.exe, NULL));
  OUT_NULL(colocated_loaded_executable_num_outputs(f.exe, NULL));
#undef OUT_NULL
  /* constructors that check their out-parameter first */
  colocated_buffer_from_host_args bargs =
      buffer_args(f.client, f.device, COLOCATED_DTYPE_F32, f.dims, 1, f.values, sizeof f.values);
  CHECK_CODE_MSG(colocated_buffer_from_host(&bargs, NULL, NULL), COLOCATED_INVALID_ARGUMENT, "out");
  CHECK_CODE_MSG(colocated_client_create_local(NULL, NULL), COLOCATED_INVALID_ARGUMENT, "out");
  CHECK_CODE_MSG(colocated_sharding_create_replicated(f.client, &f.device, 1, NULL), COLOCATED_INVALID_ARGUMENT, "out");
  const uint8_t *bytes;
  CHECK_OK(colocated_bytes_data(f.bytes, &bytes, &sz));
  CHECK_CODE_MSG(colocated_client_deserialize_and_load(f.client, bytes, sz, NULL, NULL), COLOCATED_INVALID_ARGUMENT,
                 "out");
  const colocated_array_spec *specs[1] = {&f.spec};
  colocated_program program = make_program("native", "add_one", specs, 1, specs, 1, &f.device, 1);
  CHECK_CODE_MSG(colocated_client_compile(f.client, &program, NULL, NULL), COLOCATED_INVALID_ARGUMENT, "out");
  fixture_destroy(&f);
}

TEST(handles_of_another_type_are_invalid_arguments_not_crashes) {
  struct fixture f;
  fixture_make(&f);
  colocated_string_view s;
  uint32_t u32;
  uint64_t u64;
  size_t sz;
  colocated_dtype dtype;
  const colocated_device *const *devices;
  const uint8_t *data;
  bool flag;
  NOT_LIVE(colocated_client_platform_name((const colocated_client *)f.buffer, &s));
  NOT_LIVE(colocated_buffer_dtype((const colocated_buffer *)f.client, &dtype));
  NOT_LIVE(colocated_device_id((const colocated_device *)f.memory, &u32));
  NOT_LIVE(colocated_memory_space_id((const colocated_memory_space *)f.device, &u32));
  NOT_LIVE(colocated_host_index((const colocated_host *)f.device, &sz));
  NOT_LIVE(colocated_stream_id((const colocated_stream *)f.event, &u64));
  NOT_LIVE(colocated_event_await((const colocated_event *)f.stream));
  NOT_LIVE(colocated_sharding_devices((const colocated_sharding *)f.array, &devices, &sz));
  NOT_LIVE(colocated_array_dtype((const colocated_array *)f.sharding, &dtype));
  NOT_LIVE(colocated_bytes_data((const colocated_bytes *)f.buffer, &data, &sz));
  NOT_LIVE(colocated_loaded_executable_name((const colocated_loaded_executable *)f.callback, &s));
  NOT_LIVE(colocated_execution_context_num_outputs((const colocated_execution_context *)f.buffer, &sz));
  NOT_LIVE(colocated_callback_result_set((colocated_callback_result *)f.bytes, (const uint8_t *)"x", 1));
  NOT_LIVE(colocated_buffer_is_deleted((const colocated_buffer *)f.array, &flag));
  /* arbitrary memory is not a handle either */
  uint64_t zeros[4] = {0, 0, 0, 0};
  NOT_LIVE(colocated_client_process_index((const colocated_client *)zeros, &u32));
  /* inside argument lists and structs */
  const colocated_device *wrong[1] = {(const colocated_device *)f.buffer};
  colocated_sharding *sharding = NULL;
  NOT_LIVE(colocated_sharding_create_replicated(f.client, wrong, 1, &sharding));
  const colocated_loaded_host_callback *cbs[1] = {(const colocated_loaded_host_callback *)f.exe};
  colocated_compile_options options = {sizeof options};
  options.host_callbacks = cbs;
  options.num_host_callbacks = 1;
  const colocated_array_spec *specs[1] = {&f.spec};
  colocated_program program = make_program("native", "add_one", specs, 1, specs, 1, &f.device, 1);
  colocated_loaded_executable *exe = NULL;
  NOT_LIVE(colocated_client_compile(f.client, &program, &options, &exe));
  const colocated_array *args[1] = {(const colocated_array *)f.buffer};
  colocated_array *out = NULL;
  NOT_LIVE(colocated_loaded_executable_execute(f.exe, args, 1, NULL, &out, 1, NULL));
  colocated_execute_options eo = {sizeof eo};
  eo.stream = (const colocated_stream *)f.event;
  const colocated_array *good[1] = {f.array};
  NOT_LIVE(colocated_loaded_executable_execute(f.exe, good, 1, &eo, &out, 1, NULL));
  colocated_buffer_from_host_args bargs = {sizeof bargs};
  bargs.client = (const colocated_client *)f.buffer;
  bargs.device = f.device;
  bargs.dtype = COLOCATED_DTYPE_F32;
  colocated_buffer *b = NULL;
  NOT_LIVE(colocated_buffer_from_host(&bargs, &b, NULL));
  CHECK(sharding == NULL && exe == NULL && out == NULL && b == NULL);

  /* destroy functions ignore handles of another type */
  colocated_client_destroy((colocated_client *)f.buffer);
  colocated_buffer_destroy((colocated_buffer *)f.client);
  colocated_array_destroy((colocated_array *)f.sharding);
  colocated_sharding_destroy((colocated_sharding *)f.array);
  colocated_event_destroy((colocated_event *)f.stream);
  colocated_stream_destroy((colocated_stream *)f.event);
  colocated_bytes_destroy((colocated_bytes *)f.exe);
  colocated_loaded_executable_destroy((colocated_loaded_executable *)f.bytes);
  colocated_loaded_host_callback_destroy((colocated_loaded_host_callback *)f.buffer);
  /* ... and every handle still works (AddressSanitizer would see a freed one) */
  CHECK_OK(colocated_client_platform_name(f.client, &s));
  CHECK_OK(colocated_buffer_dtype(f.buffer, &dtype));
  CHECK_OK(colocated_array_dtype(f.array, &dtype));
  CHECK_OK(colocated_sharding_devices(f.sharding, &devices, &sz));
  CHECK_OK(colocated_event_is_ready(f.event, &flag));
  CHECK_OK(colocated_stream_id(f.stream, &u64));
  CHECK_OK(colocated_bytes_data(f.bytes, &data, &sz));
  CHECK_OK(colocated_loaded_executable_name(f.exe, &s));
  fixture_destroy(&f);
}

/* ---- versioned structs ------------------------------------------------------------------- */

/* Calls the function under test with `args` (whose struct_size the caller set),
 * releasing whatever it made. */
typedef colocated_error *(*try_fn)(struct fixture *f, const void *args);

/* A struct image padded with room for a "newer" caller's extra fields. */
typedef struct {
  _Alignas(16) uint8_t bytes[512];
} image;

/* Calls `fn` on a copy of `base` whose struct_size is `size`. */
static colocated_error *try_with_size(struct fixture *f, try_fn fn, size_t size, const image *base) {
  image img = *base;
  memcpy(img.bytes, &size, sizeof size);
  return fn(f, img.bytes);
}

/* Pins the versioning rules for one struct:
 *   sizeof, and a larger struct whose unknown tail is zero, are accepted;
 *   a non-zero byte in that tail is rejected;
 *   `older` (a smaller struct ending on a field boundary that holds every required
 *   field) is accepted, and the bytes past it are ignored (filled with garbage);
 *   `too_small` (missing a required field), 0, and `mid_field` (ending inside a
 *   field; 0 to skip) are rejected. */
static void check_versions(struct fixture *f, try_fn fn, const void *valid, size_t full, size_t older,
                           size_t too_small, size_t mid_field) {
  image zero;
  memset(&zero, 0, sizeof zero);
  memcpy(zero.bytes, valid, full);
  CHECK_OK(try_with_size(f, fn, full, &zero));
  CHECK_OK(try_with_size(f, fn, full + 24, &zero));
  CHECK_OK(try_with_size(f, fn, full + 3, &zero));
  image tail = zero;
  tail.bytes[full + 17] = 1;
  CHECK_CODE_MSG(try_with_size(f, fn, full + 24, &tail), COLOCATED_INVALID_ARGUMENT, "not zero");
  if (older != 0) {
    image garbage = zero;
    memset(garbage.bytes + older, 0xA5, full - older);
    CHECK_OK(try_with_size(f, fn, older, &garbage));
  }
  CHECK_CODE_MSG(try_with_size(f, fn, too_small, &zero), COLOCATED_INVALID_ARGUMENT, "struct_size");
  CHECK_CODE_MSG(try_with_size(f, fn, 0, &zero), COLOCATED_INVALID_ARGUMENT, "struct_size");
  if (mid_field != 0)
    CHECK_CODE_MSG(try_with_size(f, fn, mid_field, &zero), COLOCATED_INVALID_ARGUMENT, "struct_size");
}

static colocated_error *try_client_options(struct fixture *f, const void *args) {
  (void)f;
  colocated_client *c = NULL;
  colocated_error *err = colocated_client_create_local(args, &c);
  colocated_client_destroy(c);
  return err;
}

static colocated_error *try_connect_options(struct fixture *f, const void *args) {
  (void)f;
  colocated_client *c = NULL;
  colocated_error *err = colocated_client_connect(args, &c);
  colocated_client_destroy(c);
  return err;
}

static colocated_error *try_buffer_args(struct fixture *f, const void *args) {
  (void)f;
  colocated_buffer *b = NULL;
  colocated_error *err = colocated_buffer_from_host(args, &b, NULL);
  colocated_buffer_destroy(b);
  return err;
}

static colocated_error *try_named_args(struct fixture *f, const void *args) {
  (void)f;
  colocated_sharding *s = NULL;
  colocated_error *err = colocated_sharding_create_named(args, &s);
  colocated_sharding_destroy(s);
  return err;
}

static colocated_error *try_assemble_args(struct fixture *f, const void *args) {
  (void)f;
  colocated_array *a = NULL;
  colocated_error *err = colocated_array_assemble(args, &a);
  colocated_array_destroy(a);
  return err;
}

/* Every registration needs a new name: the struct's name view points at this
 * buffer, which each call rewrites (same length). */
#define NATIVE_NAME_SIZE 6
static char native_name[NATIVE_NAME_SIZE + 1];
static unsigned native_names;
static colocated_error *try_native_args(struct fixture *f, const void *args) {
  snprintf(native_name, sizeof native_name, "fn%04u", native_names++ % 10000u);
  return colocated_client_register_native_function(f->client, args);
}

static colocated_error *try_callback_args(struct fixture *f, const void *args) {
  colocated_loaded_host_callback *cb = NULL;
  colocated_error *err = colocated_client_make_loaded_host_callback(f->client, args, &cb);
  colocated_loaded_host_callback_destroy(cb);
  return err;
}

static colocated_error *try_spec(struct fixture *f, const void *args) {
  const colocated_array_spec *specs[1] = {args};
  colocated_program program = make_program("native", "add_one", specs, 1, specs, 1, &f->device, 1);
  colocated_loaded_executable *exe = NULL;
  colocated_error *err = colocated_client_compile(f->client, &program, NULL, &exe);
  colocated_loaded_executable_destroy(exe);
  return err;
}

static colocated_error *try_program(struct fixture *f, const void *args) {
  colocated_loaded_executable *exe = NULL;
  colocated_error *err = colocated_client_compile(f->client, args, NULL, &exe);
  colocated_loaded_executable_destroy(exe);
  return err;
}

static colocated_error *try_compile_options(struct fixture *f, const void *args) {
  const colocated_array_spec *specs[1] = {&f->spec};
  colocated_program program = make_program("native", "add_one", specs, 1, specs, 1, &f->device, 1);
  colocated_loaded_executable *exe = NULL;
  colocated_error *err = colocated_client_compile(f->client, &program, args, &exe);
  colocated_loaded_executable_destroy(exe);
  return err;
}

static colocated_error *try_execute_options(struct fixture *f, const void *args) {
  const colocated_array *in[1] = {f->array};
  colocated_array *out = NULL;
  colocated_event *status = NULL;
  colocated_error *err = colocated_loaded_executable_execute(f->exe, in, 1, args, &out, 1, &status);
  if (err == NULL) err = await_and_destroy(status);
  colocated_array_destroy(out);
  return err;
}

#define END(type, field) COLOCATED_STRUCT_SIZE(type, field)

TEST(client_options_follow_the_struct_size_rules) {
  struct fixture f;
  fixture_make(&f);
  colocated_client_options o = {sizeof o};
  o.num_cpu_devices = 1;
  o.executor_threads = 1;
  check_versions(&f, try_client_options, &o, sizeof o, END(colocated_client_options, num_cpu_devices), 4,
                 offsetof(colocated_client_options, num_cpu_devices) + 2);
  fixture_destroy(&f);
}

TEST(connect_options_follow_the_struct_size_rules) {
  struct fixture f;
  fixture_make(&f);
  /* the local host alone, so that a valid struct connects without a worker (an
   * older caller's struct is checked against a worker in test_connect.c) */
  colocated_connect_options o = {sizeof o};
  o.include_local = 1;
  o.num_cpu_devices = 1;
  o.executor_threads = 1;
  check_versions(&f, try_connect_options, &o, sizeof o, 0, END(colocated_connect_options, workers),
                 offsetof(colocated_connect_options, timeout_ms) + 2);
  fixture_destroy(&f);
}

TEST(buffer_from_host_args_follow_the_struct_size_rules) {
  struct fixture f;
  fixture_make(&f);
  colocated_buffer_from_host_args a =
      buffer_args(f.client, f.device, COLOCATED_DTYPE_F32, f.dims, 1, f.values, sizeof f.values);
  check_versions(&f, try_buffer_args, &a, sizeof a, END(colocated_buffer_from_host_args, device),
                 END(colocated_buffer_from_host_args, num_dims),
                 offsetof(colocated_buffer_from_host_args, memory_space) + 4);
  fixture_destroy(&f);
}

TEST(named_sharding_args_follow_the_struct_size_rules) {
  struct fixture f;
  fixture_make(&f);
  const colocated_device *devices[2] = {f.device, f.device1};
  size_t mesh[1] = {2}, counts[1] = {1};
  uint32_t axes[1] = {0};
  colocated_named_sharding_args a = named_args(f.client, devices, 2, mesh, 1, NULL, counts, 1, axes);
  check_versions(&f, try_named_args, &a, sizeof a, 0, END(colocated_named_sharding_args, num_devices),
                 offsetof(colocated_named_sharding_args, partition_axes) + 4);
  fixture_destroy(&f);
}

TEST(array_args_follow_the_struct_size_rules) {
  struct fixture f;
  fixture_make(&f);
  const colocated_buffer *parts[1] = {f.buffer};
  colocated_array_args a = array_args(f.client, COLOCATED_DTYPE_F32, f.dims, 1, f.sharding);
  a.buffers = parts;
  a.num_buffers = 1;
  /* assemble needs no more than `num_buffers`: data / data_size are ignored */
  check_versions(&f, try_assemble_args, &a, sizeof a, END(colocated_array_args, num_buffers),
                 END(colocated_array_args, num_dims), offsetof(colocated_array_args, data) + 4);
  fixture_destroy(&f);
}

TEST(native_function_args_follow_the_struct_size_rules) {
  struct fixture f;
  fixture_make(&f);
  colocated_native_function_args a = {sizeof a};
  a.name = (colocated_string_view){native_name, NATIVE_NAME_SIZE};
  a.function = native_add_one;
  /* garbage past `function` would be user data and a destructor: it must be ignored */
  check_versions(&f, try_native_args, &a, sizeof a, END(colocated_native_function_args, function),
                 END(colocated_native_function_args, name), offsetof(colocated_native_function_args, user_data) + 4);
  fixture_destroy(&f);
}

TEST(host_callback_args_follow_the_struct_size_rules) {
  struct fixture f;
  fixture_make(&f);
  colocated_host_callback_args a = {sizeof a};
  a.function = cb_echo;
  a.name = sv("cb");
  /* garbage past `function` would be a destructor pointer: it must be ignored */
  check_versions(&f, try_callback_args, &a, sizeof a, END(colocated_host_callback_args, function),
                 END(colocated_host_callback_args, struct_size), offsetof(colocated_host_callback_args, name) + 8);
  fixture_destroy(&f);
}

TEST(array_specs_follow_the_struct_size_rules) {
  struct fixture f;
  fixture_make(&f);
  colocated_array_spec s = f.spec;
  check_versions(&f, try_spec, &s, sizeof s, 0, END(colocated_array_spec, num_dims),
                 offsetof(colocated_array_spec, sharding) + 4);
  fixture_destroy(&f);
}

TEST(programs_follow_the_struct_size_rules) {
  struct fixture f;
  fixture_make(&f);
  const colocated_array_spec *specs[1] = {&f.spec};
  colocated_program p = make_program("native", "add_one", specs, 1, specs, 1, &f.device, 1);
  check_versions(&f, try_program, &p, sizeof p, 0, END(colocated_program, devices),
                 offsetof(colocated_program, num_devices) + 4);
  fixture_destroy(&f);
}

TEST(compile_options_follow_the_struct_size_rules) {
  struct fixture f;
  fixture_make(&f);
  const colocated_loaded_host_callback *cbs[1] = {f.callback};
  colocated_compile_options o = {sizeof o};
  o.host_callbacks = cbs;
  o.num_host_callbacks = 1;
  check_versions(&f, try_compile_options, &o, sizeof o, END(colocated_compile_options, struct_size), 4,
                 offsetof(colocated_compile_options, host_callbacks) + 4);
  fixture_destroy(&f);
}

TEST(execute_options_follow_the_struct_size_rules) {
  struct fixture f;
  fixture_make(&f);
  colocated_execute_options o = {sizeof o};
  o.stream = f.stream;
  check_versions(&f, try_execute_options, &o, sizeof o, END(colocated_execute_options, struct_size), 4,
                 offsetof(colocated_execute_options, stream) + 4);
  fixture_destroy(&f);
}

TEST(versioned_structs_passed_as_null_are_defaults_or_errors) {
  struct fixture f;
  fixture_make(&f);
  colocated_buffer *b = NULL;
  colocated_sharding *s = NULL;
  colocated_array *a = NULL;
  colocated_loaded_executable *exe = NULL;
  colocated_loaded_host_callback *cb = NULL;
  CHECK_CODE_MSG(colocated_buffer_from_host(NULL, &b, NULL), COLOCATED_INVALID_ARGUMENT, "is NULL");
  CHECK_CODE_MSG(colocated_sharding_create_named(NULL, &s), COLOCATED_INVALID_ARGUMENT, "is NULL");
  CHECK_CODE_MSG(colocated_array_from_host(NULL, &a), COLOCATED_INVALID_ARGUMENT, "is NULL");
  CHECK_CODE_MSG(colocated_client_register_native_function(f.client, NULL), COLOCATED_INVALID_ARGUMENT, "is NULL");
  CHECK_CODE_MSG(colocated_client_make_loaded_host_callback(f.client, NULL, &cb), COLOCATED_INVALID_ARGUMENT,
                 "is NULL");
  CHECK_CODE_MSG(colocated_client_compile(f.client, NULL, NULL, &exe), COLOCATED_INVALID_ARGUMENT, "is NULL");
  colocated_client *c = NULL;
  CHECK_CODE_MSG(colocated_client_connect(NULL, &c), COLOCATED_INVALID_ARGUMENT, "is NULL");
  CHECK(c == NULL);
  const colocated_array_spec *null_spec[1] = {NULL};
  colocated_program p = make_program("native", "add_one", null_spec, 1, NULL, 0, &f.device, 1);
  CHECK_CODE_MSG(colocated_client_compile(f.client, &p, NULL, &exe), COLOCATED_INVALID_ARGUMENT, "is NULL");
  CHECK(b == NULL && s == NULL && a == NULL && exe == NULL && cb == NULL);
  fixture_destroy(&f);
}

/* ---- bad values ----------------------------------------------------------------------------- */

static colocated_error *from_host(struct fixture *f, uint32_t dtype, const int64_t *dims, size_t num_dims,
                                  const void *data, size_t size) {
  colocated_buffer_from_host_args a = buffer_args(f->client, f->device, dtype, dims, num_dims, data, size);
  colocated_buffer *b = NULL;
  colocated_error *err = colocated_buffer_from_host(&a, &b, NULL);
  colocated_buffer_destroy(b);
  return err;
}

TEST(unknown_dtypes_negative_and_overflowing_dims_and_size_mismatches_are_invalid) {
  struct fixture f;
  fixture_make(&f);
  uint8_t data[64] = {0};
  const int64_t two[1] = {2};
  CHECK_CODE_MSG(from_host(&f, 99, two, 1, data, 8), COLOCATED_INVALID_ARGUMENT, "unknown dtype 99");
  CHECK_CODE_MSG(from_host(&f, COLOCATED_DTYPE_INVALID, two, 1, data, 8), COLOCATED_INVALID_ARGUMENT,
                 "unknown dtype 0");
  CHECK_CODE_MSG(from_host(&f, 15, two, 1, data, 8), COLOCATED_INVALID_ARGUMENT, "unknown dtype 15");
  const int64_t negative[2] = {2, -1};
  CHECK_CODE_MSG(from_host(&f, COLOCATED_DTYPE_F32, negative, 2, data, 8), COLOCATED_INVALID_ARGUMENT, "negative");
  const int64_t huge[2] = {INT64_MAX, 4};
  CHECK_CODE_MSG(from_host(&f, COLOCATED_DTYPE_F32, huge, 2, data, 8), COLOCATED_INVALID_ARGUMENT, "overflow");
  const int64_t bytes_overflow[1] = {(int64_t)1 << 61};
  CHECK_CODE_MSG(from_host(&f, COLOCATED_DTYPE_F64, bytes_overflow, 1, data, 8), COLOCATED_INVALID_ARGUMENT,
                 "overflow");
  const int64_t square[2] = {(int64_t)1 << 40, (int64_t)1 << 40};
  CHECK_CODE_MSG(from_host(&f, COLOCATED_DTYPE_U8, square, 2, data, 8), COLOCATED_INVALID_ARGUMENT, "overflow");
  CHECK_CODE_MSG(from_host(&f, COLOCATED_DTYPE_F32, two, 1, data, 7), COLOCATED_INVALID_ARGUMENT, "bytes");
  CHECK_CODE_MSG(from_host(&f, COLOCATED_DTYPE_F32, two, 1, data, 12), COLOCATED_INVALID_ARGUMENT, "bytes");
  CHECK_CODE_MSG(from_host(&f, COLOCATED_DTYPE_F32, two, 1, NULL, 8), COLOCATED_INVALID_ARGUMENT, "NULL");
  CHECK_CODE_MSG(from_host(&f, COLOCATED_DTYPE_F32, NULL, 1, data, 8), COLOCATED_INVALID_ARGUMENT, "NULL");

  /* the same rules hold for array specs */
  colocated_array_spec spec = make_spec(99, two, 1, f.sharding);
  const colocated_array_spec *specs[1] = {&spec};
  colocated_program p = make_program("native", "add_one", specs, 1, specs, 1, &f.device, 1);
  colocated_loaded_executable *exe = NULL;
  CHECK_CODE_MSG(colocated_client_compile(f.client, &p, NULL, &exe), COLOCATED_INVALID_ARGUMENT, "dtype");
  spec = make_spec(COLOCATED_DTYPE_F32, negative, 2, f.sharding);
  CHECK_CODE_MSG(colocated_client_compile(f.client, &p, NULL, &exe), COLOCATED_INVALID_ARGUMENT, "negative");
  spec = make_spec(COLOCATED_DTYPE_F32, huge, 2, f.sharding);
  CHECK_CODE_MSG(colocated_client_compile(f.client, &p, NULL, &exe), COLOCATED_INVALID_ARGUMENT, "overflow");
  CHECK(exe == NULL);
  fixture_destroy(&f);
}

TEST(objects_of_another_client_are_invalid_arguments) {
  struct fixture f;
  fixture_make(&f);
  colocated_buffer_from_host_args a =
      buffer_args(f.client, f.foreign_device, COLOCATED_DTYPE_F32, f.dims, 1, f.values, sizeof f.values);
  colocated_buffer *b = NULL;
  CHECK_CODE_MSG(colocated_buffer_from_host(&a, &b, NULL), COLOCATED_INVALID_ARGUMENT, "another client");
  a.device = f.device;
  a.memory_space = f.foreign_memory;
  CHECK_CODE_MSG(colocated_buffer_from_host(&a, &b, NULL), COLOCATED_INVALID_ARGUMENT, "another client");
  a.client = f.other; /* a client whose device this is not */
  a.memory_space = NULL;
  CHECK_CODE_MSG(colocated_buffer_from_host(&a, &b, NULL), COLOCATED_INVALID_ARGUMENT, "another client");
  CHECK(b == NULL);

  /* memory space the device cannot address */
  const colocated_memory_space *dev1_memory;
  CHECK_OK(colocated_device_default_memory_space(f.device1, &dev1_memory));
  a.client = f.client;
  a.memory_space = dev1_memory;
  CHECK_CODE_MSG(colocated_buffer_from_host(&a, &b, NULL), COLOCATED_INVALID_ARGUMENT, "cannot address");

  /* a program on devices of another client */
  const colocated_array_spec *specs[1] = {&f.spec};
  colocated_program p = make_program("native", "add_one", specs, 1, specs, 1, &f.foreign_device, 1);
  colocated_loaded_executable *exe = NULL;
  CHECK_CODE_MSG(colocated_client_compile(f.client, &p, NULL, &exe), COLOCATED_INVALID_ARGUMENT, "another client");
  /* an array of another client at execute */
  const colocated_device *od = f.foreign_device;
  colocated_sharding *os = make_replicated(f.other, &od, 1);
  colocated_array *foreign_array =
      make_array(f.other, os, COLOCATED_DTYPE_F32, f.dims, 1, f.values, sizeof f.values);
  const colocated_array *args[1] = {foreign_array};
  colocated_array *out = NULL;
  CHECK_CODE_MSG(colocated_loaded_executable_execute(f.exe, args, 1, NULL, &out, 1, NULL), COLOCATED_INVALID_ARGUMENT,
                 "argument 0");
  /* a stream of another client */
  colocated_stream *foreign_stream;
  CHECK_OK(colocated_client_create_stream(f.other, &foreign_stream));
  colocated_execute_options eo = {sizeof eo};
  eo.stream = foreign_stream;
  const colocated_array *mine[1] = {f.array};
  CHECK_CODE_MSG(colocated_loaded_executable_execute(f.exe, mine, 1, &eo, &out, 1, NULL), COLOCATED_INVALID_ARGUMENT,
                 "another client");
  CHECK(exe == NULL && out == NULL);
  colocated_stream_destroy(foreign_stream);
  colocated_array_destroy(foreign_array);
  colocated_sharding_destroy(os);
  fixture_destroy(&f);
}

TEST(programs_for_a_language_the_hosts_lack_are_unimplemented) {
  struct fixture f;
  fixture_make(&f);
  const colocated_array_spec *specs[1] = {&f.spec};
  colocated_loaded_executable *exe = NULL;
  colocated_program p = make_program("python", "add_one", specs, 1, specs, 1, &f.device, 1);
  CHECK_CODE_MSG(colocated_client_compile(f.client, &p, NULL, &exe), COLOCATED_UNIMPLEMENTED, "python");
  p.language = sv("node");
  CHECK_CODE_MSG(colocated_client_compile(f.client, &p, NULL, &exe), COLOCATED_UNIMPLEMENTED, "node");
  p.language = sv("");
  CHECK_CODE(colocated_client_compile(f.client, &p, NULL, &exe), COLOCATED_UNIMPLEMENTED);
  CHECK(exe == NULL);
  fixture_destroy(&f);
}

TEST(an_unknown_native_function_is_not_found) {
  struct fixture f;
  fixture_make(&f);
  const colocated_array_spec *specs[1] = {&f.spec};
  colocated_loaded_executable *exe = NULL;
  colocated_program p = make_program("native", "no_such_fn", specs, 1, specs, 1, &f.device, 1);
  CHECK_CODE_MSG(colocated_client_compile(f.client, &p, NULL, &exe), COLOCATED_NOT_FOUND, "no_such_fn");
  /* names are exact (no prefix or case folding) */
  p = make_program("native", "ADD_ONE", specs, 1, specs, 1, &f.device, 1);
  CHECK_CODE_MSG(colocated_client_compile(f.client, &p, NULL, &exe), COLOCATED_NOT_FOUND, "ADD_ONE");
  /* a function of another client is not visible */
  colocated_program q = make_program("native", "add_one", NULL, 0, NULL, 0, &f.foreign_device, 1);
  CHECK_CODE_MSG(colocated_client_compile(f.other, &q, NULL, &exe), COLOCATED_NOT_FOUND, "add_one");
  CHECK(exe == NULL);
  fixture_destroy(&f);
}

TEST(malformed_programs_are_invalid_arguments) {
  struct fixture f;
  fixture_make(&f);
  const colocated_array_spec *specs[1] = {&f.spec};
  colocated_loaded_executable *exe = NULL;
  colocated_program p = make_program("native", "add_one", specs, 1, specs, 1, &f.device, 0);
  CHECK_CODE_MSG(colocated_client_compile(f.client, &p, NULL, &exe), COLOCATED_INVALID_ARGUMENT, "device");
  const colocated_device *twice[2] = {f.device, f.device};
  p = make_program("native", "add_one", NULL, 0, NULL, 0, twice, 2);
  CHECK_CODE_MSG(colocated_client_compile(f.client, &p, NULL, &exe), COLOCATED_INVALID_ARGUMENT, "twice");
  /* a spec over other devices than the program's */
  p = make_program("native", "add_one", specs, 1, specs, 1, &f.device1, 1);
  CHECK_CODE_MSG(colocated_client_compile(f.client, &p, NULL, &exe), COLOCATED_INVALID_ARGUMENT, "devices");
  /* a split that does not divide */
  const colocated_device *both[2] = {f.device, f.device1};
  colocated_sharding *split = make_split(f.client, both, 2);
  const int64_t three[1] = {3};
  colocated_array_spec uneven = make_spec(COLOCATED_DTYPE_F32, three, 1, split);
  const colocated_array_spec *uneven_specs[1] = {&uneven};
  p = make_program("native", "add_one", uneven_specs, 1, uneven_specs, 1, both, 2);
  CHECK_CODE_MSG(colocated_client_compile(f.client, &p, NULL, &exe), COLOCATED_INVALID_ARGUMENT, "evenly");
  colocated_sharding_destroy(split);
  /* bad strings and NULL lists */
  p = make_program("native", "add_one", specs, 1, specs, 1, &f.device, 1);
  const uint8_t bad_payload[2] = {0xff, 0xfe};
  p.payload = bad_payload;
  p.payload_size = 2;
  CHECK_CODE_MSG(colocated_client_compile(f.client, &p, NULL, &exe), COLOCATED_INVALID_ARGUMENT, "UTF-8");
  p = make_program("native", "add_one", specs, 1, specs, 1, &f.device, 1);
  p.language = (colocated_string_view){"\xff", 1};
  CHECK_CODE_MSG(colocated_client_compile(f.client, &p, NULL, &exe), COLOCATED_INVALID_ARGUMENT, "UTF-8");
  p = make_program("native", "add_one", specs, 1, specs, 1, &f.device, 1);
  p.name = (colocated_string_view){NULL, 4};
  CHECK_CODE_MSG(colocated_client_compile(f.client, &p, NULL, &exe), COLOCATED_INVALID_ARGUMENT, "NULL");
  p = make_program("native", "add_one", NULL, 1, specs, 1, &f.device, 1);
  CHECK_CODE_MSG(colocated_client_compile(f.client, &p, NULL, &exe), COLOCATED_INVALID_ARGUMENT, "NULL");
  p = make_program("native", "add_one", specs, 1, specs, 1, NULL, 1);
  CHECK_CODE_MSG(colocated_client_compile(f.client, &p, NULL, &exe), COLOCATED_INVALID_ARGUMENT, "NULL");
  const colocated_loaded_host_callback *no_cb[1] = {NULL};
  colocated_compile_options o = {sizeof o};
  o.host_callbacks = no_cb;
  o.num_host_callbacks = 1;
  p = make_program("native", "add_one", specs, 1, specs, 1, &f.device, 1);
  CHECK_CODE_MSG(colocated_client_compile(f.client, &p, &o, &exe), COLOCATED_INVALID_ARGUMENT, "host_callbacks[0]");
  o.host_callbacks = NULL;
  CHECK_CODE_MSG(colocated_client_compile(f.client, &p, &o, &exe), COLOCATED_INVALID_ARGUMENT, "NULL");
  CHECK(exe == NULL);
  fixture_destroy(&f);
}

TEST(wrong_arguments_at_execute_are_invalid_arguments) {
  struct fixture f;
  fixture_make(&f);
  colocated_array *out[2] = {NULL, NULL};
  colocated_event *status = NULL;
  const colocated_array *one[1] = {f.array};
  const colocated_array *two[2] = {f.array, f.array};
  CHECK_CODE_MSG(colocated_loaded_executable_execute(f.exe, NULL, 0, NULL, out, 1, &status),
                 COLOCATED_INVALID_ARGUMENT, "takes 1 arguments, 0 were given");
  CHECK_CODE_MSG(colocated_loaded_executable_execute(f.exe, two, 2, NULL, out, 1, &status),
                 COLOCATED_INVALID_ARGUMENT, "takes 1 arguments, 2 were given");
  CHECK_CODE_MSG(colocated_loaded_executable_execute(f.exe, NULL, 1, NULL, out, 1, &status),
                 COLOCATED_INVALID_ARGUMENT, "NULL");
  const colocated_array *null_arg[1] = {NULL};
  CHECK_CODE_MSG(colocated_loaded_executable_execute(f.exe, null_arg, 1, NULL, out, 1, &status),
                 COLOCATED_INVALID_ARGUMENT, "args[0]");
  CHECK_CODE_MSG(colocated_loaded_executable_execute(f.exe, one, 1, NULL, out, 2, &status),
                 COLOCATED_INVALID_ARGUMENT, "num_outputs");
  CHECK_CODE_MSG(colocated_loaded_executable_execute(f.exe, one, 1, NULL, NULL, 1, &status),
                 COLOCATED_INVALID_ARGUMENT, "outputs");
  /* an argument whose spec differs: other dims, other dtype, other sharding */
  const int64_t three[1] = {3};
  float values[3] = {1, 2, 3};
  colocated_array *wrong_dims = make_array(f.client, f.sharding, COLOCATED_DTYPE_F32, three, 1, values, sizeof values);
  const colocated_array *bad[1] = {wrong_dims};
  CHECK_CODE_MSG(colocated_loaded_executable_execute(f.exe, bad, 1, NULL, out, 1, &status), COLOCATED_INVALID_ARGUMENT,
                 "argument 0 is float32[3]");
  int32_t ints[2] = {1, 2};
  colocated_array *wrong_dtype = make_array(f.client, f.sharding, COLOCATED_DTYPE_I32, f.dims, 1, ints, sizeof ints);
  bad[0] = wrong_dtype;
  CHECK_CODE_MSG(colocated_loaded_executable_execute(f.exe, bad, 1, NULL, out, 1, &status), COLOCATED_INVALID_ARGUMENT,
                 "argument 0 is int32[2]");
  colocated_sharding *elsewhere = make_replicated(f.client, &f.device1, 1);
  colocated_array *wrong_place =
      make_array(f.client, elsewhere, COLOCATED_DTYPE_F32, f.dims, 1, f.values, sizeof f.values);
  bad[0] = wrong_place;
  CHECK_CODE_MSG(colocated_loaded_executable_execute(f.exe, bad, 1, NULL, out, 1, &status), COLOCATED_INVALID_ARGUMENT,
                 "argument 0");
  /* a deleted argument */
  CHECK_OK(colocated_array_delete(wrong_place));
  colocated_array *deleted =
      make_array(f.client, f.sharding, COLOCATED_DTYPE_F32, f.dims, 1, f.values, sizeof f.values);
  CHECK_OK(colocated_array_delete(deleted));
  bad[0] = deleted;
  CHECK_CODE_MSG(colocated_loaded_executable_execute(f.exe, bad, 1, NULL, out, 1, &status),
                 COLOCATED_FAILED_PRECONDITION, "deleted");
  CHECK(out[0] == NULL && status == NULL);
  colocated_array_destroy(deleted);
  colocated_array_destroy(wrong_place);
  colocated_sharding_destroy(elsewhere);
  colocated_array_destroy(wrong_dtype);
  colocated_array_destroy(wrong_dims);
  fixture_destroy(&f);
}

TEST(impossible_counts_and_misaligned_arrays_are_invalid_arguments) {
  struct client_fixture f = client_fixture(2, 2);
  const colocated_device *out[2];
  CHECK_CODE_MSG(colocated_client_cpu_devices(f.client, f.devices, SIZE_MAX / 4, out), COLOCATED_INVALID_ARGUMENT,
                 "impossible count");
  const colocated_device *const *misaligned = (const colocated_device *const *)((const char *)f.devices + 1);
  CHECK_CODE_MSG(colocated_client_cpu_devices(f.client, misaligned, 1, out), COLOCATED_INVALID_ARGUMENT, "not aligned");
  CHECK_OK(colocated_client_cpu_devices(f.client, f.devices, f.num_devices, out));
  client_fixture_destroy(&f);
}
