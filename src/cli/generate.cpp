// `tachyon generate`: one prompt, its generated text alone on stdout (streamed as it is decoded),
// load time, prompt and decode speed on stderr. With --prompts-file, every line of the file is a
// request of its own, all run together through the engine (continuous batching); stdout gets one
// JSON object per line, in the file's order: {"index": i, "text": "..."}.
#include <algorithm>
#include <cstdio>
#include <map>
#include <random>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/constraint_args.h"
#include "cli/spec_args.h"
#include "core/mapped_file.h"
#include "engine/engine.h"
#include "io/json_file.h"

namespace tachyon::cli {

namespace {

struct GenerateArgs {
  CommonOptions common;
  EngineArgs engine;
  SpecArgs spec;
  ConstraintArgs constraint;
  std::string prompt;
  std::string prompt_file;
  std::string prompts_file;  // one request per line
  std::string prompt_ids;    // "[1, 2, 3]" or "1,2,3"
  int prompt_len = 0;        // random prompt of this many tokens (models without a tokenizer)
  int max_new_tokens = 128;
  SamplingParams sampling;
  std::string seed;  // empty: random
  bool ignore_eos = false;
  bool no_bos = false;
  bool special = false;
  std::vector<std::string> stop;
  std::string dtype = "bf16";
};

Result<std::vector<int32_t>> parse_ids(const std::string& text) {
  std::string s = text;
  if (!s.empty() && s.front() != '[') s = "[" + s + "]";
  nlohmann::json j = nlohmann::json::parse(s, nullptr, false);
  if (j.is_discarded() || !j.is_array()) {
    return make_error(ErrorCode::kInvalidArgument, "--prompt-ids '{}' is not a list of integers", excerpt(text));
  }
  std::vector<int32_t> ids;
  for (const auto& v : j) {
    // Range-checked, never wrapped (2^40 must not become token 0); the vocabulary is checked later.
    const bool id = v.is_number_unsigned() ? v.get<uint64_t>() <= INT32_MAX
                                           : v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() <= INT32_MAX;
    if (!id) return make_error(ErrorCode::kInvalidArgument, "--prompt-ids holds {}, not a token id", json_excerpt(v));
    ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
  }
  return ids;
}

std::string json_line(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// Every line of the file as a request; prints the results in file order as they complete.
int run_prompts_file(GenerateArgs& a, LoadedModel& m, const EngineOptions& eo, const GenerationParams& gp) {
  if (!m.tokenizer) {
    return report(make_error(ErrorCode::kInvalidArgument, "{} has no tokenizer: --prompts-file needs one", m.path));
  }
  auto text = read_text_file(a.prompts_file);
  if (!text.ok()) return report(text.status());
  std::vector<std::string> lines;
  size_t pos = 0;
  while (pos < text->size()) {
    size_t end = text->find('\n', pos);
    if (end == std::string::npos) end = text->size();
    std::string line = text->substr(pos, end - pos);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(std::move(line));
    pos = end + 1;
  }
  auto engine = Engine::create(*m.model, m.tokenizer.get(), m.eos_token_ids, eo);
  if (!engine.ok()) return report(engine.status());
  announce_device(a.common, m.model->device());
  Engine& e = **engine;
  std::map<RequestId, size_t> index_of;
  std::vector<std::string> texts(lines.size());
  std::vector<std::string> errors(lines.size());
  std::vector<bool> done(lines.size(), false);
  for (size_t i = 0; i < lines.size(); ++i) {
    auto id = e.add_request(lines[i], gp);
    if (!id.ok()) {
      errors[i] = id.status().to_string();
      done[i] = true;
    } else {
      index_of[*id] = i;
    }
  }
  size_t next_to_print = 0;
  int failures = 0;
  const auto print_ready = [&]() {
    for (; next_to_print < lines.size() && done[next_to_print]; ++next_to_print) {
      nlohmann::json j;
      j["index"] = next_to_print;
      if (!errors[next_to_print].empty()) {
        j["error"] = errors[next_to_print];
        ++failures;
      } else {
        j["text"] = texts[next_to_print];
      }
      std::fprintf(stdout, "%s\n", json_line(j).c_str());
    }
    std::fflush(stdout);
  };
  print_ready();
  Timer timer;
  while (e.has_unfinished()) {
    auto outputs = e.step();
    if (!outputs.ok()) return report(outputs.status());
    for (const RequestOutput& o : *outputs) {
      const size_t i = index_of.at(o.id);
      texts[i] += o.text;
      if (o.finished) {
        done[i] = true;
        if (o.finish_reason == FinishReason::kError) errors[i] = o.error.to_string();
      }
    }
    print_ready();
  }
  const EngineStats st = e.stats();
  const double secs = timer.seconds();
  std::fprintf(stderr,
               "load %.2f s | %zu requests in %.2f s | %lld prompt tokens (%lld from the prefix cache), %lld generated "
               "tokens (%.1f tok/s) | %lld steps, %lld preemptions\n",
               m.load_seconds, lines.size(), secs, static_cast<long long>(st.prefix.query_tokens),
               static_cast<long long>(st.prefix.hit_tokens), static_cast<long long>(st.generated_tokens),
               secs > 0 ? static_cast<double>(st.generated_tokens) / secs : 0.0, static_cast<long long>(st.num_steps),
               static_cast<long long>(st.num_preemptions));
  if (const std::string spec = spec_summary(eo, st.spec); !spec.empty()) std::fprintf(stderr, "%s\n", spec.c_str());
  if (failures == 0) return 0;
  // Each failure is in its JSON line on stdout; stderr still gets the one error line.
  const size_t first = static_cast<size_t>(
      std::find_if(errors.begin(), errors.end(), [](const std::string& s) { return !s.empty(); }) - errors.begin());
  std::fprintf(stderr, "tachyon: error: %d of %zu prompts failed; line %zu: %s\n", failures, lines.size(), first + 1,
               excerpt(errors[first]).c_str());
  return 1;
}

int run_generate(GenerateArgs& a) {
  const auto dtype = parse_dtype(a.dtype);
  if (!dtype) return report(make_error(ErrorCode::kInvalidArgument, "--dtype '{}' is not a dtype", a.dtype));
  a.sampling.seed = seed_or_random(a.seed);
  auto eo = engine_options(a.engine);
  if (!eo.ok()) return report(eo.status());
  auto grammar = constraint_grammar(a.constraint);  // before the load: a bad schema fails fast
  if (!grammar.ok()) return report(grammar.status());
  auto loaded = load(a.common, *dtype);
  if (!loaded.ok()) return report(loaded.status());
  LoadedModel& m = *loaded;
  const ModelConfig& config = m.model->config();
  Status valid = a.sampling.validate(config.vocab_size);
  if (!valid.ok()) return report(valid);
  SpecModels drafts;  // --draft-model, alive as long as the engine
  Status spec = apply_spec_options(a.spec, m, drafts, *eo);
  if (!spec.ok()) return report(spec);

  if (Status vocab = apply_constraint_vocabulary(m, *grammar != nullptr, *eo); !vocab.ok()) return report(vocab);

  GenerationParams gp;
  gp.grammar = *grammar;
  gp.sampling = a.sampling;
  gp.max_tokens = a.max_new_tokens;
  gp.ignore_eos = a.ignore_eos;
  gp.draft = a.spec.request_draft;
  gp.stop = a.stop;
  if (a.no_bos) gp.add_bos = false;
  gp.parse_special = a.special;
  if (!a.prompts_file.empty()) return run_prompts_file(a, m, *eo, gp);

  std::vector<int32_t> prompt;
  if (!a.prompt_file.empty()) {
    auto text = read_text_file(a.prompt_file);
    if (!text.ok()) return report(text.status());
    a.prompt = *text;
  }
  const bool text_prompt = a.prompt_ids.empty() && a.prompt_len == 0;
  if (!a.prompt_ids.empty()) {
    auto ids = parse_ids(a.prompt_ids);
    if (!ids.ok()) return report(ids.status());
    prompt = *ids;
  } else if (a.prompt_len > 0) {
    std::mt19937 rng(1234);
    prompt.resize(static_cast<size_t>(a.prompt_len));
    for (auto& id : prompt) id = static_cast<int32_t>(rng() % static_cast<uint32_t>(config.vocab_size));
  } else if (m.tokenizer) {
    EncodeOptions enc;
    enc.add_bos = gp.add_bos;
    enc.parse_special = a.special;
    prompt = m.tokenizer->encode(a.prompt, enc);
  } else {
    return report(make_error(ErrorCode::kInvalidArgument,
                             "{} has no tokenizer: give the prompt as --prompt-ids or --prompt-len", m.path));
  }
  if (prompt.empty()) return report(make_error(ErrorCode::kInvalidArgument, "the prompt is empty"));
  gp.detokenize = text_prompt && m.tokenizer != nullptr;

  // One request: unless told otherwise, a KV cache just large enough for it.
  EngineOptions one = *eo;
  if (a.engine.kv_cache_mem.empty()) {
    const int64_t need = static_cast<int64_t>(prompt.size()) + a.max_new_tokens + 1;
    const int ctx = one.max_model_len > 0 ? one.max_model_len : config.max_position_embeddings;
    if (need < ctx) one.max_model_len = static_cast<int>(need);
    one.kv.num_blocks = ((one.max_model_len > 0 ? one.max_model_len : ctx) + one.kv.block_size - 1) / one.kv.block_size;
  }
  auto engine = Engine::create(*m.model, m.tokenizer.get(), m.eos_token_ids, one);
  if (!engine.ok()) return report(engine.status());
  Engine& e = **engine;
  auto id = e.add_request(prompt, gp);
  if (!id.ok()) return report(id.status());
  announce_device(a.common, m.model->device());

  bool first = true;
  RequestOutput last;
  while (e.has_unfinished()) {
    auto outputs = e.step();
    if (!outputs.ok()) return report(outputs.status());
    for (RequestOutput& o : *outputs) {
      if (gp.detokenize) {
        std::fwrite(o.text.data(), 1, o.text.size(), stdout);
      } else {
        for (int32_t t : o.new_token_ids) {
          std::fprintf(stdout, "%s%d", first ? "" : " ", t);
          first = false;
        }
      }
      std::fflush(stdout);
      if (o.finished) last = std::move(o);
    }
  }
  std::fputc('\n', stdout);
  std::fflush(stdout);
  if (last.finish_reason == FinishReason::kError) return report(last.error);
  const RequestTiming& t = last.timing;
  const double prefill = t.first_token - t.first_scheduled;
  const double decode = t.finished - t.first_token;
  const int n = last.num_generated_tokens;
  const double weight_gb =
      static_cast<double>(m.model->weights().decode_bytes_per_token(m.model->config().num_experts_per_tok)) / 1e9;
  std::fprintf(stderr,
               "load %.2f s | prompt %d tokens in %.3f s (%.1f tok/s) | generated %d tokens in %.3f s (%.2f tok/s, "
               "%.2f GB weights/token) | finish: %s | seed %llu\n",
               m.load_seconds, last.num_prompt_tokens, prefill, prefill > 0 ? last.num_prompt_tokens / prefill : 0.0, n,
               decode, decode > 0 && n > 1 ? (n - 1) / decode : 0.0, weight_gb, finish_reason_name(last.finish_reason),
               static_cast<unsigned long long>(*a.sampling.seed));
  if (const std::string summary = spec_summary(one, e.stats().spec); !summary.empty()) {
    std::fprintf(stderr, "%s\n", summary.c_str());
  }
  return 0;
}

}  // namespace

void add_generate(CLI::App& app, std::function<int()>& run) {
  auto args = std::make_shared<GenerateArgs>();
  args->sampling.temperature = 0.8f;
  args->sampling.top_k = 40;
  args->sampling.top_p = 0.95f;
  args->sampling.min_p = 0.05f;
  CLI::App* cmd = app.add_subcommand("generate", "generate text from a prompt");
  add_common_options(*cmd, args->common);
  cmd->add_option("-p,--prompt", args->prompt, "prompt text");
  cmd->add_option("-f,--file", args->prompt_file, "read the prompt from a file");
  cmd->add_option("--prompt-ids", args->prompt_ids, "prompt as token ids, e.g. '[1, 15, 27]'");
  cmd->add_option("--prompt-len", args->prompt_len, "random prompt of N tokens (for speed runs)")
      ->check(non_negative_int());
  cmd->add_option("-n,--max-tokens", args->max_new_tokens, "tokens to generate (default 128)")
      ->check(non_negative_int());
  cmd->add_option("--temp", args->sampling.temperature, "temperature; 0 = greedy (default 0.8)");
  cmd->add_option("--top-k", args->sampling.top_k, "top-k; 0 = off (default 40)");
  cmd->add_option("--top-p", args->sampling.top_p, "top-p (default 0.95)");
  cmd->add_option("--min-p", args->sampling.min_p, "min-p (default 0.05)");
  cmd->add_option("--repeat-penalty", args->sampling.repetition_penalty, "repetition penalty (default 1.0 = off)");
  cmd->add_option("--presence-penalty", args->sampling.presence_penalty, "presence penalty (default 0)");
  cmd->add_option("--frequency-penalty", args->sampling.frequency_penalty, "frequency penalty (default 0)");
  cmd->add_option("--seed", args->seed, "sampling seed (default: random; printed on stderr)")->check(seed_value());
  cmd->add_flag("--ignore-eos", args->ignore_eos, "keep generating past end-of-sequence tokens");
  cmd->add_flag("--no-bos", args->no_bos, "do not add the BOS token");
  cmd->add_flag("--special", args->special, "parse special tokens written in the prompt");
  cmd->add_option("--dtype", args->dtype, "weight dtype of synthetic models: bf16, f16, f32 (default bf16)");
  cmd->add_option("--stop", args->stop, "stop string (repeatable); not part of the output");
  cmd->add_option("--prompts-file", args->prompts_file,
                  "run every line of FILE as its own request, all at once; prints one JSON object per line");
  add_constraint_options(*cmd, args->constraint);
  add_engine_options(*cmd, args->engine);
  add_spec_options(*cmd, args->spec);
  cmd->callback([args, &run]() { run = [args]() { return run_generate(*args); }; });
}

}  // namespace tachyon::cli
