/* Note [The watch]
 * What a GraphedForward's graphs read by address besides their inputs, watched between calls: the
 * module's parameters, buffers and tensor attributes, and the dicts that say which tensors,
 * submodules, hooks and modes the module has. A graph bakes in the addresses its capture saw; if a
 * parameter is re-assigned (`m.weight = nn.Parameter(w)`), swapped through `.data`, moved or
 * re-typed, or a submodule or hook is replaced, a replay would compute with what is gone. The
 * check runs before every GraphedForward call, in `call` (pyext/gf_fastcall.c; `call_flat` is only
 * reached after `call` returned FALLBACK, so the one check serves both), and must cost well under a
 * microsecond for a 24-block DiT's 300 tensors, so it only says "something may have changed"; the
 * Python layer then compares what it recorded (graphed._baked) and recaptures or runs eager.
 *
 * Cheap signals:
 *  - a tensor's data address (its storage's data plus its offset): `.data =`, `.to()`, `.half()`,
 *    an offload hook's move or a storage resize change it; an in-place update (`copy_`,
 *    `load_state_dict`, a LoRA fused into the same tensor) does not, and keeps replaying;
 *  - a mutation of any watched dict: on Python 3.12 and later through a dict watcher (one counter
 *    for the process, so the check reads one word), before that through each dict's version tag
 *    (PEP 509; one word per dict). The dicts are the modules' own (attributes, parameters,
 *    buffers, children, hooks) and the dicts their Python values hold (peft's `scaling`);
 *  - a watched list or set (peft's `merged_adapters`, `_active_adapter`) whose items differ from
 *    a copy made when armed: a length and a pointer per item, as neither has a watcher;
 *  - a swap of two tensors' contents anywhere in the process (torch.utils.swap_tensors, which
 *    graphed._watch wraps to count): one counter, read first, as a swapped parameter keeps its
 *    Python object and its module's dicts but not the TensorImpl the watch read.
 * Who does what: this file arms and checks (CallState.watch / watch_fired, and `call` before each
 * call, which returns CHANGED when it fires) and says what changed (watch_changes: the dicts from a
 * log of the latest mutations on 3.12+, from their version tags before; the lists, sets and
 * tensors by comparison), so that graphed._watch's Watch records again only the modules that read
 * them; the Watch records, compares and settles (what a change means: a recapture, or eager under
 * an offload hook). */
#ifndef GF_BAKED_H
#define GF_BAKED_H

#include <Python.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gf_baked gf_baked;

/* Installs the dict watcher where Python has one; 0, or -1 with a Python error. Once, at load. */
int gf_baked_init(void);

/* A watch of `dicts` (a list of dicts), `tensors` (a list of plain tensors) and `sequences` (a list
 * of lists and sets), recording their state now; the watch holds references to the lists' items.
 * NULL with a Python error. */
gf_baked *gf_baked_arm(PyObject *dicts, PyObject *tensors, PyObject *sequences);

/* 1 when a watched dict was mutated, a watched list's or set's items changed or a watched tensor's
 * data address changed since the watch was armed (or may have: another watched dict's mutation
 * counts too on Python 3.12+), else 0. Never raises. */
int gf_baked_changed(const gf_baked *baked);

/* What changed since the watch was armed: a new list of the watched dicts, lists, sets and tensors
 * that changed (each once), so that the Python layer records only what reads them again; None when
 * that cannot be told (a tensor swap, or more dict mutations than the log keeps), NULL with a
 * Python error. */
PyObject *gf_baked_changes(const gf_baked *baked);

void gf_baked_free(gf_baked *baked);

/* Counts a swap of two tensors' contents (torch.utils.swap_tensors), after which every watch
 * fires once: a swapped parameter keeps its Python object and dicts but not its TensorImpl. */
void gf_baked_note_swap(void);

#ifdef __cplusplus
}
#endif

#endif /* GF_BAKED_H */
