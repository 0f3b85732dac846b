/* Private to pyext/ (tests/python/test_layering.py keeps it so): the extension's two halves talk
 * through it. What the CPython entry point (pyext/) needs from libtorch, as plain C: recognise
 * tensor and torch leaf objects, describe a tensor without copying, and run one runner call
 * (directly, or through the dispatcher for the Python path) with the call state set, getting the
 * outputs back as new Python tensor objects. Definitions catch every C++ exception and return a
 * status. */
#ifndef GF_FASTCALL_TORCH_H
#define GF_FASTCALL_TORCH_H

#include <Python.h>

#include "gf_backend.h"
#include "gf_call_state.h"
#include "gf_status.h"
#include "gf_tensor.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when obj is exactly a torch.Tensor or an nn.Parameter: a tensor the C entry point takes.
 * Tensor subclasses (FakeTensor, functional wrappers, user subclasses) answer 0 and take the
 * Python path, which goes through the dispatcher where their modes can see the call. */
int gf_fastcall_torch_is_plain_tensor(PyObject *obj);

/* 1 when obj is any tensor, subclasses included. */
int gf_fastcall_torch_is_tensor(PyObject *obj);

/* 1 when obj is exactly a torch.dtype, torch.device, torch.Size, torch.layout or
 * torch.memory_format: torch values that cannot hold a tensor. */
int gf_fastcall_torch_is_plain_leaf(PyObject *obj);

enum {
  GF_DESCRIBE_OK = 0,
  GF_DESCRIBE_UNSUPPORTED = 1,   /* *why: the end of a sentence (TypeError) */
  GF_DESCRIBE_TOO_MANY_DIMS = 2, /* out->ndim holds the count (ValueError) */
};

/* A borrowed descriptor of a tensor object, valid while obj lives, after the one check both call
 * paths share (graphed::unsupported_tensor_reason: sparse, nested, mkldnn, meta, quantized,
 * sub-byte, storage-less functorch wrappers are refused) and the dimension limit. Never lets a
 * C++ exception out: anything torch throws is GF_DESCRIBE_UNSUPPORTED. */
int gf_fastcall_torch_describe(PyObject *obj, gf_tensor *out, const char **why);

/* The StorageImpl of `obj` (a tensor: gf_fastcall_torch_is_tensor), the key the capture's
 * inventory sorts storages by (what Python's `tensor.untyped_storage()._cdata` says), when the
 * tensor is on a device of type `device_type` (a c10::DeviceType; -1: any) and has a storage;
 * NULL otherwise. Never throws. */
const void *gf_fastcall_torch_storage_on(PyObject *obj, int device_type);
/* A weak reference to the StorageImpl of `obj` (a tensor) when gf_fastcall_torch_storage_on
 * gives one, NULL otherwise: it keeps the StorageImpl's address from being reused and says
 * whether the storage is still alive, without keeping its memory. Free it with
 * gf_fastcall_torch_storage_weak_free. Never throws. */
void *gf_fastcall_torch_storage_weak(PyObject *obj, int device_type);
/* The storage's key (as gf_fastcall_torch_storage_on gives it) while it is alive, else NULL. */
const void *gf_fastcall_torch_storage_weak_alive(void *weak);
void gf_fastcall_torch_storage_weak_free(void *weak);
/* The c10::DeviceType of a device type's name ("cuda", "xpu", "cpu"), or -1 for none. */
int gf_fastcall_torch_device_type(const char *name);

/* A watched tensor (pyext/gf_baked.h) as its check reads it: its TensorImpl, the StorageImpl it
 * held, that storage's data and the tensor's offset in it when armed. storage is NULL for a
 * tensor whose offset torch will not say (symbolic sizes): it is watched by its dicts alone. */
typedef struct gf_watched_tensor {
  const void *impl; /* kept alive by the watch's reference to the tensor object */
  const void *storage;
  const void *data;
  int64_t offset;
} gf_watched_tensor;

/* Records `obj` (a tensor: gf_fastcall_torch_is_tensor) as it is now; never throws. */
void gf_fastcall_torch_watch_tensor(PyObject *obj, gf_watched_tensor *out);
/* 1 when any of `count` watched tensors holds another storage, its storage other data, or it
 * another offset; 0 otherwise. The per-call check of gf_baked_changed: three loads a tensor, all
 * compared with what was recorded (no element size looked up, nothing computed). */
int gf_fastcall_torch_tensors_moved(const gf_watched_tensor *tensors, size_t count);
/* The tensor object a descriptor from gf_fastcall_torch_describe was made of (a new reference). */
PyObject *gf_fastcall_torch_object_of(const gf_tensor *tensor);

/* The call a runner call puts into a GraphedForward's call state while it holds the runner's
 * lock: `tree` (kwargs dict or TreeSpec), `key` (bytes) and `held` (the non-tensor keep_alive
 * objects). Outputs (new references, or NULL): `error`, the exception the forward recorded during
 * the call; `output_template`, after a call that succeeded, the template its outputs are rebuilt
 * with: the serving entry's (gf_entry.user, a (template, held) pair that a capture fills from what
 * its forward recorded, so that the entry holds `held` for its life), or for an eager call the one
 * its own forward recorded. */
typedef struct gf_call_in_flight {
  gf_call_state *state;
  PyObject *tree;
  PyObject *key;
  PyObject *held;
  PyObject *error;
  PyObject *output_template;
  /* how many calls the serving entry has served, this one included (0: it ran eager); copied
   * under the runner's lock, for verify's sampling after it (another thread's call may have
   * changed the state's by then) */
  unsigned long long served;
} gf_call_in_flight;

/* The fast path: one call of runner `runner_id` (see gf_runner_call) with inputs the walker
 * described, entered with the GIL held. When another thread holds the runner, the GIL is released
 * while waiting for it, so a forward running in that thread can take the GIL back. On success
 * *outputs is a new list of tensors. */
gf_status gf_fastcall_torch_call(int64_t runner_id, gf_call_in_flight *call, const void *key,
                                 size_t key_length, gf_tensor *inputs, size_t input_count,
                                 const gf_tensor *keep_alive, size_t keep_alive_count, int pin,
                                 int static_outputs, PyObject **outputs, gf_error *err);

/* The Python path: torch.ops.graphed.forward(runner_id, call->key, inputs, keep_alive, pin,
 * static_outputs) through the dispatcher (so FakeTensor and other modes see it), with the call
 * state set under the runner's lock as gf_fastcall_torch_call sets it. inputs and keep_alive are
 * lists of tensors. A Python exception raised inside is restored as it was. */
gf_status gf_fastcall_torch_call_dispatched(int64_t runner_id, gf_call_in_flight *call,
                                            PyObject *inputs, PyObject *keep_alive, int pin,
                                            int static_outputs, PyObject **outputs, gf_error *err);

/* Resets the runner (gf_runner_reset; gf_runner_drop_graphs, which keeps the churn guard, when
 * restart_churn is 0) under the runner's lock, waiting for it with the GIL released; the core
 * releases each entry's output template with the entry. `*at_limit`: the drop was not made, as
 * it would be the last of GF_STALE_LIMIT in a row (gf_runner_drop_graphs). */
gf_status gf_fastcall_torch_reset(int64_t runner_id, int restart_churn, int *at_limit,
                                  gf_error *err);

/* Selects the state the runner's calls are keyed in (gf_runner_select_state) under its lock.
 * `*at_limit`: a first-time state was not selected, as it would be the last of GF_STALE_LIMIT
 * drops in a row. */
gf_status gf_fastcall_torch_select_state(int64_t runner_id, uint64_t state, int first_time,
                                         int *at_limit, gf_error *err);

/* Verify mode's comparison of a sampled call (gf_runner_compare_later) on runner `runner_id`'s
 * device, under its lock: GF_ERR_NOT_FOUND, having queued nothing, where its backend cannot. */
gf_status gf_fastcall_torch_compare_later(int64_t runner_id, const gf_copy *pairs, size_t count,
                                          uint8_t *verdict, uint32_t *scratch, gf_error *err);

enum {
  GF_BYTE_PAIR_SAME_SHAPE = 0, /* *pair: both tensors' bytes, comparable as they lie */
  GF_BYTE_PAIR_DIFFERS = 1,    /* another dtype, device or shape */
  GF_BYTE_PAIR_ELSEWHERE = 2,  /* bytes that cannot tell: compare their values another way */
};

/* Verify mode's look at a pair of output tensors (plain tensors: gf_fastcall_torch_is_plain_tensor)
 * before their bytes are compared: the pair's addresses and byte count (left as dst, right as
 * src) and their device, where both are contiguous strided tensors of one dtype, device and shape
 * whose bytes are their values. Never lets a C++ exception out. */
int gf_fastcall_torch_byte_pair(PyObject *left, PyObject *right, gf_copy *pair, int *device_type,
                                int *device_index);

/* forward(**kwargs) with grad mode off (a new reference, or NULL with the exception set): verify
 * mode's eager run of a sampled call (pyext/gf_verify_sampled.c). */
PyObject *gf_fastcall_torch_call_without_grad(PyObject *forward, PyObject *kwargs);

/* 1 while torch.jit.trace records on this thread (torch._C._get_tracing_state() is not None), for
 * gf_module_call.c, which reads it without a Python call; never lets a C++ exception out. */
int gf_fastcall_torch_is_tracing(void);

/* Waits, with the GIL released, for everything queued on a CUDA device (torch.cuda.synchronize);
 * nothing for another device type. 0, or -1 when torch raised. */
int gf_fastcall_torch_synchronize(int device_type, int device_index);

/* The phase of the forward the runner of runner_call (a CallState's) is running: GF_PHASE_EAGER
 * outside one or when runner_call is NULL. */
int gf_fastcall_torch_phase(const void *runner_call);

/* Installs, for the plugin's kernels, the way to run work holding the GIL (see
 * shim/gf_shim_interpreter_lock.h): graphed::forward then releases a call's input tensors under
 * one acquisition instead of one per tensor. Called once, when the module loads. */
void gf_fastcall_torch_install_interpreter_lock(void);

/* Installs the release of the output templates cache entries hold (graphed::set_entry_user_release:
 * a decref taken under the GIL). Called once, when the module loads. */
void gf_fastcall_torch_install_template_release(void);

/* Raises the Python exception that matches a failed status (ValueError, TypeError or
 * RuntimeError) and returns NULL. */
PyObject *gf_fastcall_torch_raise(gf_status status, const gf_error *err);

/* Rewords err, when it is about an input (err->input_number), in torch's words with `subject`
 * (the input's kwarg path) as the input's name; see graphed::word_input_error. */
void gf_fastcall_torch_word_input_error(int64_t runner_id, PyObject *tensor, const char *subject,
                                        gf_error *err);

#ifdef __cplusplus
}
#endif

#endif /* GF_FASTCALL_TORCH_H */
