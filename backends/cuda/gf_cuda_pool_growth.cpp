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
// ends: other allocations keep torch's default, except those another thread makes during a
// window, which land in expandable segments too (torch supports segments of both kinds in one
// pool, and a setting switched at run time). The user's choice wins: where the allocator settings
// are not empty (PYTORCH_ALLOC_CONF or PYTORCH_CUDA_ALLOC_CONF set, or set at run time), graphed
// changes nothing, so expandable_segments:False keeps plain segments and expandable_segments:True
// has them everywhere already.
#include "gf_cuda_pool_growth.h"

#include <c10/cuda/CUDAAllocatorConfig.h>

#if __has_include(<c10/core/AllocatorConfig.h>)
#include <c10/core/AllocatorConfig.h>
#define GF_HAS_ALLOCATOR_SETTINGS 1
#else
#define GF_HAS_ALLOCATOR_SETTINGS 0
#endif

#include <mutex>
#include <string>

namespace graphed::cuda {
namespace {

std::mutex growth_mutex;
int windows_open = 0;     // under growth_mutex
bool switched_on = false; // under growth_mutex: graphed turned expandable segments on

#if GF_HAS_ALLOCATOR_SETTINGS
// The allocator settings as last set (from the environment or at run time), on a torch that keeps
// them; "?" (not empty: the user's, left alone) on one that does not. Found at compile time.
template <typename Config>
auto settings_of(int) -> decltype(std::string(Config::last_allocator_settings())) {
  return Config::last_allocator_settings();
}
template <typename Config> std::string settings_of(long) { return "?"; }

// The user left the allocator as torch starts it: no settings, plain segments.
bool settings_untouched() {
  return settings_of<c10::CachingAllocator::AcceleratorAllocatorConfig>(0).empty() &&
         !c10::cuda::CUDACachingAllocator::CUDAAllocatorConfig::expandable_segments();
}
#else
bool settings_untouched() { return false; } // an older torch: pools grow by plain segments
#endif

void switch_on() {
  c10::cuda::CUDACachingAllocator::setAllocatorSettings("expandable_segments:True");
}

// Back to torch's defaults: first the one setting torch does not reset where it is absent, then
// the empty settings the user had (which torch then reports again).
void switch_off() {
  c10::cuda::CUDACachingAllocator::setAllocatorSettings("expandable_segments:False");
  c10::cuda::CUDACachingAllocator::setAllocatorSettings("");
}

} // namespace

void pool_growth_begin() noexcept {
  try {
    std::lock_guard<std::mutex> lock(growth_mutex);
    if (windows_open++ == 0 && settings_untouched()) {
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
    if (--windows_open == 0 && switched_on) {
      switched_on = false;
      switch_off();
    }
  } catch (...) {
    // Left on: allocations after this use expandable segments, which torch supports everywhere.
  }
}

} // namespace graphed::cuda
