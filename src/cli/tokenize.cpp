// `tachyon tokenize -m MODEL -p TEXT`: the token ids as a JSON array (BOS as the model's
// tokenizer config says).
#include <cstdio>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"

namespace tachyon::cli {

namespace {

struct TokenizeArgs {
  CommonOptions common;
  std::string prompt;
  bool no_bos = false;
  bool special = false;
  bool pieces = false;
};

int run_tokenize(const TokenizeArgs& a) {
  auto loaded = load(a.common);
  if (!loaded.ok()) return report(loaded.status());
  if (!loaded->tokenizer) {
    return report(make_error(ErrorCode::kInvalidArgument, "{} has no tokenizer", loaded->path));
  }
  EncodeOptions eo;
  if (a.no_bos) eo.add_bos = false;
  eo.parse_special = a.special;
  const std::vector<int32_t> ids = loaded->tokenizer->encode(a.prompt, eo);
  std::string out = "[";
  for (size_t i = 0; i < ids.size(); ++i) out += fmt::format("{}{}", i ? ", " : "", ids[i]);
  out += "]";
  std::printf("%s\n", out.c_str());
  if (a.pieces) {
    for (int32_t id : ids) {
      std::fprintf(stderr, "%6d  %s\n", id, nlohmann::json(loaded->tokenizer->token_to_piece(id)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    }
  }
  return 0;
}

}  // namespace

void add_tokenize(CLI::App& app, std::function<int()>& run) {
  auto args = std::make_shared<TokenizeArgs>();
  CLI::App* cmd = app.add_subcommand("tokenize", "print the token ids of a text as a JSON array");
  add_common_options(*cmd, args->common);
  cmd->add_option("-p,--prompt", args->prompt, "text to tokenize")->required();
  cmd->add_flag("--no-bos", args->no_bos, "do not add the BOS token");
  cmd->add_flag("--special", args->special, "parse special tokens written in the text");
  cmd->add_flag("--pieces", args->pieces, "also print each token's bytes on stderr");
  cmd->callback([args, &run]() { run = [args]() { return run_tokenize(*args); }; });
}

}  // namespace tachyon::cli
