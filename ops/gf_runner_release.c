/* What a runner gives back, which both of its halves need: one entry (the cache's release
 * callback, for an eviction, a clear or a capture that failed) and, when the runner fails, every
 * entry at once, for good (the disable). It is a file of its own so that the calls between the
 * runner's files only go down: gf_runner.c calls gf_capture.c and gf_replay.c, gf_runner.c and
 * gf_capture.c call this file, and this file calls none of them. */
#include "gf_runner_internal.h"

#include <stdio.h>
#include <string.h>

void gf_runner_release_entry(void *context, gf_entry *entry) {
  gf_runner *runner = context;
  if (runner->evicting) {
    gf_event evicted = gf_entry_event(GF_EVENT_EVICTED, entry);
    gf_runner_notify(runner, &evicted);
  }
  if (entry->graph != NULL && runner->backend->release_graph != NULL) {
    runner->backend->release_graph(runner->backend->context, runner->backend_state, entry->graph);
    entry->graph = NULL;
  }
  if (entry->device_bytes > 0) {
    runner->graph_bytes -= entry->device_bytes;
    entry->device_bytes = 0;
  }
  /* A buffer another entry still holds stays counted (the entry is out of the cache by now). */
  const int64_t still_held = gf_runner_shared_input_bytes(runner, entry);
  runner->pool_bytes -=
      gf_pool_release(&entry->static_inputs, gf_runner_release_handle, runner) - still_held;
  runner->pool_bytes -= gf_pool_release(&entry->static_outputs, gf_runner_release_handle, runner);
  gf_pool_release(&entry->keep_alive, gf_runner_release_handle, runner);
  if (entry->user != NULL && runner->host.release_user != NULL) {
    runner->host.release_user(runner->host.context, entry->user);
  }
  entry->user = NULL;
  gf_runner_release_inventory(runner, entry->inventory);
  entry->inventory = NULL;
}

/* gf_runner_internal.h: the first line of `text`, without the "graphed: " a message of the core
 * or the host starts with, there or after a ": " (a failure quotes another's message). */
void gf_text_said_once(char *reason, size_t capacity, const char *text) {
  static const char prefix[] = "graphed: ";
  const size_t prefix_length = sizeof prefix - 1;
  size_t length = 0;
  for (const char *at = text; *at != '\0' && *at != '\n' && length + 1 < capacity;) {
    const int starts_clause = at == text || (at - text >= 2 && at[-2] == ':' && at[-1] == ' ');
    if (starts_clause && strncmp(at, prefix, prefix_length) == 0) {
      at += prefix_length;
      continue;
    }
    reason[length++] = *at++;
  }
  reason[length] = '\0';
}

void gf_runner_set_disabled(gf_runner *runner, gf_disable_cause cause, const char *reason) {
  if (runner->enabled || runner->disabled_reason[0] == '\0') {
    gf_text_said_once(runner->disabled_reason, sizeof runner->disabled_reason,
                      reason && reason[0] ? reason : "disabled");
    runner->disabled_cause = cause != GF_CAUSE_NONE ? cause : GF_CAUSE_USER;
  }
  runner->enabled = 0;
}

void gf_runner_disable(gf_runner *runner, gf_disable_cause cause, const char *reason) {
  const int was_enabled = runner->enabled;
  gf_runner_set_disabled(runner, cause, reason);
  gf_cache_clear(&runner->cache);
  if (was_enabled) {
    gf_event disabled = {.kind = GF_EVENT_DISABLED,
                         .message = runner->disabled_reason,
                         .device_bytes = -1,
                         .reserved_bytes = -1};
    gf_runner_notify(runner, &disabled);
  }
}

/* Disables the runner for good and says so once: a host that observes got the disable as an event
 * (gf_runner_disable); any other is warned. */
void gf_runner_fail(gf_runner *runner, gf_disable_cause cause, const char *reason) {
  gf_runner_disable(runner, cause, reason);
  if (runner->host.notify != NULL) {
    return;
  }
  char message[GF_REASON_CAPACITY + 64];
  snprintf(message, sizeof message, "graphed: runner disabled, calls now run eager: %s",
           runner->disabled_reason);
  gf_runner_warn(runner, message);
}
