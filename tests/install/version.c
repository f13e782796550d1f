/* A C program built against an installed libcolocated (pkg-config or CMake):
 * reads the library's release and API version without a client, then makes
 * a local client with 3 devices and lists them. Prints one line:
 * `colocated RELEASE api MAJOR.MINOR devices N`. */
#include <colocated.h>
#include <stdio.h>
#include <string.h>

int main(void) {
  uint32_t api = colocated_api_version();
  if (api >> 16 != COLOCATED_API_VERSION_MAJOR || (api & 0xffff) < COLOCATED_API_VERSION_MINOR) {
    fprintf(stderr, "library API %u.%u, header %u.%u\n", api >> 16, api & 0xffff,
            COLOCATED_API_VERSION_MAJOR, COLOCATED_API_VERSION_MINOR);
    return 1;
  }
  colocated_client_options options;
  memset(&options, 0, sizeof options);
  options.struct_size = sizeof options;
  options.num_cpu_devices = 3;
  options.executor_threads = 2;
  colocated_client *client = NULL;
  colocated_error *err = colocated_client_create_local(&options, &client);
  if (err != NULL) {
    colocated_string_view message = colocated_error_message(err);
    fprintf(stderr, "%.*s\n", (int)message.size, message.data);
    colocated_error_destroy(err);
    return 1;
  }
  const colocated_device *const *devices = NULL;
  size_t count = 0;
  err = colocated_client_devices(client, &devices, &count);
  if (err != NULL) {
    colocated_error_destroy(err);
    colocated_client_destroy(client);
    return 1;
  }
  printf("colocated %s api %u.%u devices %zu\n", colocated_version(), api >> 16, api & 0xffff, count);
  colocated_client_destroy(client);
  return 0;
}
