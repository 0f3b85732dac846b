// Tests of how a runner meets the other ranks of its process group through the host's agreement:
// not at all without a group; with one, before the live warm-ups, after each and after the capture.
// A failure on any rank (its probe, a warm-up, the side stream, the capture, or the collective
// itself) stops every rank before its next live forward and disables them together; the forward's
// own error is a failure of the group with a group, and the caller's without one.
#include "gf_runner.h"
#include "gf_test_fakes.h"
#include "runner_fixture.h"

#include <gtest/gtest.h>

namespace {

using namespace runner_test;

TEST_F(Runner, WithoutAGroupNoAgreementIsAsked) {
  host_.no_group = 1;
  config_.warmup_iters = 3;
  Create();
  Inputs inputs = MakeInputs(2, {2, 3}, 1.0f);
  CallExpectingCorrect(inputs);
  EXPECT_EQ(host_.agree_calls, 0u);
  EXPECT_EQ(Stats().captures, 1u);
  EXPECT_EQ(host_.forward_calls, 4u);
}

TEST_F(Runner, AnotherRankFailingItsProbeStopsTheWarmUpsOnThisRankToo) {
  host_.agree_forced = 1;
  host_.agree_value = 0;
  host_.agree_forced_from = 2; // the agreement after the probe
  config_.warmup_iters = 3;
  Create();
  Inputs inputs = MakeInputs(2, {3}, 1.0f);
  CallExpectingCorrect(inputs);
  // No live forward after the one every rank ran: the warm-ups and the capture are skipped.
  EXPECT_EQ(Log(), (Events{"warmup_begin", "probe_begin", "forward", "probe_end", "warmup_end",
                           "forward"}));
  EXPECT_EQ(host_.agree_calls, 3u) << "before the warm-ups, after the probe, and the final one";
  EXPECT_TRUE(Contains(Reason(), "another rank of the process group failed in its sync probe"))
      << Reason();
  EXPECT_EQ(Stats().enabled, 0);
  EXPECT_EQ(Stats().captures, 0u);
  EXPECT_EQ(backend_.live_graphs, 0);
}

TEST_F(Runner, AWarmUpFailingOnThisRankStopsBeforeAnyFurtherLiveForward) {
  host_.fail_forward_number = 2; // the warm-up after the probe
  config_.warmup_iters = 3;
  Create();
  Inputs inputs = MakeInputs(2, {3}, 1.0f);
  CallExpectingCorrect(inputs);
  ASSERT_EQ(host_.agree_calls, 4u);
  const uint64_t forwards[] = {0, 1, 2, 2};
  const int oks[] = {1, 1, 0, 0};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(host_.forwards_at_agreement[i], forwards[i]) << "agreement " << i;
    EXPECT_EQ(host_.ok_at_agreement[i], oks[i]) << "agreement " << i;
  }
  EXPECT_TRUE(Contains(Reason(), "fake forward failed")) << Reason();
  EXPECT_EQ(Stats().enabled, 0);
  EXPECT_EQ(host_.forward_calls, 3u) << "probe, the failing warm-up, then the eager run";
}

TEST_F(Runner, TheForwardsOwnErrorInAWarmUpIsAFailureOfTheGroup) {
  host_.fail_forward_number = 2; // the warm-up after the probe
  host_.forward_error_is_own = 1;
  Create();
  Inputs inputs = MakeInputs(2, {3}, 1.0f);
  CallExpectingCorrect(inputs); // the eager run after the disable
  EXPECT_EQ(Stats().enabled, 0) << "with a group every rank disables together";
  EXPECT_EQ(host_.last_agree_ok, 0);
}

TEST_F(Runner, TheForwardsOwnErrorWithoutAGroupIsTheCallersAndKeepsTheRunner) {
  host_.no_group = 1;
  host_.fail_forward_number = 2;
  host_.forward_error_is_own = 1;
  Create();
  Inputs inputs = MakeInputs(2, {3}, 1.0f);
  Result result = Call(inputs.views);
  EXPECT_EQ(result.status, GF_ERR_FORWARD);
  EXPECT_EQ(Stats().enabled, 1);
}

TEST_F(Runner, ASideStreamFailingOnThisRankIsAgreedBeforeAnyLiveForward) {
  host_.agree_forced = 1;
  host_.agree_value = 0; // the peers learn that this rank failed; so does this rank
  gf_fake_backend_fail(&backend_, GF_FAKE_HOOK_WARMUP_BEGIN, 0, "no side stream");
  Create();
  Inputs inputs = MakeInputs(2, {3}, 1.0f);
  CallExpectingCorrect(inputs);
  ASSERT_EQ(host_.agree_calls, 2u);
  EXPECT_EQ(host_.forwards_at_agreement[0], 0u);
  EXPECT_EQ(host_.ok_at_agreement[0], 0);
  EXPECT_EQ(host_.forward_calls, 1u) << "only the eager run";
  EXPECT_TRUE(Contains(Reason(), "no side stream")) << Reason();
}

TEST_F(Runner, AnotherRankFailingDisables) {
  host_.agree_forced = 1;
  host_.agree_value = 0;
  host_.agree_forced_from = 5; // the final agreement, after the capture
  config_.warmup_iters = 3;
  Create();
  Inputs inputs = MakeInputs(2, {3}, 1.0f);
  CallExpectingCorrect(inputs);
  EXPECT_EQ(host_.last_agree_ok, 1) << "this rank's own capture succeeded";
  EXPECT_TRUE(Contains(Reason(), "another rank")) << Reason();
  EXPECT_TRUE(Contains(LastWarning(), "another rank")) << LastWarning();
  gf_runner_stats stats = Stats();
  EXPECT_EQ(stats.enabled, 0);
  EXPECT_EQ(stats.graphs, 0u);
  EXPECT_EQ(stats.captures, 0u);
  EXPECT_EQ(stats.eager_calls, 1u);
  EXPECT_EQ(backend_.live_graphs, 0) << "the graph this rank captured is released";
  ClearLog();
  CallExpectingCorrect(inputs);
  ExpectEagerOnly(Log());
}

TEST_F(Runner, AgreementErrorCountsAsFailure) {
  host_.agree_forced = 1;
  host_.agree_value = -1; // the collective itself failed
  Create();
  Inputs inputs = MakeInputs(1, {3}, 1.0f);
  CallExpectingCorrect(inputs);
  EXPECT_EQ(Stats().enabled, 0);
  EXPECT_TRUE(Contains(Reason(), "the agreement across the process group failed")) << Reason();
  EXPECT_EQ(host_.forward_calls, 1u) << "the first agreement failed: no live warm-up ran";
}

} // namespace
