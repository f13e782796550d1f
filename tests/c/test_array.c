/*
 * Shardings (replicated and named, shard_index, memory kinds) and sharded arrays (from_host,
 * assemble, to_host, buffer, sharding, dims, dtype, num_buffers, ready_event,
 * delete / is_deleted).
 */
#include "harness.h"
#include "helpers.h"

static colocated_sharding *make_named(const colocated_client *client, const colocated_device *const *devices,
                                      size_t num_devices, const size_t *mesh_shape, size_t num_axes,
                                      const colocated_string_view *names, const size_t *counts, size_t num_dims,
                                      const uint32_t *axes, colocated_error **err) {
  colocated_named_sharding_args args =
      named_args(client, devices, num_devices, mesh_shape, num_axes, names, counts, num_dims, axes);
  colocated_sharding *sharding = NULL;
  *err = colocated_sharding_create_named(&args, &sharding);
  return sharding;
}

TEST(replicated_sharding_gives_every_device_the_whole_array) {
  struct client_fixture f = client_fixture(3, 2);
  const colocated_device *order[3] = {f.devices[2], f.devices[0], f.devices[1]};
  f.sharding = make_replicated(f.client, order, 3);
  const colocated_device *const *got;
  size_t count;
  CHECK_OK(colocated_sharding_devices(f.sharding, &got, &count));
  CHECK_EQ_U64(count, 3);
  for (int i = 0; i < 3; ++i) CHECK(got[i] == order[i]);
  bool replicated = false;
  CHECK_OK(colocated_sharding_is_fully_replicated(f.sharding, &replicated));
  CHECK(replicated);
  const int64_t dims[2] = {4, 5};
  for (size_t i = 0; i < 3; ++i) {
    int64_t starts[2] = {-1, -1}, limits[2] = {-1, -1};
    CHECK_OK(colocated_sharding_shard_index(f.sharding, i, dims, 2, starts, limits));
    CHECK(starts[0] == 0 && starts[1] == 0 && limits[0] == 4 && limits[1] == 5);
  }
  client_fixture_destroy(&f);
}

TEST(a_sharding_says_the_memory_its_arrays_go_to) {
  struct client_fixture f = client_fixture(2, 2);
  f.sharding = make_split(f.client, f.devices, 2);
  colocated_memory_kind kind = 0;
  CHECK_OK(colocated_sharding_memory_kind(f.sharding, &kind));
  CHECK(kind == COLOCATED_MEMORY_DEVICE);
  colocated_sharding *pinned = NULL;
  CHECK_OK(colocated_sharding_with_memory_kind(f.sharding, COLOCATED_MEMORY_PINNED_HOST, &pinned));
  CHECK_OK(colocated_sharding_memory_kind(pinned, &kind));
  CHECK(kind == COLOCATED_MEMORY_PINNED_HOST);
  /* An array made with it is in that memory, and says so. */
  const float values[4] = {1, 2, 3, 4};
  int64_t n = 4;
  colocated_array *array = make_array(f.client, pinned, COLOCATED_DTYPE_F32, &n, 1, values, sizeof values);
  colocated_buffer *buffer = NULL;
  CHECK_OK(colocated_array_buffer(array, 1, &buffer));
  const colocated_memory_space *memory = NULL;
  CHECK_OK(colocated_buffer_memory_space(buffer, &memory));
  CHECK_OK(colocated_memory_space_kind(memory, &kind));
  CHECK(kind == COLOCATED_MEMORY_PINNED_HOST);
  colocated_sharding *of_array = NULL;
  CHECK_OK(colocated_array_sharding(array, &of_array));
  CHECK_OK(colocated_sharding_memory_kind(of_array, &kind));
  CHECK(kind == COLOCATED_MEMORY_PINNED_HOST);
  /* 0 is each device's default memory; no kind has value 7. */
  colocated_sharding *plain = NULL;
  CHECK_OK(colocated_sharding_with_memory_kind(pinned, 0, &plain));
  CHECK_OK(colocated_sharding_memory_kind(plain, &kind));
  CHECK(kind == COLOCATED_MEMORY_DEVICE);
  colocated_sharding *bad = NULL;
  CHECK_CODE_MSG(colocated_sharding_with_memory_kind(f.sharding, 7, &bad), COLOCATED_INVALID_ARGUMENT,
                 "memory kind 7");
  CHECK(bad == NULL);
  colocated_sharding_destroy(plain);
  colocated_sharding_destroy(of_array);
  colocated_buffer_destroy(buffer);
  colocated_array_destroy(array);
  colocated_sharding_destroy(pinned);
  client_fixture_destroy(&f);
}

TEST(named_sharding_splits_a_dimension_over_a_mesh_axis) {
  struct client_fixture f = client_fixture(4, 2);
  f.sharding = make_split(f.client, f.devices, 4);
  bool replicated = true;
  CHECK_OK(colocated_sharding_is_fully_replicated(f.sharding, &replicated));
  CHECK(!replicated);
  const int64_t dims[2] = {8, 3};
  for (size_t i = 0; i < 4; ++i) {
    int64_t starts[2], limits[2];
    CHECK_OK(colocated_sharding_shard_index(f.sharding, i, dims, 2, starts, limits));
    CHECK_EQ_I64(starts[0], 2 * (int64_t)i);
    CHECK_EQ_I64(limits[0], 2 * (int64_t)i + 2);
    CHECK(starts[1] == 0 && limits[1] == 3); /* dimensions beyond the spec are not split */
  }
  /* either output may be NULL */
  int64_t only[2];
  CHECK_OK(colocated_sharding_shard_index(f.sharding, 3, dims, 2, NULL, only));
  CHECK(only[0] == 8);
  CHECK_OK(colocated_sharding_shard_index(f.sharding, 3, dims, 2, only, NULL));
  CHECK(only[0] == 6);
  CHECK_OK(colocated_sharding_shard_index(f.sharding, 3, dims, 2, NULL, NULL));
  client_fixture_destroy(&f);
}

TEST(named_sharding_over_a_2d_mesh_splits_rows_and_columns) {
  struct client_fixture f = client_fixture(4, 2);
  const size_t mesh[2] = {2, 2};
  const colocated_string_view names[2] = {sv("x"), sv("y")};
  const size_t counts[2] = {1, 1};
  const uint32_t axes[2] = {0, 1};
  colocated_error *err;
  f.sharding = make_named(f.client, f.devices, 4, mesh, 2, names, counts, 2, axes, &err);
  CHECK_OK(err);
  const int64_t dims[2] = {4, 6};
  for (size_t k = 0; k < 4; ++k) {
    int64_t starts[2], limits[2];
    CHECK_OK(colocated_sharding_shard_index(f.sharding, k, dims, 2, starts, limits));
    int64_t r = (int64_t)k / 2, c = (int64_t)k % 2; /* devices are row-major over the mesh */
    CHECK(starts[0] == 2 * r && limits[0] == 2 * r + 2);
    CHECK(starts[1] == 3 * c && limits[1] == 3 * c + 3);
  }
  colocated_sharding_destroy(f.sharding);

  /* one dimension over both axes, major axis first: 4 row blocks */
  const size_t both[1] = {2};
  const uint32_t yx[2] = {1, 0}; /* y major */
  f.sharding = make_named(f.client, f.devices, 4, mesh, 2, NULL, both, 1, yx, &err); /* NULL names: axis0, axis1 */
  CHECK_OK(err);
  for (size_t k = 0; k < 4; ++k) {
    int64_t start, limit;
    CHECK_OK(colocated_sharding_shard_index(f.sharding, k, dims, 2, &start, &limit));
    int64_t x = (int64_t)k / 2, y = (int64_t)k % 2;
    int64_t block = y * 2 + x;
    CHECK(start == block && limit == block + 1);
  }
  colocated_sharding_destroy(f.sharding);

  /* a partition over a size-1 axis only is fully replicated */
  const size_t mesh41[2] = {4, 1};
  const uint32_t axis1[1] = {1};
  const size_t one[1] = {1};
  f.sharding = make_named(f.client, f.devices, 4, mesh41, 2, NULL, one, 1, axis1, &err);
  CHECK_OK(err);
  bool replicated = false;
  CHECK_OK(colocated_sharding_is_fully_replicated(f.sharding, &replicated));
  CHECK(replicated);
  client_fixture_destroy(&f);
}

TEST(shard_index_rejects_out_of_range_devices_uneven_splits_and_negative_dims) {
  struct client_fixture f = client_fixture(4, 2);
  f.sharding = make_split(f.client, f.devices, 4);
  int64_t starts[1], limits[1];
  const int64_t dims[1] = {8};
  CHECK_CODE_MSG(colocated_sharding_shard_index(f.sharding, 4, dims, 1, starts, limits), COLOCATED_INVALID_ARGUMENT,
                 "out of range");
  const int64_t uneven[1] = {7};
  CHECK_CODE_MSG(colocated_sharding_shard_index(f.sharding, 0, uneven, 1, starts, limits), COLOCATED_INVALID_ARGUMENT,
                 "evenly");
  CHECK_CODE_MSG(colocated_sharding_shard_index(f.sharding, 0, NULL, 0, starts, limits), COLOCATED_INVALID_ARGUMENT,
                 "rank");
  CHECK_CODE_MSG(colocated_sharding_shard_index(f.sharding, 0, NULL, 1, starts, limits), COLOCATED_INVALID_ARGUMENT,
                 "NULL");
  const int64_t negative[1] = {-8};
  colocated_error *err = colocated_sharding_shard_index(f.sharding, 1, negative, 1, starts, limits);
  if (err == NULL) fprintf(stderr, "shard_index of dims [-8]: [%lld, %lld)\n", (long long)starts[0], (long long)limits[0]);
  CHECK_CODE_MSG(err, COLOCATED_INVALID_ARGUMENT, "negative");
  client_fixture_destroy(&f);
}

TEST(bad_shardings_are_invalid_arguments) {
  struct client_fixture f = client_fixture(4, 2);
  colocated_client *other = make_client(2, 2);
  colocated_sharding *s = NULL;
  CHECK_CODE_MSG(colocated_sharding_create_replicated(f.client, f.devices, 0, &s), COLOCATED_INVALID_ARGUMENT,
                 "at least one device");
  const colocated_device *twice[2] = {f.devices[1], f.devices[1]};
  CHECK_CODE_MSG(colocated_sharding_create_replicated(f.client, twice, 2, &s), COLOCATED_INVALID_ARGUMENT, "twice");
  const colocated_device *mixed[2] = {f.devices[0], device_at(other, 1)};
  CHECK_CODE_MSG(colocated_sharding_create_replicated(f.client, mixed, 2, &s), COLOCATED_INVALID_ARGUMENT,
                 "another client");
  const colocated_device *foreign[1] = {device_at(other, 0)};
  CHECK_CODE_MSG(colocated_sharding_create_replicated(f.client, foreign, 1, &s), COLOCATED_INVALID_ARGUMENT,
                 "another client");
  CHECK_CODE_MSG(colocated_sharding_create_replicated(f.client, NULL, 2, &s), COLOCATED_INVALID_ARGUMENT, "NULL");
  CHECK_CODE_MSG(colocated_sharding_create_replicated(f.client, f.devices, 2, NULL), COLOCATED_INVALID_ARGUMENT, "out");

  colocated_error *err;
  const size_t mesh3[1] = {3}, mesh4[1] = {4}, mesh22[2] = {2, 2};
  const size_t one[1] = {1}, two[1] = {2}, ones[2] = {1, 1};
  const uint32_t axis0[1] = {0}, axis1[1] = {1}, axes00[2] = {0, 0};
  const colocated_string_view xx[2] = {sv("x"), sv("x")};
  s = make_named(f.client, f.devices, 4, mesh3, 1, NULL, one, 1, axis0, &err);
  CHECK_CODE_MSG(err, COLOCATED_INVALID_ARGUMENT, "mesh shape");
  s = make_named(f.client, f.devices, 4, mesh22, 2, xx, one, 1, axis0, &err);
  CHECK_CODE_MSG(err, COLOCATED_INVALID_ARGUMENT, "repeated");
  s = make_named(f.client, f.devices, 4, mesh4, 1, NULL, one, 1, axis1, &err);
  CHECK_CODE_MSG(err, COLOCATED_INVALID_ARGUMENT, "mesh axis 1");
  s = make_named(f.client, f.devices, 4, mesh22, 2, NULL, ones, 2, axes00, &err);
  CHECK_CODE_MSG(err, COLOCATED_INVALID_ARGUMENT, "used twice");
  s = make_named(f.client, f.devices, 4, mesh22, 2, NULL, two, 1, axes00, &err);
  CHECK_CODE_MSG(err, COLOCATED_INVALID_ARGUMENT, "used twice");
  const colocated_device *twice4[4] = {f.devices[0], f.devices[1], f.devices[2], f.devices[0]};
  s = make_named(f.client, twice4, 4, mesh4, 1, NULL, one, 1, axis0, &err);
  CHECK_CODE_MSG(err, COLOCATED_INVALID_ARGUMENT, "twice");
  const colocated_device *foreign4[4] = {f.devices[0], f.devices[1], f.devices[2], device_at(other, 0)};
  s = make_named(f.client, foreign4, 4, mesh4, 1, NULL, one, 1, axis0, &err);
  CHECK_CODE_MSG(err, COLOCATED_INVALID_ARGUMENT, "another client");
  const size_t huge[2] = {SIZE_MAX, SIZE_MAX};
  s = make_named(f.client, f.devices, 4, one, 1, NULL, huge, 2, axis0, &err);
  CHECK_CODE_MSG(err, COLOCATED_INVALID_ARGUMENT, "overflow");
  s = make_named(f.client, f.devices, 4, mesh4, 1, NULL, one, 1, NULL, &err);
  CHECK_CODE_MSG(err, COLOCATED_INVALID_ARGUMENT, "NULL");
  CHECK(s == NULL);
  colocated_client_destroy(other);
  client_fixture_destroy(&f);
}

TEST(array_from_host_splits_rows_and_to_host_gathers_them) {
  struct client_fixture f = client_fixture(4, 2);
  f.sharding = make_split(f.client, f.devices, 4);
  const int64_t dims[2] = {8, 2};
  float x[16];
  for (int i = 0; i < 16; ++i) x[i] = (float)i;
  colocated_array *a = make_array(f.client, f.sharding, COLOCATED_DTYPE_F32, dims, 2, x, sizeof x);
  size_t num_buffers = 0;
  CHECK_OK(colocated_array_num_buffers(a, &num_buffers));
  CHECK_EQ_U64(num_buffers, 4);
  for (size_t i = 0; i < 4; ++i) {
    colocated_buffer *b = NULL;
    CHECK_OK(colocated_array_buffer(a, i, &b));
    check_buffer_device(b, f.devices[i]);
    const int64_t *bdims;
    size_t nd;
    CHECK_OK(colocated_buffer_dims(b, &bdims, &nd));
    CHECK(nd == 2 && bdims[0] == 2 && bdims[1] == 2);
    float shard[4];
    read_buffer(b, shard, sizeof shard);
    CHECK(memcmp(shard, x + 4 * i, sizeof shard) == 0);
    colocated_buffer_destroy(b);
  }
  float back[16];
  CHECK_OK(colocated_array_to_host(a, back, sizeof back));
  CHECK(memcmp(back, x, sizeof x) == 0);

  const int64_t *got;
  size_t num_dims;
  CHECK_OK(colocated_array_dims(a, &got, &num_dims));
  CHECK(num_dims == 2 && got[0] == 8 && got[1] == 2);
  colocated_dtype dtype;
  CHECK_OK(colocated_array_dtype(a, &dtype));
  CHECK_EQ_U64(dtype, COLOCATED_DTYPE_F32);
  colocated_sharding *as = NULL;
  CHECK_OK(colocated_array_sharding(a, &as));
  CHECK(as != NULL && as != f.sharding); /* a new handle */
  const colocated_device *const *sd;
  size_t count;
  CHECK_OK(colocated_sharding_devices(as, &sd, &count));
  CHECK_EQ_U64(count, 4);
  for (size_t i = 0; i < 4; ++i) CHECK(sd[i] == f.devices[i]);
  colocated_sharding_destroy(as);
  await_array_ready(a);
  colocated_array_destroy(a);
  client_fixture_destroy(&f);
}

TEST(array_from_host_over_a_2d_mesh_round_trips) {
  struct client_fixture f = client_fixture(4, 2);
  const size_t mesh[2] = {2, 2};
  const size_t counts[2] = {1, 1};
  const uint32_t axes[2] = {0, 1};
  colocated_error *err;
  f.sharding = make_named(f.client, f.devices, 4, mesh, 2, NULL, counts, 2, axes, &err);
  CHECK_OK(err);
  const int64_t dims[2] = {4, 6};
  int16_t x[24];
  for (int i = 0; i < 24; ++i) x[i] = (int16_t)(i * 3 - 20);
  colocated_array *a = make_array(f.client, f.sharding, COLOCATED_DTYPE_I16, dims, 2, x, sizeof x);
  /* device 3 = mesh (1, 1): rows 2..4, columns 3..6 */
  colocated_buffer *b;
  CHECK_OK(colocated_array_buffer(a, 3, &b));
  int16_t shard[6];
  read_buffer(b, shard, sizeof shard);
  for (int r = 0; r < 2; ++r)
    for (int c = 0; c < 3; ++c) CHECK(shard[r * 3 + c] == x[(2 + r) * 6 + 3 + c]);
  colocated_buffer_destroy(b);
  int16_t back[24];
  CHECK_OK(colocated_array_to_host(a, back, sizeof back));
  CHECK(memcmp(back, x, sizeof x) == 0);
  colocated_array_destroy(a);
  client_fixture_destroy(&f);
}

TEST(replicated_arrays_copy_the_whole_data_to_every_device_including_scalars) {
  struct client_fixture f = client_fixture(3, 2);
  f.sharding = make_replicated(f.client, f.devices, 3);
  const int64_t dims[1] = {5};
  uint64_t x[5] = {1, 2, 3, 4, UINT64_MAX};
  colocated_array *a = make_array(f.client, f.sharding, COLOCATED_DTYPE_U64, dims, 1, x, sizeof x);
  for (size_t i = 0; i < 3; ++i) {
    colocated_buffer *b;
    CHECK_OK(colocated_array_buffer(a, i, &b));
    uint64_t whole[5];
    read_buffer(b, whole, sizeof whole);
    CHECK(memcmp(whole, x, sizeof x) == 0);
    colocated_buffer_destroy(b);
  }
  uint64_t back[5];
  CHECK_OK(colocated_array_to_host(a, back, sizeof back));
  CHECK(memcmp(back, x, sizeof x) == 0);
  colocated_array_destroy(a);

  double scalar = 3.25, got = 0;
  colocated_array_args sargs = array_args(f.client, COLOCATED_DTYPE_F64, NULL, 0, f.sharding);
  sargs.data = &scalar;
  sargs.data_size = sizeof scalar;
  CHECK_OK(colocated_array_from_host(&sargs, &a));
  const int64_t *d;
  size_t nd = 99;
  CHECK_OK(colocated_array_dims(a, &d, &nd));
  CHECK_EQ_U64(nd, 0);
  CHECK_OK(colocated_array_to_host(a, &got, sizeof got));
  CHECK(got == 3.25);
  colocated_array_destroy(a);

  const int64_t empty[2] = {0, 4};
  colocated_array_args eargs = array_args(f.client, COLOCATED_DTYPE_F32, empty, 2, f.sharding);
  CHECK_OK(colocated_array_from_host(&eargs, &a));
  CHECK_OK(colocated_array_to_host(a, NULL, 0));
  colocated_array_destroy(a);
  client_fixture_destroy(&f);
}

TEST(string_arrays_split_their_elements_and_have_no_dense_to_host) {
  struct client_fixture f = client_fixture(2, 2);
  f.sharding = make_split(f.client, f.devices, 2);
  const int64_t dims[1] = {4};
  colocated_string_view strings[4] = {sv("zero"), sv("one"), sv("two"), sv("three")};
  colocated_array *a = make_array(f.client, f.sharding, COLOCATED_DTYPE_STRING, dims, 1, strings, sizeof strings);
  colocated_buffer *b;
  CHECK_OK(colocated_array_buffer(a, 1, &b));
  size_t size;
  CHECK_OK(colocated_buffer_on_host_size(b, &size));
  CHECK_EQ_U64(size, 3 * 8 + 8);
  uint8_t host[32];
  read_buffer(b, host, sizeof host);
  CHECK(memcmp(host + 24, "twothree", 8) == 0);
  colocated_buffer_destroy(b);
  uint8_t dst[64];
  CHECK_CODE_MSG(colocated_array_to_host(a, dst, sizeof dst), COLOCATED_INVALID_ARGUMENT, "string");
  colocated_array_destroy(a);
  client_fixture_destroy(&f);
}

TEST(array_assemble_shares_the_given_buffers) {
  struct client_fixture f = client_fixture(2, 2);
  f.sharding = make_split(f.client, f.devices, 2);
  float lo[2] = {1, 2}, hi[2] = {3, 4};
  colocated_buffer *parts[2] = {make_f32(f.client, f.devices[0], lo, 2), make_f32(f.client, f.devices[1], hi, 2)};
  const int64_t dims[1] = {4};
  colocated_array_args args = array_args(f.client, COLOCATED_DTYPE_F32, dims, 1, f.sharding);
  args.buffers = (const colocated_buffer *const *)parts;
  args.num_buffers = 2;
  colocated_array *a;
  CHECK_OK(colocated_array_assemble(&args, &a));
  float back[4];
  CHECK_OK(colocated_array_to_host(a, back, sizeof back));
  CHECK(back[0] == 1 && back[1] == 2 && back[2] == 3 && back[3] == 4);
  /* the same data: deleting through the buffer deletes the array's shard */
  CHECK_OK(colocated_buffer_delete(parts[1]));
  bool deleted = false;
  CHECK_OK(colocated_array_is_deleted(a, &deleted));
  CHECK(deleted);
  CHECK_CODE_MSG(colocated_array_to_host(a, back, sizeof back), COLOCATED_FAILED_PRECONDITION, "deleted");
  colocated_buffer_destroy(parts[0]);
  colocated_buffer_destroy(parts[1]);
  colocated_array_destroy(a);
  client_fixture_destroy(&f);
}

TEST(array_assemble_rejects_mismatched_buffers) {
  struct client_fixture f = client_fixture(2, 2);
  f.sharding = make_split(f.client, f.devices, 2);
  float two[2] = {1, 2}, three[3] = {1, 2, 3};
  colocated_buffer *on0 = make_f32(f.client, f.devices[0], two, 2);
  colocated_buffer *on1 = make_f32(f.client, f.devices[1], two, 2);
  colocated_buffer *long1 = make_f32(f.client, f.devices[1], three, 3);
  int32_t ints[2] = {1, 2};
  const int64_t d2[1] = {2};
  colocated_buffer *int1 = make_buffer(f.client, f.devices[1], COLOCATED_DTYPE_I32, d2, 1, ints, sizeof ints);
  const int64_t dims[1] = {4};
  colocated_array_args args = array_args(f.client, COLOCATED_DTYPE_F32, dims, 1, f.sharding);
  colocated_array *a = NULL;

  const colocated_buffer *one[1] = {on0};
  args.buffers = one;
  args.num_buffers = 1;
  CHECK_CODE_MSG(colocated_array_assemble(&args, &a), COLOCATED_INVALID_ARGUMENT, "2 devices but 1 buffers");
  const colocated_buffer *swapped[2] = {on1, on0};
  args.buffers = swapped;
  args.num_buffers = 2;
  CHECK_CODE_MSG(colocated_array_assemble(&args, &a), COLOCATED_INVALID_ARGUMENT, "buffer 0 is on");
  const colocated_buffer *wrong_shape[2] = {on0, long1};
  args.buffers = wrong_shape;
  CHECK_CODE_MSG(colocated_array_assemble(&args, &a), COLOCATED_INVALID_ARGUMENT, "buffer 1 is float32[3]");
  const colocated_buffer *wrong_dtype[2] = {on0, int1};
  args.buffers = wrong_dtype;
  CHECK_CODE_MSG(colocated_array_assemble(&args, &a), COLOCATED_INVALID_ARGUMENT, "int32");
  const colocated_buffer *with_null[2] = {on0, NULL};
  args.buffers = with_null;
  CHECK_CODE_MSG(colocated_array_assemble(&args, &a), COLOCATED_INVALID_ARGUMENT, "buffers[1]");
  args.buffers = NULL;
  CHECK_CODE_MSG(colocated_array_assemble(&args, &a), COLOCATED_INVALID_ARGUMENT, "NULL");
  const colocated_buffer *good[2] = {on0, on1};
  args.buffers = good;
  CHECK_OK(colocated_buffer_delete(on1));
  CHECK_CODE_MSG(colocated_array_assemble(&args, &a), COLOCATED_FAILED_PRECONDITION, "deleted");
  CHECK(a == NULL);
  colocated_buffer_destroy(on0);
  colocated_buffer_destroy(on1);
  colocated_buffer_destroy(long1);
  colocated_buffer_destroy(int1);
  client_fixture_destroy(&f);
}

TEST(array_from_host_rejects_bad_sizes_dims_and_splits) {
  struct client_fixture f = client_fixture(2, 2);
  colocated_client *other = make_client(1, 1);
  f.sharding = make_split(f.client, f.devices, 2);
  float x[6] = {0};
  colocated_array *a = NULL;
  const int64_t dims4[1] = {4}, dims3[1] = {3}, neg[1] = {-4};
  colocated_array_args args = array_args(f.client, COLOCATED_DTYPE_F32, dims4, 1, f.sharding);
  args.data = x;
  args.data_size = 3 * sizeof(float);
  CHECK_CODE_MSG(colocated_array_from_host(&args, &a), COLOCATED_INVALID_ARGUMENT, "bytes");
  args.dims = dims3;
  CHECK_CODE_MSG(colocated_array_from_host(&args, &a), COLOCATED_INVALID_ARGUMENT, "evenly");
  args.dims = neg;
  CHECK_CODE_MSG(colocated_array_from_host(&args, &a), COLOCATED_INVALID_ARGUMENT, "negative");
  args.dims = NULL; /* a scalar cannot be split along dimension 0 */
  args.num_dims = 0;
  args.data_size = sizeof(float);
  CHECK_CODE_MSG(colocated_array_from_host(&args, &a), COLOCATED_INVALID_ARGUMENT, "rank");
  args.dims = dims4;
  args.num_dims = 1;
  args.data_size = 4 * sizeof(float);
  args.dtype = 99;
  CHECK_CODE_MSG(colocated_array_from_host(&args, &a), COLOCATED_INVALID_ARGUMENT, "dtype");
  args.dtype = COLOCATED_DTYPE_F32;
  args.data = NULL;
  CHECK_CODE_MSG(colocated_array_from_host(&args, &a), COLOCATED_INVALID_ARGUMENT, "NULL");
  args.data = x;
  args.sharding = NULL;
  CHECK_CODE_MSG(colocated_array_from_host(&args, &a), COLOCATED_INVALID_ARGUMENT, "NULL");
  args.sharding = f.sharding;
  args.client = other; /* the sharding's devices belong to client */
  CHECK_CODE_MSG(colocated_array_from_host(&args, &a), COLOCATED_INVALID_ARGUMENT, "another client");
  CHECK(a == NULL);
  colocated_client_destroy(other);
  client_fixture_destroy(&f);
}

/* A client with one float32 array on it: the start of the tests of one call on
 * an existing array (small_array or split_array, then array_fixture_destroy). */
struct array_fixture {
  colocated_client *client;
  const colocated_device *device; /* device 0 */
  colocated_sharding *sharding;
  colocated_array *array;
};

/* A client of one device and a sharding replicated on it; no array yet. */
static struct array_fixture one_device(void) {
  struct array_fixture f;
  f.client = make_client(1, 1);
  f.device = device_at(f.client, 0);
  f.sharding = make_replicated(f.client, &f.device, 1);
  f.array = NULL;
  return f;
}

/* The scalar 1, replicated on the one device of its client. */
static struct array_fixture small_array(void) {
  struct array_fixture f = one_device();
  float x = 1;
  f.array = make_array(f.client, f.sharding, COLOCATED_DTYPE_F32, NULL, 0, &x, sizeof x);
  return f;
}

/* {1, 2, 3, 4}, split over the two devices of its client. */
static struct array_fixture split_array(void) {
  struct array_fixture f;
  f.client = make_client(2, 2);
  size_t n;
  const colocated_device *const *devices = client_devices(f.client, &n);
  f.device = devices[0];
  f.sharding = make_split(f.client, devices, 2);
  float x[4] = {1, 2, 3, 4};
  const int64_t dims[1] = {4};
  f.array = make_array(f.client, f.sharding, COLOCATED_DTYPE_F32, dims, 1, x, sizeof x);
  return f;
}

/* Destroys the array (if any), its sharding and the client. */
static void array_fixture_destroy(struct array_fixture *f) {
  if (f->array) colocated_array_destroy(f->array);
  colocated_sharding_destroy(f->sharding);
  colocated_client_destroy(f->client);
}

TEST(array_buffer_and_to_host_reject_bad_indices_and_sizes) {
  struct array_fixture f = split_array();
  colocated_buffer *b = NULL;
  CHECK_CODE_MSG(colocated_array_buffer(f.array, 2, &b), COLOCATED_INVALID_ARGUMENT, "out of range");
  CHECK(b == NULL);
  float small[3];
  CHECK_CODE_MSG(colocated_array_to_host(f.array, small, sizeof small), COLOCATED_INVALID_ARGUMENT, "bytes");
  CHECK_CODE_MSG(colocated_array_to_host(f.array, NULL, 4 * sizeof(float)), COLOCATED_INVALID_ARGUMENT, "NULL");
  array_fixture_destroy(&f);
}

TEST(array_delete_deletes_every_buffer) {
  struct array_fixture f = split_array();
  colocated_array *a = f.array;
  colocated_buffer *first;
  CHECK_OK(colocated_array_buffer(a, 0, &first));
  bool deleted = true;
  CHECK_OK(colocated_array_is_deleted(a, &deleted));
  CHECK(!deleted);
  CHECK_OK(colocated_array_delete(a));
  CHECK_OK(colocated_array_delete(a));
  CHECK_OK(colocated_array_is_deleted(a, &deleted));
  CHECK(deleted);
  CHECK_OK(colocated_buffer_is_deleted(first, &deleted));
  CHECK(deleted);
  float back[4];
  CHECK_CODE_MSG(colocated_array_to_host(a, back, sizeof back), COLOCATED_FAILED_PRECONDITION, "deleted");
  colocated_buffer_destroy(first);
  colocated_array_destroy(NULL);
  colocated_sharding_destroy(NULL);
  array_fixture_destroy(&f);
}

TEST(arrays_outlive_their_sharding_handle) {
  struct client_fixture f = client_fixture(2, 2);
  f.sharding = make_split(f.client, f.devices, 2);
  float x[2] = {1, 2};
  const int64_t dims[1] = {2};
  colocated_array *a = make_array(f.client, f.sharding, COLOCATED_DTYPE_F32, dims, 1, x, sizeof x);
  client_fixture_destroy(&f);
  float back[2];
  CHECK_OK(colocated_array_to_host(a, back, sizeof back));
  CHECK(back[0] == 1 && back[1] == 2);
  colocated_sharding *again;
  CHECK_OK(colocated_array_sharding(a, &again));
  const colocated_device *const *sd;
  size_t count;
  CHECK_OK(colocated_sharding_devices(again, &sd, &count));
  CHECK_EQ_U64(count, 2);
  colocated_sharding_destroy(again);
  colocated_array_destroy(a);
}

/* The NULL-out cases of functions that allocate before checking `out`, one per
 * test so that a LeakSanitizer report names the function. */
TEST(array_from_host_with_null_out_is_invalid_and_leaks_nothing) {
  struct array_fixture f = one_device();
  float x = 1;
  colocated_array_args args = array_args(f.client, COLOCATED_DTYPE_F32, NULL, 0, f.sharding);
  args.data = &x;
  args.data_size = sizeof x;
  CHECK_CODE_MSG(colocated_array_from_host(&args, NULL), COLOCATED_INVALID_ARGUMENT, "out");
  array_fixture_destroy(&f);
}

TEST(array_assemble_with_null_out_is_invalid_and_leaks_nothing) {
  struct array_fixture f = one_device();
  float x = 1;
  colocated_buffer *b = make_buffer(f.client, f.device, COLOCATED_DTYPE_F32, NULL, 0, &x, sizeof x);
  const colocated_buffer *parts[1] = {b};
  colocated_array_args args = array_args(f.client, COLOCATED_DTYPE_F32, NULL, 0, f.sharding);
  args.buffers = parts;
  args.num_buffers = 1;
  CHECK_CODE_MSG(colocated_array_assemble(&args, NULL), COLOCATED_INVALID_ARGUMENT, "out");
  colocated_buffer_destroy(b);
  array_fixture_destroy(&f);
}

TEST(array_sharding_with_null_out_is_invalid_and_leaks_nothing) {
  struct array_fixture f = small_array();
  CHECK_CODE_MSG(colocated_array_sharding(f.array, NULL), COLOCATED_INVALID_ARGUMENT, "out");
  array_fixture_destroy(&f);
}

TEST(array_buffer_with_null_out_is_invalid_and_leaks_nothing) {
  struct array_fixture f = small_array();
  CHECK_CODE_MSG(colocated_array_buffer(f.array, 0, NULL), COLOCATED_INVALID_ARGUMENT, "out");
  array_fixture_destroy(&f);
}

TEST(array_ready_event_with_null_out_is_invalid_and_leaks_nothing) {
  struct array_fixture f = small_array();
  CHECK_CODE_MSG(colocated_array_ready_event(f.array, NULL), COLOCATED_INVALID_ARGUMENT, "out");
  array_fixture_destroy(&f);
}
