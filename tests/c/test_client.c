/*
 * Clients and their topology: create (options / NULL options), platform name and
 * version, process index, devices, addressable devices, memory spaces, hosts,
 * device and memory-space getters, attributes, lookup_device, cpu_devices,
 * streams, and the lifetime of the client relative to its objects.
 */
#include "harness.h"
#include "helpers.h"

TEST(client_with_null_options_gets_the_default_device_count) {
  colocated_client *client = NULL;
  CHECK_OK(colocated_client_create_local(NULL, &client));
  CHECK(client != NULL);
  size_t n;
  client_devices(client, &n);
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  CHECK(n >= 1);
  /* one per core available to the process (CPU affinity and quotas may lower it) */
  if (cores > 0) CHECK(n <= (size_t)cores);
  colocated_client_destroy(client);
}

TEST(client_options_set_the_device_count) {
  colocated_client *client = make_client(3, 2);
  size_t n;
  client_devices(client, &n);
  CHECK_EQ_U64(n, 3);
  colocated_client_destroy(client);
}

TEST(client_options_of_an_older_caller_get_defaults_for_missing_fields) {
  /* A caller that knows only num_cpu_devices. */
  colocated_client_options options = {COLOCATED_STRUCT_SIZE(colocated_client_options, num_cpu_devices)};
  options.num_cpu_devices = 5;
  options.executor_threads = 0xdeadbeef; /* beyond struct_size: must be ignored */
  colocated_client *client;
  CHECK_OK(colocated_client_create_local(&options, &client));
  size_t n;
  client_devices(client, &n);
  CHECK_EQ_U64(n, 5);
  colocated_client_destroy(client);

  /* A caller that knows only struct_size: all defaults. */
  colocated_client_options bare = {COLOCATED_STRUCT_SIZE(colocated_client_options, struct_size)};
  CHECK_OK(colocated_client_create_local(&bare, &client));
  colocated_client_destroy(client);
}

TEST(client_options_out_of_range_are_invalid_arguments) {
  colocated_client_options options = {sizeof options};
  colocated_client *client = NULL;
  options.num_cpu_devices = 4097;
  CHECK_CODE_MSG(colocated_client_create_local(&options, &client), COLOCATED_INVALID_ARGUMENT, "num_cpu_devices");
  options.num_cpu_devices = 2;
  options.executor_threads = 1025;
  CHECK_CODE_MSG(colocated_client_create_local(&options, &client), COLOCATED_INVALID_ARGUMENT, "executor_threads");
  options.executor_threads = 4;
  options.max_executor_threads = 3; /* fewer than the threads kept */
  CHECK_CODE_MSG(colocated_client_create_local(&options, &client), COLOCATED_INVALID_ARGUMENT,
                 "max_executor_threads must be between executor_threads (4) and 4096, got 3");
  options.max_executor_threads = 4097;
  CHECK_CODE_MSG(colocated_client_create_local(&options, &client), COLOCATED_INVALID_ARGUMENT, "max_executor_threads");
  CHECK(client == NULL);
  options.max_executor_threads = 4; /* a fixed pool */
  options.reserved = 1;
  CHECK_CODE_MSG(colocated_client_create_local(&options, &client), COLOCATED_INVALID_ARGUMENT,
                 "colocated_client_options.reserved must be zero, got 1");
  options.reserved = 0;
  CHECK_OK(colocated_client_create_local(&options, &client));
  colocated_client_destroy(client);
  CHECK_CODE_MSG(colocated_client_create_local(NULL, NULL), COLOCATED_INVALID_ARGUMENT, "out");
}

TEST(platform_name_version_and_process_index) {
  colocated_client *client = make_client(2, 2);
  colocated_string_view name, version;
  CHECK_OK(colocated_client_platform_name(client, &name));
  CHECK_VIEW_EQ(name, "colocated");
  CHECK_OK(colocated_client_platform_version(client, &version));
  /* "major.minor.patch" ("0.2.0" today), NUL-terminated */
  int dots = 0;
  CHECK(version.size >= 5 && version.data[version.size] == '\0');
  for (size_t i = 0; i < version.size; ++i) {
    CHECK((version.data[i] >= '0' && version.data[i] <= '9') || version.data[i] == '.');
    dots += version.data[i] == '.';
  }
  CHECK_EQ_I64(dots, 2);
  uint32_t index = 99;
  CHECK_OK(colocated_client_process_index(client, &index));
  CHECK_EQ_U64(index, 0);
  colocated_client_destroy(client);
}

TEST(devices_are_ordered_by_id_and_all_addressable) {
  colocated_client *client = make_client(4, 2);
  size_t n, na;
  const colocated_device *const *devices = client_devices(client, &n);
  const colocated_device *const *addressable;
  CHECK_OK(colocated_client_addressable_devices(client, &addressable, &na));
  CHECK_EQ_U64(n, 4);
  CHECK_EQ_U64(na, 4);
  for (size_t i = 0; i < n; ++i) {
    uint32_t id;
    CHECK_OK(colocated_device_id(devices[i], &id));
    CHECK_EQ_U64(id, i);
    CHECK(addressable[i] == devices[i]);
  }
  /* the lists are stable: the same borrowed handles each time */
  const colocated_device *const *again;
  CHECK_OK(colocated_client_devices(client, &again, &n));
  CHECK(again == devices);
  colocated_client_destroy(client);
}

TEST(device_getters_describe_each_cpu_device) {
  struct client_fixture f = client_fixture(3, 2);
  for (size_t i = 0; i < f.num_devices; ++i) {
    colocated_string_view kind, text, debug;
    uint32_t process_index = 99, local = 99;
    CHECK_OK(colocated_device_kind(f.devices[i], &kind));
    CHECK_VIEW_EQ(kind, "cpu");
    CHECK_OK(colocated_device_process_index(f.devices[i], &process_index));
    CHECK_EQ_U64(process_index, 0);
    CHECK_OK(colocated_device_local_hardware_id(f.devices[i], &local));
    CHECK_EQ_U64(local, i);
    char expected[64];
    snprintf(expected, sizeof expected, "CpuDevice(id=%zu)", i);
    CHECK_OK(colocated_device_to_string(f.devices[i], &text));
    CHECK_VIEW_EQ(text, expected);
    CHECK_OK(colocated_device_debug_string(f.devices[i], &debug));
    CHECK(harness_contains(debug.data, debug.size, "cpu"));
    CHECK(debug.data[debug.size] == '\0');
  }
  client_fixture_destroy(&f);
}

TEST(device_attributes_are_well_formed_and_report_the_local_hardware_id) {
  struct client_fixture f = client_fixture(2, 2);
  for (size_t d = 0; d < f.num_devices; ++d) {
    const colocated_device_attribute *attrs = NULL;
    size_t count = 0;
    CHECK_OK(colocated_device_attributes(f.devices[d], &attrs, &count));
    CHECK(count > 0 && attrs != NULL);
    bool found_local_id = false;
    for (size_t i = 0; i < count; ++i) {
      const colocated_device_attribute *a = &attrs[i];
      CHECK(a->name.size > 0 && a->name.data[a->name.size] == '\0');
      for (size_t j = 0; j < i; ++j)
        CHECK(!(attrs[j].name.size == a->name.size && memcmp(attrs[j].name.data, a->name.data, a->name.size) == 0));
      CHECK(a->type_ == COLOCATED_ATTRIBUTE_INT || a->type_ == COLOCATED_ATTRIBUTE_STRING ||
            a->type_ == COLOCATED_ATTRIBUTE_BOOL);
      if (a->type_ == COLOCATED_ATTRIBUTE_STRING) CHECK(a->string_value.data[a->string_value.size] == '\0');
      if (a->name.size == strlen("local_hardware_id") && memcmp(a->name.data, "local_hardware_id", a->name.size) == 0) {
        CHECK(a->type_ == COLOCATED_ATTRIBUTE_INT);
        CHECK_EQ_I64(a->int_value, (int64_t)d);
        found_local_id = true;
      }
    }
    CHECK(found_local_id);
  }
  client_fixture_destroy(&f);
}

static const char *kind_name(colocated_memory_kind kind) {
  switch (kind) {
    case COLOCATED_MEMORY_DEVICE: return "device";
    case COLOCATED_MEMORY_PINNED_HOST: return "pinned_host";
    case COLOCATED_MEMORY_UNPINNED_HOST: return "unpinned_host";
  }
  return "?";
}

/* A CPU device's default memory is its own; the host memories (pinned and
 * unpinned) are shared by every device of the host. */
TEST(each_device_has_its_own_memory_first_and_shares_the_host_memories) {
  const size_t num = 3;
  colocated_client *client = make_client((uint32_t)num, 2);
  size_t n;
  const colocated_device *const *devices = client_devices(client, &n);
  const colocated_memory_space *const *all;
  size_t num_all;
  CHECK_OK(colocated_client_memory_spaces(client, &all, &num_all));
  CHECK(num_all >= num + 2);
  for (size_t i = 0; i < num_all; ++i) {
    uint32_t id_i, id_j;
    colocated_memory_kind kind;
    colocated_string_view name;
    CHECK_OK(colocated_memory_space_id(all[i], &id_i));
    for (size_t j = 0; j < i; ++j) {
      CHECK_OK(colocated_memory_space_id(all[j], &id_j));
      CHECK(id_i != id_j); /* unique within the client */
    }
    CHECK_OK(colocated_memory_space_kind(all[i], &kind));
    CHECK_OK(colocated_memory_space_kind_name(all[i], &name));
    CHECK_VIEW_EQ(name, kind_name(kind));
  }
  for (size_t d = 0; d < n; ++d) {
    const colocated_memory_space *const *spaces;
    size_t count;
    CHECK_OK(colocated_device_memory_spaces(devices[d], &spaces, &count));
    CHECK(count >= 3);
    const colocated_memory_space *def;
    CHECK_OK(colocated_device_default_memory_space(devices[d], &def));
    CHECK(def == spaces[0]);
    colocated_memory_kind kind;
    CHECK_OK(colocated_memory_space_kind(def, &kind));
    CHECK_EQ_U64(kind, COLOCATED_MEMORY_DEVICE);
    const colocated_device *const *addressers;
    size_t num_addressers;
    CHECK_OK(colocated_memory_space_devices(def, &addressers, &num_addressers));
    CHECK_EQ_U64(num_addressers, 1); /* its own memory: this device only */
    CHECK(addressers[0] == devices[d]);
    bool pinned = false, unpinned = false;
    for (size_t k = 0; k < count; ++k) {
      bool listed = false;
      for (size_t i = 0; i < num_all; ++i) listed = listed || all[i] == spaces[k];
      CHECK(listed); /* the device's spaces are the client's handles */
      CHECK_OK(colocated_memory_space_kind(spaces[k], &kind));
      if (kind == COLOCATED_MEMORY_DEVICE) continue;
      pinned = pinned || kind == COLOCATED_MEMORY_PINNED_HOST;
      unpinned = unpinned || kind == COLOCATED_MEMORY_UNPINNED_HOST;
      CHECK_OK(colocated_memory_space_devices(spaces[k], &addressers, &num_addressers));
      CHECK_EQ_U64(num_addressers, n); /* host memory: every device of the host */
      for (size_t i = 0; i < n; ++i) CHECK(addressers[i] == devices[i]);
    }
    CHECK(pinned && unpinned);
  }
  colocated_client_destroy(client);
}

TEST(a_local_client_has_one_host_named_local_owning_every_device) {
  struct client_fixture f = client_fixture(3, 2);
  const colocated_host *const *hosts;
  size_t num_hosts;
  CHECK_OK(colocated_client_hosts(f.client, &hosts, &num_hosts));
  CHECK_EQ_U64(num_hosts, 1);
  size_t index = 99;
  uint32_t process_index = 99;
  colocated_string_view name;
  CHECK_OK(colocated_host_index(hosts[0], &index));
  CHECK_EQ_U64(index, 0);
  CHECK_OK(colocated_host_process_index(hosts[0], &process_index));
  CHECK_EQ_U64(process_index, 0);
  CHECK_OK(colocated_host_name(hosts[0], &name));
  CHECK_VIEW_EQ(name, "local");
  const colocated_device *const *owned;
  size_t num_owned;
  CHECK_OK(colocated_host_devices(hosts[0], &owned, &num_owned));
  CHECK_EQ_U64(num_owned, f.num_devices);
  for (size_t i = 0; i < f.num_devices; ++i) CHECK(owned[i] == f.devices[i]);
  client_fixture_destroy(&f);
}

TEST(lookup_device_finds_by_id_and_reports_not_found) {
  struct client_fixture f = client_fixture(4, 2);
  for (uint32_t id = 0; id < f.num_devices; ++id) {
    const colocated_device *d = NULL;
    CHECK_OK(colocated_client_lookup_device(f.client, id, &d));
    CHECK(d == f.devices[id]);
  }
  const colocated_device *d = NULL;
  CHECK_CODE_MSG(colocated_client_lookup_device(f.client, 4, &d), COLOCATED_NOT_FOUND, "4");
  CHECK_CODE_MSG(colocated_client_lookup_device(f.client, UINT32_MAX, &d), COLOCATED_NOT_FOUND, "no device");
  CHECK(d == NULL);
  CHECK_CODE_MSG(colocated_client_lookup_device(f.client, 0, NULL), COLOCATED_INVALID_ARGUMENT, "out");
  client_fixture_destroy(&f);
}

TEST(cpu_devices_maps_cpu_devices_to_themselves_in_order) {
  struct client_fixture f = client_fixture(4, 2);
  const colocated_device *in[3] = {f.devices[3], f.devices[0], f.devices[2]};
  const colocated_device *out[3] = {NULL, NULL, NULL};
  CHECK_OK(colocated_client_cpu_devices(f.client, in, 3, out));
  for (int i = 0; i < 3; ++i) CHECK(out[i] == in[i]);
  /* nothing to map: out may be NULL */
  CHECK_OK(colocated_client_cpu_devices(f.client, NULL, 0, NULL));
  CHECK_CODE_MSG(colocated_client_cpu_devices(f.client, in, 3, NULL), COLOCATED_INVALID_ARGUMENT, "out");
  CHECK_CODE_MSG(colocated_client_cpu_devices(f.client, NULL, 2, out), COLOCATED_INVALID_ARGUMENT, "NULL");
  client_fixture_destroy(&f);
}

TEST(cpu_devices_rejects_a_device_of_another_client) {
  colocated_client *a = make_client(2, 2);
  colocated_client *b = make_client(2, 2);
  const colocated_device *foreign[1] = {device_at(b, 0)};
  const colocated_device *out[1] = {NULL};
  CHECK_CODE_MSG(colocated_client_cpu_devices(a, foreign, 1, out), COLOCATED_INVALID_ARGUMENT, "another client");
  colocated_client_destroy(a);
  colocated_client_destroy(b);
}

TEST(streams_have_distinct_ids_and_accept_null_destroy) {
  colocated_client *client = make_client(2, 2);
  colocated_stream *s1 = NULL, *s2 = NULL;
  CHECK_OK(colocated_client_create_stream(client, &s1));
  CHECK_OK(colocated_client_create_stream(client, &s2));
  uint64_t id1 = 0, id2 = 0;
  CHECK_OK(colocated_stream_id(s1, &id1));
  CHECK_OK(colocated_stream_id(s2, &id2));
  CHECK(id1 != 0 && id2 != 0 && id1 != id2);
  CHECK_CODE_MSG(colocated_stream_id(s1, NULL), COLOCATED_INVALID_ARGUMENT, "out");
  CHECK_CODE_MSG(colocated_stream_id(NULL, &id1), COLOCATED_INVALID_ARGUMENT, "NULL");
  CHECK_CODE_MSG(colocated_client_create_stream(NULL, &s1), COLOCATED_INVALID_ARGUMENT, "NULL");
  colocated_stream_destroy(s1);
  colocated_stream_destroy(s2);
  colocated_stream_destroy(NULL);
  colocated_client_destroy(client);
}

TEST(create_stream_with_null_out_is_invalid_and_leaks_nothing) {
  colocated_client *client = make_client(1, 1);
  CHECK_CODE_MSG(colocated_client_create_stream(client, NULL), COLOCATED_INVALID_ARGUMENT, "out");
  colocated_client_destroy(client);
}

TEST(client_destroy_accepts_null) {
  colocated_client_destroy(NULL);
}

TEST(objects_outlive_the_client_handle_with_their_devices) {
  colocated_client *client = make_client(2, 2);
  const colocated_device *d1 = device_at(client, 1);
  float values[3] = {1, 2, 3};
  colocated_buffer *buffer = make_f32(client, d1, values, 3);
  colocated_client_destroy(client);
  /* the buffer keeps the runtime alive, and the borrowed device with it */
  const colocated_device *device = NULL;
  CHECK_OK(colocated_buffer_device(buffer, &device));
  CHECK(device == d1);
  colocated_string_view text;
  CHECK_OK(colocated_device_to_string(device, &text));
  CHECK_VIEW_EQ(text, "CpuDevice(id=1)");
  colocated_buffer *copy = NULL;
  CHECK_OK(colocated_buffer_copy_to_device(buffer, device, &copy));
  float back[3] = {0};
  read_buffer(copy, back, sizeof back);
  CHECK(back[0] == 1 && back[1] == 2 && back[2] == 3);
  colocated_buffer_destroy(copy);
  colocated_buffer_destroy(buffer);
}

TEST(executor_threads_stop_when_the_last_object_of_the_client_is_gone) {
  quiet_runtime();
  int before = thread_count();
  CHECK(before >= 1);
  colocated_client *client = make_client(2, 3);
  CHECK(thread_count() >= before + 3);
  float v = 1;
  colocated_buffer *buffer = make_f32(client, device_at(client, 0), &v, 1);
  colocated_buffer *copy = NULL;
  CHECK_OK(colocated_buffer_copy_to_device(buffer, device_at(client, 1), &copy));
  await_buffer_ready(copy);
  colocated_client_destroy(client);
  CHECK(thread_count() >= before + 3); /* buffers still use the runtime */
  colocated_buffer_destroy(buffer);
  colocated_buffer_destroy(copy);
  CHECK(WAIT_FOR(thread_count() == before, 5000));
}

TEST(several_clients_are_independent) {
  colocated_client *a = make_client(2, 2);
  colocated_client *b = make_client(3, 2);
  size_t na, nb;
  const colocated_device *const *da = client_devices(a, &na);
  const colocated_device *const *db = client_devices(b, &nb);
  CHECK_EQ_U64(na, 2);
  CHECK_EQ_U64(nb, 3);
  CHECK(da[0] != db[0]);
  uint32_t id;
  CHECK_OK(colocated_device_id(db[0], &id));
  CHECK_EQ_U64(id, 0); /* ids are per client */
  colocated_client_destroy(a);
  CHECK_OK(colocated_device_id(db[2], &id)); /* b is unaffected */
  CHECK_EQ_U64(id, 2);
  colocated_client_destroy(b);
}
