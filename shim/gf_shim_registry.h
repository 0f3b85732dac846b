// The table of live runners, addressed from Python and from the dispatcher by a small integer id.
// Each runner has its own recursive mutex: calls into one runner are serialised (a forward may
// call back into graphed through another runner, or, eagerly, the same one).
#pragma once

#include <c10/core/Device.h>

#include <memory>
#include <mutex>
#include <string>

extern "C" {
#include "gf_runner.h"
}

namespace graphed {

struct RunnerSlot {
  gf_runner *runner = nullptr;
  std::recursive_mutex mutex;
  std::string name;
  c10::Device device{c10::kCPU}; // the runner's, for errors in torch's words
  ~RunnerSlot() { gf_runner_destroy(runner); }
};

// Takes ownership of runner; returns its id.
int64_t register_runner(gf_runner *runner, const std::string &name, c10::Device device);

// The slot of a live runner, or a ValueError naming the id.
std::shared_ptr<RunnerSlot> find_runner(int64_t id);

// Destroys a runner (its graphs and pools); later use of the id is a ValueError. False when no
// runner has that id.
bool unregister_runner(int64_t id);

} // namespace graphed
