// `tachyon serve`: the OpenAI-compatible HTTP server (src/server/) over one model. Startup lines
// and logs go to stderr, including "listening on http://HOST:PORT" once the socket accepts
// (with --port 0 that line tells which port was picked). SIGINT/SIGTERM drain and exit 0.
//
// --role prefill|decode makes it one side of a disaggregated deployment behind `tachyon router`
// (server/disagg_worker.h, server/disagg_protocol.h); a decode worker also prints
// "kv transfers on HOST:PORT" (with --kv-port 0, the port picked). --role both (the default) is a
// plain server.
//
// --api-key KEY (or the environment's TACHYON_API_KEY): /v1/* requests need "Authorization: Bearer
// KEY" (401 otherwise); --allowed-origins a,b (or *) answers those origins' CORS preflights and
// marks the responses to them. Neither is on by default.
#include <sys/resource.h>

#include <csignal>
#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/spec_args.h"
#include "engine/async_engine.h"
#include "server/chat_prompt.h"
#include "server/disagg_protocol.h"
#include "disagg/kv_staging.h"
#include "disagg/kv_transfer.h"
#include "server/disagg_worker.h"
#include "server/http_server.h"
#include "server/metrics.h"

namespace tachyon::cli {
namespace {

struct ServeArgs {
  CommonOptions common;
  EngineArgs engine;
  SpecArgs spec;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string served_model_name;
  std::string chat_template;
  std::string max_body = "8MiB";
  int max_waiting = 1024;
  double request_timeout = 600.0;
  int io_threads = 2;
  double keep_alive_timeout = 65.0;
  std::string dtype = "bf16";
  bool stream_timestamps = false;
  std::string role = "both";
  std::string kv_host;     // default: --host
  int kv_port = 0;
  std::string kv_transport = "tcp";  // prefill role: tcp or cuda-ipc
  std::string kv_staging_mem = "1GiB";
  double transfer_wait = 30.0;
  double adopt_wait = 10.0;
  std::string api_key;          // also TACHYON_API_KEY
  std::string allowed_origins;  // CORS: a comma list, or *
};

// The -m path's last component: "models/tachyon-demo/" -> "tachyon-demo".
std::string default_model_name(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const std::string name = std::filesystem::path(p).filename().string();
  return name.empty() ? p : name;
}

// Thousands of connections need as many descriptors: raise the soft limit to the hard one.
void raise_open_files_limit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    setrlimit(RLIMIT_NOFILE, &lim);
  }
}

int run_serve(ServeArgs& a) {
  std::signal(SIGPIPE, SIG_IGN);  // a client that hangs up is an error code on the socket, not a signal
  raise_open_files_limit();
  const auto dtype = parse_dtype(a.dtype);
  if (!dtype) return report(make_error(ErrorCode::kInvalidArgument, "--dtype '{}' is not a dtype", a.dtype));
  auto max_body = parse_bytes(a.max_body);
  if (!max_body.ok()) return report(max_body.status().with_context("--max-body"));
  if (*max_body == 0) return report(make_error(ErrorCode::kInvalidArgument, "--max-body must be positive"));
  if (a.max_waiting < 1 || a.request_timeout < 0 || a.io_threads < 1 || a.keep_alive_timeout <= 0) {
    return report(make_error(ErrorCode::kInvalidArgument,
                             "--max-waiting and --io-threads must be at least 1, --request-timeout not negative, "
                             "--keep-alive-timeout positive"));
  }
  auto role = server::parse_role(a.role);
  if (!role.ok()) return report(role.status().with_context("--role"));
  if (a.transfer_wait <= 0 || a.adopt_wait <= 0) {
    return report(make_error(ErrorCode::kInvalidArgument, "--transfer-wait and --adopt-wait must be positive"));
  }
  // Checked before the model loads: a typo costs no load time.
  if (a.kv_transport != "tcp" && a.kv_transport != "cuda-ipc") {
    return report(make_error(ErrorCode::kInvalidArgument, "--kv-transport '{}': tcp or cuda-ipc", a.kv_transport));
  }
  if (a.kv_transport == "cuda-ipc" && *role != server::WorkerRole::kPrefill) {
    return report(make_error(ErrorCode::kInvalidArgument,
                             "--kv-transport is the prefill role's choice (a decode worker takes either)"));
  }
  auto origins = server::parse_allowed_origins(a.allowed_origins);
  if (!origins.ok()) return report(origins.status().with_context("--allowed-origins"));
  auto staging_bytes = parse_bytes(a.kv_staging_mem);
  if (!staging_bytes.ok()) return report(staging_bytes.status().with_context("--kv-staging-mem"));
  auto eo = engine_options(a.engine);
  if (!eo.ok()) return report(eo.status());
  auto loaded = load(a.common, *dtype);
  if (!loaded.ok()) return report(loaded.status());
  LoadedModel& m = *loaded;
  if (!m.tokenizer) {
    return report(make_error(ErrorCode::kInvalidArgument, "{} has no tokenizer: the server needs one", m.path));
  }
  SpecModels drafts;  // --draft-model, alive as long as the server
  Status spec = apply_spec_options(a.spec, m, drafts, *eo);
  if (!spec.ok()) return report(spec);
  auto chat_template = server::load_server_chat_template(*m.tokenizer, a.chat_template);
  if (!chat_template.ok()) return report(chat_template.status());
  auto engine = Engine::create(*m.model, m.tokenizer.get(), m.eos_token_ids, *eo);
  if (!engine.ok()) return report(engine.status());
  const EngineStats stats = (*engine)->stats();
  const disagg::KvModelShape kv_shape = disagg::kv_model_shape(**engine);  // what a transfer must match

  server::ServingContext context;
  context.model_name = a.served_model_name.empty() ? default_model_name(a.common.model) : a.served_model_name;
  context.tokenizer = m.tokenizer.get();
  context.chat_template = &*chat_template;
  context.template_extras = chat_template_extras(*m.tokenizer);
  context.max_model_len = (*engine)->max_model_len();
  context.vocab_size = m.model->config().vocab_size;
  context.max_choices = a.max_waiting;
  context.stream_timestamps = a.stream_timestamps;
  context.sparse_attention = eo->sparse_budget > 0;
  for (const NamedDraft& d : eo->spec.drafts) {
    if (!d.name.empty()) context.drafts.push_back(d.name);
  }

  server::ServerMetrics metrics;
  AsyncEngineOptions ao;
  ao.max_waiting = a.max_waiting;
  ao.request_timeout = a.request_timeout;
  ao.adopt_wait = a.adopt_wait;
  // Declared before the engine: the prefill worker outlives the engine that calls it, the
  // registry the HTTP sessions that register in it.
  std::unique_ptr<server::PrefillWorker> prefill_worker;
  std::shared_ptr<disagg::KvExportArena> kv_arena;  // prefill role with --kv-transport cuda-ipc
  server::TransferRegistry registry;
  server::DisaggContext disagg;
  disagg.role = *role;
  disagg.transfer_wait = a.transfer_wait;
  if (*role == server::WorkerRole::kPrefill && a.kv_transport == "cuda-ipc") {
    auto pool = disagg::KvStagingPool::create(m.model->device(), *staging_bytes);
    if (!pool.ok()) return report(pool.status().with_context("--kv-transport cuda-ipc"));
    kv_arena = std::move(pool).value();
  }
  if (*role == server::WorkerRole::kPrefill) {
    prefill_worker = std::make_unique<server::PrefillWorker>(metrics, disagg::KvSenderOptions{}, kv_arena);
    ao.on_transfer = prefill_worker->on_transfer();
    disagg.prefill = prefill_worker.get();
  }
  auto async_engine = std::make_unique<AsyncEngine>(std::move(*engine), ao, metrics);
  AsyncEngine& engine_ref = *async_engine;
  std::unique_ptr<server::DecodeWorker> decode_worker;  // reset before the engine goes
  if (*role == server::WorkerRole::kDecode) {
    server::DecodeWorkerOptions dw;
    dw.receiver.address = a.kv_host.empty() ? a.host : a.kv_host;
    dw.receiver.port = static_cast<uint16_t>(a.kv_port);
    dw.receiver.receive.expect = kv_shape;
    if (!m.model->device().is_cpu()) {
      // K/V a prefill worker of this host left in its GPU memory (--kv-transport cuda-ipc).
      const Device device = m.model->device();
      dw.receiver.receive.map_region = [device](std::span<const uint8_t> handle, uint64_t offset, uint64_t bytes) {
        return disagg::map_device_region(device, handle, offset, bytes);
      };
    }
    dw.adopt_wait = a.adopt_wait;
    auto started = server::DecodeWorker::start(engine_ref, registry, metrics, dw);
    if (!started.ok()) return report(started.status());
    decode_worker = std::move(started).value();
    disagg.registry = &registry;
    disagg.kv_port = decode_worker->kv_port();
  }

  server::HttpServerOptions ho;
  ho.host = a.host;
  ho.port = a.port;
  ho.io_threads = a.io_threads;
  ho.max_body = *max_body;
  ho.keep_alive_timeout = a.keep_alive_timeout;
  ho.max_registered = a.max_waiting;
  ho.access.api_key = a.api_key;
  ho.access.allowed_origins = *origins;
  auto http = server::HttpServer::create(ho, context, std::move(async_engine), metrics, disagg);
  if (!http.ok()) {
    decode_worker.reset();
    return report(http.status());
  }

  const char* template_source = !a.chat_template.empty()          ? a.chat_template.c_str()
                                : m.tokenizer->chat_template().empty() ? "built-in ChatML (the model has none)"
                                                                       : "the model's";
  announce_device(a.common, m.model->device());
  std::fprintf(stderr,
               "tachyon serve: model '%s' (%s) loaded in %.2f s | max_model_len %d | kv cache %d blocks of %d tokens "
               "(%.1f MiB) | max_seqs %d, max_waiting %d | chat template: %s\n",
               context.model_name.c_str(), m.path.c_str(), m.load_seconds, context.max_model_len, stats.kv_blocks_total,
               eo->kv.block_size, static_cast<double>(stats.kv_cache_bytes) / (1 << 20), eo->scheduler.max_seqs, a.max_waiting,
               template_source);
  if (decode_worker) {
    std::fprintf(stderr, "tachyon serve: role decode | kv transfers on %s:%d\n",
                 (a.kv_host.empty() ? a.host : a.kv_host).c_str(), decode_worker->kv_port());
  } else if (*role == server::WorkerRole::kPrefill) {
    std::fprintf(stderr, "tachyon serve: role prefill | ships KV to the decode workers the router names (%s)\n",
                 kv_arena ? fmt::format("CUDA IPC from {} of device memory, TCP when it is full", a.kv_staging_mem).c_str()
                             : "TCP");
  }
  if (!a.api_key.empty() || !origins->empty()) {
    std::fprintf(stderr, "tachyon serve: %s | CORS: %s\n",
                 a.api_key.empty() ? "no API key" : "/v1/* needs the API key",
                 origins->empty() ? "off" : fmt::format("{} allowed origin(s)", origins->size()).c_str());
  }
  std::fprintf(stderr, "tachyon serve: listening on http://%s:%d\n", a.host.c_str(), (*http)->port());
  std::fflush(stderr);
  const int code = (*http)->run();
  decode_worker.reset();  // its threads feed the engine, which goes with the server
  if (prefill_worker) prefill_worker->stop();  // its callbacks reach the server's connections
  return code;
}

}  // namespace

void add_serve(CLI::App& app, std::function<int()>& run) {
  auto a = std::make_shared<ServeArgs>();
  CLI::App* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions)");
  add_common_options(*cmd, a->common);
  cmd->add_option("--host", a->host, "address to listen on (default 127.0.0.1)");
  cmd->add_option("--port", a->port, "TCP port; 0 picks a free one (default 8000)")->check(CLI::Range(0, 65535));
  cmd->add_option("--served-model-name", a->served_model_name,
                  "the model name clients send (default: the last component of -m)");
  cmd->add_option("--chat-template", a->chat_template, "Jinja chat template file (default: the model's, else ChatML)");
  cmd->add_option("--max-body", a->max_body, "largest request body, e.g. 8MiB (default 8MiB)");
  cmd->add_option("--max-waiting", a->max_waiting, "requests waiting to run before new ones get 503 (default 1024)");
  cmd->add_flag("--stream-timestamps", a->stream_timestamps,
                "add \"tachyon_handed_over\" (CLOCK_MONOTONIC seconds) to streamed chunks, for delivery benchmarks");
  cmd->add_option("--request-timeout", a->request_timeout, "seconds before a request is aborted; 0 = never (default 600)");
  cmd->add_option("--io-threads", a->io_threads, "threads for network I/O (default 2)");
  cmd->add_option("--keep-alive-timeout", a->keep_alive_timeout, "seconds an idle connection stays open (default 65)");
  cmd->add_option("--dtype", a->dtype, "weight dtype of synthetic models (default bf16)");
  cmd->add_option("--role", a->role,
                  "both (a plain server), prefill or decode (a disaggregated worker behind tachyon router)")
      ->check(CLI::IsMember({"both", "prefill", "decode"}));
  cmd->add_option("--kv-transport", a->kv_transport,
                  "prefill role: how K/V reach the decode workers: tcp (any host), or cuda-ipc (a decode worker on "
                  "a GPU of this host maps this worker's GPU memory; no copy through the host; default tcp)");
  cmd->add_option("--kv-staging-mem", a->kv_staging_mem,
                  "prefill role, cuda-ipc: GPU memory for K/V awaiting their decode worker (default 1GiB); a "
                  "transfer that finds it full goes by TCP");
  cmd->add_option("--kv-host", a->kv_host, "decode role: address of the KV transfer port (default: --host)");
  cmd->add_option("--kv-port", a->kv_port, "decode role: KV transfer port; 0 picks a free one (default 0)")
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--transfer-wait", a->transfer_wait,
                  "decode role: seconds a registered request waits for its KV transfer (default 30)");
  cmd->add_option("--adopt-wait", a->adopt_wait,
                  "decode role: seconds a received transfer may wait for room in the engine (default 10)");
  cmd->add_option("--api-key", a->api_key,
                  "requests to /v1/* must send 'Authorization: Bearer KEY' (401 otherwise); /health, /metrics, "
                  "/tokenize and /detokenize stay open (default: $TACHYON_API_KEY, else none)")
      ->envname("TACHYON_API_KEY");
  cmd->add_option("--allowed-origins", a->allowed_origins,
                  "CORS: origins browsers may call from, a comma list or * (default none: no CORS headers)");
  add_engine_options(*cmd, a->engine);
  add_spec_options(*cmd, a->spec);
  cmd->callback([a, &run]() { run = [a]() { return run_serve(*a); }; });
}

}  // namespace tachyon::cli
