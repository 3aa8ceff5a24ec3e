// A `tachyon` process for the end-to-end server tests (serve, router): started through /bin/sh
// with its output in a scratch log, on a free port it reports ("listening on
// http://127.0.0.1:PORT"), killed at destruction if still running. Plus what those tests share:
// the bundled model, the project's Python with the openai package, a file's contents.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>

#include "test_util.h"

namespace tachyon::testing {

inline std::string demo_model_dir() { return source_dir() + "/models/tachyon-demo"; }

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The venv's Python when it has the openai package (scripts/setup makes it); nullopt otherwise.
inline std::optional<std::string> openai_python() {
  static const std::optional<std::string> found = []() -> std::optional<std::string> {
    const std::string p = source_dir() + "/.venv/bin/python";
    if (!std::filesystem::exists(p)) return std::nullopt;
    if (run_command(p + " -c 'import openai'").exit_code != 0) return std::nullopt;
    return p;
  }();
  return found;
}

class TachyonProcess {
 public:
  // `args` follow `tachyon`; the log goes to a scratch directory named after `tag`.
  TachyonProcess(const std::string& tag, const std::string& args) {
    log_ = scratch_dir(tag) + "/process.log";
    command_ = tachyon_binary() + " " + args;
    const std::string command = "exec " + command_;
    pid_ = fork();
    if (pid_ == 0) {
      FILE* f = std::freopen(log_.c_str(), "w", stdout);
      if (f == nullptr || dup2(fileno(stdout), STDERR_FILENO) < 0) _exit(127);
      execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    // Wait (at most ~2 minutes) for the port, or for the process's end.
    const std::string marker = "listening on http://127.0.0.1:";
    for (int i = 0; i < 2400 && port_ == 0; ++i) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        break;
      }
      const std::string text = slurp(log_);
      const size_t at = text.find(marker);
      if (at != std::string::npos && text.find('\n', at) != std::string::npos) {
        port_ = std::stoi(text.substr(at + marker.size()));
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
  }
  ~TachyonProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  TachyonProcess(const TachyonProcess&) = delete;
  TachyonProcess& operator=(const TachyonProcess&) = delete;

  bool started() const { return port_ > 0; }
  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  std::string log() const { return slurp(log_); }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  const std::string& command() const { return command_; }

  // Sends `signal` (none: 0) and waits for the exit; the exit code, or 128 + signal number.
  int stop(int signal = SIGTERM) {
    if (pid_ <= 0) return -1;
    if (signal != 0) kill(pid_, signal);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

 private:
  std::string log_;
  std::string command_;
  pid_t pid_ = -1;
  int port_ = 0;
};

}  // namespace tachyon::testing
