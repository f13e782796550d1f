/*
 * Buffers: from_host with every dtype (strings, scalars, zero-size dims) and every
 * host-buffer semantics, to_host and on_host_size (the string layout), ready
 * events, delete / is_deleted, pin / unpin, copy_to_device and
 * copy_to_memory_space.
 */
#include "harness.h"
#include "helpers.h"

static const struct {
  uint32_t dtype;
  size_t size;
  const char *name;
} DENSE[] = {
    {COLOCATED_DTYPE_BOOL, 1, "bool"}, {COLOCATED_DTYPE_I8, 1, "i8"},     {COLOCATED_DTYPE_I16, 2, "i16"},
    {COLOCATED_DTYPE_I32, 4, "i32"},   {COLOCATED_DTYPE_I64, 8, "i64"},   {COLOCATED_DTYPE_U8, 1, "u8"},
    {COLOCATED_DTYPE_U16, 2, "u16"},   {COLOCATED_DTYPE_U32, 4, "u32"},   {COLOCATED_DTYPE_U64, 8, "u64"},
    {COLOCATED_DTYPE_F16, 2, "f16"},   {COLOCATED_DTYPE_BF16, 2, "bf16"}, {COLOCATED_DTYPE_F32, 4, "f32"},
    {COLOCATED_DTYPE_F64, 8, "f64"},
};
#define NUM_DENSE (sizeof DENSE / sizeof DENSE[0])

/* Reads a little-endian u64 (the string layout's offsets). */
static uint64_t le64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

/* A client of one device and a float32 buffer on it: the start of the tests of
 * one buffer (f32_on_one_device, then buffer_fixture_destroy). */
struct buffer_fixture {
  colocated_client *client;
  colocated_buffer *buffer;
};

/* The `n` float32 `values` in a buffer on the one device of a new client. */
static struct buffer_fixture f32_on_one_device(const float *values, size_t n) {
  struct buffer_fixture f;
  f.client = make_client(1, 1);
  f.buffer = make_f32(f.client, device_at(f.client, 0), values, n);
  return f;
}

/* Destroys the buffer, then the client. */
static void buffer_fixture_destroy(struct buffer_fixture *f) {
  colocated_buffer_destroy(f->buffer);
  colocated_client_destroy(f->client);
}

/* Another handle of buffer `b` (float32[n] on `device`), taken through an
 * array assembled from it. */
struct second_handle {
  colocated_sharding *sharding;
  colocated_array *array;
  colocated_buffer *other; /* the other handle */
};

static struct second_handle second_handle(const colocated_client *client, const colocated_device *device,
                                          const colocated_buffer *b, int64_t n) {
  struct second_handle h;
  h.sharding = make_replicated(client, &device, 1);
  const int64_t dims[1] = {n};
  const colocated_buffer *parts[1] = {b};
  h.array = assemble_array(client, h.sharding, COLOCATED_DTYPE_F32, dims, 1, parts, 1);
  CHECK_OK(colocated_array_buffer(h.array, 0, &h.other));
  return h;
}

/* Destroys the other handle, the array and the sharding. */
static void second_handle_destroy(struct second_handle *h) {
  colocated_buffer_destroy(h->other);
  colocated_array_destroy(h->array);
  colocated_sharding_destroy(h->sharding);
}

TEST(every_dense_dtype_round_trips_with_its_dims_and_size) {
  colocated_client *client = make_client(2, 2);
  const colocated_device *device = device_at(client, 1);
  const int64_t dims[2] = {2, 3};
  for (size_t t = 0; t < NUM_DENSE; ++t) {
    size_t bytes = 6 * DENSE[t].size;
    uint8_t data[48], back[48];
    for (size_t i = 0; i < bytes; ++i)
      data[i] = DENSE[t].dtype == COLOCATED_DTYPE_BOOL ? (uint8_t)(i % 2) : (uint8_t)(i * 7 + t);
    colocated_buffer *b = make_buffer(client, device, DENSE[t].dtype, dims, 2, data, bytes);
    colocated_dtype dtype = 0;
    CHECK_OK(colocated_buffer_dtype(b, &dtype));
    CHECK_EQ_U64(dtype, DENSE[t].dtype);
    const int64_t *got_dims = NULL;
    size_t num_dims = 0;
    CHECK_OK(colocated_buffer_dims(b, &got_dims, &num_dims));
    CHECK_EQ_U64(num_dims, 2);
    CHECK(got_dims[0] == 2 && got_dims[1] == 3);
    size_t size = 0;
    CHECK_OK(colocated_buffer_on_host_size(b, &size));
    CHECK_EQ_U64(size, bytes);
    memset(back, 0xAA, sizeof back);
    read_buffer(b, back, bytes);
    if (memcmp(back, data, bytes) != 0) FAIL("dtype %s did not round-trip", DENSE[t].name);
    check_buffer_place(b, device, NULL);
    colocated_buffer_destroy(b);
  }
  colocated_client_destroy(client);
}

TEST(scalars_have_no_dims_and_one_element) {
  colocated_client *client = make_client(1, 1);
  double x = 2.5, back = 0;
  colocated_buffer *b = make_buffer(client, device_at(client, 0), COLOCATED_DTYPE_F64, NULL, 0, &x, sizeof x);
  const int64_t *dims = (const int64_t *)1;
  size_t num_dims = 99, size = 0;
  CHECK_OK(colocated_buffer_dims(b, &dims, &num_dims));
  CHECK_EQ_U64(num_dims, 0);
  CHECK_OK(colocated_buffer_on_host_size(b, &size));
  CHECK_EQ_U64(size, sizeof x);
  read_buffer(b, &back, sizeof back);
  CHECK(back == 2.5);
  colocated_buffer_destroy(b);
  colocated_client_destroy(client);
}

TEST(zero_size_dims_make_empty_buffers) {
  colocated_client *client = make_client(1, 1);
  const colocated_device *device = device_at(client, 0);
  const int64_t dims[3] = {4, 0, 3};
  for (size_t t = 0; t < NUM_DENSE; ++t) {
    colocated_buffer *b = make_buffer(client, device, DENSE[t].dtype, dims, 3, NULL, 0);
    size_t size = 99;
    CHECK_OK(colocated_buffer_on_host_size(b, &size));
    CHECK_EQ_U64(size, 0);
    colocated_event *done;
    CHECK_OK(colocated_buffer_to_host(b, NULL, 0, &done));
    CHECK_OK(await_and_destroy(done));
    void *ptr = NULL;
    size_t pinned = 99;
    CHECK_OK(colocated_buffer_pin(b, &ptr, &pinned));
    CHECK_EQ_U64(pinned, 0);
    CHECK_OK(colocated_buffer_unpin(b));
    colocated_buffer_destroy(b);
  }
  /* a zero-size buffer given a non-zero data_size is a mismatch */
  uint8_t one = 1;
  colocated_buffer_from_host_args args = buffer_args(client, device, COLOCATED_DTYPE_U8, dims, 3, &one, 1);
  colocated_buffer *b = NULL;
  CHECK_CODE_MSG(colocated_buffer_from_host(&args, &b, NULL), COLOCATED_INVALID_ARGUMENT, "bytes");
  colocated_client_destroy(client);
}

TEST(string_buffers_use_offsets_then_bytes_on_the_host) {
  colocated_client *client = make_client(2, 2);
  const colocated_device *device = device_at(client, 0);
  colocated_string_view strings[4] = {sv("a"), sv(""), {"h\xc3\xa9llo", 6}, sv("xyz")};
  const int64_t dims[2] = {2, 2};
  colocated_event *done = NULL;
  colocated_buffer *b =
      make_buffer_with(client, device, COLOCATED_DTYPE_STRING, dims, 2, strings, sizeof strings, 0, &done);
  /* strings are always copied: the done event is ready at once */
  CHECK(done != NULL && event_is_ready(done));
  CHECK_OK(await_and_destroy(done));
  colocated_dtype dtype;
  CHECK_OK(colocated_buffer_dtype(b, &dtype));
  CHECK_EQ_U64(dtype, COLOCATED_DTYPE_STRING);
  size_t size = 0;
  CHECK_OK(colocated_buffer_on_host_size(b, &size));
  CHECK_EQ_U64(size, 5 * 8 + 10);
  uint8_t host[50];
  read_buffer(b, host, sizeof host);
  const uint64_t offsets[5] = {0, 1, 1, 7, 10};
  for (int i = 0; i < 5; ++i) CHECK_EQ_U64(le64(host + 8 * i), offsets[i]);
  CHECK(memcmp(host + 40, "ah\xc3\xa9llo" "xyz", 10) == 0);

  /* the strings survive a copy to another device */
  colocated_buffer *copy = NULL;
  CHECK_OK(colocated_buffer_copy_to_device(b, device_at(client, 1), &copy));
  uint8_t again[50];
  CHECK_OK(colocated_buffer_on_host_size(copy, &size));
  CHECK_EQ_U64(size, sizeof again);
  read_buffer(copy, again, sizeof again);
  CHECK(memcmp(again, host, sizeof host) == 0);
  colocated_buffer_destroy(copy);
  colocated_buffer_destroy(b);
  colocated_client_destroy(client);
}

TEST(string_scalars_and_empty_string_buffers) {
  colocated_client *client = make_client(1, 1);
  const colocated_device *device = device_at(client, 0);
  colocated_string_view one = sv("scalar");
  colocated_buffer *b = make_buffer_with(client, device, COLOCATED_DTYPE_STRING, NULL, 0, &one, sizeof one, 0, NULL);
  size_t size = 0;
  CHECK_OK(colocated_buffer_on_host_size(b, &size));
  CHECK_EQ_U64(size, 16 + 6);
  uint8_t host[22];
  read_buffer(b, host, sizeof host);
  CHECK_EQ_U64(le64(host), 0);
  CHECK_EQ_U64(le64(host + 8), 6);
  CHECK(memcmp(host + 16, "scalar", 6) == 0);
  colocated_buffer_destroy(b);

  const int64_t zero[1] = {0};
  b = make_buffer_with(client, device, COLOCATED_DTYPE_STRING, zero, 1, NULL, 0, 0, NULL);
  CHECK_OK(colocated_buffer_on_host_size(b, &size));
  CHECK_EQ_U64(size, 8); /* one offset, no bytes */
  uint8_t offset[8];
  read_buffer(b, offset, sizeof offset);
  CHECK_EQ_U64(le64(offset), 0);
  colocated_buffer_destroy(b);

  /* an empty element may have a NULL pointer */
  colocated_string_view empty = {NULL, 0};
  b = make_buffer_with(client, device, COLOCATED_DTYPE_STRING, NULL, 0, &empty, sizeof empty, 0, NULL);
  CHECK_OK(colocated_buffer_on_host_size(b, &size));
  CHECK_EQ_U64(size, 16);
  colocated_buffer_destroy(b);
  colocated_client_destroy(client);
}

TEST(bad_string_input_is_invalid) {
  colocated_client *client = make_client(1, 1);
  colocated_buffer_from_host_args args = {sizeof args};
  args.client = client;
  args.device = device_at(client, 0);
  args.dtype = COLOCATED_DTYPE_STRING;
  colocated_buffer *b = NULL;

  colocated_string_view bad_utf8[1] = {{"\xff\xfe", 2}};
  args.data = bad_utf8;
  args.data_size = sizeof bad_utf8;
  CHECK_CODE_MSG(colocated_buffer_from_host(&args, &b, NULL), COLOCATED_INVALID_ARGUMENT, "UTF-8");

  colocated_string_view null_with_size[1] = {{NULL, 3}};
  args.data = null_with_size;
  args.data_size = sizeof null_with_size;
  CHECK_CODE_MSG(colocated_buffer_from_host(&args, &b, NULL), COLOCATED_INVALID_ARGUMENT, "NULL");

  colocated_string_view two[2] = {sv("a"), sv("b")};
  args.data = two;
  args.data_size = sizeof two - 1; /* not a whole number of views */
  CHECK_CODE_MSG(colocated_buffer_from_host(&args, &b, NULL), COLOCATED_INVALID_ARGUMENT, "multiple");

  const int64_t three[1] = {3};
  args.data_size = sizeof two; /* 2 strings for 3 elements */
  args.dims = three;
  args.num_dims = 1;
  CHECK_CODE_MSG(colocated_buffer_from_host(&args, &b, NULL), COLOCATED_INVALID_ARGUMENT, "3");

  args.dims = NULL;
  args.num_dims = 0;
  args.data_size = sizeof two[0];
  void *ptr;
  size_t size;
  CHECK_OK(colocated_buffer_from_host(&args, &b, NULL));
  CHECK_CODE_MSG(colocated_buffer_pin(b, &ptr, &size), COLOCATED_INVALID_ARGUMENT, "string");
  CHECK_CODE_MSG(colocated_buffer_unpin(b), COLOCATED_FAILED_PRECONDITION, "no pin");
  /* a destination of the wrong size: now or on the event, but invalid_argument */
  uint8_t small[4];
  colocated_event *done = NULL;
  colocated_error *err = colocated_buffer_to_host(b, small, sizeof small, &done);
  if (err == NULL) err = await_and_destroy(done);
  CHECK_CODE_MSG(err, COLOCATED_INVALID_ARGUMENT, "bytes");
  colocated_buffer_destroy(b);
  colocated_client_destroy(client);
}

/* The header's error list for from_host includes "unknown ... semantics"; it
 * holds for string buffers too, even though strings are always copied. */
TEST(unknown_semantics_are_invalid_for_every_dtype) {
  colocated_client *client = make_client(1, 1);
  float x = 1;
  colocated_buffer_from_host_args args =
      buffer_args(client, device_at(client, 0), COLOCATED_DTYPE_F32, NULL, 0, &x, sizeof x);
  args.semantics = 4;
  colocated_buffer *b = NULL;
  CHECK_CODE_MSG(colocated_buffer_from_host(&args, &b, NULL), COLOCATED_INVALID_ARGUMENT, "semantics");
  colocated_string_view s = sv("s");
  args.dtype = COLOCATED_DTYPE_STRING;
  args.data = &s;
  args.data_size = sizeof s;
  args.semantics = 99;
  colocated_error *err = colocated_buffer_from_host(&args, &b, NULL);
  if (err == NULL) colocated_buffer_destroy(b);
  CHECK_CODE_MSG(err, COLOCATED_INVALID_ARGUMENT, "semantics");
  colocated_client_destroy(client);
}

TEST(a_failed_from_host_returns_neither_buffer_nor_done_event) {
  colocated_client *client = make_client(1, 1);
  float x[2] = {1, 2};
  const int64_t dims[1] = {3}; /* 3 elements, 2 given */
  colocated_buffer_from_host_args args =
      buffer_args(client, device_at(client, 0), COLOCATED_DTYPE_F32, dims, 1, x, sizeof x);
  args.semantics = COLOCATED_HOST_BUFFER_IMMUTABLE_ZERO_COPY;
  colocated_buffer *b = NULL;
  colocated_event *done = NULL;
  CHECK_CODE_MSG(colocated_buffer_from_host(&args, &b, &done), COLOCATED_INVALID_ARGUMENT, "bytes");
  CHECK(b == NULL && done == NULL);
  colocated_client_destroy(client);
}

TEST(copying_semantics_are_done_with_the_host_buffer_at_once) {
  colocated_client *client = make_client(1, 1);
  const colocated_device *device = device_at(client, 0);
  const uint32_t semantics[2] = {COLOCATED_HOST_BUFFER_DEFAULT, COLOCATED_HOST_BUFFER_IMMUTABLE_ONLY_DURING_CALL};
  for (int s = 0; s < 2; ++s) {
    float host[4] = {1, 2, 3, 4}, back[4];
    const int64_t dims[1] = {4};
    colocated_event *done = NULL;
    colocated_buffer *b =
        make_buffer_with(client, device, COLOCATED_DTYPE_F32, dims, 1, host, sizeof host, semantics[s], &done);
    CHECK(done != NULL);
    CHECK(event_is_ready(done));
    CHECK_OK(await_and_destroy(done));
    for (int i = 0; i < 4; ++i) host[i] = -1; /* the caller may reuse its memory */
    read_buffer(b, back, sizeof back);
    CHECK(back[0] == 1 && back[3] == 4);
    colocated_buffer_destroy(b);
  }
  colocated_client_destroy(client);
}

TEST(until_transfer_completes_semantics_release_the_host_buffer_after_the_done_event) {
  colocated_client *client = make_client(1, 1);
  float *host = malloc(4 * sizeof(float));
  for (int i = 0; i < 4; ++i) host[i] = (float)i;
  const int64_t dims[1] = {4};
  colocated_event *done = NULL;
  colocated_buffer *b =
      make_buffer_with(client, device_at(client, 0), COLOCATED_DTYPE_F32, dims, 1, host, 4 * sizeof(float),
                       COLOCATED_HOST_BUFFER_IMMUTABLE_UNTIL_TRANSFER_COMPLETES, &done);
  CHECK(done != NULL);
  CHECK_OK(colocated_event_await_timeout(done, 5ull * 1000 * 1000 * 1000));
  colocated_event_destroy(done);
  free(host); /* allowed now; AddressSanitizer catches any later read */
  float back[4];
  read_buffer(b, back, sizeof back);
  CHECK(back[0] == 0 && back[3] == 3);
  colocated_buffer_destroy(b);
  colocated_client_destroy(client);
}

TEST(zero_copy_done_event_fires_only_after_the_buffer_and_its_copies_are_gone) {
  colocated_client *client = make_client(2, 2);
  const colocated_device *device = device_at(client, 0);
  float *host = malloc(4 * sizeof(float));
  for (int i = 0; i < 4; ++i) host[i] = (float)(i + 10);
  const int64_t dims[1] = {4};
  colocated_event *done = NULL;
  colocated_buffer *b = make_buffer_with(client, device, COLOCATED_DTYPE_F32, dims, 1, host, 4 * sizeof(float),
                                         COLOCATED_HOST_BUFFER_IMMUTABLE_ZERO_COPY, &done);
  CHECK(done != NULL);
  CHECK(!event_is_ready(done));
  float back[4];
  read_buffer(b, back, sizeof back);
  CHECK(back[0] == 10 && back[3] == 13);

  /* a second handle (through an array) is another user */
  colocated_sharding *sharding = make_replicated(client, &device, 1);
  const colocated_buffer *parts[1] = {b};
  colocated_array *array = assemble_array(client, sharding, COLOCATED_DTYPE_F32, dims, 1, parts, 1);

  colocated_buffer *copy = NULL;
  CHECK_OK(colocated_buffer_copy_to_device(b, device_at(client, 1), &copy));
  await_buffer_ready(copy);

  colocated_buffer_destroy(b);
  harness_sleep_ms(20);
  CHECK(!event_is_ready(done)); /* the array still uses the host memory */
  colocated_array_destroy(array);
  CHECK(WAIT_FOR(event_is_ready(done), 5000));
  CHECK_OK(await_and_destroy(done));
  free(host); /* the runtime must not touch it again */

  read_buffer(copy, back, sizeof back); /* the copy owns its data */
  CHECK(back[0] == 10 && back[3] == 13);
  colocated_buffer_destroy(copy);
  colocated_sharding_destroy(sharding);
  colocated_client_destroy(client);
}

TEST(to_host_is_asynchronous_and_waits_for_the_data) {
  colocated_client *client = make_client(2, 2);
  float values[256];
  for (int i = 0; i < 256; ++i) values[i] = (float)i;
  colocated_buffer *src = make_f32(client, device_at(client, 0), values, 256);
  colocated_buffer *copy = NULL;
  CHECK_OK(colocated_buffer_copy_to_device(src, device_at(client, 1), &copy));
  size_t size = 0;
  CHECK_OK(colocated_buffer_on_host_size(copy, &size)); /* known before the data is */
  CHECK_EQ_U64(size, sizeof values);
  float back[256];
  colocated_event *done = NULL;
  CHECK_OK(colocated_buffer_to_host(copy, back, sizeof back, &done));
  CHECK_OK(await_and_destroy(done));
  CHECK(memcmp(back, values, sizeof values) == 0);
  colocated_event *ready;
  CHECK_OK(colocated_buffer_ready_event(copy, &ready));
  CHECK(event_is_ready(ready));
  CHECK_OK(await_and_destroy(ready));
  colocated_buffer_destroy(copy);
  colocated_buffer_destroy(src);
  colocated_client_destroy(client);
}

TEST(to_host_rejects_wrong_sizes_and_null_destinations) {
  float values[3] = {1, 2, 3}, back[4];
  struct buffer_fixture f = f32_on_one_device(values, 3);
  colocated_event *done = NULL;
  CHECK_CODE_MSG(colocated_buffer_to_host(f.buffer, back, sizeof back, &done), COLOCATED_INVALID_ARGUMENT, "bytes");
  CHECK_CODE_MSG(colocated_buffer_to_host(f.buffer, back, 2 * sizeof(float), &done), COLOCATED_INVALID_ARGUMENT,
                 "bytes");
  CHECK_CODE_MSG(colocated_buffer_to_host(f.buffer, NULL, 3 * sizeof(float), &done), COLOCATED_INVALID_ARGUMENT,
                 "NULL");
  CHECK_CODE_MSG(colocated_buffer_to_host(f.buffer, back, 3 * sizeof(float), NULL), COLOCATED_INVALID_ARGUMENT, "out");
  CHECK(done == NULL);
  buffer_fixture_destroy(&f);
}

TEST(from_host_copies_during_the_call_by_default) {
  float values[2] = {5, 6}, back[2];
  struct buffer_fixture f = f32_on_one_device(values, 2);
  values[0] = 0;
  read_buffer(f.buffer, back, sizeof back);
  CHECK(back[0] == 5 && back[1] == 6);
  buffer_fixture_destroy(&f);
}

TEST(deleted_buffers_fail_every_data_use_with_failed_precondition) {
  colocated_client *client = make_client(2, 2);
  float values[2] = {1, 2}, back[2];
  const colocated_device *device = device_at(client, 0);
  colocated_buffer *b = make_f32(client, device, values, 2);
  bool deleted = true;
  CHECK_OK(colocated_buffer_is_deleted(b, &deleted));
  CHECK(!deleted);
  CHECK_OK(colocated_buffer_delete(b));
  CHECK_OK(colocated_buffer_is_deleted(b, &deleted));
  CHECK(deleted);
  CHECK_OK(colocated_buffer_delete(b)); /* deleting twice is allowed */

  size_t size;
  colocated_event *ev = NULL;
  void *ptr;
  colocated_buffer *out = NULL;
  CHECK_CODE_MSG(colocated_buffer_on_host_size(b, &size), COLOCATED_FAILED_PRECONDITION, "deleted");
  CHECK_CODE_MSG(colocated_buffer_to_host(b, back, sizeof back, &ev), COLOCATED_FAILED_PRECONDITION, "deleted");
  CHECK_CODE_MSG(colocated_buffer_pin(b, &ptr, &size), COLOCATED_FAILED_PRECONDITION, "deleted");
  CHECK_CODE_MSG(colocated_buffer_copy_to_device(b, device_at(client, 1), &out), COLOCATED_FAILED_PRECONDITION,
                 "deleted");
  CHECK_CODE_MSG(colocated_buffer_copy_to_memory_space(b, memory_of_kind(device, COLOCATED_MEMORY_PINNED_HOST), &out),
                 COLOCATED_FAILED_PRECONDITION, "deleted");
  CHECK(ev == NULL && out == NULL);

  /* metadata stays readable */
  colocated_dtype dtype;
  const int64_t *dims;
  size_t num_dims;
  const colocated_device *on;
  const colocated_memory_space *memory;
  CHECK_OK(colocated_buffer_dtype(b, &dtype));
  CHECK_OK(colocated_buffer_dims(b, &dims, &num_dims));
  CHECK_OK(colocated_buffer_device(b, &on));
  CHECK_OK(colocated_buffer_memory_space(b, &memory));
  CHECK(dtype == COLOCATED_DTYPE_F32 && num_dims == 1 && dims[0] == 2 && on == device);
  colocated_buffer_destroy(b);
  colocated_client_destroy(client);
}

TEST(delete_is_seen_by_every_handle_and_array_sharing_the_buffer) {
  colocated_client *client = make_client(1, 1);
  const colocated_device *device = device_at(client, 0);
  float values[2] = {1, 2};
  colocated_buffer *b = make_f32(client, device, values, 2);
  struct second_handle h = second_handle(client, device, b, 2);
  CHECK_OK(colocated_buffer_delete(b));
  bool deleted = false;
  CHECK_OK(colocated_buffer_is_deleted(h.other, &deleted));
  CHECK(deleted);
  CHECK_OK(colocated_array_is_deleted(h.array, &deleted));
  CHECK(deleted);
  size_t size;
  CHECK_CODE_MSG(colocated_buffer_on_host_size(h.other, &size), COLOCATED_FAILED_PRECONDITION, "deleted");
  second_handle_destroy(&h);
  colocated_buffer_destroy(b);
  colocated_client_destroy(client);
}

TEST(pin_gives_the_data_and_unpin_pairs_with_it) {
  float values[3] = {7, 8, 9};
  struct buffer_fixture f = f32_on_one_device(values, 3);
  void *p1 = NULL, *p2 = NULL;
  size_t s1 = 0, s2 = 0;
  CHECK_OK(colocated_buffer_pin(f.buffer, &p1, &s1));
  CHECK(p1 != NULL);
  CHECK_EQ_U64(s1, sizeof values);
  CHECK(memcmp(p1, values, sizeof values) == 0);
  CHECK_OK(colocated_buffer_pin(f.buffer, &p2, &s2)); /* pins nest */
  CHECK(p2 == p1 && s2 == s1);
  CHECK_OK(colocated_buffer_unpin(f.buffer));
  CHECK_OK(colocated_buffer_unpin(f.buffer));
  CHECK_CODE_MSG(colocated_buffer_unpin(f.buffer), COLOCATED_FAILED_PRECONDITION, "no pin");
  buffer_fixture_destroy(&f);
}

TEST(unpin_without_pin_is_a_failed_precondition) {
  float v = 1;
  struct buffer_fixture f = f32_on_one_device(&v, 1);
  CHECK_CODE_MSG(colocated_buffer_unpin(f.buffer), COLOCATED_FAILED_PRECONDITION, "no pin");
  /* a pin on another handle of the same buffer does not count for this one */
  struct second_handle h = second_handle(f.client, device_at(f.client, 0), f.buffer, 1);
  void *ptr;
  size_t size;
  CHECK_OK(colocated_buffer_pin(h.other, &ptr, &size));
  CHECK_CODE_MSG(colocated_buffer_unpin(f.buffer), COLOCATED_FAILED_PRECONDITION, "no pin");
  CHECK_OK(colocated_buffer_unpin(h.other));
  second_handle_destroy(&h);
  buffer_fixture_destroy(&f);
}

TEST(a_pinned_pointer_stays_valid_across_delete_until_unpin) {
  float values[64];
  for (int i = 0; i < 64; ++i) values[i] = (float)i;
  struct buffer_fixture f = f32_on_one_device(values, 64);
  void *ptr;
  size_t size;
  CHECK_OK(colocated_buffer_pin(f.buffer, &ptr, &size));
  CHECK_OK(colocated_buffer_delete(f.buffer));
  /* AddressSanitizer reports this read if delete freed the pinned data */
  CHECK(memcmp(ptr, values, sizeof values) == 0);
  ((float *)ptr)[0] = 42; /* writing through a pin is the caller's business */
  CHECK_OK(colocated_buffer_unpin(f.buffer));
  buffer_fixture_destroy(&f);
}

TEST(destroying_a_handle_releases_its_pins) {
  colocated_client *client = make_client(1, 1);
  float values[4] = {1, 2, 3, 4};
  colocated_buffer *b = make_f32(client, device_at(client, 0), values, 4);
  void *ptr;
  size_t size;
  CHECK_OK(colocated_buffer_pin(b, &ptr, &size));
  CHECK_OK(colocated_buffer_pin(b, &ptr, &size));
  colocated_buffer_destroy(b); /* LeakSanitizer reports the data if the pins leak */
  colocated_client_destroy(client);
}

TEST(pin_waits_for_a_pending_buffer) {
  colocated_client *client = make_client(2, 2);
  float values[1024];
  for (int i = 0; i < 1024; ++i) values[i] = (float)i;
  colocated_buffer *src = make_f32(client, device_at(client, 0), values, 1024);
  colocated_buffer *copy;
  CHECK_OK(colocated_buffer_copy_to_device(src, device_at(client, 1), &copy));
  void *ptr;
  size_t size;
  CHECK_OK(colocated_buffer_pin(copy, &ptr, &size));
  CHECK_EQ_U64(size, sizeof values);
  CHECK(memcmp(ptr, values, sizeof values) == 0);
  CHECK(ptr != (void *)values);
  CHECK_OK(colocated_buffer_unpin(copy));
  colocated_buffer_destroy(copy);
  colocated_buffer_destroy(src);
  colocated_client_destroy(client);
}

TEST(pin_with_a_null_data_out_is_invalid_and_takes_no_pin) {
  float v = 1;
  struct buffer_fixture f = f32_on_one_device(&v, 1);
  size_t size;
  CHECK_CODE_MSG(colocated_buffer_pin(f.buffer, NULL, &size), COLOCATED_INVALID_ARGUMENT, "data");
  CHECK_CODE_MSG(colocated_buffer_unpin(f.buffer), COLOCATED_FAILED_PRECONDITION, "no pin");
  buffer_fixture_destroy(&f);
}

TEST(copy_to_device_lands_on_the_device_default_memory) {
  struct client_fixture f = client_fixture(3, 2);
  int32_t values[5] = {1, -2, 3, -4, 5}, back[5];
  const int64_t dims[1] = {5};
  colocated_buffer *src = make_buffer(f.client, f.devices[0], COLOCATED_DTYPE_I32, dims, 1, values, sizeof values);
  for (size_t d = 0; d < f.num_devices; ++d) {
    colocated_buffer *copy = NULL;
    CHECK_OK(colocated_buffer_copy_to_device(src, f.devices[d], &copy));
    check_buffer_place(copy, f.devices[d], NULL);
    colocated_dtype dtype;
    CHECK_OK(colocated_buffer_dtype(copy, &dtype));
    CHECK_EQ_U64(dtype, COLOCATED_DTYPE_I32);
    read_buffer(copy, back, sizeof back);
    CHECK(memcmp(back, values, sizeof values) == 0);
    colocated_buffer_destroy(copy);
  }
  colocated_buffer_destroy(src);
  client_fixture_destroy(&f);
}

TEST(a_chain_of_copies_runs_in_program_order) {
  struct client_fixture f = client_fixture(2, 2);
  float values[4] = {1, 2, 3, 4};
  colocated_buffer *current = make_f32(f.client, f.devices[0], values, 4);
  for (int i = 0; i < 50; ++i) {
    colocated_buffer *next;
    CHECK_OK(colocated_buffer_copy_to_device(current, f.devices[(i + 1) % 2], &next));
    colocated_buffer_destroy(current); /* in-flight copies keep their source alive */
    current = next;
  }
  float back[4];
  read_buffer(current, back, sizeof back);
  CHECK(memcmp(back, values, sizeof values) == 0);
  colocated_buffer_destroy(current);
  client_fixture_destroy(&f);
}

TEST(copy_to_memory_space_keeps_the_device_when_it_can_address_the_space) {
  struct client_fixture f = client_fixture(2, 2);
  float values[2] = {3, 4}, back[2];
  colocated_buffer *src = make_f32(f.client, f.devices[1], values, 2);
  const colocated_memory_kind kinds[2] = {COLOCATED_MEMORY_PINNED_HOST, COLOCATED_MEMORY_UNPINNED_HOST};
  for (int k = 0; k < 2; ++k) {
    const colocated_memory_space *target = memory_of_kind(f.devices[1], kinds[k]);
    colocated_buffer *copy;
    CHECK_OK(colocated_buffer_copy_to_memory_space(src, target, &copy));
    check_buffer_place(copy, f.devices[1], target);
    read_buffer(copy, back, sizeof back);
    CHECK(back[0] == 3 && back[1] == 4);
    colocated_buffer_destroy(copy);
  }
  /* another device's own memory moves the buffer to that device */
  const colocated_memory_space *dev0_memory;
  CHECK_OK(colocated_device_default_memory_space(f.devices[0], &dev0_memory));
  colocated_buffer *moved;
  CHECK_OK(colocated_buffer_copy_to_memory_space(src, dev0_memory, &moved));
  check_buffer_device(moved, f.devices[0]);
  read_buffer(moved, back, sizeof back);
  CHECK(back[0] == 3 && back[1] == 4);
  colocated_buffer_destroy(moved);
  colocated_buffer_destroy(src);
  client_fixture_destroy(&f);
}

TEST(copies_reject_devices_and_memory_spaces_of_another_client) {
  colocated_client *a = make_client(1, 1);
  colocated_client *b = make_client(1, 1);
  float v = 1;
  colocated_buffer *src = make_f32(a, device_at(a, 0), &v, 1);
  colocated_buffer *out = NULL;
  CHECK_CODE_MSG(colocated_buffer_copy_to_device(src, device_at(b, 0), &out), COLOCATED_INVALID_ARGUMENT,
                 "another client");
  const colocated_memory_space *foreign;
  CHECK_OK(colocated_device_default_memory_space(device_at(b, 0), &foreign));
  CHECK_CODE_MSG(colocated_buffer_copy_to_memory_space(src, foreign, &out), COLOCATED_INVALID_ARGUMENT,
                 "another client");
  CHECK_CODE_MSG(colocated_buffer_copy_to_device(src, NULL, &out), COLOCATED_INVALID_ARGUMENT, "NULL");
  CHECK_CODE_MSG(colocated_buffer_copy_to_memory_space(src, NULL, &out), COLOCATED_INVALID_ARGUMENT, "NULL");
  CHECK_CODE_MSG(colocated_buffer_copy_to_device(src, device_at(a, 0), NULL), COLOCATED_INVALID_ARGUMENT, "out");
  CHECK_CODE_MSG(colocated_buffer_copy_to_memory_space(src, foreign, NULL), COLOCATED_INVALID_ARGUMENT, "out");
  CHECK(out == NULL);
  colocated_buffer_destroy(src);
  colocated_client_destroy(a);
  colocated_client_destroy(b);
}

TEST(from_host_places_the_buffer_in_the_requested_memory_space) {
  colocated_client *client = make_client(2, 2);
  const colocated_device *d0 = device_at(client, 0), *d1 = device_at(client, 1);
  const colocated_memory_space *pinned = memory_of_kind(d0, COLOCATED_MEMORY_PINNED_HOST);
  float values[2] = {1, 2}, back[2];
  const int64_t dims[1] = {2};
  colocated_buffer_from_host_args args = buffer_args(client, d0, COLOCATED_DTYPE_F32, dims, 1, values, sizeof values);
  args.memory_space = pinned;
  colocated_buffer *b = NULL;
  CHECK_OK(colocated_buffer_from_host(&args, &b, NULL));
  check_buffer_place(b, d0, pinned);
  read_buffer(b, back, sizeof back);
  CHECK(back[1] == 2);
  colocated_buffer_destroy(b);

  /* device 1's own memory cannot be addressed by device 0 */
  CHECK_OK(colocated_device_default_memory_space(d1, &args.memory_space));
  b = NULL;
  CHECK_CODE_MSG(colocated_buffer_from_host(&args, &b, NULL), COLOCATED_INVALID_ARGUMENT, "cannot address");
  CHECK(b == NULL);
  colocated_client_destroy(client);
}

TEST(ready_event_of_a_host_buffer_is_ready) {
  colocated_client *client = make_client(1, 1);
  float v = 1;
  colocated_buffer *b = make_f32(client, device_at(client, 0), &v, 1);
  colocated_event *ready = NULL;
  CHECK_OK(colocated_buffer_ready_event(b, &ready));
  CHECK(event_is_ready(ready));
  colocated_error *outcome = (colocated_error *)1;
  CHECK_OK(colocated_event_error(ready, &outcome));
  CHECK(outcome == NULL);
  colocated_buffer_destroy(b);
  CHECK_OK(await_and_destroy(ready)); /* the event outlives the buffer */
  colocated_client_destroy(client);
}

TEST(buffer_ready_event_with_null_out_is_invalid_and_leaks_nothing) {
  float v = 1;
  struct buffer_fixture f = f32_on_one_device(&v, 1);
  CHECK_CODE_MSG(colocated_buffer_ready_event(f.buffer, NULL), COLOCATED_INVALID_ARGUMENT, "out");
  buffer_fixture_destroy(&f);
}

TEST(buffer_destroy_accepts_null) {
  colocated_buffer_destroy(NULL);
}
