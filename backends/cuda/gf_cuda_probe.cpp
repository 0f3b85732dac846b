// Why this exists: the sync probe. A captured graph cannot hold a host synchronization, so the
// first validated forward runs under torch's sync-debug mode "warn", and each synchronizing
// operator it calls is counted, not raised: mode "error" would raise in the middle of the forward,
// leaving the collectives after that point unrun on this rank while its peers run them; "warn" lets
// the forward finish. The warning handler installed on the probing thread (SyncRecorder) counts
// the warnings that start with GF_SYNC_WARNING and passes the rest on. Operators called from
// Python report to Python's warnings instead (its bindings install their own handler), where
// graphed's Python layer listens during the probe for the same text.
#include "gf_cuda_torch_internal.h"

#include "gf_sync_warning.h"
#include "gf_torch_errors.h"

#include <c10/cuda/CUDAFunctions.h>

#include <mutex>

using graphed::cuda::torch_runner_of;

void graphed::cuda::SyncRecorder::process(const c10::Warning &warning) {
  if (warning.msg().rfind(GF_SYNC_WARNING, 0) == 0) {
    ++syncs;
    return;
  }
  if (passed_on != nullptr) {
    passed_on->process(warning);
  }
}

namespace {

// torch's sync-debug mode is one setting for the process, while probes run per runner and may
// overlap on several threads: the first probe to begin saves the mode and sets "warn", the last
// to end puts the saved mode back.
std::mutex probes_mutex;
int probes_running = 0;
c10::cuda::SyncDebugMode mode_before_probes = c10::cuda::SyncDebugMode::L_DISABLED;

} // namespace

extern "C" gf_status gf_cuda_torch_sync_probe_begin(void *, void *state, gf_error *err) {
  gf_cuda_torch_runner *runner = torch_runner_of(state);
  try {
    std::lock_guard<std::mutex> lock(probes_mutex);
    auto &warnings = c10::cuda::warning_state();
    if (probes_running++ == 0) {
      mode_before_probes = warnings.get_sync_debug_mode();
      warnings.set_sync_debug_mode(c10::cuda::SyncDebugMode::L_WARN);
    }
  } catch (...) {
    return graphed::status_of_current_exception(err, "graphed: starting the sync probe failed");
  }
  runner->sync_recorder.syncs = 0;
  runner->sync_recorder.passed_on = c10::WarningUtils::get_warning_handler();
  c10::WarningUtils::set_warning_handler(&runner->sync_recorder);
  return GF_OK;
}

extern "C" gf_status gf_cuda_torch_sync_probe_end(void *, void *state, gf_error *err) {
  gf_cuda_torch_runner *runner = torch_runner_of(state);
  c10::WarningUtils::set_warning_handler(runner->sync_recorder.passed_on);
  try {
    std::lock_guard<std::mutex> lock(probes_mutex);
    if (--probes_running == 0) {
      c10::cuda::warning_state().set_sync_debug_mode(mode_before_probes);
    }
  } catch (...) {
    return graphed::status_of_current_exception(err, "graphed: ending the sync probe failed");
  }
  runner->sync_recorder.passed_on = nullptr;
  if (runner->sync_recorder.syncs > 0) {
    return gf_error_set(err, GF_ERR_CAPTURE,
                        "graphed: the forward " GF_SYNC_WARNING
                        " (%d time(s) during graphed's sync probe); a captured graph cannot hold "
                        "a host synchronization: take it out of the forward, or leave this module "
                        "eager",
                        runner->sync_recorder.syncs);
  }
  return GF_OK;
}
