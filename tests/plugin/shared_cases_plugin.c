/*
 * The functions of the shared cases (tests/cases/colocated.json) that the C
 * runner (tests/c/test_shared_cases.c) calls on a worker, which serves them
 * from this plugin (`colocated worker --plugin`): a controller cannot make a
 * worker load its code. It registers
 *
 *   add_one  each output shard is its input shard plus one (float32 or
 *            int32; output i shaped like argument i);
 *   first    the output's shards are argument 0's, as they are.
 *
 * Plugin functions fill outputs the program declares: the runner declares
 * them, from the first call's inputs. The tests build it at test time:
 *
 *   cc -std=c11 -shared -fPIC -I include tests/plugin/shared_cases_plugin.c -o libshared_cases_plugin.so
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

/* Checks that output shard `o` is shaped like input shard `i`. */
static uint32_t check_like(const colocated_plugin_call *call, size_t i, size_t o) {
  const colocated_plugin_array *in = &call->inputs[i];
  const colocated_plugin_array *out = &call->outputs[o];
  if (in->struct_size < sizeof *in || out->struct_size < sizeof *out) return COLOCATED_FAILED_PRECONDITION;
  if (in->dtype != out->dtype || in->size != out->size || in->device != out->device)
    return fail_with(call, COLOCATED_INVALID_ARGUMENT, "output shard %zu is not shaped like input shard %zu", o, i);
  if (in->dtype != COLOCATED_DTYPE_F32 && in->dtype != COLOCATED_DTYPE_I32)
    return fail_with(call, COLOCATED_INVALID_ARGUMENT, "takes float32 or int32 arrays, got dtype %u",
                     (unsigned)in->dtype);
  return 0;
}

static uint32_t add_one(void *user_data, const colocated_plugin_call *call) {
  (void)user_data;
  if (call->struct_size < COLOCATED_STRUCT_SIZE(colocated_plugin_call, message_capacity))
    return COLOCATED_FAILED_PRECONDITION;
  if (call->num_outputs != call->num_inputs)
    return fail_with(call, COLOCATED_INVALID_ARGUMENT, "add_one: %zu input shards but %zu output shards",
                     call->num_inputs, call->num_outputs);
  for (size_t i = 0; i < call->num_inputs; ++i) {
    uint32_t code = check_like(call, i, i);
    if (code != 0) return code;
    const colocated_plugin_array *in = &call->inputs[i];
    colocated_plugin_array *out = &call->outputs[i];
    size_t n = out->size / 4;
    if (in->dtype == COLOCATED_DTYPE_F32) {
      const float *x = in->data;
      float *y = out->data;
      for (size_t k = 0; k < n; ++k) y[k] = x[k] + 1.0f;
    } else {
      const int32_t *x = in->data;
      int32_t *y = out->data;
      for (size_t k = 0; k < n; ++k) y[k] = x[k] + 1;
    }
  }
  return 0;
}

static uint32_t first(void *user_data, const colocated_plugin_call *call) {
  (void)user_data;
  if (call->struct_size < COLOCATED_STRUCT_SIZE(colocated_plugin_call, message_capacity))
    return COLOCATED_FAILED_PRECONDITION;
  if (call->num_arguments == 0 || call->input_shard_counts[0] != call->num_outputs)
    return fail_with(call, COLOCATED_INVALID_ARGUMENT, "first: its output is not shaped like its argument 0");
  for (size_t o = 0; o < call->num_outputs; ++o) {
    uint32_t code = check_like(call, o, o);
    if (code != 0) return code;
    const colocated_plugin_array *in = &call->inputs[o];
    colocated_plugin_array *out = &call->outputs[o];
    if (out->size > 0) memcpy(out->data, in->data, out->size);
  }
  return 0;
}

static uint32_t add(const colocated_plugin_registrar *registrar, const char *name, colocated_plugin_function function) {
  return registrar->register_function(registrar->context, (const uint8_t *)name, strlen(name), function, NULL);
}

COLOCATED_PLUGIN_EXPORT uint32_t colocated_plugin_init(const colocated_plugin_registrar *registrar) {
  if (registrar->struct_size < COLOCATED_STRUCT_SIZE(colocated_plugin_registrar, register_function) ||
      registrar->api_version >> 16 != COLOCATED_API_VERSION_MAJOR)
    return COLOCATED_FAILED_PRECONDITION;
  uint32_t code;
  if ((code = add(registrar, "add_one", add_one)) != 0) return code;
  return add(registrar, "first", first);
}
