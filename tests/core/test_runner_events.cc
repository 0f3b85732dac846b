// Tests of what the runner tells its host, for the logs users read: one event per capture (how
// long it took, the entry's bytes and shapes), one per eviction, one when the runner is disabled
// after creation, and one (only one) when captures keep evicting.
#include "gf_runner.h"
#include "gf_test_fakes.h"
#include "runner_fixture.h"

#include <gtest/gtest.h>

#include <string>

namespace {

using namespace runner_test;

class RunnerEvents : public Runner {
protected:
  void SetUp() override {
    Runner::SetUp();
    host_.observe = 1;
  }
};

TEST_F(RunnerEvents, ACaptureIsToldWithItsCostAndShapes) {
  Create();
  Inputs inputs = MakeInputs(2, {2, 3}, 1.0f);
  CallExpectingCorrect(inputs);
  ASSERT_EQ(host_.events[GF_EVENT_CAPTURED], 1u);
  const gf_event &captured = host_.last_event[GF_EVENT_CAPTURED];
  EXPECT_GE(captured.seconds, 0.0);
  EXPECT_EQ(captured.device_bytes, -1) << "the fake backend cannot say";
  EXPECT_EQ(captured.reserved_bytes, -1) << "nor what the device holds";
  EXPECT_EQ(captured.static_bytes, 3 * 6 * 4) << "two static inputs and one output of 6 floats";
  EXPECT_EQ(captured.input_count, 2u);
  CallExpectingCorrect(inputs); // a replay tells nothing
  EXPECT_EQ(host_.events[GF_EVENT_CAPTURED], 1u);
  EXPECT_EQ(host_.events[GF_EVENT_EVICTED], 0u);
  EXPECT_EQ(host_.events[GF_EVENT_DISABLED], 0u);
}

TEST_F(RunnerEvents, EvictionsAreToldButResetsAndDestroyAreNot) {
  config_.max_entries = 1;
  Create();
  Inputs small = MakeInputs(1, {2}, 1.0f);
  Inputs large = MakeInputs(1, {5}, 1.0f);
  CallExpectingCorrect(small);
  CallExpectingCorrect(large);
  ASSERT_EQ(host_.events[GF_EVENT_EVICTED], 1u);
  EXPECT_EQ(host_.last_event[GF_EVENT_EVICTED].input_count, 1u);
  EXPECT_EQ(host_.last_event[GF_EVENT_EVICTED].static_bytes, 2 * 2 * 4);
  gf_runner_reset(runner_);
  EXPECT_EQ(host_.events[GF_EVENT_EVICTED], 1u);
}

TEST_F(RunnerEvents, ADisableIsToldOnceWithItsReason) {
  Create();
  gf_runner_disable(runner_, GF_CAUSE_USER, "the operator said so");
  gf_runner_disable(runner_, GF_CAUSE_USER, "again");
  ASSERT_EQ(host_.events[GF_EVENT_DISABLED], 1u);
  EXPECT_EQ(std::string(host_.last_event[GF_EVENT_DISABLED].message), "the operator said so");
}

TEST_F(RunnerEvents, AFailedCaptureIsToldAsADisable) {
  gf_fake_backend_fail(&backend_, GF_FAKE_HOOK_CAPTURE_END, 0, "instantiate failed");
  Create();
  Inputs inputs = MakeInputs(1, {3}, 1.0f);
  CallExpectingCorrect(inputs);
  ASSERT_EQ(host_.events[GF_EVENT_DISABLED], 1u);
  EXPECT_TRUE(Contains(host_.last_event[GF_EVENT_DISABLED].message, "capture failed"))
      << host_.last_event[GF_EVENT_DISABLED].message;
  EXPECT_EQ(host_.events[GF_EVENT_CAPTURED], 0u);
  EXPECT_EQ(host_.warn_count, 0u) << "a host that observes hears of the disable once, as an event";
}

TEST_F(RunnerEvents, TheChurnGuardStartingIsTold) {
  host_.no_group = 1;
  config_.churn_limit = 2;
  Create();
  for (int64_t rows = 1; rows <= 8; ++rows) {
    Inputs inputs = MakeInputs(1, {rows}, 1.0f);
    CallExpectingCorrect(inputs);
  }
  EXPECT_EQ(Stats().captures, 2u);
  ASSERT_EQ(host_.events[GF_EVENT_CHURN], 1u);
  const gf_event &churn = host_.last_event[GF_EVENT_CHURN];
  EXPECT_EQ(churn.count, 2u) << "the captures before the guard";
  EXPECT_TRUE(Contains(churn.message, "3 new keys in a row, none reused")) << churn.message;
}

TEST_F(RunnerEvents, UnguardedCapturesThatKeepEvictingAreToldOnce) {
  config_.max_entries = 1; // churn_limit 0: every new key captures
  Create();
  for (int64_t rows = 1; rows <= 8; ++rows) {
    Inputs inputs = MakeInputs(1, {rows}, 1.0f);
    CallExpectingCorrect(inputs);
  }
  EXPECT_EQ(Stats().captures, 8u);
  EXPECT_EQ(host_.events[GF_EVENT_CHURN], 0u) << "no guard: its own kind";
  ASSERT_EQ(host_.events[GF_EVENT_THRASH], 1u);
  const gf_event &churn = host_.last_event[GF_EVENT_THRASH];
  EXPECT_EQ(churn.count, 5u) << "said at the first capture past 4 x max_entries";
  EXPECT_TRUE(Contains(churn.message, "5 captures and 4 evictions with max_entries=1"))
      << churn.message;
}

TEST_F(RunnerEvents, CreatingADisabledRunnerTellsNothing) {
  config_.enabled = 0;
  Create();
  EXPECT_EQ(host_.events[GF_EVENT_DISABLED], 0u);
}

} // namespace

// A backend that can say what the device holds: each capture's event and entry carry the growth,
// and stats what the runner's pool holds.
TEST_F(RunnerEvents, ACaptureSaysWhatItAddedToTheMemoryTheDeviceHolds) {
  static int64_t held = 1000;
  backend_.table.device_bytes_reserved = [](void *, void *) -> int64_t { return held += 256; };
  backend_.table.pool_bytes_reserved = [](void *, void *) -> int64_t { return 4096; };
  Create();
  CallExpectingCorrect(MakeInputs(1, {2}, 1.0f));
  EXPECT_EQ(host_.last_event[GF_EVENT_CAPTURED].reserved_bytes, 256) << "after minus before";
  int64_t entry_reserved = 0;
  gf_runner_visit_entries(
      runner_,
      [](void *context, const gf_entry_info *info) {
        *static_cast<int64_t *>(context) = info->reserved_bytes;
      },
      &entry_reserved);
  EXPECT_EQ(entry_reserved, 256);
  gf_runner_stats stats{};
  gf_runner_get_stats(runner_, &stats);
  EXPECT_EQ(stats.pool_reserved_bytes, 4096);
}
