/*
 * A plugin for the tests (the plugin contract is on colocated_plugin_registrar in
 * colocated.h). It registers
 *
 *   plugin_add_one_i32  each int32 output shard is its input shard plus one (one
 *                       argument, sharded like the one result);
 *   plugin_fail         fails with COLOCATED_FAILED_PRECONDITION and a message.
 *
 * Its init also checks that the registrar refuses bad registrations, and fails
 * the load if it does not. The tests build it at test time:
 *
 *   cc -std=c11 -shared -fPIC -I include tests/plugin/add_one_plugin.c -o libadd_one_plugin.so
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "colocated.h"

/* Writes the message of a failing call and returns `code`. */
__attribute__((format(printf, 3, 4))) static uint32_t fail_with(const colocated_plugin_call *call, uint32_t code,
                                                                 const char *format, ...) {
  if (call->message != NULL && call->message_capacity > 0) {
    va_list args;
    va_start(args, format);
    vsnprintf(call->message, call->message_capacity, format, args);
    va_end(args);
  }
  return code;
}

static uint32_t add_one_i32(void *user_data, const colocated_plugin_call *call) {
  (void)user_data;
  if (call->struct_size < COLOCATED_STRUCT_SIZE(colocated_plugin_call, message_capacity))
    return COLOCATED_FAILED_PRECONDITION;
  if (call->num_arguments != 1 || call->input_shard_counts[0] != call->num_inputs)
    return fail_with(call, COLOCATED_INVALID_ARGUMENT, "plugin_add_one_i32 takes one argument, got %zu",
                     call->num_arguments);
  if (call->num_outputs != call->num_inputs)
    return fail_with(call, COLOCATED_INVALID_ARGUMENT, "plugin_add_one_i32: %zu input shards but %zu output shards",
                     call->num_inputs, call->num_outputs);
  for (size_t i = 0; i < call->num_inputs; ++i) {
    const colocated_plugin_array *in = &call->inputs[i];
    colocated_plugin_array *out = &call->outputs[i];
    if (in->struct_size < sizeof *in) return COLOCATED_FAILED_PRECONDITION;
    if (in->dtype != COLOCATED_DTYPE_I32 || out->dtype != COLOCATED_DTYPE_I32)
      return fail_with(call, COLOCATED_INVALID_ARGUMENT,
                       "plugin_add_one_i32 takes and returns int32 arrays, got dtypes %u and %u", (unsigned)in->dtype,
                       (unsigned)out->dtype);
    if (in->size != out->size || in->device != out->device || in->num_dims != out->num_dims ||
        (in->num_dims > 0 && memcmp(in->dims, out->dims, in->num_dims * sizeof *in->dims) != 0))
      return fail_with(call, COLOCATED_INVALID_ARGUMENT, "plugin_add_one_i32: shard %zu differs from its output", i);
    const int32_t *x = in->data;
    int32_t *y = out->data;
    for (size_t k = 0; k < out->size / sizeof(int32_t); ++k) y[k] = x[k] + 1;
  }
  return 0;
}

static uint32_t always_fail(void *user_data, const colocated_plugin_call *call) {
  (void)user_data;
  return fail_with(call, COLOCATED_FAILED_PRECONDITION, "plugin_fail failed on purpose (%zu input shards)",
                   call->num_inputs);
}

static uint32_t add(const colocated_plugin_registrar *registrar, const char *name, colocated_plugin_function function) {
  return registrar->register_function(registrar->context, (const uint8_t *)name, strlen(name), function, NULL);
}

COLOCATED_PLUGIN_EXPORT uint32_t colocated_plugin_init(const colocated_plugin_registrar *registrar) {
  if (registrar->struct_size < COLOCATED_STRUCT_SIZE(colocated_plugin_registrar, register_function) ||
      registrar->api_version >> 16 != COLOCATED_API_VERSION_MAJOR)
    return COLOCATED_FAILED_PRECONDITION;
  uint32_t code;
  if ((code = add(registrar, "plugin_add_one_i32", add_one_i32)) != 0) return code;
  if ((code = add(registrar, "plugin_fail", always_fail)) != 0) return code;
  /* Bad registrations are refused with a code, and change nothing. */
  if (add(registrar, "", add_one_i32) != COLOCATED_INVALID_ARGUMENT) return COLOCATED_INTERNAL;
  if (add(registrar, "\xff\xfe", add_one_i32) != COLOCATED_INVALID_ARGUMENT) return COLOCATED_INTERNAL;
  if (registrar->register_function(registrar->context, NULL, 3, add_one_i32, NULL) != COLOCATED_INVALID_ARGUMENT)
    return COLOCATED_INTERNAL;
  if (add(registrar, "plugin_no_function", NULL) != COLOCATED_INVALID_ARGUMENT) return COLOCATED_INTERNAL;
  if (add(registrar, "plugin_fail", always_fail) != COLOCATED_ALREADY_EXISTS) return COLOCATED_INTERNAL;
  return 0;
}
