/* The load-time choice of backend, in the order CUDA, then Level Zero (XPU), then none, as the
 * serving stack picks its platform. Each compiled-in backend offers a probe that answers from
 * what is installed (a driver library that loads, a device that answers) without creating device
 * contexts; a platform that is absent costs one failed probe and nothing else. */
#include "gf_backend.h"
#include "gf_backend_probes.h"

#include <stdio.h>
#include <string.h>

static const gf_backend *gf_chosen_backend = NULL;
static char gf_choice_reason[768] = "the backend was not chosen yet";

void gf_backend_choose(void) {
  char cuda_why[256] = "graphed was built without the CUDA backend";
  char xpu_why[256] = "graphed was built without the Level Zero backend";
  const gf_backend *chosen = NULL;
#ifdef GF_WITH_CUDA
  chosen = gf_cuda_backend_probe(cuda_why, sizeof cuda_why);
#endif
#ifdef GF_WITH_XPU
  if (chosen == NULL) {
    chosen = gf_xpu_backend_probe(xpu_why, sizeof xpu_why);
  }
#endif
  if (chosen != NULL) {
    snprintf(gf_choice_reason, sizeof gf_choice_reason, "backend %s chosen at load", chosen->name);
    gf_chosen_backend = chosen;
    return;
  }
  snprintf(gf_choice_reason, sizeof gf_choice_reason, "no graph-capable device: CUDA: %s; XPU: %s",
           cuda_why, xpu_why);
  gf_chosen_backend = gf_backend_none();
}

const gf_backend *gf_backend_current(void) {
  if (gf_chosen_backend == NULL) {
    gf_backend_choose();
  }
  return gf_chosen_backend;
}

const char *gf_backend_choice_reason(void) { return gf_choice_reason; }
