// Tests for the runner's folded replay path: a backend with capture_copy_node and launch_folded
// records the input and output copies into the graph, and each replay rewrites their tables and
// launches once. Covered here through the recording backend with folding turned on: one launch
// per replay, zero-byte copies of inputs already in place, tables too long to record, graphs
// whose nodes cannot be found (fall back to copy_batch + launch for that entry), failures of
// either hook, and static outputs.
#include "gf_runner.h"
#include "gf_test_fakes.h"
#include "runner_fixture.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace {

using namespace runner_test;

class RunnerFolding : public Runner {
protected:
  void SetUp() override {
    Runner::SetUp();
    gf_fake_backend_enable_folding(&backend_);
  }

  uint64_t Calls(gf_fake_hook hook) const { return backend_.calls[hook]; }
};

// ---- folded replays ----------------------------------------------------------------------

TEST_F(RunnerFolding, CaptureRecordsBothCopyNodesAroundTheForward) {
  Create();
  Inputs inputs = MakeInputs(2, {2, 3}, 1.0f);
  CallExpectingCorrect(inputs);
  EXPECT_EQ(Log(), (Events{"warmup_begin", "probe_begin", "forward", "probe_end", "forward",
                           "warmup_end", "capture_begin", "capture_copy_node(inputs,2)", "forward",
                           "capture_copy_node(outputs,1)", "capture_end", "launch_folded(2,1)"}));
  EXPECT_EQ(Calls(GF_FAKE_HOOK_CAPTURE_COPY_NODE), 2u);
  EXPECT_EQ(Calls(GF_FAKE_HOOK_LAUNCH_FOLDED), 1u);
  EXPECT_EQ(Calls(GF_FAKE_HOOK_COPY_BATCH), 0u);
  EXPECT_EQ(Calls(GF_FAKE_HOOK_LAUNCH), 0u);
  gf_runner_stats stats = Stats();
  EXPECT_EQ(stats.captures, 1u);
  EXPECT_EQ(stats.replays, 1u);
  EXPECT_EQ(stats.enabled, 1);
}

TEST_F(RunnerFolding, ReplayIsOneFoldedLaunchWithCorrectOutputsOnFreshInputs) {
  Create();
  Inputs first = MakeInputs(2, {2, 3}, 1.0f);
  CallExpectingCorrect(first);
  uint64_t forwards = host_.forward_calls;
  for (float seed : {-7.5f, 3.25f, 40.0f}) {
    ClearLog();
    Inputs fresh = MakeInputs(2, {2, 3}, seed);
    CallExpectingCorrect(fresh);
    EXPECT_EQ(Log(), (Events{"launch_folded(2,1)"})) << "a folded replay is one launch";
    // Both fresh inputs and the fresh output are copied, all of their bytes.
    EXPECT_EQ(backend_.last_folded_nonempty[GF_COPY_INPUTS], 2u);
    EXPECT_EQ(backend_.last_folded_bytes[GF_COPY_INPUTS], 2u * 6 * sizeof(float));
    EXPECT_EQ(backend_.last_folded_nonempty[GF_COPY_OUTPUTS], 1u);
    EXPECT_EQ(backend_.last_folded_bytes[GF_COPY_OUTPUTS], 6 * sizeof(float));
  }
  EXPECT_EQ(host_.forward_calls, forwards) << "a replay must not run the forward";
  EXPECT_EQ(Calls(GF_FAKE_HOOK_COPY_BATCH), 0u);
  EXPECT_EQ(Calls(GF_FAKE_HOOK_LAUNCH), 0u);
  EXPECT_EQ(Calls(GF_FAKE_HOOK_LAUNCH_FOLDED), 4u);
  EXPECT_EQ(Stats().replays, 4u);
  CallExpectingCorrect(first); // back to the first values
}

TEST_F(RunnerFolding, SixtyFourInputsAreStillOneLaunch) {
  Create();
  Inputs warm = MakeInputs(64, {3}, 0.0f);
  CallExpectingCorrect(warm);
  ClearLog();
  Inputs inputs = MakeInputs(64, {3}, 2.0f);
  CallExpectingCorrect(inputs);
  EXPECT_EQ(Log(), (Events{"launch_folded(64,1)"}));
  EXPECT_EQ(backend_.last_folded_count[GF_COPY_INPUTS], 64u);
}

TEST_F(RunnerFolding, EveryOutputOfAMultiOutputForwardIsFolded) {
  host_.output_count = 2;
  Create();
  Inputs first = MakeInputs(1, {3}, 1.0f);
  ASSERT_EQ(Call(first.views).status, GF_OK);
  ClearLog();
  Inputs second = MakeInputs(1, {3}, 5.0f);
  Result result = Call(second.views);
  ASSERT_EQ(result.status, GF_OK) << result.message;
  ASSERT_EQ(result.values.size(), 2u);
  EXPECT_EQ(result.values[0], Expected(second.views, 0));
  EXPECT_EQ(result.values[1], Expected(second.views, 1));
  EXPECT_EQ(Log(), (Events{"launch_folded(1,2)"}));
  EXPECT_EQ(backend_.last_folded_nonempty[GF_COPY_OUTPUTS], 2u);
}

TEST_F(RunnerFolding, InputAlreadyInItsStaticBufferGetsAZeroByteCopy) {
  Create();
  Inputs first = MakeInputs(2, {4}, 1.0f);
  CallExpectingCorrect(first);
  ASSERT_EQ(host_.clone_calls, 2u);
  gf_tensor static_a = host_.clones[0];
  gf_tensor static_b = host_.clones[1];

  // The caller writes input 0 straight into its static buffer and passes that buffer.
  float *a = static_cast<float *>(static_a.data);
  for (int e = 0; e < 4; ++e) {
    a[e] = 100.0f + e;
  }
  Inputs b = MakeInputs(1, {4}, -3.0f);
  std::vector<gf_tensor> mixed = {static_a, b.views[0]};
  ClearLog();
  Result result = Call(mixed);
  ASSERT_EQ(result.status, GF_OK) << result.message;
  EXPECT_EQ(Log(), (Events{"launch_folded(2,1)"}));
  // The table keeps one entry per input (its length is the node's), the in-place one empty.
  EXPECT_EQ(backend_.last_folded_count[GF_COPY_INPUTS], 2u);
  EXPECT_EQ(backend_.last_folded_nonempty[GF_COPY_INPUTS], 1u);
  EXPECT_EQ(backend_.last_folded_bytes[GF_COPY_INPUTS], 4 * sizeof(float));
  EXPECT_EQ(result.values[0], Expected(mixed));
  EXPECT_EQ(result.values[0][0], 2 * 100.0f - 3.0f);

  // Both in place: every input entry is empty, and the replay still reads the new values.
  static_cast<float *>(static_b.data)[0] = 1000.0f;
  ClearLog();
  result = Call({static_a, static_b});
  ASSERT_EQ(result.status, GF_OK) << result.message;
  EXPECT_EQ(Log(), (Events{"launch_folded(2,1)"}));
  EXPECT_EQ(backend_.last_folded_nonempty[GF_COPY_INPUTS], 0u);
  EXPECT_EQ(backend_.last_folded_bytes[GF_COPY_INPUTS], 0u);
  EXPECT_EQ(result.values[0][0], 2 * 100.0f + 1000.0f);
}

// ---- recording refused ------------------------------------------------------------------

TEST_F(RunnerFolding, RefusedInputNodeLeavesTheOutputsUnfoldedAndReplaysCopyInBatches) {
  backend_.fold_max_copies = 1; // two inputs are too many
  Create();
  Inputs first = MakeInputs(2, {3}, 1.0f);
  CallExpectingCorrect(first);
  EXPECT_EQ(Log(), (Events{"warmup_begin", "probe_begin", "forward", "probe_end", "forward",
                           "warmup_end", "capture_begin", "capture_copy_node(inputs,2)", "forward",
                           "capture_end", "copy_batch(2)", "launch", "copy_batch(1)"}))
      << "without an input node the outputs are not folded either";
  ClearLog();
  Inputs second = MakeInputs(2, {3}, 9.0f);
  CallExpectingCorrect(second);
  EXPECT_EQ(Log(), (Events{"copy_batch(2)", "launch", "copy_batch(1)"}));
  EXPECT_EQ(Calls(GF_FAKE_HOOK_CAPTURE_COPY_NODE), 1u);
  EXPECT_EQ(Calls(GF_FAKE_HOOK_LAUNCH_FOLDED), 0u);
  EXPECT_EQ(Stats().replays, 2u);
}

TEST_F(RunnerFolding, RefusedOutputNodeReplaysUnfoldedThroughTheRecordedInputNode) {
  backend_.fold_max_copies = 1; // one input fits, two outputs do not
  host_.output_count = 2;
  Create();
  Inputs first = MakeInputs(1, {3}, 1.0f);
  ASSERT_EQ(Call(first.views).status, GF_OK);
  EXPECT_EQ(gf_fake_log_count(&log_, "capture_copy_node(inputs,1)"), 1u);
  EXPECT_EQ(gf_fake_log_count(&log_, "capture_copy_node(outputs,2)"), 1u);
  ClearLog();
  // The graph holds the input node, recorded with self-copies; a plain launch runs it harmlessly.
  Inputs second = MakeInputs(1, {3}, -4.0f);
  Result result = Call(second.views);
  ASSERT_EQ(result.status, GF_OK) << result.message;
  ASSERT_EQ(result.values.size(), 2u);
  EXPECT_EQ(result.values[0], Expected(second.views, 0));
  EXPECT_EQ(result.values[1], Expected(second.views, 1));
  EXPECT_EQ(Log(), (Events{"copy_batch(1)", "launch", "copy_batch(2)"}));
  EXPECT_EQ(Calls(GF_FAKE_HOOK_LAUNCH_FOLDED), 0u);
}

// ---- nodes not found: the entry falls back ----------------------------------------------

TEST_F(RunnerFolding, NodesNotFoundFallBackToBatchedCopiesAndAreNotTriedAgain) {
  backend_.fold_hide_nodes = 1; // graphs captured now keep their nodes out of launch_folded's sight
  Create();
  Inputs first = MakeInputs(2, {3}, 1.0f);
  CallExpectingCorrect(first);
  EXPECT_EQ(gf_fake_log_count_prefix(&log_, "capture_copy_node("), 2u);
  Events log = Log();
  ASSERT_GE(log.size(), 4u);
  EXPECT_EQ(Events(log.end() - 4, log.end()),
            (Events{"launch_folded(2,1)", "copy_batch(2)", "launch", "copy_batch(1)"}))
      << "GF_ERR_NOT_FOUND launched nothing, so the same call copies and launches";
  EXPECT_EQ(Stats().enabled, 1);

  for (float seed : {5.0f, -2.0f}) {
    ClearLog();
    Inputs fresh = MakeInputs(2, {3}, seed);
    CallExpectingCorrect(fresh);
    EXPECT_EQ(Log(), (Events{"copy_batch(2)", "launch", "copy_batch(1)"}));
  }
  EXPECT_EQ(Calls(GF_FAKE_HOOK_LAUNCH_FOLDED), 1u) << "the entry stopped trying to fold";
  gf_runner_stats stats = Stats();
  EXPECT_EQ(stats.enabled, 1);
  EXPECT_EQ(stats.replays, 3u);
  EXPECT_EQ(stats.eager_calls, 0u);
  EXPECT_EQ(host_.warn_count, 0u) << "falling back is not worth a warning";

  // The fallback is the entry's: a graph captured later, with findable nodes, folds.
  backend_.fold_hide_nodes = 0;
  Inputs other = MakeInputs(2, {5}, 1.0f);
  CallExpectingCorrect(other);
  ClearLog();
  Inputs other_fresh = MakeInputs(2, {5}, 7.0f);
  CallExpectingCorrect(other_fresh);
  EXPECT_EQ(Log(), (Events{"launch_folded(2,1)"}));
  ClearLog();
  CallExpectingCorrect(first);
  EXPECT_EQ(Log(), (Events{"copy_batch(2)", "launch", "copy_batch(1)"}));
}

// ---- failures disable the runner --------------------------------------------------------

TEST_F(RunnerFolding, LaunchFoldedFailingOnALaterReplayDisablesAndReturnsTheEagerResult) {
  Create();
  Inputs first = MakeInputs(2, {3}, 1.0f);
  CallExpectingCorrect(first);
  gf_fake_backend_fail(&backend_, GF_FAKE_HOOK_LAUNCH_FOLDED, 0, "table rewrite failed");
  ClearLog();
  Inputs next = MakeInputs(2, {3}, 3.0f);
  Result result = Call(next.views);
  ASSERT_EQ(result.status, GF_OK) << result.message;
  ASSERT_EQ(result.values.size(), 1u) << "only the eager output is returned";
  EXPECT_EQ(result.values[0], Expected(next.views));
  EXPECT_EQ(Log(), (Events{"launch_folded(2,1)", "release_graph", "forward"}))
      << "a failure other than GF_ERR_NOT_FOUND is not retried unfolded";
  EXPECT_EQ(Reason(), "replay failed: table rewrite failed");
  EXPECT_TRUE(Contains(LastWarning(), "table rewrite failed")) << LastWarning();
  gf_runner_stats stats = Stats();
  EXPECT_EQ(stats.enabled, 0);
  EXPECT_EQ(stats.graphs, 0u);
  EXPECT_EQ(stats.pool_bytes, 0);
  EXPECT_EQ(stats.replays, 1u);
  EXPECT_EQ(stats.eager_calls, 1u);
  EXPECT_EQ(Calls(GF_FAKE_HOOK_COPY_BATCH), 0u);
  EXPECT_EQ(Calls(GF_FAKE_HOOK_LAUNCH), 0u);
  ReleaseResults();
  EXPECT_EQ(host_.live_handles, 0) << "the failed replay's fresh output is released";
  EXPECT_EQ(backend_.live_graphs, 0);

  gf_fake_backend_fail(&backend_, GF_FAKE_HOOK_NONE, 0, nullptr);
  ClearLog();
  CallExpectingCorrect(first);
  ExpectEagerOnly(Log());
}

TEST_F(RunnerFolding, LaunchFoldedFailingOnTheFirstReplayDisables) {
  gf_fake_backend_fail(&backend_, GF_FAKE_HOOK_LAUNCH_FOLDED, 0, "no memory for the tables");
  Create();
  Inputs first = MakeInputs(2, {3}, 1.0f);
  CallExpectingCorrect(first);
  EXPECT_EQ(host_.last_agree_ok, 1) << "the capture itself succeeded";
  EXPECT_EQ(Reason(), "replay failed: no memory for the tables");
  gf_runner_stats stats = Stats();
  EXPECT_EQ(stats.enabled, 0);
  EXPECT_EQ(stats.captures, 1u);
  EXPECT_EQ(stats.replays, 0u);
  EXPECT_EQ(stats.eager_calls, 1u);
  EXPECT_EQ(stats.graphs, 0u);
  ReleaseResults();
  EXPECT_EQ(host_.live_handles, 0);
}

TEST_F(RunnerFolding, CaptureCopyNodeFailingFailsTheCapture) {
  // The input node is recorded; the output node fails.
  gf_fake_backend_fail(&backend_, GF_FAKE_HOOK_CAPTURE_COPY_NODE, 1, "node table too large");
  Create();
  Inputs first = MakeInputs(2, {3}, 1.0f);
  CallExpectingCorrect(first);
  Events log = Log();
  ASSERT_GE(log.size(), 6u);
  EXPECT_EQ(Events(log.end() - 6, log.end()),
            (Events{"capture_begin", "capture_copy_node(inputs,2)", "forward",
                    "capture_copy_node(outputs,1)", "capture_end", "forward"}))
      << "capture_end closes the capture also when a copy node failed";
  EXPECT_EQ(host_.last_agree_ok, 0) << "every rank must learn of the failure";
  EXPECT_EQ(Reason(), "capture failed: node table too large");
  gf_runner_stats stats = Stats();
  EXPECT_EQ(stats.enabled, 0);
  EXPECT_EQ(stats.captures, 0u);
  EXPECT_EQ(stats.eager_calls, 1u);
  EXPECT_EQ(stats.pool_bytes, 0);
  EXPECT_EQ(backend_.live_graphs, 0);
  ReleaseResults();
  EXPECT_EQ(host_.live_handles, 0);
}

// ---- static outputs ---------------------------------------------------------------------

TEST_F(RunnerFolding, StaticOutputsAreFoldedWithEmptyOutputCopies) {
  Create();
  Inputs first = MakeInputs(2, {3}, 1.0f);
  Result one = Call(first.views, kStaticOutputs);
  ASSERT_EQ(one.status, GF_OK) << one.message;
  EXPECT_EQ(one.values[0], Expected(first.views));
  ClearLog();
  Inputs second = MakeInputs(2, {3}, 20.0f);
  Result two = Call(second.views, kStaticOutputs);
  ASSERT_EQ(two.status, GF_OK) << two.message;
  EXPECT_EQ(two.values[0], Expected(second.views));
  EXPECT_EQ(Log(), (Events{"launch_folded(2,1)"}));
  EXPECT_EQ(one.data[0], two.data[0]) << "the same static buffer every call";
  EXPECT_EQ(backend_.last_folded_count[GF_COPY_OUTPUTS], 1u);
  EXPECT_EQ(backend_.last_folded_nonempty[GF_COPY_OUTPUTS], 0u) << "nothing to copy out";
  EXPECT_EQ(ReadFloats(one.pool->tensors[0]), Expected(second.views));
  EXPECT_EQ(host_.empty_calls, 0u);

  // A default call on the same graph gets a fresh buffer, filled by the output node.
  ClearLog();
  Inputs third = MakeInputs(2, {3}, -6.0f);
  Result fresh = Call(third.views);
  ASSERT_EQ(fresh.status, GF_OK) << fresh.message;
  EXPECT_EQ(Log(), (Events{"launch_folded(2,1)"}));
  EXPECT_NE(fresh.data[0], one.data[0]);
  EXPECT_EQ(fresh.values[0], Expected(third.views));
  EXPECT_EQ(backend_.last_folded_nonempty[GF_COPY_OUTPUTS], 1u);

  // A later static call returns the static buffer again; the fresh output keeps its values.
  Inputs fourth = MakeInputs(2, {3}, 2.5f);
  Result again = Call(fourth.views, kStaticOutputs);
  ASSERT_EQ(again.status, GF_OK) << again.message;
  EXPECT_EQ(again.data[0], one.data[0]);
  EXPECT_EQ(again.values[0], Expected(fourth.views));
  EXPECT_EQ(ReadFloats(fresh.pool->tensors[0]), Expected(third.views))
      << "a fresh output must not change when the graph replays";
}

} // namespace
