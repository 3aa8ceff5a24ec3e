// AsyncEngine's disaggregation paths without the network, wired to export_kv() and adopt() as a
// server's workers wire them: a prefill-only request's first token is delivered and its KV
// exported through on_transfer at once (its blocks freed); a decode engine's
// submit_adoption() continues it exactly as one engine alone would; adoption without room is
// retried after steps while anything runs (backpressure) and fails at once otherwise; a cancelled
// stream is never adopted.
#include <any>
#include <future>
#include <mutex>

#include <gtest/gtest.h>

#include "disagg/kv_export.h"
#include "engine/async_engine.h"
#include "engine/recording_metrics.h"
#include "engine/stream_collector.h"
#include "model/model_loader.h"
#include "test_util.h"

namespace tachyon::disagg {
namespace {

using Collector = testing::StreamCollector;
using Metrics = testing::RecordingMetrics;

// A prefill-only request's destination, as a server sets it: the loop only carries it.
struct Target {
  uint64_t transfer_id = 0;
};

// What a decode worker hands the loop for a received transfer.
ImportedSequence imported(const KvImport& kv) {
  ImportedSequence seq;
  seq.tokens = kv.tokens;
  seq.num_prompt_tokens = kv.num_prompt_tokens;
  seq.adopt = [kv](Engine& engine, const GenerationParams& params) { return adopt(engine, kv, params); };
  return seq;
}

class AsyncEngineDisaggTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = new LoadedModel(testing::load_model_or_fail(testing::source_dir() + "/models/tachyon-demo"));
  }
  static void TearDownTestSuite() { delete model_; }

  std::unique_ptr<AsyncEngine> make(AsyncEngineOptions ao, Metrics& metrics, int num_kv_blocks = 128,
                                    int max_seqs = 16) {
    EngineOptions eo;
    eo.kv.num_blocks = num_kv_blocks;
    eo.scheduler.max_seqs = max_seqs;
    eo.batch_invariant = true;
    auto e = Engine::create(*model_->model, model_->tokenizer.get(), model_->eos_token_ids, eo);
    EXPECT_TRUE(e.ok()) << e.status().to_string();
    return std::make_unique<AsyncEngine>(std::move(*e), ao, metrics);
  }

  static std::vector<int32_t> prompt() {
    return model_->tokenizer->encode("func (b *Buffer) Len() int { return len(b.buf) - b.off } // the unread part");
  }
  static GenerationParams params(int max_tokens) {
    GenerationParams p;
    p.max_tokens = max_tokens;
    p.ignore_eos = true;
    p.sampling.temperature = 0.0f;
    return p;
  }

  // Runs the prompt prefill-only; returns the export the shipper got and the stream's outputs.
  KvExport prefill(int max_tokens, Collector& seen, Metrics& metrics) {
    std::promise<KvExport> exported;
    AsyncEngineOptions ao;
    ao.on_transfer = [&exported](Engine& engine, RequestId id) -> Result<ShipTransfer> {
      TACHYON_ASSIGN_OR_RETURN(KvExport kv, export_kv(engine, id));
      return ShipTransfer([&exported, kv = std::move(kv)](std::shared_ptr<RequestStream> s) {
        EXPECT_EQ(std::any_cast<const Target&>(s->transfer_target()).transfer_id, 77u);
        exported.set_value(kv);
      });
    };
    auto engine = make(ao, metrics);
    GenerationParams p = params(max_tokens);
    p.prefill_only = true;
    auto s = std::make_shared<RequestStream>(prompt(), p);
    s->set_transfer_target(Target{77});
    seen.attach(s);
    EXPECT_EQ(engine->submit({s}), SubmitError::kNone);
    auto f = exported.get_future();
    EXPECT_EQ(f.wait_for(std::chrono::seconds(60)), std::future_status::ready);
    KvExport kv = f.get();
    EXPECT_TRUE(seen.wait_outputs(1));
    engine->begin_drain();
    EXPECT_TRUE(testing::wait_stopped(*engine)) << "the loop did not stop after the drain";
    return kv;
  }

  static inline LoadedModel* model_ = nullptr;
};

TEST_F(AsyncEngineDisaggTest, PrefillHandsOverAndDecodeAdoptionEqualsColocated) {
  // One engine alone.
  Metrics colocated_metrics;
  auto colocated = make({}, colocated_metrics);
  auto alone = std::make_shared<RequestStream>(prompt(), params(12));
  Collector want;
  want.attach(alone);
  ASSERT_EQ(colocated->submit({alone}), SubmitError::kNone);
  ASSERT_TRUE(want.wait_finished());

  Metrics prefill_metrics;
  Collector first;
  KvExport kv = prefill(12, first, prefill_metrics);
  ASSERT_EQ(first.outputs.size(), 1u);
  EXPECT_FALSE(first.outputs[0].finished);  // the first token is news; the handoff ends the stream
  EXPECT_EQ(first.outputs[0].finish_reason, FinishReason::kTransfer);
  ASSERT_EQ(first.outputs[0].new_token_ids.size(), 1u);
  EXPECT_EQ(prefill_metrics.engine_stats().kv_blocks_used, 0);  // freed at export
  EXPECT_EQ(prefill_metrics.finished(FinishReason::kTransfer), 1);
  EXPECT_EQ(kv.tokens.size(), prompt().size() + 1);

  Metrics decode_metrics;
  auto decode = make({}, decode_metrics);
  auto cont = std::make_shared<RequestStream>(prompt(), params(12));
  Collector rest;
  rest.attach(cont);
  std::promise<Status> adopted;
  decode->submit_adoption(cont, imported(kv), [&adopted](const Status& st) { adopted.set_value(st); });
  auto f = adopted.get_future();
  ASSERT_EQ(f.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  EXPECT_TRUE(f.get().ok());
  ASSERT_TRUE(rest.wait_finished());
  EXPECT_EQ(cont->imported_tokens(), first.outputs[0].new_token_ids);
  std::vector<int32_t> joined = first.tokens();
  for (int32_t t : rest.tokens()) joined.push_back(t);
  EXPECT_EQ(joined, want.tokens());
  EXPECT_EQ(rest.outputs.back().num_generated_tokens, 12);
  EXPECT_EQ(decode_metrics.engine_stats().prompt_tokens_computed, 0);  // the prompt never ran here
  EXPECT_EQ(decode_metrics.adoptions(true), 1);

  // The shipper's outcome ends the prefill stream.
  Collector end;
  auto s = std::make_shared<RequestStream>(prompt(), params(4));
  end.attach(s);
  s->finish_handoff(make_error(ErrorCode::kIo, "peer closed"));
  ASSERT_TRUE(end.wait_finished());
  EXPECT_EQ(end.outputs[0].finish_reason, FinishReason::kTransfer);
  EXPECT_EQ(end.outputs[0].error.code(), ErrorCode::kIo);
}

TEST_F(AsyncEngineDisaggTest, AdoptionWaitsForRoomWhileOthersRunAndFailsWhenNothingCanFree) {
  Metrics pm;
  Collector first;
  const KvExport kv = prefill(8, first, pm);

  // max_seqs 1 and a long request running: the adoption waits for it, then runs.
  Metrics dm;
  AsyncEngineOptions ao;
  ao.adopt_wait = 60.0;
  auto decode = make(ao, dm, 128, 1);
  auto busy = std::make_shared<RequestStream>(model_->tokenizer->encode("Once upon a time"), params(64));
  Collector busy_out;
  busy_out.attach(busy);
  ASSERT_EQ(decode->submit({busy}), SubmitError::kNone);
  ASSERT_TRUE(busy_out.wait_outputs(1));
  auto cont = std::make_shared<RequestStream>(prompt(), params(8));
  Collector rest;
  rest.attach(cont);
  std::promise<Status> adopted;
  decode->submit_adoption(cont, imported(kv), [&](const Status& st) {
    std::lock_guard lock(busy_out.mu);  // the loop delivered its end before trying again
    EXPECT_TRUE(busy_out.finished) << "adopted while max_seqs requests ran";
    adopted.set_value(st);
  });
  auto f = adopted.get_future();
  ASSERT_EQ(f.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  EXPECT_TRUE(f.get().ok());
  ASSERT_TRUE(rest.wait_finished());
  EXPECT_EQ(rest.outputs.back().finish_reason, FinishReason::kLength);

  // A cache too small for the sequence and nothing running: no step can make room, so it fails now.
  Metrics tm;
  ASSERT_GT(kv.num_computed, 16);
  auto tiny = make({}, tm, 1, 4);  // one block of 16 tokens
  auto none = std::make_shared<RequestStream>(prompt(), params(8));
  Collector failed;
  failed.attach(none);
  std::promise<Status> refused;
  tiny->submit_adoption(none, imported(kv), [&refused](const Status& st) { refused.set_value(st); });
  auto r = refused.get_future();
  ASSERT_EQ(r.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  const Status st = r.get();
  EXPECT_EQ(st.code(), ErrorCode::kOutOfRange) << st.to_string();
  ASSERT_TRUE(failed.wait_finished());
  EXPECT_EQ(failed.outputs.back().finish_reason, FinishReason::kError);
  EXPECT_EQ(tm.adoptions(false), 1);

  // Another request's prompt under this transfer id: refused, never adopted.
  auto other = std::make_shared<RequestStream>(model_->tokenizer->encode("Something else entirely"), params(8));
  std::promise<Status> mismatch;
  decode->submit_adoption(other, imported(kv), [&mismatch](const Status& st) { mismatch.set_value(st); });
  auto m = mismatch.get_future();
  ASSERT_EQ(m.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  EXPECT_EQ(m.get().code(), ErrorCode::kInvalidArgument);

  // A stream whose client went away before its KV arrived: dropped.
  auto gone = std::make_shared<RequestStream>(prompt(), params(8));
  decode->abort(gone);
  std::promise<Status> cancelled;
  decode->submit_adoption(gone, imported(kv), [&cancelled](const Status& st) { cancelled.set_value(st); });
  auto c = cancelled.get_future();
  ASSERT_EQ(c.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  EXPECT_FALSE(c.get().ok());
  decode->begin_drain();
  EXPECT_TRUE(testing::wait_stopped(*decode)) << "the loop did not stop after the drain";
  EXPECT_EQ(dm.engine_stats().kv_blocks_used, 0);
  EXPECT_EQ(decode->num_pending_adoptions(), 0);
}

}  // namespace
}  // namespace tachyon::disagg
