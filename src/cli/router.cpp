// `tachyon router`: the OpenAI-compatible front of a disaggregated deployment (router/router.h).
// It loads no model: the workers check requests and count tokens. Prints
// "listening on http://HOST:PORT" to stderr once the socket accepts; SIGINT/SIGTERM drain and
// exit 0.
#include <csignal>
#include <cstdio>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/log.h"
#include "net/http_url.h"
#include "router/router.h"

namespace tachyon::cli {
namespace {

struct RouterArgs {
  std::vector<std::string> prefill;
  std::vector<std::string> decode;
  std::string host = "127.0.0.1";
  int port = 8000;
  int disagg_min_prompt = 0;
  int decode_max_queue = 8;
  double decode_min_free_kv = 0.05;
  int max_held = 64;
  double hold_timeout = 30.0;
  double worker_timeout = 60.0;
  double poll_interval = 0.1;
  std::string max_body = "8MiB";
  bool verbose = false;
};

int run_router(const RouterArgs& a) {
  std::signal(SIGPIPE, SIG_IGN);
  if (a.verbose) set_log_level(LogLevel::kDebug);
  router::RouterOptions o;
  for (const std::string& url : a.prefill) {
    auto u = net::parse_http_url(url);
    if (!u.ok()) return report(u.status().with_context("--prefill"));
    o.prefill.push_back(*u);
  }
  for (const std::string& url : a.decode) {
    auto u = net::parse_http_url(url);
    if (!u.ok()) return report(u.status().with_context("--decode"));
    o.decode.push_back(*u);
  }
  auto max_body = parse_bytes(a.max_body);
  if (!max_body.ok()) return report(max_body.status().with_context("--max-body"));
  o.host = a.host;
  o.port = a.port;
  o.disagg_min_prompt = a.disagg_min_prompt;
  o.policy.max_decode_queue = a.decode_max_queue;
  o.policy.min_decode_free_kv = a.decode_min_free_kv;
  o.policy.max_held = a.max_held;
  o.hold_timeout = a.hold_timeout;
  o.worker_timeout = a.worker_timeout;
  o.poll_interval = a.poll_interval;
  o.max_body = *max_body;
  auto router = router::Router::create(o);
  if (!router.ok()) return report(router.status());
  std::fprintf(stderr, "tachyon router: %zu prefill and %zu decode workers | prompts under %d tokens run colocated\n",
               o.prefill.size(), o.decode.size(), o.disagg_min_prompt);
  std::fprintf(stderr, "tachyon router: listening on http://%s:%d\n", a.host.c_str(), (*router)->port());
  std::fflush(stderr);
  return (*router)->run();
}

}  // namespace

void add_router(CLI::App& app, std::function<int()>& run) {
  auto a = std::make_shared<RouterArgs>();
  CLI::App* cmd = app.add_subcommand(
      "router", "OpenAI-compatible front for disaggregated workers (tachyon serve --role prefill|decode)");
  cmd->add_option("--prefill", a->prefill,
                  "a prefill worker's URL, http://HOST:PORT (repeatable); none: every request runs whole on a decode "
                  "worker (a colocated pool behind the same router)");
  cmd->add_option("--decode", a->decode, "a decode worker's URL, http://HOST:PORT (repeatable)")->required();
  cmd->add_option("--host", a->host, "address to listen on (default 127.0.0.1)");
  cmd->add_option("--port", a->port, "TCP port; 0 picks a free one (default 8000)")->check(CLI::Range(0, 65535));
  cmd->add_option("--disagg-min-prompt", a->disagg_min_prompt,
                  "prompts shorter than this many tokens run colocated on a decode worker (default 0: none)")
      ->check(CLI::Range(0, 1 << 30));
  cmd->add_option("--decode-max-queue", a->decode_max_queue,
                  "a decode worker with this many waiting requests and transfers is busy (default 8)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--decode-min-free-kv", a->decode_min_free_kv,
                  "a decode worker with less than this fraction of its KV blocks free is busy (default 0.05)")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--max-held", a->max_held,
                  "requests held while every decode worker is busy, past which 503 (default 64)")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--hold-timeout", a->hold_timeout, "seconds a held request waits before 503 (default 30)");
  cmd->add_option("--worker-timeout", a->worker_timeout,
                  "seconds any one wait for a worker's next bytes may take (default 60)");
  cmd->add_option("--poll-interval", a->poll_interval, "seconds between load polls of each worker (default 0.1)");
  cmd->add_option("--max-body", a->max_body, "largest request body, e.g. 8MiB (default 8MiB)");
  cmd->add_flag("-v,--verbose", a->verbose, "debug logging");
  cmd->callback([a, &run]() { run = [a]() { return run_router(*a); }; });
}

}  // namespace tachyon::cli
