// Why this exists: a graph pool that grows by plain segments keeps the segments its first, small
// captures made, and a larger shape captured after them cannot reuse them where its blocks do not
// fit: on an H200 (torch 2.11), the Stable Audio Open DiT's six latent lengths captured smallest
// first reserved 302 MiB where the largest alone takes 264 (and torch.compile's CUDAGraph Trees
// 284). With torch's expandable segments the pool is one range that grows in place, so the freed
// blocks of earlier graphs merge and serve the next: the same six shapes reserve 194 MiB, in any
// order, the largest alone 188 (Trees, under the same setting: 252).
//
// The setting is torch's, process-wide (PYTORCH_ALLOC_CONF's expandable_segments), and torch
// reads it at each allocation. graphed switches it on only for the windows in which it allocates
// into its pools (a warm-up or capture, under the pool's lock) and back off when the last window
// ends. Other allocations keep torch's default, except those another thread makes during a window,
// which land in expandable segments too: torch supports segments of both kinds side by side and a
// setting switched at run time, but with the setting off it does not hand out those blocks again,
// so they stay cached until torch.cuda.empty_cache() or an out-of-memory retry frees them.
//
// When graphed leaves the allocator alone:
// - The user's choice wins: where the allocator settings are not empty (PYTORCH_ALLOC_CONF or
//   PYTORCH_CUDA_ALLOC_CONF set, or set at run time), graphed changes nothing, so
//   expandable_segments:False keeps plain segments and expandable_segments:True has them
//   everywhere already. A window's end puts torch's defaults back only where the settings are
//   still what the window wrote: a user's setting made meanwhile stays.
// - A distributed job (WORLD_SIZE or MASTER_ADDR in the environment, as torchrun and
//   torch.distributed's env:// rendezvous set them): memory of expandable segments is shared
//   between processes through another path than cudaIpcGetMemHandle, and collective libraries
//   that register buffers or share them by IPC decide at their start from the allocator settings
//   whether they may, which graphed's switch would bypass. There the pools grow by plain segments,
//   unless the user sets expandable_segments:True for the whole process.
// - A torch without the settings graphed reads (before c10/core/AllocatorConfig.h).
#include "gf_cuda_pool_growth.h"

#include <c10/cuda/CUDAAllocatorConfig.h>

#if __has_include(<c10/core/AllocatorConfig.h>)
#include <c10/core/AllocatorConfig.h>
#define GF_HAS_ALLOCATOR_SETTINGS 1
#else
#define GF_HAS_ALLOCATOR_SETTINGS 0
#endif

#include <cstdlib>
#include <mutex>

namespace graphed::cuda {

bool pool_growth_wanted(const std::string &settings, bool expandable_already,
                        const char *(*environment)(const char *name)) noexcept {
  if (!settings.empty() || expandable_already) {
    return false;
  }
  for (const char *launch : {"WORLD_SIZE", "MASTER_ADDR"}) {
    const char *value = environment(launch);
    if (value != nullptr && value[0] != '\0') {
      return false;
    }
  }
  return true;
}

namespace {

std::mutex growth_mutex;
int windows_open = 0;     // under growth_mutex
bool switched_on = false; // under growth_mutex: graphed turned expandable segments on

const char *environment_of_process(const char *name) { return std::getenv(name); }

#if GF_HAS_ALLOCATOR_SETTINGS
// The allocator settings as last set (from the environment or at run time).
std::string settings_now() {
  return c10::CachingAllocator::AcceleratorAllocatorConfig::last_allocator_settings();
}
#else
std::string settings_now() { return "?"; } // not empty: an older torch keeps plain segments
#endif

bool wanted_now() {
  return pool_growth_wanted(
      settings_now(), c10::cuda::CUDACachingAllocator::CUDAAllocatorConfig::expandable_segments(),
      environment_of_process);
}

void switch_on() { c10::cuda::CUDACachingAllocator::setAllocatorSettings(kPoolGrowthSettings); }

// Back to torch's defaults, where the settings are still the ones switch_on wrote (a user's
// setting made since stays): first the one setting torch does not reset where it is absent, then
// the empty settings the user had (which torch then reports again).
void switch_off() {
  if (settings_now() != kPoolGrowthSettings) {
    return;
  }
  c10::cuda::CUDACachingAllocator::setAllocatorSettings("expandable_segments:False");
  c10::cuda::CUDACachingAllocator::setAllocatorSettings("");
}

} // namespace

void pool_growth_begin() noexcept {
  try {
    std::lock_guard<std::mutex> lock(growth_mutex);
    if (windows_open++ == 0 && wanted_now()) {
      switched_on = true; // set first, so that a switch that fails halfway is undone at the end
      switch_on();
    }
  } catch (...) {
    // The settings could not be read or parsed: the pool grows by plain segments.
  }
}

void pool_growth_end() noexcept {
  try {
    std::lock_guard<std::mutex> lock(growth_mutex);
    if (windows_open > 0 && --windows_open == 0 && switched_on) {
      switched_on = false;
      switch_off();
    }
  } catch (...) {
    // Left on: allocations after this use expandable segments, which torch supports everywhere.
  }
}

} // namespace graphed::cuda
