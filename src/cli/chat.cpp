// `tachyon chat`: an interactive conversation in the terminal. Each line read from stdin is a user
// turn; the whole history goes through the model's chat template (as the server renders it) and
// the reply streams to stdout as it is decoded. `/exit`, `/quit` or end of input quits, `/reset`
// forgets the history. When the history outgrows the context, the oldest turns are dropped.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <random>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "server/chat_prompt.h"

namespace tachyon::cli {
namespace {

struct ChatArgs {
  CommonOptions common;
  EngineArgs engine;
  std::string system;
  std::string chat_template;
  int max_tokens = 0;  // per reply; 0 = the rest of the context
  SamplingParams sampling;
  std::string seed;  // empty: random
  std::string dtype = "bf16";
};

int run_chat(ChatArgs& a) {
  const auto dtype = parse_dtype(a.dtype);
  if (!dtype) return report(make_error(ErrorCode::kInvalidArgument, "--dtype '{}' is not a dtype", a.dtype));
  auto eo = engine_options(a.engine);
  if (!eo.ok()) return report(eo.status());
  a.sampling.seed = seed_or_random(a.seed);
  auto loaded = load(a.common, *dtype);
  if (!loaded.ok()) return report(loaded.status());
  LoadedModel& m = *loaded;
  if (!m.tokenizer) return report(make_error(ErrorCode::kInvalidArgument, "{} has no tokenizer: chat needs one", m.path));
  const Status valid = a.sampling.validate(m.model->config().vocab_size);
  if (!valid.ok()) return report(valid);
  auto chat_template = server::load_server_chat_template(*m.tokenizer, a.chat_template);
  if (!chat_template.ok()) return report(chat_template.status());
  const ChatTemplateExtras extras = chat_template_extras(*m.tokenizer);

  // One conversation at a time: unless told otherwise, a KV cache for one full context.
  EngineOptions one = *eo;
  one.scheduler.max_seqs = 1;
  if (a.engine.kv_cache_mem.empty()) {
    const int ctx = one.max_model_len > 0 ? one.max_model_len : m.model->config().max_position_embeddings;
    one.kv.num_blocks = (ctx + one.kv.block_size - 1) / one.kv.block_size;
  }
  auto engine = Engine::create(*m.model, m.tokenizer.get(), m.eos_token_ids, one);
  if (!engine.ok()) return report(engine.status());
  announce_device(a.common, m.model->device());
  Engine& e = **engine;

  const bool interactive = isatty(STDIN_FILENO) != 0;
  if (interactive) std::fprintf(stderr, "chatting with %s; /exit quits, /reset forgets the conversation\n", m.path.c_str());
  nlohmann::ordered_json history = nlohmann::ordered_json::array();
  const auto reset = [&] {
    history = nlohmann::ordered_json::array();
    if (!a.system.empty()) history.push_back({{"role", "system"}, {"content", a.system}});
  };
  reset();
  const size_t first_turn = a.system.empty() ? 0 : 1;
  std::string line;
  uint64_t turn = 0;
  for (;;) {
    if (interactive) {
      std::fputs("> ", stdout);
      std::fflush(stdout);
    }
    if (!std::getline(std::cin, line)) break;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line == "/exit" || line == "/quit") break;
    if (line == "/reset") {
      reset();
      continue;
    }
    if (line.empty()) continue;
    history.push_back({{"role", "user"}, {"content", line}});

    // Render; drop the oldest exchanges until the prompt leaves room for a reply.
    Result<server::ChatPrompt> prompt = Status(ErrorCode::kInternal, "not rendered");
    for (;;) {
      prompt = server::build_chat_prompt(*chat_template, extras, *m.tokenizer, history);
      if (!prompt.ok() || static_cast<int>(prompt->ids.size()) < e.max_model_len() ||
          history.size() <= first_turn + 1) {
        break;
      }
      history.erase(history.begin() + static_cast<std::ptrdiff_t>(first_turn));
      std::fprintf(stderr, "(the conversation outgrew the context: dropped its oldest turn)\n");
    }
    if (!prompt.ok() || static_cast<int>(prompt->ids.size()) >= e.max_model_len()) {
      const Status why = prompt.ok() ? make_error(ErrorCode::kOutOfRange, "the message has {} tokens; the context holds {}",
                                                  prompt->ids.size(), e.max_model_len())
                                     : prompt.status();
      std::fprintf(stderr, "tachyon: error: %s\n", why.to_string().c_str());
      history.erase(history.end() - 1);
      continue;
    }
    GenerationParams gp;
    gp.sampling = a.sampling;
    gp.sampling.seed = *a.sampling.seed + turn++;  // reproducible with --seed, different per turn
    const int room = e.max_model_len() - static_cast<int>(prompt->ids.size());
    gp.max_tokens = a.max_tokens > 0 ? std::min(a.max_tokens, room) : room;
    auto id = e.add_request(prompt->ids, gp);
    if (!id.ok()) return report(id.status());
    std::string reply;
    RequestOutput last;
    while (e.has_unfinished()) {
      auto outputs = e.step();
      if (!outputs.ok()) return report(outputs.status());
      for (RequestOutput& o : *outputs) {
        std::fwrite(o.text.data(), 1, o.text.size(), stdout);
        std::fflush(stdout);
        reply += o.text;
        if (o.finished) last = std::move(o);
      }
    }
    std::fputc('\n', stdout);
    std::fflush(stdout);
    if (last.finish_reason == FinishReason::kError) return report(last.error);
    if (a.common.verbose) {
      const RequestTiming& t = last.timing;
      const double decode = t.finished - t.first_token;
      std::fprintf(stderr, "[%d prompt tokens (%d cached), %d generated, %.1f tok/s, finish: %s]\n",
                   last.num_prompt_tokens, last.num_cached_tokens, last.num_generated_tokens,
                   decode > 0 && last.num_generated_tokens > 1 ? (last.num_generated_tokens - 1) / decode : 0.0,
                   finish_reason_name(last.finish_reason));
    }
    history.push_back({{"role", "assistant"}, {"content", reply}});
  }
  if (interactive) std::fputc('\n', stdout);
  return 0;
}

}  // namespace

void add_chat(CLI::App& app, std::function<int()>& run) {
  auto a = std::make_shared<ChatArgs>();
  a->sampling.temperature = 0.7f;
  a->sampling.top_p = 0.9f;
  CLI::App* cmd = app.add_subcommand("chat", "interactive chat in the terminal with the model's chat template");
  add_common_options(*cmd, a->common);
  cmd->add_option("--system", a->system, "system message that opens the conversation");
  cmd->add_option("--chat-template", a->chat_template, "Jinja chat template file (default: the model's, else ChatML)");
  cmd->add_option("-n,--max-tokens", a->max_tokens, "tokens per reply at most (default: the rest of the context)")
      ->check(non_negative_int());
  cmd->add_option("--temp", a->sampling.temperature, "temperature; 0 = greedy (default 0.7)");
  cmd->add_option("--top-k", a->sampling.top_k, "top-k; 0 = off (default 0)");
  cmd->add_option("--top-p", a->sampling.top_p, "top-p (default 0.9)");
  cmd->add_option("--min-p", a->sampling.min_p, "min-p (default 0)");
  cmd->add_option("--repeat-penalty", a->sampling.repetition_penalty, "repetition penalty (default 1.0 = off)");
  cmd->add_option("--seed", a->seed, "sampling seed (default: random)")->check(seed_value());
  cmd->add_option("--dtype", a->dtype, "weight dtype of synthetic models (default bf16)");
  add_engine_options(*cmd, a->engine);
  cmd->callback([a, &run]() { run = [a]() { return run_chat(*a); }; });
}

}  // namespace tachyon::cli
