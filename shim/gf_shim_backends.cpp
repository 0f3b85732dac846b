// Fills the core's backend registry with the backends this build has, then runs the load-time
// choice, when the library loads. This is the one place that names the product's backends: the
// core only holds the registry, and each backend only offers its probe. Priorities give the order
// CUDA, then Level Zero. The tests' emulated backend is no part of the library: the test plugin
// (tests/plugin) registers it, by name only, through the same exported registry when a test loads
// it, and a runner gets it by naming it (create's `backend`).
extern "C" {
#include "gf_backend_registry.h"
#ifdef GF_WITH_CUDA
#include "gf_cuda_backend.h"
#endif
#ifdef GF_WITH_XPU
#include "gf_xpu_backend.h"
#endif
}

#include <c10/util/Logging.h>

namespace {

enum : int { kCudaPriority = 200, kXpuPriority = 100 };

void register_backend(const char *name, int priority, gf_backend_probe_fn probe) {
  gf_error err{};
  if (gf_backend_register(name, priority, probe, &err) != GF_OK) {
    LOG(WARNING) << err.message; // a fixed table of a handful: only a build error gets here
  }
}

struct RegisterBackendsAtLoad {
  RegisterBackendsAtLoad() {
#ifdef GF_WITH_CUDA
    register_backend("cuda", kCudaPriority, gf_cuda_backend_probe);
#endif
#ifdef GF_WITH_XPU
    register_backend("xpu", kXpuPriority, gf_xpu_backend_probe);
#endif
    gf_backend_choose();
  }
} register_backends_at_load;

} // namespace
