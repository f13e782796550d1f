/*
 * A native-function plugin for the tests of session isolation: `plugin_pid`
 * fills each int32 output shard with the id of the process that runs it, so a
 * controller learns which worker process served its session.
 */
#define _POSIX_C_SOURCE 200809L

#include <string.h>
#include <unistd.h>

#include "colocated.h"

static uint32_t pid(void *user_data, const colocated_plugin_call *call) {
  (void)user_data;
  if (call->struct_size < COLOCATED_STRUCT_SIZE(colocated_plugin_call, message_capacity))
    return COLOCATED_FAILED_PRECONDITION;
  for (size_t i = 0; i < call->num_outputs; ++i) {
    colocated_plugin_array *out = &call->outputs[i];
    if (out->struct_size < sizeof *out || out->dtype != COLOCATED_DTYPE_I32) return COLOCATED_INVALID_ARGUMENT;
    int32_t *y = out->data;
    for (size_t k = 0; k < out->size / sizeof(int32_t); ++k) y[k] = (int32_t)getpid();
  }
  return 0;
}

COLOCATED_PLUGIN_EXPORT uint32_t colocated_plugin_init(const colocated_plugin_registrar *registrar) {
  if (registrar->struct_size < COLOCATED_STRUCT_SIZE(colocated_plugin_registrar, register_function) ||
      registrar->api_version >> 16 != COLOCATED_API_VERSION_MAJOR)
    return COLOCATED_FAILED_PRECONDITION;
  const char *name = "plugin_pid";
  return registrar->register_function(registrar->context, (const uint8_t *)name, strlen(name), pid, NULL);
}
