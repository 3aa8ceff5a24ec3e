// AsyncEngine's disaggregation paths without the network: a prefill-only request's first token is
// delivered and its export handed to on_transfer at once (its blocks freed); a decode engine's
// submit_adoption() continues it exactly as one engine alone would; adoption without room is
// retried after steps while anything runs (backpressure) and fails at once otherwise; a cancelled
// stream is never adopted.
#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>

#include <gtest/gtest.h>

#include "model/model_loader.h"
#include "server/async_engine.h"
#include "server/stream_collector.h"
#include "test_util.h"

namespace tachyon::server {
namespace {

using Collector = testing::StreamCollector;

class AsyncEngineDisaggTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    LoadOptions lo;
    lo.path = testing::source_dir() + "/models/tachyon-demo";
    auto m = load_model(lo);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    model_ = new LoadedModel(std::move(*m));
  }
  static void TearDownTestSuite() { delete model_; }

  std::unique_ptr<AsyncEngine> make(AsyncEngineOptions ao, ServerMetrics& metrics, int num_kv_blocks = 128,
                                    int max_seqs = 16) {
    EngineOptions eo;
    eo.num_kv_blocks = num_kv_blocks;
    eo.max_seqs = max_seqs;
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

  // Runs the prompt prefill-only; returns the export handed to on_transfer and the stream's outputs.
  disagg::KvExport prefill(int max_tokens, Collector& seen, ServerMetrics& metrics) {
    std::promise<disagg::KvExport> exported;
    AsyncEngineOptions ao;
    ao.on_transfer = [&exported](std::shared_ptr<RequestStream> s, disagg::KvExport kv) {
      EXPECT_EQ(s->transfer_target()->transfer_id, 77u);
      exported.set_value(std::move(kv));
    };
    auto engine = make(ao, metrics);
    GenerationParams p = params(max_tokens);
    p.prefill_only = true;
    auto s = std::make_shared<RequestStream>(prompt(), p);
    s->set_transfer_target(TransferTarget{disagg::KvDestination{"127.0.0.1", 1}, 77});
    seen.attach(s);
    EXPECT_EQ(engine->submit({s}), SubmitError::kNone);
    auto f = exported.get_future();
    EXPECT_EQ(f.wait_for(std::chrono::seconds(60)), std::future_status::ready);
    disagg::KvExport kv = f.get();
    EXPECT_TRUE(seen.wait_outputs(1));
    engine->begin_drain();
    while (!engine->stopped()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return kv;
  }

  static inline LoadedModel* model_ = nullptr;
};

TEST_F(AsyncEngineDisaggTest, PrefillHandsOverAndDecodeAdoptionEqualsColocated) {
  // One engine alone.
  ServerMetrics colocated_metrics;
  auto colocated = make({}, colocated_metrics);
  auto alone = std::make_shared<RequestStream>(prompt(), params(12));
  Collector want;
  want.attach(alone);
  ASSERT_EQ(colocated->submit({alone}), SubmitError::kNone);
  ASSERT_TRUE(want.wait_finished());

  ServerMetrics prefill_metrics;
  Collector first;
  disagg::KvExport kv = prefill(12, first, prefill_metrics);
  ASSERT_EQ(first.outputs.size(), 1u);
  EXPECT_FALSE(first.outputs[0].finished);  // the first token is news; the handoff ends the stream
  EXPECT_EQ(first.outputs[0].finish_reason, FinishReason::kTransfer);
  ASSERT_EQ(first.outputs[0].new_token_ids.size(), 1u);
  EXPECT_EQ(prefill_metrics.engine_stats().kv_blocks_used, 0);  // freed at export
  EXPECT_NE(prefill_metrics.render().find("tachyon_requests_finished_total{finish_reason=\"transfer\"} 1"),
            std::string::npos);
  EXPECT_EQ(kv.tokens.size(), prompt().size() + 1);

  ServerMetrics decode_metrics;
  auto decode = make({}, decode_metrics);
  auto cont = std::make_shared<RequestStream>(prompt(), params(12));
  Collector rest;
  rest.attach(cont);
  std::promise<Status> adopted;
  decode->submit_adoption(cont, kv, [&adopted](const Status& st) { adopted.set_value(st); });
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
  EXPECT_NE(decode_metrics.render().find("tachyon_kv_adoptions_total{outcome=\"ok\"} 1"), std::string::npos);

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
  ServerMetrics pm;
  Collector first;
  const disagg::KvExport kv = prefill(8, first, pm);

  // max_seqs 1 and a long request running: the adoption waits for it, then runs.
  ServerMetrics dm;
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
  decode->submit_adoption(cont, kv, [&](const Status& st) {
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
  ServerMetrics tm;
  ASSERT_GT(kv.num_computed, 16);
  auto tiny = make({}, tm, 1, 4);  // one block of 16 tokens
  auto none = std::make_shared<RequestStream>(prompt(), params(8));
  Collector failed;
  failed.attach(none);
  std::promise<Status> refused;
  tiny->submit_adoption(none, kv, [&refused](const Status& st) { refused.set_value(st); });
  auto r = refused.get_future();
  ASSERT_EQ(r.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  const Status st = r.get();
  EXPECT_EQ(st.code(), ErrorCode::kOutOfRange) << st.to_string();
  ASSERT_TRUE(failed.wait_finished());
  EXPECT_EQ(failed.outputs.back().finish_reason, FinishReason::kError);
  EXPECT_NE(tm.render().find("tachyon_kv_adoptions_total{outcome=\"error\"} 1"), std::string::npos);

  // Another request's prompt under this transfer id: refused, never adopted.
  auto other = std::make_shared<RequestStream>(model_->tokenizer->encode("Something else entirely"), params(8));
  std::promise<Status> mismatch;
  decode->submit_adoption(other, kv, [&mismatch](const Status& st) { mismatch.set_value(st); });
  auto m = mismatch.get_future();
  ASSERT_EQ(m.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  EXPECT_EQ(m.get().code(), ErrorCode::kInvalidArgument);

  // A stream whose client went away before its KV arrived: dropped.
  auto gone = std::make_shared<RequestStream>(prompt(), params(8));
  decode->abort(gone);
  std::promise<Status> cancelled;
  decode->submit_adoption(gone, kv, [&cancelled](const Status& st) { cancelled.set_value(st); });
  auto c = cancelled.get_future();
  ASSERT_EQ(c.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  EXPECT_FALSE(c.get().ok());
  decode->begin_drain();
  for (int i = 0; i < 2000 && !decode->stopped(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_TRUE(decode->stopped());
  EXPECT_EQ(dm.engine_stats().kv_blocks_used, 0);
  EXPECT_EQ(decode->num_pending_adoptions(), 0);
}

}  // namespace
}  // namespace tachyon::server
