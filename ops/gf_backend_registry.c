/* The backend registry (see gf_backend_registry.h): a small fixed table, because a build has a
 * handful of backends and registration happens once at load. */
#include "gf_backend_registry.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

enum { GF_BACKEND_NAME_CAPACITY = 32, GF_BACKEND_REASON_CAPACITY = 1024 };

typedef struct gf_backend_entry {
  char name[GF_BACKEND_NAME_CAPACITY];
  int priority;
  gf_backend_probe_fn probe;
} gf_backend_entry;

static gf_backend_entry gf_entries[GF_BACKEND_REGISTRY_CAPACITY];
static size_t gf_entry_count;
static const gf_backend *gf_chosen;
static char gf_choice_reason[GF_BACKEND_REASON_CAPACITY] = "no backend was chosen yet";

static gf_backend_entry *gf_backend_entry_named(const char *name) {
  for (size_t i = 0; i < gf_entry_count; ++i) {
    if (strcmp(gf_entries[i].name, name) == 0) {
      return &gf_entries[i];
    }
  }
  return NULL;
}

gf_status gf_backend_register(const char *name, int priority, gf_backend_probe_fn probe,
                              gf_error *err) {
  if (name == NULL || name[0] == '\0' || strlen(name) >= GF_BACKEND_NAME_CAPACITY ||
      probe == NULL || strcmp(name, "none") == 0) {
    return gf_error_set(err, GF_ERR_INVALID_ARGUMENT,
                        "graphed: a backend needs a name of 1 to %d characters other than "
                        "'none', and a probe",
                        GF_BACKEND_NAME_CAPACITY - 1);
  }
  gf_backend_entry *entry = gf_backend_entry_named(name);
  if (entry == NULL) {
    if (gf_entry_count == GF_BACKEND_REGISTRY_CAPACITY) {
      return gf_error_set(err, GF_ERR_NO_MEMORY, "graphed: the backend registry is full (%d)",
                          GF_BACKEND_REGISTRY_CAPACITY);
    }
    entry = &gf_entries[gf_entry_count++];
  }
  snprintf(entry->name, sizeof entry->name, "%s", name);
  entry->priority = priority;
  entry->probe = probe;
  return GF_OK;
}

const gf_backend *gf_backend_find(const char *name, char *why, size_t why_capacity) {
  if (name != NULL && strcmp(name, "none") == 0) {
    return gf_backend_none();
  }
  const gf_backend_entry *entry = name != NULL ? gf_backend_entry_named(name) : NULL;
  if (entry == NULL) {
    char names[256];
    gf_backend_list(names, sizeof names);
    snprintf(why, why_capacity, "no backend named '%s' is registered (registered: %s)",
             name != NULL ? name : "", names);
    return NULL;
  }
  return entry->probe(why, why_capacity);
}

/* Appends to text, which holds *used characters; stops quietly at its capacity. */
static void gf_backend_append(char *text, size_t capacity, size_t *used, const char *format, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;
static void gf_backend_append(char *text, size_t capacity, size_t *used, const char *format, ...) {
  if (*used + 1 >= capacity) {
    return;
  }
  va_list args;
  va_start(args, format);
  int written = vsnprintf(text + *used, capacity - *used, format, args);
  va_end(args);
  if (written > 0) {
    *used += (size_t)written < capacity - *used ? (size_t)written : capacity - *used - 1;
  }
}

/* The entries that gf_backend_choose probes, by descending priority (registration order breaks
 * ties). */
static size_t gf_backend_by_priority(const gf_backend_entry **sorted) {
  size_t count = 0;
  for (size_t i = 0; i < gf_entry_count; ++i) {
    size_t at = count++;
    while (at > 0 && sorted[at - 1]->priority < gf_entries[i].priority) {
      sorted[at] = sorted[at - 1];
      --at;
    }
    sorted[at] = &gf_entries[i];
  }
  return count;
}

void gf_backend_choose(void) {
  const gf_backend_entry *sorted[GF_BACKEND_REGISTRY_CAPACITY];
  const size_t count = gf_backend_by_priority(sorted);
  char refusals[GF_BACKEND_REASON_CAPACITY] = "";
  size_t used = 0;
  for (size_t i = 0; i < count; ++i) {
    if (sorted[i]->priority == GF_BACKEND_BY_NAME_ONLY) {
      continue;
    }
    char why[256] = "";
    const gf_backend *backend = sorted[i]->probe(why, sizeof why);
    if (backend != NULL) {
      gf_chosen = backend;
      snprintf(gf_choice_reason, sizeof gf_choice_reason, "backend %s chosen at load",
               backend->name);
      return;
    }
    gf_backend_append(refusals, sizeof refusals, &used, "%s%s: %s", used ? "; " : "",
                      sorted[i]->name, why[0] ? why : "refused");
  }
  snprintf(gf_choice_reason, sizeof gf_choice_reason, "no graph-capable device: %s",
           used ? refusals : "graphed was built with no device backend");
  gf_backend_none_set_reason(gf_choice_reason);
  gf_chosen = gf_backend_none();
}

const gf_backend *gf_backend_current(void) {
  return gf_chosen != NULL ? gf_chosen : gf_backend_none();
}

const char *gf_backend_choice_reason(void) { return gf_choice_reason; }

void gf_backend_list(char *names, size_t names_capacity) {
  const gf_backend_entry *sorted[GF_BACKEND_REGISTRY_CAPACITY];
  const size_t count = gf_backend_by_priority(sorted);
  size_t used = 0;
  if (names_capacity == 0) {
    return;
  }
  names[0] = '\0';
  for (size_t i = 0; i < count; ++i) {
    gf_backend_append(names, names_capacity, &used, "%s, ", sorted[i]->name);
  }
  gf_backend_append(names, names_capacity, &used, "none");
}
