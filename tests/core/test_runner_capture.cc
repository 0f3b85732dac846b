// Tests of the capture protocol as the recording backend sees it: on a first call the sync probe,
// the warm-ups on the side stream and the capture in that order, then the replay that serves the
// call; a new shape captures again without the probe and with one warm-up; warmup_iters=0; an outer
// capture runs the call eager without disabling; and a hook or the forward failing during a capture
// disables the runner while the call still returns the eager result.
#include "gf_runner.h"
#include "gf_test_fakes.h"
#include "runner_fixture.h"

#include <gtest/gtest.h>

#include <string>

namespace {

using namespace runner_test;

// ---- the protocol ------------------------------------------------------------------------

TEST_F(Runner, FirstCallCapturesInProtocolOrderThenReplays) {
  config_.warmup_iters = 3;
  Create();
  EXPECT_STREQ(gf_runner_backend_name(runner_), "fake");
  EXPECT_STREQ(gf_runner_disabled_reason(runner_), "");
  Inputs inputs = MakeInputs(2, {2, 3}, 1.0f);
  CallExpectingCorrect(inputs);
  // The sync probe is the first of the warm-ups on the side stream.
  EXPECT_EQ(Log(), (Events{"warmup_begin", "probe_begin", "forward", "probe_end", "forward",
                           "forward", "warmup_end", "capture_begin", "forward", "capture_end",
                           "copy_batch(2)", "launch", "copy_batch(1)"}));
  EXPECT_EQ(host_.forward_calls, 4u);
  // With a process group the ranks meet before the live warm-ups, after each, and after the
  // capture: the counts of forwards run before each agreement.
  ASSERT_EQ(host_.agree_calls, 5u);
  for (uint64_t i = 0; i < 5; ++i) {
    EXPECT_EQ(host_.forwards_at_agreement[i], i) << "agreement " << i;
    EXPECT_EQ(host_.ok_at_agreement[i], 1) << "agreement " << i;
  }
  gf_runner_stats stats = Stats();
  EXPECT_EQ(stats.enabled, 1);
  EXPECT_EQ(stats.graphs, 1u);
  EXPECT_EQ(stats.captures, 1u);
  EXPECT_EQ(stats.replays, 1u);
  EXPECT_EQ(stats.eager_calls, 0u);
  EXPECT_EQ(stats.pool_bytes, 3 * 6 * 4); // two static inputs and one output of 6 floats
  EXPECT_EQ(backend_.live_graphs, 1);
  EXPECT_EQ(gf_runner_entry_replays(runner_, "key", 3, inputs.views.data(), 2), 1);
}

TEST_F(Runner, NewShapeCapturesAgainWithoutProbeAndOneWarmup) {
  config_.warmup_iters = 3;
  Create();
  Inputs small = MakeInputs(2, {2, 3}, 1.0f);
  CallExpectingCorrect(small);
  ClearLog();
  Inputs large = MakeInputs(2, {5}, 4.0f);
  CallExpectingCorrect(large);
  EXPECT_EQ(Log(), (Events{"warmup_begin", "forward", "warmup_end", "capture_begin", "forward",
                           "capture_end", "copy_batch(2)", "launch", "copy_batch(1)"}));
  EXPECT_EQ(Stats().captures, 2u);
  EXPECT_EQ(Stats().graphs, 2u);
  ClearLog();
  CallExpectingCorrect(small); // the first graph is still there
  EXPECT_EQ(Log(), (Events{"copy_batch(2)", "launch", "copy_batch(1)"}));
}

TEST_F(Runner, ZeroWarmupItersSkipsTheSideStream) {
  config_.warmup_iters = 0;
  Create();
  Inputs small = MakeInputs(1, {3}, 1.0f);
  CallExpectingCorrect(small);
  // The probe runs all the same, as the one warm-up of the first capture.
  EXPECT_EQ(Log(), (Events{"warmup_begin", "probe_begin", "forward", "probe_end", "warmup_end",
                           "capture_begin", "forward", "capture_end", "copy_batch(1)", "launch",
                           "copy_batch(1)"}));
  ClearLog();
  Inputs large = MakeInputs(1, {4}, 1.0f);
  CallExpectingCorrect(large);
  EXPECT_EQ(Log(), (Events{"capture_begin", "forward", "capture_end", "copy_batch(1)", "launch",
                           "copy_batch(1)"}));
}

TEST_F(Runner, OuterCaptureRunsEagerWithoutDisabling) {
  Create();
  backend_.outer_capture_active = 1;
  Inputs inputs = MakeInputs(2, {3}, 1.0f);
  CallExpectingCorrect(inputs);
  ExpectEagerOnly(Log());
  gf_runner_stats stats = Stats();
  EXPECT_EQ(stats.enabled, 1);
  EXPECT_EQ(stats.eager_calls, 1u);
  EXPECT_EQ(stats.captures, 0u);
  EXPECT_STREQ(gf_runner_disabled_reason(runner_), "");
  backend_.outer_capture_active = 0;
  ClearLog();
  CallExpectingCorrect(inputs);
  EXPECT_EQ(Log().at(1), "probe_begin");
  EXPECT_EQ(Stats().captures, 1u);
}

// ---- failures disable the runner ---------------------------------------------------------

class RunnerFailingHook : public Runner, public ::testing::WithParamInterface<gf_fake_hook> {};

TEST_P(RunnerFailingHook, FirstCallDisablesAndStillReturnsTheEagerResult) {
  gf_fake_hook hook = GetParam();
  std::string message = std::string("boom in ") + gf_fake_hook_name(hook);
  gf_fake_backend_fail(&backend_, hook, 0, message.c_str());
  Create();
  Inputs first = MakeInputs(2, {3}, 1.0f);
  CallExpectingCorrect(first);

  bool during_replay = hook == GF_FAKE_HOOK_COPY_BATCH || hook == GF_FAKE_HOOK_LAUNCH;
  std::string reason = Reason();
  EXPECT_TRUE(Contains(reason, message)) << reason;
  EXPECT_EQ(reason.rfind(during_replay ? "replay failed: " : "capture failed: ", 0), 0u) << reason;
  EXPECT_EQ(host_.last_agree_ok, during_replay ? 1 : 0) << "every rank must learn of the failure";
  EXPECT_GE(host_.warn_count, 1u);
  EXPECT_TRUE(Contains(LastWarning(), message)) << LastWarning();
  gf_runner_stats stats = Stats();
  EXPECT_EQ(stats.enabled, 0);
  EXPECT_EQ(stats.graphs, 0u);
  EXPECT_EQ(stats.pool_bytes, 0);
  EXPECT_EQ(stats.eager_calls, 1u);
  EXPECT_EQ(backend_.live_graphs, 0);

  // Later calls run eager even when the hook would work again.
  gf_fake_backend_fail(&backend_, GF_FAKE_HOOK_NONE, 0, nullptr);
  ClearLog();
  Inputs second = MakeInputs(2, {3}, 8.0f);
  CallExpectingCorrect(second);
  ExpectEagerOnly(Log());
  EXPECT_EQ(Stats().eager_calls, 2u);
  EXPECT_EQ(Stats().captures, during_replay ? 1u : 0u);
  EXPECT_EQ(Reason(), reason);
}

INSTANTIATE_TEST_SUITE_P(EveryHook, RunnerFailingHook,
                         ::testing::Values(GF_FAKE_HOOK_PROBE_BEGIN, GF_FAKE_HOOK_PROBE_END,
                                           GF_FAKE_HOOK_WARMUP_BEGIN, GF_FAKE_HOOK_WARMUP_END,
                                           GF_FAKE_HOOK_CAPTURE_BEGIN, GF_FAKE_HOOK_CAPTURE_END,
                                           GF_FAKE_HOOK_COPY_BATCH, GF_FAKE_HOOK_LAUNCH),
                         [](const ::testing::TestParamInfo<gf_fake_hook> &info) {
                           return std::string(gf_fake_hook_name(info.param));
                         });

TEST_F(Runner, CaptureEndFailingOnALaterCaptureDropsEveryGraph) {
  Create();
  Inputs a = MakeInputs(2, {3}, 1.0f);
  CallExpectingCorrect(a);
  ReleaseResults();
  EXPECT_EQ(backend_.live_graphs, 1);
  gf_fake_backend_fail(&backend_, GF_FAKE_HOOK_CAPTURE_END, 0, "instantiate ran out of memory");
  Inputs b = MakeInputs(2, {4}, 1.0f);
  ClearLog();
  CallExpectingCorrect(b);
  EXPECT_EQ(Log(), (Events{"warmup_begin", "forward", "warmup_end", "capture_begin", "forward",
                           "capture_end", "release_graph", "forward"}));
  EXPECT_TRUE(Contains(Reason(), "instantiate ran out of memory")) << Reason();
  gf_runner_stats stats = Stats();
  EXPECT_EQ(stats.enabled, 0);
  EXPECT_EQ(stats.graphs, 0u);
  EXPECT_EQ(stats.pool_bytes, 0);
  EXPECT_EQ(stats.captures, 1u);
  EXPECT_EQ(backend_.live_graphs, 0);
  ReleaseResults();
  EXPECT_EQ(host_.live_handles, 0) << "dropped graphs give back their static buffers";
  // The shape that had a graph runs eager now.
  ClearLog();
  CallExpectingCorrect(a);
  ExpectEagerOnly(Log());
  EXPECT_EQ(Stats().eager_calls, 2u);
}

TEST_F(Runner, ForwardFailingDuringCaptureDisables) {
  host_.fail_forward_while_capturing = 1;
  Create();
  Inputs inputs = MakeInputs(2, {3}, 1.0f);
  CallExpectingCorrect(inputs);
  EXPECT_EQ(Log(), (Events{"warmup_begin", "probe_begin", "forward", "probe_end", "forward",
                           "warmup_end", "capture_begin", "forward", "capture_end", "forward"}))
      << "capture_end must close the capture also when the forward failed";
  EXPECT_TRUE(Contains(Reason(), "fake forward failed during capture")) << Reason();
  EXPECT_EQ(host_.last_agree_ok, 0);
  EXPECT_EQ(Stats().enabled, 0);
  EXPECT_EQ(Stats().eager_calls, 1u);
  EXPECT_EQ(Stats().captures, 0u);
}

} // namespace
