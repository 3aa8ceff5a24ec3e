// Structured output on the GPU: grammar masks applied to device logits (ops::mask_logits) before the
// device's argmax and draw. On the bundled model, greedy and sampled requests under a JSON Schema,
// batched with unconstrained ones, all end at EOS with output that parses and validates (a validator
// written from the specification, tests/sampling/json_schema_checker.h); speculative greedy (n-gram
// drafts, verified from device argmax rows) gives plain greedy's tokens; and every KV block is back.
#include <gtest/gtest.h>

#include <map>

#include "engine/engine.h"
#include "gpu_test_util.h"
#include "model/model_loader.h"
#include "sampling/json_schema.h"
#include "sampling/json_schema_checker.h"
#include "test_util.h"

namespace tachyon {
namespace {

const Device kGpu = Device::cuda(0);

const char* kSchema = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 10},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
    "active": {"type": "boolean"}
  },
  "required": ["name", "age", "tags"]
})";

struct Outcome {
  std::vector<int32_t> tokens;
  FinishReason reason = FinishReason::kLength;
  Status error;
};

using Requests = std::vector<std::pair<std::vector<int32_t>, GenerationParams>>;

std::vector<Outcome> run_all(Engine& e, const Requests& requests) {
  std::vector<RequestId> ids;
  for (const auto& [prompt, p] : requests) {
    auto id = e.add_request(prompt, p);
    EXPECT_TRUE(id.ok()) << id.status().to_string();
    ids.push_back(id.ok() ? *id : 0);
  }
  std::map<RequestId, Outcome> out;
  for (int step = 0; e.has_unfinished() && step < 20000; ++step) {
    auto outputs = e.step();
    EXPECT_TRUE(outputs.ok()) << outputs.status().to_string();
    if (!outputs.ok()) break;
    for (const RequestOutput& o : *outputs) {
      Outcome& r = out[o.id];
      r.tokens.insert(r.tokens.end(), o.new_token_ids.begin(), o.new_token_ids.end());
      if (o.finished) {
        r.reason = o.finish_reason;
        r.error = o.error;
      }
    }
  }
  EXPECT_TRUE(e.check_no_leaks().ok());
  std::vector<Outcome> result;
  for (RequestId id : ids) result.push_back(out[id]);
  return result;
}

TEST(GpuStructuredOutput, DeviceMasksKeepOutputsValid) {
  TACHYON_START_GPU();
  LoadedModel m = testing::load_model_or_fail(testing::source_dir() + "/models/tachyon-demo", kGpu);
  JsonSchemaOptions jo;
  jo.max_whitespace = 1;
  auto grammar = std::make_shared<const Grammar>(json_schema_to_grammar(std::string_view(kSchema), jo).value());
  const std::vector<int32_t> prompt = m.tokenizer->encode("The user record as JSON: ");
  const std::vector<int32_t> other = m.tokenizer->encode("Once upon a time");
  std::vector<std::pair<std::vector<int32_t>, GenerationParams>> requests;
  for (int i = 0; i < 8; ++i) {
    GenerationParams p;
    p.sampling.temperature = i < 2 ? 0.0f : 1.0f;
    p.sampling.seed = 100 + i;
    p.max_tokens = 300;
    p.grammar = grammar;
    requests.emplace_back(prompt, p);
    if (i % 3 == 0) {
      GenerationParams plain;
      plain.sampling.temperature = 0.0f;
      plain.max_tokens = 20;
      requests.emplace_back(other, plain);
    }
  }
  EngineOptions o;
  o.max_model_len = 512;
  o.kv.num_blocks = 512;
  o.scheduler.max_seqs = 16;
  o.batch_invariant = true;
  const auto make = [&](const EngineOptions& eo) {
    auto e = Engine::create(*m.model, m.tokenizer.get(), m.eos_token_ids, eo);
    EXPECT_TRUE(e.ok()) << e.status().to_string();
    return std::move(e).value();
  };
  auto engine = make(o);
  const std::vector<Outcome> runs = run_all(*engine, requests);
  const grammar_test::ojson schema = grammar_test::ojson::parse(kSchema);
  for (size_t i = 0; i < requests.size(); ++i) {
    if (!requests[i].second.grammar) continue;
    std::vector<int32_t> text_ids = runs[i].tokens;
    std::erase_if(text_ids, [&](int32_t t) { return m.tokenizer->is_eos(t); });
    const std::string text = m.tokenizer->decode(text_ids);
    SCOPED_TRACE(::testing::Message() << "request " << i << ": " << text);
    ASSERT_EQ(runs[i].reason, FinishReason::kStop) << runs[i].error.to_string();
    std::string error;
    const grammar_test::ojson value = grammar_test::parse_json(text, error);
    ASSERT_EQ(error, "");
    EXPECT_EQ(grammar_test::SchemaChecker(schema).check(value, schema), "");
  }
  EXPECT_GT(engine->stats().grammar_masked_rows, 0);

  // Greedy with n-gram drafts (verified from the device's argmax rows) equals plain greedy.
  std::vector<std::pair<std::vector<int32_t>, GenerationParams>> greedy = {requests[0], requests[2]};
  const std::vector<Outcome> plain = run_all(*make(o), greedy);
  o.spec.method = SpecMethod::kNgram;
  o.spec.k = 4;
  auto spec = make(o);
  const std::vector<Outcome> drafted = run_all(*spec, greedy);
  for (size_t i = 0; i < greedy.size(); ++i) EXPECT_EQ(drafted[i].tokens, plain[i].tokens) << "request " << i;
}

}  // namespace
}  // namespace tachyon
