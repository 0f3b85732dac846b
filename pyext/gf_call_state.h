/* The call in flight of one GraphedForward, as the forward operator the core calls back reads it
 * (graphed._native._graphed_fastcall.CallState). Both call paths set it in
 * pyext/gf_fastcall_torch.cpp while the runner's lock is held and put the outer call back when
 * they return, so a nested call (the forward calling a GraphedForward, or the same one eagerly)
 * and calls from other threads each see their own. */
#ifndef GF_CALL_STATE_H
#define GF_CALL_STATE_H

#include <Python.h>

#ifdef __cplusplus
extern "C" {
#endif

/* tree: the kwargs dict of a fast-path call (the walker's tree; never read again: the forward's
 *   kwargs are decoded from `key`), the TreeSpec of a Python-path call, or None outside a call.
 * key: bytes, the key of the call in flight (b"" outside a call).
 * held: the non-tensor keep_alive objects of the call in flight (a tuple).
 * error: the exception the forward raised during the call in flight, or None.
 * recorded: the output template the forward recorded last in the call in flight (NULL before
 *   it ran): the template of an eager call, and the one a capture leaves in its entry.
 * rebuild: callable(template, outputs) for templates that are not plain.
 * last_key: bytes, the key of the latest fast-path call (NULL before one), reused by the next
 *   call whose walk gives the same bytes (see gf_fastcall.c).
 * served: how many calls the entry that served the latest call has served, that one included (0
 *   when it ran eager); verify mode compares the first ones with eager (graphed._verify).
 * baked: the watch of what the runner's graphs read besides their inputs (pyext/gf_baked.h), or
 *   NULL; both entries return CHANGED before anything else when it fires. */
typedef struct gf_call_state {
  // clang-format off
  PyObject_HEAD
  PyObject *tree;
  // clang-format on
  PyObject *key;
  PyObject *held;
  PyObject *error;
  PyObject *recorded;
  PyObject *rebuild;
  PyObject *last_key;
  unsigned long long served;
  struct gf_baked *baked;
} gf_call_state;

#ifdef __cplusplus
}
#endif

#endif /* GF_CALL_STATE_H */
