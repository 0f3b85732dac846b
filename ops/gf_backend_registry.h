/* The core's list of backends, filled from outside as c10's device-guard registry or SQLite's VFS
 * list are: the layer above registers each backend it was built with (a name, a priority and a
 * probe) when the library loads, then asks the registry to choose; a test plugin registers its
 * backend the same way when it is loaded (the library exports these functions). The core itself
 * names no backend except "none", which it owns and which is chosen when no probe accepts.
 *
 * Registration is meant for load time, of the library or of a plugin (one thread, before any
 * runner names the backend); lookups after that only read. */
#ifndef GF_BACKEND_REGISTRY_H
#define GF_BACKEND_REGISTRY_H

#include "gf_backend.h"
#include "gf_status.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Answers from what is installed (a driver library that loads, a device that answers) without
 * creating device contexts: the backend's table when the platform is present, else NULL and a
 * sentence in why. */
typedef const gf_backend *(*gf_backend_probe_fn)(char *why, size_t why_capacity);

enum {
  GF_BACKEND_REGISTRY_CAPACITY = 16,
  /* A priority for backends that are found by name only (a test plugin's), never chosen. */
  GF_BACKEND_BY_NAME_ONLY = -1
};

/* Adds a backend; registering a name again replaces its entry. Higher priorities are probed
 * first; GF_BACKEND_BY_NAME_ONLY is never probed by gf_backend_choose. */
gf_status gf_backend_register(const char *name, int priority, gf_backend_probe_fn probe,
                              gf_error *err);

/* Probes the backend registered under name ("none" always exists). NULL and a sentence in why
 * when no such backend is registered or its probe refuses. */
const gf_backend *gf_backend_find(const char *name, char *why, size_t why_capacity);

/* Probes every registered backend by descending priority and keeps the first that accepts; none
 * when no backend accepts, with every refusal in the reason. Run once at load, and again by tests
 * after changing the environment. */
void gf_backend_choose(void);

/* The backend chosen by the last gf_backend_choose (none before any), never NULL, and the
 * sentence that says why. */
const gf_backend *gf_backend_current(void);
const char *gf_backend_choice_reason(void);

/* The names registered, by descending priority, comma-separated, into names. */
void gf_backend_list(char *names, size_t names_capacity);

/* The backend that supports nothing: every runner made on it is disabled with `reason`'s copy as
 * its why, and every call runs eager. gf_backend_choose sets the reason when it falls back. */
const gf_backend *gf_backend_none(void);
void gf_backend_none_set_reason(const char *reason);

#ifdef __cplusplus
}
#endif

#endif /* GF_BACKEND_REGISTRY_H */
