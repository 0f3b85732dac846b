/* Private to pyext/: how a GraphedForward's runner gets its forward and its observer as direct
 * hooks of the shim's host (graphed::DirectHooks, shim/gf_shim_host.h) instead of operators
 * registered per instance. See Note [The direct forward] in gf_model_hooks.cpp. */
#ifndef GF_MODEL_HOOKS_H
#define GF_MODEL_HOOKS_H

#include <Python.h>

#include "gf_call_state.h"
#include "gf_status.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Gives runner `runner_id` (made with an empty forward_op) `forward`, a callable(list of tensors)
 * -> list of tensors that the host calls for every forward the core runs, and `observer`, a
 * callable(kind, message, seconds, device_bytes, reserved_bytes, static_bytes, count, shapes)
 * told of the runner's events, or None. What a run reports besides its outputs is read from
 * `state` (CallState.record_error's kind, record_kept_state). The runner holds all three until it
 * is destroyed. Returns a status with err set on failure (no Python error set). */
gf_status gf_model_hooks_attach(int64_t runner_id, gf_call_state *state, PyObject *forward,
                                PyObject *observer, gf_error *err);

#ifdef __cplusplus
}
#endif

#endif /* GF_MODEL_HOOKS_H */
