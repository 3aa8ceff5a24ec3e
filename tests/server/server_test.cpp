// `tachyon serve` as clients see it: the real binary on a free loopback port with the bundled model
// (models/tachyon-demo), driven by the Python scripts beside this file through the official
// `openai` client and raw sockets. The scripts run with the project's virtual environment
// (.venv, made by scripts/setup); without it these tests skip and say so.
#include <signal.h>

#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

#include "server/tachyon_process.h"
#include "test_util.h"

namespace tachyon {
namespace {

using testing::TachyonProcess;

std::string model_dir() { return testing::demo_model_dir(); }
std::string script(const std::string& name) { return testing::source_dir() + "/tests/server/" + name; }
std::optional<std::string> python() { return testing::openai_python(); }

#define SKIP_WITHOUT_VENV()                                                                                  \
  if (!python()) GTEST_SKIP() << "no .venv with the openai package (scripts/setup makes it); skipping"

// One `tachyon serve` process on the bundled model; killed at destruction if still running.
class ServerProcess : public TachyonProcess {
 public:
  explicit ServerProcess(const std::string& args)
      : TachyonProcess("serve", "serve -m " + model_dir() + " --port 0 --kv-cache-mem 128MiB " + args) {}

  std::string base_url() const { return url(); }

  // Runs tests/server/<name> against this server; its output is the failure message.
  testing::CommandResult run_script(const std::string& name, const std::string& env = "") const {
    const std::string command = "TACHYON_BASE_URL=" + base_url() + " TACHYON_MODEL_NAME=tachyon-demo" +
                                " TACHYON_MODEL_DIR=" + model_dir() + " TACHYON_BINARY=" +
                                testing::tachyon_binary() + " " + env + " " + *python() + " " + script(name);
    return testing::run_command(command);
  }
};

void expect_script_passes(const ServerProcess& server, const std::string& name, const std::string& env = "") {
  const testing::CommandResult r = server.run_script(name, env);
  EXPECT_EQ(r.exit_code, 0) << name << ":\n" << r.out << r.err << "\nserver log:\n" << server.log();
}

TEST(Server, OpenAiClientCompletionsAndChat) {
  SKIP_WITHOUT_VENV();
  ServerProcess server("--batch-invariant");
  ASSERT_TRUE(server.started()) << server.log();
  expect_script_passes(server, "openai_client_test.py");
  EXPECT_EQ(server.stop(), 0) << server.log();
}

// Every field honoured or refused by name (vLLM's extras through extra_body), /tokenize and
// /detokenize, CORS for an allowed origin.
TEST(Server, OpenAiFieldsAreHonouredOrRefusedByName) {
  SKIP_WITHOUT_VENV();
  ServerProcess server("--batch-invariant --allowed-origins http://localhost:3000");
  ASSERT_TRUE(server.started()) << server.log();
  expect_script_passes(server, "api_fields_test.py");
  EXPECT_EQ(server.stop(), 0) << server.log();
}

// --api-key, and the same key from TACHYON_API_KEY: /v1/* needs it, /health and /metrics do not.
// JSON mode, JSON schemas, regexes, grammars and choices through the openai client: outputs
// parse and validate.
TEST(Server, StructuredOutputFollowsItsConstraint) {
  SKIP_WITHOUT_VENV();
  ServerProcess server("--batch-invariant");
  ASSERT_TRUE(server.started()) << server.log();
  expect_script_passes(server, "structured_output_test.py");
  EXPECT_EQ(server.stop(), 0) << server.log();
}

// Tool calling through the openai client, with the bundled model's template (no tool section:
// the tools go into the system prompt) and real ones that render tools in each call format.
TEST(Server, ToolCallsInEveryFormat) {
  SKIP_WITHOUT_VENV();
  const std::string templates = testing::source_dir() + "/tests/fixtures/chat_templates/templates/";
  const std::pair<std::string, std::string> setups[] = {
      {"", "hermes"},
      {"meta-llama-Llama-3.2-3B-Instruct.jinja", "llama3_json"},
      {"Qwen-Qwen2.5-7B-Instruct.jinja", "hermes"},
      {"mistralai-Mistral-Nemo-Instruct-2407.jinja", "mistral"},
  };
  for (const auto& [file, format] : setups) {
    SCOPED_TRACE(file.empty() ? "the bundled template" : file);
    ServerProcess server("--batch-invariant" + (file.empty() ? "" : " --chat-template " + templates + file));
    ASSERT_TRUE(server.started()) << server.log();
    expect_script_passes(server, "tool_calls_test.py", "TACHYON_TOOL_FORMAT=" + format);
    EXPECT_EQ(server.stop(), 0) << server.log();
  }
}

TEST(Server, ApiKeyGuardsV1Routes) {
  SKIP_WITHOUT_VENV();
  {
    ServerProcess server("--api-key sk-tachyon-test");
    ASSERT_TRUE(server.started()) << server.log();
    expect_script_passes(server, "api_key_test.py", "TACHYON_TEST_API_KEY=sk-tachyon-test");
    EXPECT_EQ(server.stop(), 0) << server.log();
  }
  setenv("TACHYON_API_KEY", "sk-from-env", 1);  // the server inherits it
  ServerProcess server("");
  unsetenv("TACHYON_API_KEY");
  ASSERT_TRUE(server.started()) << server.log();
  expect_script_passes(server, "api_key_test.py", "TACHYON_TEST_API_KEY=sk-from-env");
  EXPECT_EQ(server.stop(), 0) << server.log();
}

TEST(Server, ManyConcurrentStreamsAllComplete) {
  SKIP_WITHOUT_VENV();
  ServerProcess server("--io-threads 3 --stream-timestamps");
  ASSERT_TRUE(server.started()) << server.log();
  expect_script_passes(server, "load_test.py", "TACHYON_LOAD_CONCURRENCY=256 TACHYON_EXPECT_TIMESTAMPS=1");
  EXPECT_EQ(server.stop(), 0) << server.log();
}

TEST(Server, BadInputsGetErrorStatusesAndTheServerStaysUp) {
  SKIP_WITHOUT_VENV();
  ServerProcess server("--max-body 1MiB --max-seqs 1 --max-waiting 2");
  ASSERT_TRUE(server.started()) << server.log();
  expect_script_passes(server, "bad_input_test.py");
  EXPECT_EQ(server.stop(), 0) << server.log();
}

TEST(Server, ClientsHangingUpFreeTheirKvBlocks) {
  SKIP_WITHOUT_VENV();
  ServerProcess server("");
  ASSERT_TRUE(server.started()) << server.log();
  expect_script_passes(server, "disconnect_test.py");
  EXPECT_EQ(server.stop(), 0) << server.log();
}

TEST(Server, RequestTimeoutAbortsWithAnError) {
  SKIP_WITHOUT_VENV();
  ServerProcess server("--request-timeout 0.001");
  ASSERT_TRUE(server.started()) << server.log();
  expect_script_passes(server, "timeout_test.py");
  EXPECT_EQ(server.stop(), 0) << server.log();
}

TEST(Server, SigtermDrainsStreamsInFlightAndExitsZero) {
  SKIP_WITHOUT_VENV();
  ServerProcess server("");
  ASSERT_TRUE(server.started()) << server.log();
  expect_script_passes(server, "sigterm_test.py", "TACHYON_SERVER_PID=" + std::to_string(server.pid()));
  EXPECT_EQ(server.stop(0), 0) << server.log();  // the script sent SIGTERM
  EXPECT_NE(server.log().find("drained"), std::string::npos) << server.log();
}

// A step that fails inside the engine (the fault injected once, at the first forward) costs its
// request a 500 and nothing else: later requests complete, /metrics counts it, no block is held.
TEST(Server, AFailedEngineStepFailsItsRequestAndTheServerGoesOn) {
  SKIP_WITHOUT_VENV();
  for (const char* fault : {"workspace:1", "kernel:1"}) {
    SCOPED_TRACE(fault);
    setenv("TACHYON_INJECT_FAULT", fault, 1);  // the server inherits it
    ServerProcess server("");
    unsetenv("TACHYON_INJECT_FAULT");
    ASSERT_TRUE(server.started()) << server.log();
    expect_script_passes(server, "fault_test.py");
    EXPECT_EQ(server.stop(), 0) << server.log();
    EXPECT_NE(server.log().find("engine step failed"), std::string::npos) << server.log();
  }
}

TEST(Server, IdleServerExitsZeroOnSigint) {
  ServerProcess server("");
  ASSERT_TRUE(server.started()) << server.log();
  EXPECT_EQ(server.stop(SIGINT), 0) << server.log();
}

TEST(Server, BadOptionsGiveOneErrorLine) {
  const std::string serve = testing::tachyon_binary() + " serve -m " + model_dir() + " --port 0 ";
  const auto expect_error = [](const testing::CommandResult& r, const std::string& needle) {
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_EQ(r.err.rfind("tachyon: error: ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
  };
  expect_error(testing::run_command(serve + "--max-body lots"), "max-body");
  expect_error(testing::run_command(serve + "--host not-an-address"), "not-an-address");
  expect_error(testing::run_command(serve + "--chat-template /nonexistent/template.jinja"), "template.jinja");
  const std::string dir = testing::scratch_dir("template");
  std::ofstream(dir + "/broken.jinja") << "{% for m in messages %}{{ m.content ";
  expect_error(testing::run_command(serve + "--chat-template " + dir + "/broken.jinja"), "broken.jinja");
}

// `tachyon chat`: each stdin line is a turn, the reply streams to stdout, history accumulates.
TEST(Server, ChatCommandKeepsTheConversation) {
  const std::string chat = testing::tachyon_binary() + " chat -m " + model_dir() + " --temp 0 -n 6 -v";
  const testing::CommandResult r =
      testing::run_command("(printf 'Hello there\\nWrite a Go function\\n/exit\\nnever read\\n' | " + chat + ")");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // The second turn's prompt holds the first exchange: more prompt tokens, some from the cache.
  std::vector<int> prompt_tokens;
  const std::string marker = " prompt tokens (";
  for (size_t pos = r.err.find(marker); pos != std::string::npos; pos = r.err.find(marker, pos + 1)) {
    const size_t open = r.err.rfind('[', pos);
    prompt_tokens.push_back(std::atoi(r.err.c_str() + open + 1));
  }
  ASSERT_EQ(prompt_tokens.size(), 2u) << r.err;
  EXPECT_GT(prompt_tokens[1], prompt_tokens[0] + 6) << r.err;
  // The first turn alone, from a fresh process, gives the same first reply.
  const testing::CommandResult first = testing::run_command("(printf 'Hello there\\n' | " + chat + ")");
  ASSERT_EQ(first.exit_code, 0) << first.err;
  ASSERT_FALSE(first.out.empty());
  EXPECT_EQ(r.out.rfind(first.out, 0), 0u) << r.out << "\n---\n" << first.out;
  EXPECT_GT(r.out.size(), first.out.size());
}

}  // namespace
}  // namespace tachyon
